"""The operator's questions answered from a ledger built by real jobs (SQLite and PostgreSQL).

``build_ledger`` is shared with tests/test_cli.py: it runs real jobs through a coordinator and
a fake clock, leaving completed, failed (permanent and exhausted), retried, duplicate-key,
stuck and pending jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa

from jobkit import completed
from tether import Coordinator, FakeClock, JobContext, JobStatus, PermanentError
from tether.config import DEFAULT_LOCK_TIMEOUT
from tether.errors import ConfigError, JobNotFound
from tether.jobtypes import CreateFile, JobType, Payload, default_registry
from tether.ledger import schema
from tether.observe import duplicates, durations, finished, health, jobs, metrics, readonly, retention, stuck, verdict

LOCK_TIMEOUT = 300.0


class Work(Payload):
    job_type: ClassVar[str] = "work"
    name: str
    target: str | None = None
    seconds: float = 0.0
    fail_times: int = 0
    permanent: bool = False


class WorkType(JobType[Work]):
    """Takes ``seconds`` of (fake) time; fails its first ``fail_times`` runs."""

    name = "work"
    payload_model = Work

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}

    def ordering_key(self, payload: Work) -> str | None:
        return payload.target

    def run(self, payload: Work, ctx: JobContext) -> dict[str, Any]:
        self.runs[payload.name] = n = self.runs.get(payload.name, 0) + 1
        if payload.seconds:
            ctx.clock.advance(payload.seconds)  # type: ignore[attr-defined]  # these tests run on a FakeClock
        if n <= payload.fail_times:
            if payload.permanent:
                raise PermanentError(f"{payload.name} can never work\nsecond line of detail")
            raise RuntimeError(f"{payload.name} broke on run {n}")
        return {"name": payload.name, "run": n}


def run(c: Coordinator) -> int:
    # One job per claim: with batched claims, completed_at is the batch's group commit, so
    # claimed_at -> completed_at would include the wait behind the batch's earlier jobs.
    return c.run_until_idle(batch=1)


@dataclass
class Ledger:
    coordinator: Coordinator
    clock: FakeClock
    ids: dict[str, str] = field(default_factory=dict)


def build_ledger(make: Callable[..., Coordinator], clock: FakeClock) -> Ledger:
    """Completed 11 (work 1..5 s, 3 files, 2 with key 'nightly', 1 retried), failed 2 (one
    permanent, one out of attempts), stuck 1 (claimed by w-dead, lock 400 s old), pending 3."""
    registry = default_registry()
    registry.register(WorkType())
    c = make(registry=registry, lock_timeout=LOCK_TIMEOUT)
    led = Ledger(c, clock)
    ids = led.ids
    # Out of attempts: fails, waits out its backoff, fails again.
    ids["flaky"] = c.enqueue(Work(name="flaky", fail_times=5), max_attempts=2).id
    run(c)
    clock.advance(3600)
    run(c)
    for i in range(1, 6):
        ids[f"w{i}"] = c.enqueue(Work(name=f"w{i}", seconds=float(i))).id
    for name in ("a", "b", "c"):
        ids[f"file_{name}"] = c.enqueue(CreateFile(path=f"notes/{name}.json", content={"n": name})).id
    run(c)
    ids["nightly1"] = c.enqueue(Work(name="nightly-1", seconds=2), key="nightly").id
    run(c)
    ids["nightly2"] = c.enqueue(Work(name="nightly-2", seconds=2), key="nightly").id
    run(c)
    ids["bad"] = c.enqueue(Work(name="bad", fail_times=1, permanent=True)).id
    ids["comeback"] = c.enqueue(Work(name="comeback", fail_times=1, permanent=True)).id
    run(c)
    c.retry(ids["comeback"])
    run(c)
    ids["hang"] = c.enqueue(Work(name="hang")).id
    [claimed] = c.queue.claim("w-dead")
    assert claimed.id == ids["hang"]
    clock.advance(LOCK_TIMEOUT + 100)
    for i in range(3):
        ids[f"later{i}"] = c.enqueue(Work(name=f"later{i}"), delay=60).id
    return led


@pytest.fixture
def ledger(make_coordinator: Callable[..., Coordinator], clock: FakeClock) -> Ledger:
    return build_ledger(make_coordinator, clock)


def test_stats_counts_outstanding_by_type_failed_stuck_and_oldest_pending(ledger: Ledger) -> None:
    s = health.stats(ledger.coordinator)
    assert [(b.type, b.pending, b.claimed) for b in s.by_type] == [("work", 3, 1)]
    assert (s.pending, s.claimed, s.outstanding, s.failed, s.stuck) == (3, 1, 4, 2, 1)
    assert s.oldest_pending_age == 0.0  # the later jobs were enqueued at the final instant
    ledger.clock.advance(90)
    assert health.stats(ledger.coordinator).oldest_pending_age == 90.0


def test_stats_report_the_largest_pending_payload_of_each_type(make_coordinator: Callable[..., Coordinator]) -> None:
    registry = default_registry()
    registry.register(WorkType())
    c = make_coordinator(registry)
    running = c.enqueue(CreateFile(path="running.txt", text="r" * 9000)).job
    assert [j.id for j in c.queue.claim("w")] == [running.id]  # claimed: no longer waiting
    files = [c.enqueue(CreateFile(path=f"{n}.txt", text="é" * n)).job for n in (10, 3000, 200)]
    work = c.enqueue(Work(name="w" * 500)).job

    s = health.stats(c)

    largest = {b.type: b.largest_payload for b in s.by_type}
    assert largest == {"create_file": files[1].payload_bytes, "work": work.payload_bytes}
    assert s.largest_pending_payload == files[1].payload_bytes == len(files[1].payload.encode())
    assert s.to_dict()["largest_pending_payload"] == files[1].payload_bytes
    c.run_until_idle()
    assert health.stats(c).largest_pending_payload is None


def test_a_job_is_stuck_only_once_its_lock_is_older_than_the_timeout(ledger: Ledger) -> None:
    assert health.stats(ledger.coordinator, lock_timeout=401).stuck == 0
    found = stuck.stuck(ledger.coordinator)
    assert [j.id for j in found.jobs] == [ledger.ids["hang"]]
    assert found.jobs[0].locked_by == "w-dead"
    assert found.held_for(found.jobs[0]) == 400.0


def test_failed_lists_permanent_and_exhausted_failures_with_their_errors(ledger: Ledger) -> None:
    jobs = finished.failed(ledger.coordinator)
    assert [j.id for j in jobs] == [ledger.ids["bad"], ledger.ids["flaky"]]  # latest failure first
    bad, flaky = jobs
    assert bad.last_error == "PermanentError: bad can never work\nsecond line of detail"
    assert (flaky.attempts, flaky.max_attempts) == (2, 2)
    assert flaky.last_error is not None and "flaky broke on run 2" in flaky.last_error
    assert finished.failed(ledger.coordinator, job_type="create_file") == []
    assert finished.failed(ledger.coordinator, since=ledger.clock.now() - timedelta(seconds=1)) == []


def test_durations_are_percentiles_of_claim_to_completion_per_type(ledger: Ledger) -> None:
    by_type = {d.type: d for d in durations.durations(ledger.coordinator, since=timedelta(hours=1))}
    assert set(by_type) == {"create_file", "work"}
    work = by_type["work"]
    # w1..w5 took 1..5 s, nightly 2+2 s, comeback 0 s (its second, successful attempt).
    assert work.count == 8
    assert (work.p50, work.p95, work.p99, work.max) == (2.0, 5.0, 5.0, 5.0)
    assert by_type["create_file"].count == 3 and by_type["create_file"].max == 0.0
    assert durations.durations(ledger.coordinator, since=timedelta(seconds=10)) == []


def test_duration_sample_measures_one_in_k_of_a_busy_window_and_says_so(coordinator: Coordinator) -> None:
    """100 jobs completed in the window, limit 10: one in 10 is measured, those whose completion
    time's microsecond is a multiple of 10, on either database (each took 7 s, the others 1 s)."""
    now = coordinator.clock.now()
    rows = []
    for i in range(100):
        done = now - timedelta(minutes=30, microseconds=-i)  # microsecond i of its second
        took = 7.0 if i % 10 == 0 else 1.0
        rows.append(
            {
                "id": f"{i:026d}",
                "type": "work",
                "payload": "{}",
                "status": "completed",
                "attempts": 1,
                "created_at": done - timedelta(seconds=10),
                "run_at": done - timedelta(seconds=10),
                "claimed_at": done - timedelta(seconds=took),
                "completed_at": done,
            }
        )
    with coordinator.engine.begin() as conn:
        conn.execute(sa.insert(schema.jobs), rows)
    whole = durations.duration_sample(coordinator, since=timedelta(hours=1), limit=100)
    assert (whole.total, whole.every, whole.measured) == (100, 1, 100)
    assert [(d.type, d.count, d.p50, d.max) for d in whole.types] == [("work", 100, 1.0, 7.0)]
    sampled = durations.duration_sample(coordinator, since=timedelta(hours=1), limit=10)
    assert (sampled.total, sampled.every, sampled.measured) == (100, 10, 10)
    [work] = sampled.types
    assert (work.count, work.p50, work.p99, work.spend) == (10, 7.0, 7.0, None)
    with pytest.raises(ConfigError, match="at least one job"):
        durations.duration_sample(coordinator, limit=0)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [verdict.percentile(values, q) for q in (50, 95, 99, 100)] == [50.0, 95.0, 99.0, 100.0]
    assert verdict.percentile([7.0], 99) == 7.0


