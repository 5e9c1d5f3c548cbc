"""Acting on drift, in process on SQLite and PostgreSQL: the repair plan and its apply (never a
stale one), accepting what is there, ignore rules, and the findings kept of the newest runs."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from tether import Coordinator, CreateFile, DeleteFile, FakeClock
from tether.errors import ConfigError, InvalidPayload
from tether.jobtypes import RemoveTemp
from tether.jobtypes.base import Difference
from tether.ledger.schema import drift_findings, jobs, repairs
from tether.reconcile import findings, ignore
from tether.reconcile.accept import CannotAccept
from tether.reconcile.check import reconcile
from tether.reconcile.drift import Finding
from tether.reconcile.plan import Plan
from tether.reconcile.repair import StalePlan

TEMP = "people/.c.json.0123abcd.tether-tmp"


def made(coordinator: Coordinator, clock: FakeClock) -> None:
    """a, b, c written; d written then deleted; everything in sync."""
    for name in "abcd":
        coordinator.enqueue(CreateFile(path=f"people/{name}.json", content={"name": name}))
    coordinator.run_until_idle()
    coordinator.enqueue(DeleteFile(path="people/d.json"))
    coordinator.run_until_idle()
    clock.advance(1)
    assert reconcile(coordinator).exit_code == 0


def drifted(root: Path) -> None:
    (root / "people/a.json").unlink()  # missing
    (root / "people/b.json").write_text('{"by": "hand"}')  # modified
    (root / "people/d.json").write_text("{}")  # unexpected
    (root / TEMP).write_text("half")  # leftover temp
    (root / "people/stray.json").write_text("{}")  # untracked


def job_count(coordinator: Coordinator) -> int:
    with coordinator.engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one()


def test_plan_proposes_the_job_that_restores_each_finding(
    coordinator: Coordinator, root: Path, clock: FakeClock
) -> None:
    made(coordinator, clock)
    drifted(root)
    plan = coordinator.plan_repairs(untracked=True)
    steps = {s.path: s for s in plan.steps}
    assert {p: (s.finding, s.job_type) for p, s in steps.items()} == {
        "people/a.json": ("missing", "create_file"),
        "people/b.json": ("modified", "create_file"),
        "people/d.json": ("unexpected", "delete_file"),
        TEMP: ("leftover_temp", "remove_temp"),
        "people/stray.json": ("untracked", None),
    }
    assert "no job ever named it" in (steps["people/stray.json"].reason or "")
    assert steps["people/b.json"].payload == {"path": "people/b.json", "content": {"name": "b"}, "overwrite": True}
    # each repeats its target's latest completed job, whose id the plan records with the ledger's position
    assert steps["people/d.json"].repair_of == steps["people/d.json"].latest_job_id
    assert plan.newest_job_id == steps["people/d.json"].latest_job_id
    assert Plan.from_json(plan.to_json()) == plan


def test_applied_plan_enqueues_its_jobs_linked_and_the_next_check_is_in_sync(
    coordinator: Coordinator, root: Path, clock: FakeClock
) -> None:
    made(coordinator, clock)
    drifted(root)
    plan = coordinator.plan_repairs()
    results = coordinator.apply_repairs(plan)
    assert sorted(r.job.type for r in results) == ["create_file", "create_file", "delete_file", "remove_temp"]
    with coordinator.engine.connect() as conn:
        links = {row.job_id: row.repair_of for row in conn.execute(sa.select(repairs))}
    assert links == {r.job.id: s.repair_of for r, s in zip(results, plan.jobs, strict=True)}
    coordinator.run_until_idle()
    clock.advance(1)
    assert reconcile(coordinator).exit_code == 0
    assert not (root / TEMP).exists()


def test_a_stale_plan_is_refused_naming_the_target_and_enqueues_nothing(
    coordinator: Coordinator, root: Path, clock: FakeClock
) -> None:
    made(coordinator, clock)
    drifted(root)
    plan = coordinator.plan_repairs()
    coordinator.enqueue(CreateFile(path="people/b.json", content={"name": "B"}, overwrite=True))
    before = job_count(coordinator)
    with pytest.raises(StalePlan) as refused:
        coordinator.apply_repairs(plan)
    assert refused.value.targets == ["people/b.json"]
    assert job_count(coordinator) == before


def test_only_applies_the_named_targets_of_a_plan(coordinator: Coordinator, root: Path, clock: FakeClock) -> None:
    made(coordinator, clock)
    drifted(root)
    plan = coordinator.plan_repairs()
    results = coordinator.apply_repairs(plan, only=["people/a.json"])
    assert [r.job.ordering_key for r in results] == ["file:people/a.json"]
    with pytest.raises(ConfigError, match="people/zz.json"):
        coordinator.apply_repairs(plan, only=["people/zz.json"])


def test_accepted_hand_edit_is_the_expected_state_until_it_changes(
    coordinator: Coordinator, root: Path, clock: FakeClock
) -> None:
    made(coordinator, clock)
    (root / "people/b.json").write_text('{"by": "hand"}')
    (root / "people/a.json").unlink()
    done = coordinator.accept(["people/b.json", "people/a.json"], reason="fixed by hand", by="ops")
    assert [j.status.value for j in done] == ["completed", "completed"]
    assert done[0].payload_data["reason"] == "fixed by hand" and done[0].payload_data["by"] == "ops"
    clock.advance(1)
    assert reconcile(coordinator).exit_code == 0
    (root / "people/b.json").write_text('{"by": "someone else"}')
    clock.advance(1)
    report = reconcile(coordinator)
    assert [(f.path, f.status) for f in report.findings] == [("people/b.json", "modified")]
    plan = coordinator.plan_repairs(report)
    assert plan.steps[0].job_type is None and "accepted" in (plan.steps[0].reason or "")


def test_accept_is_refused_while_a_job_on_the_target_is_in_flight(
    coordinator: Coordinator, root: Path, clock: FakeClock
) -> None:
    made(coordinator, clock)
    coordinator.enqueue(CreateFile(path="people/a.json", content=2, overwrite=True))
    before = job_count(coordinator)
    with pytest.raises(CannotAccept, match="people/a.json"):
        coordinator.accept(["people/a.json"])
    assert job_count(coordinator) == before


def test_ignored_findings_are_listed_with_their_rule_and_not_drift(
    coordinator: Coordinator, root: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator.enqueue(CreateFile(path="tmp/x.json", content=1))
    made(coordinator, clock)
    (root / "tmp/x.json").write_text("2")
    (root / "people/a.json").write_text("{}")
    ignore.path_of(root).write_text("# scratch files\ntmp/*.json\npeople/a.json\n")
    caplog.set_level(logging.INFO, logger="tether.events")
    report = reconcile(coordinator)
    alerts = [
        r.getMessage() for r in caplog.records if r.name == "tether.events" and "drift_detected" in r.getMessage()
    ]
    assert alerts == []  # an ignored finding raises no drift event
    assert report.exit_code == 0 and report.findings == []
    assert sorted((f.path, rule) for f, rule in report.ignored) == [
        ("people/a.json", "people/a.json"),
        ("tmp/x.json", "tmp/*.json"),
    ]
    assert {f["rule"] for f in report.to_dict()["ignored_findings"]} == {"tmp/*.json", "people/a.json"}


def test_aws_rule_ignores_a_finding_only_when_it_covers_every_difference() -> None:
    rules = ignore.parse("aws:s3_bucket:*:tags.LastModifiedBy\n")
    tag = Difference("tags.LastModifiedBy", None, "ops", "ADD")
    other = Difference("versioning", True, False)
    only_tag = Finding("s3_bucket:us-east-1:b", "modified", job_type="sync_aws", differences=(tag,))
    both = Finding("s3_bucket:us-east-1:c", "modified", job_type="sync_aws", differences=(tag, other))
    queue = Finding("sqs_queue:us-east-1:q", "modified", job_type="sync_aws", differences=(tag,))
    reported, ignored = ignore.split([only_tag, both, queue], rules)
    assert ignored == [(only_tag, "aws:s3_bucket:*:tags.LastModifiedBy")]
    assert [f.path for f in reported] == ["s3_bucket:us-east-1:c", "sqs_queue:us-east-1:q"]
    assert reported[0].differences == (other,)  # the ignored field left out of what stays reported


def test_findings_are_kept_for_the_newest_runs_only(
    coordinator: Coordinator, root: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_DRIFT_RUNS", "2")
    made(coordinator, clock)
    (root / "people/a.json").unlink()
    for _ in range(4):
        clock.advance(1)
        reconcile(coordinator)
    with coordinator.engine.connect() as conn:
        kept = conn.execute(sa.select(sa.func.count(sa.distinct(drift_findings.c.run_id)))).scalar_one()
    assert kept == 2
    last = findings.last_run(coordinator.engine)
    assert last is not None and [f["path"] for f in last.findings] == ["people/a.json"]
    seen = findings.for_target(coordinator.engine, "people/a.json")
    assert seen.drifted_runs == 2 and seen.first_drift is not None and seen.first_drift < seen.last_drift  # type: ignore[operator]
    assert findings.for_target(coordinator.engine, "people/b.json").first_drift is None


def test_remove_temp_refuses_a_path_that_is_not_a_temp_file(coordinator: Coordinator) -> None:
    with pytest.raises(InvalidPayload, match="not a tether temp file"):
        coordinator.enqueue(RemoveTemp(path="people/a.json"))
    with pytest.raises(InvalidPayload):
        coordinator.enqueue(RemoveTemp(path="../.a.json.0123abcd.tether-tmp"))


def test_a_plan_from_an_older_check_proposes_nothing_for_a_target_a_job_touched_since(
    coordinator: Coordinator, root: Path, clock: FakeClock
) -> None:
    made(coordinator, clock)
    (root / "people/a.json").unlink()
    report = reconcile(coordinator)
    coordinator.enqueue(CreateFile(path="people/a.json", content={"name": "a"}, overwrite=True))
    coordinator.run_until_idle()
    [step] = coordinator.plan_repairs(report).steps
    assert step.job_type is None and "came after the check" in (step.reason or "")


def test_history_interleaves_the_drift_found_the_repair_applied_and_an_accept_with_its_reason(
    coordinator: Coordinator, root: Path, clock: FakeClock
) -> None:
    made(coordinator, clock)
    (root / "people/a.json").unlink()
    clock.advance(1)
    report = reconcile(coordinator)
    clock.advance(1)
    coordinator.apply_repairs(coordinator.plan_repairs(report))
    coordinator.run_until_idle()
    clock.advance(1)
    (root / "people/b.json").write_text('{"by": "hand"}')
    coordinator.accept(["people/b.json"], reason="fixed by hand", by="ops")

    repaired = coordinator.history("people/a.json")
    assert [e.event for e in repaired.entries] == [
        "enqueued",
        "completed",
        "drift missing",
        "enqueued",
        "repair missing",
        "completed",
    ]
    first, repair = repaired.jobs
    assert repaired.entries[2].job_id == first.id  # the finding names the job whose effect drifted
    assert repaired.entries[4].job_id == repair.id and repaired.entries[4].detail == f"runs {first.id} again"
    accepted = coordinator.history("people/b.json").entries
    assert [(e.event, e.detail) for e in accepted][-1] == ("accepted", "by ops: fixed by hand")


def test_a_target_whose_newest_job_was_cancelled_or_failed_is_still_repaired(
    coordinator: Coordinator, root: Path, clock: FakeClock
) -> None:
    made(coordinator, clock)
    (root / "people/a.json").unlink()
    (root / "people/b.json").write_text('{"by": "hand"}')
    cancelled = coordinator.enqueue(CreateFile(path="people/a.json", content={"name": "A"})).job
    coordinator.cancel(cancelled.id)
    failing = coordinator.enqueue(CreateFile(path="people/b.json", content={"name": "B"}, overwrite=False)).job
    coordinator.run_until_idle()  # the file is there: it fails without acting
    assert coordinator.get(failing.id).status.value == "failed"
    clock.advance(1)
    plan = coordinator.plan_repairs()
    assert {s.path: (s.job_type, s.reason) for s in plan.steps} == {
        "people/a.json": ("create_file", None),
        "people/b.json": ("create_file", None),
    }
    coordinator.apply_repairs(plan)
    coordinator.run_until_idle()
    clock.advance(1)
    assert reconcile(coordinator).exit_code == 0


def test_on_postgresql_an_apply_waits_for_an_enqueue_in_flight_on_its_target_and_then_refuses(
    pg_database: str, root: Path, clock: FakeClock
) -> None:
    """READ COMMITTED would let the apply's check miss a job whose transaction commits between the
    check and the repair's insert: the apply locks the table against writers first."""
    import threading
    import time

    from conftest import drop_ledger

    engine = sa.create_engine(pg_database)
    with engine.begin() as conn:
        drop_ledger(conn)
    coordinator = Coordinator.open(pg_database, root=root, clock=clock)
    try:
        made(coordinator, clock)
        drifted(root)
        plan = coordinator.plan_repairs()
        writer = engine.connect()
        writer.begin()
        newer = coordinator.queue.enqueuer.build([CreateFile(path="people/a.json", content={"name": "A"})])
        with coordinator.queue.backend.write(writer) as cur:  # an enqueue not yet committed
            coordinator.queue.enqueuer.insert_all(cur, newer)
        outcome: list[BaseException | None] = []

        def apply() -> None:
            try:
                coordinator.apply_repairs(plan, only=["people/a.json"])
                outcome.append(None)
            except BaseException as e:
                outcome.append(e)

        applying = threading.Thread(target=apply)
        applying.start()
        deadline = time.monotonic() + 10
        while not outcome and time.monotonic() < deadline:  # until the apply waits on a lock, or ends
            with engine.connect() as watch:
                waiting = watch.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ).scalar_one()
            if waiting:
                break
            applying.join(0.01)
        writer.commit()
        writer.close()
        applying.join(10)
        assert isinstance(outcome[0], StalePlan) and outcome[0].targets == ["people/a.json"]
    finally:
        coordinator.close()
        engine.dispose()


def test_purge_deletes_a_purged_repair_jobs_link_with_it(
    coordinator: Coordinator, root: Path, clock: FakeClock
) -> None:
    made(coordinator, clock)
    (root / "people/a.json").unlink()
    clock.advance(1)
    [repair] = coordinator.apply_repairs(coordinator.plan_repairs())
    coordinator.run_until_idle()
    coordinator.enqueue(CreateFile(path="people/a.json", content={"name": "newer"}, overwrite=True))
    coordinator.run_until_idle()  # the repair job is no longer its target's latest completed job
    clock.advance(3 * 86400)
    purged = coordinator.purge(older_than=timedelta(days=1))
    assert purged.total > 0
    with coordinator.engine.connect() as conn:
        assert conn.execute(sa.select(jobs.c.id).where(jobs.c.id == repair.job.id)).first() is None
        assert conn.execute(sa.select(repairs)).all() == []
