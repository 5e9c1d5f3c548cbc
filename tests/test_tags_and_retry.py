"""Tags and meta attached at enqueue, found by tag on each backend, shown but never the payload;
bounds refused with one line; a retry with a corrected payload: a new job linked to the failed
one, which stays as evidence, with the order per target kept."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
import sqlalchemy as sa

from clikit import run_split
from jobkit import Note, NoteType, registry_with
from tether import AlreadyRetried, Coordinator, InvalidPayload, JobStatus, Superseded
from tether.jobtypes import CreateFile
from tether.ledger.schema import job_tags
from tether.observe.jobs import jobs
from tether.observe.tags import job_ids_tagged, notes, tagged_jobs


def test_jobs_are_found_by_tag_and_carry_their_meta(coordinator: Coordinator) -> None:
    acme = coordinator.enqueue(CreateFile(path="a.txt", text="a"), tags=["tenant:acme", "x"], meta={"by": "ops"}).job
    other = coordinator.enqueue(CreateFile(path="b.txt", text="b"), tags=["tenant:globex"]).job
    plain = coordinator.enqueue(CreateFile(path="c.txt", text="c")).job
    many = coordinator.enqueue_many([CreateFile(path=f"m{n}.txt", text="m") for n in range(3)], tags=["tenant:acme"])
    with coordinator.transaction() as tx:
        tx.enqueue(CreateFile(path="t.txt", text="t"), tags=["tenant:acme"])
    tagged = [j.id for j in tagged_jobs(coordinator.engine, "tenant:acme")]
    assert tagged == sorted([acme.id, *(r.id for r in many), tx.results[0].id], reverse=True)
    assert [j.id for j in jobs(coordinator.engine, tag="tenant:globex")] == [other.id]
    assert job_ids_tagged(coordinator.engine, "tenant:acme", statuses=["pending"]) == sorted(tagged)
    assert jobs(coordinator.engine, tag="tenant:none") == []
    noted = notes(coordinator.engine, [acme.id, plain.id])
    assert noted[acme.id] == {"tags": ["tenant:acme", "x"], "meta": {"by": "ops"}, "retry_of": None, "retried_as": []}
    assert noted[plain.id]["tags"] == [] and noted[plain.id]["meta"] is None


def test_a_duplicate_by_key_gets_no_second_set_of_tags(coordinator: Coordinator) -> None:
    first = coordinator.enqueue(CreateFile(path="k.txt", text="k"), key="k", tags=["one"])
    again = coordinator.enqueue(CreateFile(path="k.txt", text="k"), key="k", tags=["two"])
    assert again.duplicate and again.id == first.id
    assert notes(coordinator.engine, [first.id])[first.id]["tags"] == ["one"]
    with coordinator.engine.connect() as conn:  # no tag row written for the job never inserted
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(job_tags).where(job_tags.c.tag == "two")).scalar() == 0
        )


@pytest.mark.parametrize(
    ("tags", "meta", "rule"),
    [
        ([f"t{n}" for n in range(17)], None, "tags: at most 16 per job"),
        (["x" * 65], None, "a tag is 1 to 64 of"),
        (["has space"], None, "a tag is 1 to 64 of"),
        ("tenant:acme", None, "tags: a list of tags"),
        ([], {"x": "y" * 4096}, "meta: at most 4096 bytes"),
    ],
)
def test_tags_and_meta_past_their_bounds_are_refused_and_nothing_is_stored(
    coordinator: Coordinator, tags: list[str], meta: dict[str, str] | None, rule: str
) -> None:
    with pytest.raises(InvalidPayload, match=rule):
        coordinator.enqueue(CreateFile(path="a.txt", text="a"), tags=tags, meta=meta)
    assert jobs(coordinator.engine) == []


def _failed(coordinator: Coordinator, path: str, **options: Any) -> str:
    """A create_file job on ``path`` that failed (different content there, overwrite off)."""
    (coordinator.root / path).write_text("someone else's")
    job = coordinator.enqueue(CreateFile(path=path, text="mine", overwrite=False), **options).job
    coordinator.run_until_idle()
    assert coordinator.get(job.id).status is JobStatus.FAILED
    return job.id


def test_a_retry_with_a_corrected_payload_is_a_new_job_and_the_failed_one_stays(coordinator: Coordinator) -> None:
    failed_id = _failed(coordinator, "a.txt", tags=["tenant:acme", "t:2"], meta={"ticket": "OPS-9"})
    before = coordinator.get(failed_id)
    new = coordinator.retry(failed_id, CreateFile(path="a.txt", text="mine", overwrite=True))
    assert new.id != failed_id and new.status is JobStatus.PENDING and new.max_attempts == before.max_attempts
    assert coordinator.get(failed_id) == before  # the evidence, untouched
    noted = notes(coordinator.engine, [failed_id, new.id])
    assert noted[failed_id]["retried_as"] == [new.id] and noted[new.id]["retry_of"] == failed_id
    assert (noted[new.id]["tags"], noted[new.id]["meta"]) == (["t:2", "tenant:acme"], {"ticket": "OPS-9"})
    coordinator.run_until_idle()
    assert coordinator.get(new.id).status is JobStatus.COMPLETED
    assert (coordinator.root / "a.txt").read_text() == "mine"
    with pytest.raises(AlreadyRetried, match=new.id):
        coordinator.retry(failed_id, CreateFile(path="a.txt", text="again", overwrite=True))


def test_a_failed_job_retried_with_a_corrected_payload_is_not_retried_again_as_it_was(make_coordinator) -> None:
    c = make_coordinator(registry_with(NoteType()))
    failed = c.enqueue(Note(name="n", fail_times=1, permanent=True)).job  # no target: nothing newer on one
    c.run_until_idle()
    corrected = c.retry(failed.id, Note(name="n2"))
    with pytest.raises(AlreadyRetried, match=corrected.id):
        c.retry(failed.id)  # the bad payload again, beside its correction
    assert c.get(failed.id).status is JobStatus.FAILED


def test_a_corrected_retry_is_validated_and_refused_once_superseded(coordinator: Coordinator) -> None:
    failed_id = _failed(coordinator, "b.txt")
    with pytest.raises(InvalidPayload, match="path"):
        coordinator.retry(failed_id, CreateFile.model_construct(path="../out.txt", text="x"))
    coordinator.enqueue(CreateFile(path="b.txt", text="newer", overwrite=True))
    with pytest.raises(Superseded):
        coordinator.retry(failed_id, CreateFile(path="b.txt", text="mine", overwrite=True))
    assert notes(coordinator.engine, [failed_id])[failed_id]["retried_as"] == []


def test_the_cli_tags_filters_shows_and_retries_with_a_corrected_payload(
    tmp_path, root, db_url, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ("--db", db_url, "--root", str(root))
    assert run_split(monkeypatch, capsys, *base, "init")[0] == 0  # the command line creates no ledger itself
    (root / "c.txt").write_text("theirs")
    code, out, _ = run_split(
        monkeypatch, capsys, *base, "enqueue", "create_file", "-q", "--payload", '{"path": "c.txt", "text": "secret"}',
        "--tag", "tenant:acme", "--tag", "batch:7", "--meta", '{"ticket": "OPS-1"}',
    )  # fmt: skip
    assert code == 0
    job_id = out.strip()
    assert run_split(monkeypatch, capsys, *base, "worker", "--until-idle")[0] == 0
    code, out, _ = run_split(monkeypatch, capsys, *base, "failed", "--tag", "tenant:acme", "--since", "1h", "--json")
    [shown] = orjson.loads(out)["jobs"]
    assert (shown["id"], shown["tags"], shown["meta"]) == (job_id, ["batch:7", "tenant:acme"], {"ticket": "OPS-1"})
    assert "secret" not in out
    assert orjson.loads(run_split(monkeypatch, capsys, *base, "jobs", "--tag", "tenant:other", "--json")[1]) == {
        "jobs": [],
        "paused": [],
    }
    fixed = tmp_path / "fixed.json"
    fixed.write_text('{"path": "c.txt", "text": "secret", "overwrite": true}')
    code, out, err = run_split(monkeypatch, capsys, *base, "retry", job_id, "--payload", f"@{fixed}", "--json")
    assert code == 0, err
    [new] = orjson.loads(out)["retried"]
    code, out, _ = run_split(monkeypatch, capsys, *base, "retry", job_id, "--payload", f"@{fixed}")
    assert code == 1  # once only
    code, out, _ = run_split(monkeypatch, capsys, *base, "show", job_id)
    assert code == 0 and re.search(rf"retried_as +{new['id']}", out) and "tenant:acme" in out and "OPS-1" in out
    code, out, _ = run_split(monkeypatch, capsys, *base, "show", new["id"])
    assert re.search(rf"retry_of +{job_id}", out)
    code, _, err = run_split(monkeypatch, capsys, *base, "enqueue", "create_file", "--payload", "{}", "--tag", "a b")
    assert code == 1 and err.count("\n") == 1 and "a tag is 1 to 64" in err


def test_a_purged_job_takes_its_tags_with_it(coordinator: Coordinator, clock) -> None:
    from datetime import timedelta

    old = coordinator.enqueue(CreateFile(path="p.txt", text="1", overwrite=True), tags=["gone"]).job
    coordinator.enqueue(CreateFile(path="p.txt", text="2", overwrite=True), tags=["kept"])
    coordinator.run_until_idle()
    clock.advance(3 * 86400)
    assert coordinator.purge(older_than=timedelta(days=1)).total == 1
    with pytest.raises(Exception, match="no job"):
        coordinator.get(old.id)
    with coordinator.engine.connect() as conn:
        assert [t for (t,) in conn.execute(sa.select(job_tags.c.tag).order_by(job_tags.c.tag))] == ["kept"]
