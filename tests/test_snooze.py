"""Snooze from any handler: the job goes back to pending at the time it names without spending an
attempt, every snooze is counted, and a job that snoozes more often than its worker allows fails,
saying so. On each backend."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import ClassVar

import orjson
import pytest

from clikit import run_split
from tether import Coordinator, Deferred, FakeClock, JobContext, JobStatus, JobType, Payload, Snooze
from tether.jobtypes import Registry, default_registry


class Nap(Payload):
    job_type: ClassVar[str] = "nap"
    name: str
    naps: int  # snoozes before it completes; -1: forever
    seconds: float = 30
    scope: str = "job"


class NapType(JobType[Nap]):
    """Snoozes until the job has snoozed ``naps`` times (read from its own row), then completes."""

    name = "nap"
    payload_model = Nap

    def run(self, payload: Nap, ctx: JobContext) -> dict[str, int]:
        if payload.naps < 0 or ctx.job.snoozes < payload.naps:
            raise Snooze(payload.seconds, scope=payload.scope, reason=f"{payload.name} is not ready")
        return {"attempt": ctx.job.attempts}


def napping(make_coordinator: Callable[..., Coordinator]) -> Coordinator:
    registry = default_registry()
    registry.register(NapType())
    return make_coordinator(registry)


def test_a_job_that_snoozes_three_times_then_completes_spends_one_attempt(
    make_coordinator: Callable[..., Coordinator], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tether.events")
    c = napping(make_coordinator)
    job = c.enqueue(Nap(name="a", naps=3)).job
    for n in range(1, 4):
        caplog.clear()
        assert c.run_until_idle() == 1
        [snoozed_event] = [e for e in map(orjson.loads, caplog.messages) if e["event"] == "snoozed"]
        assert snoozed_event["snoozes"] == n and snoozed_event["attempt"] == 0
        snoozed = c.get(job.id)
        assert (snoozed.status, snoozed.attempts, snoozed.snoozes) == (JobStatus.PENDING, 0, n)
        assert snoozed.run_at == clock.now() + timedelta(seconds=30)
        assert "a is not ready" in (snoozed.last_error or "")
        assert c.run_until_idle() == 0  # not before the time it named
        clock.advance(30)
    assert c.run_until_idle() == 1
    done = c.get(job.id)
    assert (done.status, done.attempts, done.snoozes, done.result_data) == (JobStatus.COMPLETED, 1, 3, {"attempt": 1})


def test_a_job_that_snoozes_forever_fails_at_the_cap_saying_so(
    make_coordinator: Callable[..., Coordinator], clock: FakeClock
) -> None:
    c = napping(make_coordinator)
    job = c.enqueue(Nap(name="b", naps=-1, seconds=1)).job
    for _ in range(3):
        c.run_until_idle(max_snoozes=3)
        clock.advance(1)
    assert c.get(job.id).status is JobStatus.PENDING
    assert c.run_until_idle(max_snoozes=3) == 1
    failed = c.get(job.id)
    assert (failed.status, failed.attempts, failed.snoozes) == (JobStatus.FAILED, 1, 3)
    assert failed.last_error is not None
    assert failed.last_error.startswith("SnoozedTooOften: the job snoozed 3 times, the most a job may (max_snoozes=3)")
    assert "b is not ready" in failed.last_error


def test_an_operator_retry_of_a_job_failed_at_the_cap_starts_its_snoozes_again(
    make_coordinator: Callable[..., Coordinator], clock: FakeClock
) -> None:
    c = napping(make_coordinator)
    job = c.enqueue(Nap(name="c", naps=-1, seconds=1)).job
    for _ in range(3):
        c.run_until_idle(max_snoozes=2)
        clock.advance(1)
    assert c.get(job.id).status is JobStatus.FAILED
    retried = c.retry(job.id)
    assert retried.snoozes == 0
    c.run_until_idle(max_snoozes=2)  # its first snooze since the retry is a snooze, not the cap
    assert c.get(job.id).status is JobStatus.PENDING and c.get(job.id).snoozes == 1


def test_a_snooze_of_its_type_holds_the_types_other_pending_jobs(
    make_coordinator: Callable[..., Coordinator], clock: FakeClock
) -> None:
    c = napping(make_coordinator)
    first = c.enqueue(Nap(name="first", naps=1, seconds=60, scope="type"), priority=1).job
    other = c.enqueue(Nap(name="other", naps=0)).job
    assert c.run_until_idle(batch=1, threads=1) >= 1
    held = clock.now() + timedelta(seconds=60)
    assert c.get(first.id).run_at == held
    assert c.get(other.id).status is JobStatus.PENDING and c.get(other.id).run_at == held
    clock.advance(60)
    assert c.run_until_idle() == 2
    assert c.get(other.id).attempts == 1 and c.get(first.id).snoozes == 1


def test_a_full_data_root_snooze_is_not_counted_against_the_cap(make_coordinator: Callable[..., Coordinator]) -> None:
    from tether import WorkerConfig
    from tether.errors import StorageFull
    from tether.worker.completer import Completer

    c = napping(make_coordinator)
    job = c.enqueue(Nap(name="c", naps=0)).job._replace(attempts=1, snoozes=5)
    completer = Completer(c.queue, WorkerConfig(max_snoozes=5), None, None)  # type: ignore[arg-type]
    full = completer.decide(job, StorageFull("no room"))
    assert (full.edge, full.values["snoozed"]) == ("snooze", 0)
    assert completer.decide(job, Snooze(1)).edge == "fail"
    held = completer.decide(job._replace(snoozes=4), Deferred("rate limited", c.clock.now()))
    assert (held.edge, held.values["snoozed"]) == ("defer", 1)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Snooze(),
        lambda: Snooze(1, until=FakeClock().now()),
        lambda: Snooze(-1),
        lambda: Snooze(1, scope="planet"),
    ],
)
def test_snooze_refuses_what_it_cannot_mean(make: Callable[[], Snooze]) -> None:
    with pytest.raises(ValueError, match="Snooze: "):
        make()


def register(registry: Registry) -> None:
    """``tether --import test_snooze``: the napping type, for the command line below."""
    registry.register(NapType())


def test_the_worker_command_caps_snoozes_with_max_snoozes(
    db_url: str, root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ("--db", db_url, "--root", str(root), "--import", "test_snooze")
    assert run_split(monkeypatch, capsys, *base, "init")[0] == 0  # the command line creates no ledger itself
    code, job_id, _ = run_split(
        monkeypatch, capsys, *base, "enqueue", "nap", "-q", "--payload", '{"name": "d", "naps": -1, "seconds": 0}'
    )
    assert code == 0
    code, _, err = run_split(monkeypatch, capsys, *base, "worker", "--until-idle", "--max-snoozes", "2")
    assert code == 0 and "1 failed, 2 snoozed" in err
    shown = orjson.loads(run_split(monkeypatch, capsys, *base, "show", job_id.strip(), "--json")[1])
    assert (shown["status"], shown["attempts"], shown["snoozes"]) == ("failed", 1, 2)
    assert "max_snoozes=2" in shown["last_error"]