def test_duplicates_groups_jobs_sharing_type_and_key(ledger: Ledger) -> None:
    [group] = duplicates.duplicates(ledger.coordinator)
    assert (group.type, group.idempotency_key) == ("work", "nightly")
    assert [j.id for j in group.jobs] == [ledger.ids["nightly1"], ledger.ids["nightly2"]]
    assert group.to_dict()["count"] == 2
    assert duplicates.duplicates(ledger.coordinator, job_type="create_file") == []


def test_recent_counts_and_lists_what_finished_in_the_window(ledger: Ledger) -> None:
    r = finished.recent(ledger.coordinator, since=timedelta(hours=1))
    assert (r.completed, r.failed) == (11, 2)
    assert len(r.jobs) == 13 and r.jobs[0].id == ledger.ids["comeback"]
    assert finished.recent(ledger.coordinator, since=timedelta(minutes=1)).jobs == []
    assert len(finished.recent(ledger.coordinator, since=timedelta(hours=1), limit=2).jobs) == 2


def test_recent_counts_and_lists_cancelled_jobs_apart(ledger: Ledger) -> None:
    [cancelled] = ledger.coordinator.cancel(ledger.ids["later0"], reason="not wanted")
    r = finished.recent(ledger.coordinator, since=timedelta(hours=1))
    assert (r.completed, r.failed, r.cancelled) == (11, 2, 1)
    assert r.jobs[0].id == ledger.ids["later0"] and r.jobs[0].status is JobStatus.CANCELLED


def test_jobs_filters_by_status_type_and_enqueue_time(ledger: Ledger) -> None:
    c = ledger.coordinator
    assert [j.id for j in jobs.jobs(c, status="pending")] == [ledger.ids[f"later{i}"] for i in (2, 1, 0)]
    assert {j.id for j in jobs.jobs(c, status=JobStatus.CLAIMED)} == {ledger.ids["hang"]}
    assert len(jobs.jobs(c, job_type="create_file")) == 3
    assert len(jobs.jobs(c, limit=None)) == 17
    recent = jobs.jobs(c, since=ledger.clock.now() - timedelta(seconds=1))
    assert {j.id for j in recent} == {ledger.ids[f"later{i}"] for i in range(3)}


def test_show_reads_one_job_and_names_a_missing_id(ledger: Ledger) -> None:
    job = jobs.show(ledger.coordinator, ledger.ids["file_a"])
    assert job.status is JobStatus.COMPLETED and job.result_data["written"] is True
    with pytest.raises(JobNotFound, match="no job with id 'nope'"):
        jobs.show(ledger.coordinator, "nope")


def test_health_verdict_follows_stuck_failed_and_backlog_thresholds(ledger: Ledger) -> None:
    h = health.health(ledger.coordinator)
    assert h.verdict is verdict.Verdict.ERROR and h.verdict.exit_code == 2
    assert [c.verdict.label for c in h.checks[:3]] == ["ok", "error", "warning"]
    assert [c.name for c in h.checks[:3]] == ["backlog", "stuck", "failed"]
    ok_backlog = verdict.Thresholds(backlog_limit=100)
    s = health.stats(ledger.coordinator, lock_timeout=10_000)  # nothing stuck
    assert verdict.assess(s, ok_backlog).verdict is verdict.Verdict.WARNING  # 2 failed
    assert verdict.assess(s, verdict.Thresholds(backlog_limit=5)).verdict is verdict.Verdict.WARNING  # 4 >= 80% of 5
    assert verdict.assess(s, verdict.Thresholds(backlog_limit=4)).verdict is verdict.Verdict.ERROR  # 4 >= 4


def test_empty_ledger_is_ok_and_thresholds_are_validated(coordinator: Coordinator) -> None:
    h = health.health(coordinator)
    assert h.verdict is verdict.Verdict.OK and h.reasons == []
    assert h.to_dict()["thresholds"] == {
        "backlog_limit": 100,
        "backlog_warn": 80,
        "stuck_error": 1,
        "failed_warn": 1,
        "window": 3600.0,
        "pending_age_warn": 3600.0,
        "pending_age_error": None,
        "success_rate_warn": None,
        "success_rate_error": 0.95,
        "p95_warn": 10.0,
        "p95_error": None,
        "unclaimed_grace": 300.0,
    }
    with pytest.raises(ConfigError, match="backlog limit must be at least 1"):
        verdict.Thresholds(backlog_limit=0)


def test_metrics_expose_jobs_by_status_and_type_and_histograms_of_the_window(ledger: Ledger) -> None:
    text = metrics.exposition(ledger.coordinator).decode()
    lines = set(text.splitlines())
    assert 'tether_jobs{status="failed",type="create_file"} 0.0' in lines
    assert 'tether_jobs{status="claimed",type="work"} 1.0' in lines
    assert not any(line.startswith('tether_jobs{status="completed"') for line in lines)  # a full count: not read
    assert "tether_jobs_stuck 1.0" in lines and "tether_jobs_failed 2.0" in lines
    assert "tether_health 2.0" in lines
    assert 'tether_jobs_finished_total{status="completed",type="work"} 8.0' in lines
    assert 'tether_jobs_finished_total{status="failed",type="work"} 2.0' in lines
    # work ran 0 (comeback), 1, 2, 2, 2, 3, 4, 5 s: a value on a bound is inside it
    assert 'tether_job_duration_seconds_bucket{le="1.0",type="work"} 2.0' in lines
    assert 'tether_job_duration_seconds_bucket{le="2.5",type="work"} 5.0' in lines
    assert 'tether_job_duration_seconds_sum{type="work"} 19.0' in lines
    assert 'tether_job_attempts_bucket{le="1.0",type="work"} 8.0' in lines  # a retry by hand starts again at 0
    assert "# TYPE tether_job_duration_seconds histogram" in lines
    assert "# TYPE tether_job_queue_wait_seconds histogram" in lines
    assert "tether_ledger_up 1.0" in lines
    assert not any(line.startswith("process_") for line in lines)  # a one-off process's own numbers mean nothing
    # The window is the last hour: move past it and the finished jobs are gone, the backlog stays.
    ledger.clock.advance(3600)
    later = set(metrics.exposition(ledger.coordinator).decode().splitlines())
    assert not any(line.startswith("tether_jobs_finished_total") for line in later)
    assert 'tether_jobs{status="failed",type="work"} 2.0' in later


def test_purge_deletes_old_finished_jobs_but_keeps_the_latest_per_target(
    make_coordinator: Callable[..., Coordinator], clock: FakeClock
) -> None:
    registry = default_registry()
    registry.register(WorkType())
    c = make_coordinator(registry=registry)
    old = [c.enqueue(CreateFile(path="a.json", content={"v": v}, overwrite=True)).id for v in range(3)]
    untargeted = c.enqueue(Work(name="x")).id
    failed = c.enqueue(Work(name="y", fail_times=1, permanent=True)).id
    run(c)
    clock.advance(days=8)
    fresh = c.enqueue(Work(name="z")).id
    run(c)
    plan = retention.purge(c, older_than=timedelta(days=7), dry_run=True)
    assert plan.by_status_type == {("completed", "create_file"): 2, ("completed", "work"): 1}
    assert {j.id for j in jobs.jobs(c, limit=None)} >= set(old)  # a dry run deletes nothing
    done = retention.purge(c, older_than=timedelta(days=7), batch_size=1)
    assert done.total == 3
    left = {j.id for j in jobs.jobs(c, limit=None)}
    assert left == {old[-1], failed, fresh}  # latest write of a.json kept; failed needs --failed
    assert untargeted not in left
    assert retention.purge(c, older_than=timedelta(days=7), statuses=["failed"]).total == 1
    with pytest.raises(ConfigError, match="finished jobs only"):
        retention.purge(c, older_than=timedelta(days=7), statuses=["pending"])


def test_reads_never_create_a_ledger(tmp_path) -> None:
    missing = tmp_path / "nowhere" / "tether.db"
    with pytest.raises(readonly.NoLedger, match=f"no ledger at {missing}"):
        readonly.open_ledger(f"sqlite:///{missing}")
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    sa.create_engine(f"sqlite:///{empty}").connect().close()
    with pytest.raises(readonly.NoLedger, match="has no tether_jobs table"):
        readonly.open_ledger(f"sqlite:///{empty}")


def test_a_read_judges_by_a_coordinators_clock_and_lock_timeout_and_a_bare_engine_by_the_defaults(
    make_coordinator: Callable[..., Coordinator], clock: FakeClock
) -> None:
    c = make_coordinator(lock_timeout=7.0)
    clock.advance(86_400)  # a day from the system's time: only the coordinator's clock says so
    view, bare = readonly.view_of(c), readonly.view_of(c.engine)
    assert (view.engine, view.clock, view.lock_timeout) == (c.engine, clock, 7.0)
    assert (bare.engine, bare.clock, bare.lock_timeout) == (c.engine, None, DEFAULT_LOCK_TIMEOUT)
    s = health.stats(c)
    assert (s.now, s.lock_timeout) == (clock.now(), 7.0)
    assert health.stats(c.engine).lock_timeout == DEFAULT_LOCK_TIMEOUT


def test_the_coordinator_answers_the_operators_questions_from_python(coordinator, clock):
    from datetime import timedelta

    from tether import CreateFile
    from tether.observe.verdict import Verdict

    coordinator.enqueue(CreateFile(path="a.json", content=1))
    coordinator.enqueue(CreateFile(path="a.json", content=2, overwrite=True))
    coordinator.run_until_idle()
    coordinator.enqueue(CreateFile(path="b.json", content=1))
    assert coordinator.stats().pending == 1
    assert coordinator.health().verdict is Verdict.OK
    clock.advance(days=8)
    # The older write of a.json can go; its newer one is what reconcile proves the file against.
    assert coordinator.purge(older_than=timedelta(days=7), dry_run=True).total == 1


def test_the_alerting_rules_judge_pending_age_success_rate_and_p95_per_type(make_coordinator, clock) -> None:
    """The alerting rules of docs/design.md: oldest pending over 1 h warns, a success rate under 95%
    over the window is an error, a type's p95 run time over 10 s warns; each level can be set."""
    from datetime import timedelta

    c = make_coordinator()
    c.register(WorkType())
    th = verdict.Thresholds()

    def verdicts() -> dict[str, str]:
        h = health.health(c, th)
        return {check.name: check.verdict.label for check in h.checks[3:]}

    assert verdicts() == {"oldest_pending_age": "ok", "success_rate": "ok"}  # nothing finished yet
    for i in range(19):
        c.enqueue(Work(name=f"ok{i}"))
    c.enqueue(Work(name="bad", fail_times=1, permanent=True))
    clock.advance(30)  # each job waits 30 s in the queue, then runs "instantly" on the fake clock
    c.run_until_idle()
    assert verdicts()["success_rate"] == "ok"  # 19 of 20: exactly 95%
    c.enqueue(Work(name="bad2", fail_times=1, permanent=True))
    c.run_until_idle()
    assert verdicts()["success_rate"] == "error"  # 19 of 21
    c.enqueue(Work(name="waits"))
    clock.advance(hours=2)
    v = verdicts()
    assert v["oldest_pending_age"] == "warning" and v["success_rate"] == "ok"  # the failures left the window
    th = verdict.Thresholds(pending_age_error=timedelta(hours=1).total_seconds())
    assert verdicts()["oldest_pending_age"] == "error"
    th = verdict.Thresholds(pending_age_warn=None)
    assert verdicts()["oldest_pending_age"] == "ok"
    c.run_until_idle()  # "waits" runs at once: the window now holds one completed job, of 0 s
    job = c.enqueue(Work(name="slow")).id
    [claimed] = c.queue.claim("w")
    clock.advance(11)  # a run of 11 s: claimed_at to completed_at

    c.queue.finish_and_claim("w", [completed(claimed, None)])
    assert c.get(job).status.value == "completed"
    checks = {ch.name: ch for ch in health.health(c, verdict.Thresholds()).checks}
    assert checks["p95_duration:work"].verdict.label == "warning" and checks["p95_duration:work"].value == 11.0
    assert health.health(c, verdict.Thresholds(p95_warn=None, p95_error=10)).verdict is verdict.Verdict.ERROR
    with pytest.raises(ConfigError, match="success-rate-error must be a fraction"):
        verdict.Thresholds(success_rate_error=95)
