"""tether.testing: the pytest plugin an application's tests get with tether installed (its
fixtures, on SQLite and on a PostgreSQL schema of their own), and its helpers."""

from __future__ import annotations

import textwrap

import pytest
import sqlalchemy as sa

from tether import Coordinator, JobStatus, PermanentError
from tether.jobtypes import CreateFile, DeleteFile
from tether.testing import abandon, assert_enqueued, drain, failing, refute_enqueued, timing_out

pytest_plugins = ["pytester"]

APPLICATION_TEST = textwrap.dedent(
    """
    from tether.jobtypes import CreateFile
    from tether.testing import assert_enqueued, drain

    def test_a_save_is_enqueued_then_written(tether_coordinator, tether_clock, tmp_path):
        assert tether_coordinator.clock is tether_clock
        assert tether_coordinator.root == tmp_path / "tether-data"
        tether_coordinator.enqueue(CreateFile(path="a.json", content={"n": 1}))
        assert_enqueued(tether_coordinator, "create_file", path="a.json")
        [ran] = drain(tether_coordinator)
        assert ran.status.value == "completed"
        assert (tmp_path / "tether-data" / "a.json").exists()
    """
)


def test_an_application_gets_the_fixtures_from_the_installed_plugin(pytester: pytest.Pytester):
    pytester.makepyfile(APPLICATION_TEST)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_with_a_postgresql_url_each_test_gets_a_schema_dropped_after_it(pytester: pytest.Pytester, pg_database: str):
    engine = sa.create_engine(pg_database)
    before = set(sa.inspect(engine).get_schema_names())
    pytester.makepyfile(APPLICATION_TEST + "\n\ntest_again = test_a_save_is_enqueued_then_written\n")
    pytester.makeconftest(
        textwrap.dedent(
            """
            import pytest, sqlalchemy as sa
            from tether.ledger.engine import schema_of

            @pytest.fixture(autouse=True)
            def on_postgresql(tether_coordinator):
                engine = tether_coordinator.engine
                assert engine.dialect.name == "postgresql" and schema_of(engine).startswith("tether_test_")
            """
        )
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tether-db={pg_database}").assert_outcomes(passed=2)
    after = set(sa.inspect(engine).get_schema_names())
    engine.dispose()
    assert after == before


def test_a_sqlite_url_for_the_test_database_is_refused_in_one_line(pytester: pytest.Pytester):
    pytester.makepyfile(APPLICATION_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tether-db=sqlite:///x.db")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*takes a PostgreSQL URL, not 'sqlite'*"])


def test_assert_enqueued_matches_active_jobs_by_payload_fields(tether_coordinator: Coordinator):
    job = tether_coordinator.enqueue(CreateFile(path="a.json", content={"n": 1}))
    assert assert_enqueued(tether_coordinator, "create_file", path="a.json").id == job.id
    assert assert_enqueued(tether_coordinator, "create_file", content={"n": 1}).id == job.id
    refute_enqueued(tether_coordinator, "create_file", path="b.json")
    refute_enqueued(tether_coordinator, "delete_file")
    with pytest.raises(
        AssertionError, match=r"no active create_file job with path='b.json'; its active jobs:\n.*a.json"
    ):
        assert_enqueued(tether_coordinator, "create_file", path="b.json")
    with pytest.raises(AssertionError, match=r"1 active create_file job\(s\) with path='a.json'") as shown:
        refute_enqueued(tether_coordinator, "create_file", path="a.json")
    assert "content" not in str(shown.value)  # the fields asked about, never the whole payload
    drain(tether_coordinator)  # done: no longer enqueued
    refute_enqueued(tether_coordinator, "create_file")


def test_drain_runs_jobs_in_the_calling_thread_and_returns_each_attempts_outcome(tether_coordinator: Coordinator):
    import threading

    threads = []
    handler = tether_coordinator.registry.get("create_file")
    real = handler.run
    handler.run = lambda payload, ctx: threads.append(threading.current_thread()) or real(payload, ctx)
    ok = tether_coordinator.enqueue(CreateFile(path="a.json", content=1))
    gone = tether_coordinator.enqueue(DeleteFile(path="missing.json", require_exists=True), max_attempts=1)
    outcomes = drain(tether_coordinator)
    assert [(o.job_id, o.status) for o in outcomes] == [(ok.id, JobStatus.COMPLETED), (gone.id, JobStatus.FAILED)]
    assert outcomes[1].error and "missing.json" in outcomes[1].error
    assert threads == [threading.current_thread()]
    assert drain(tether_coordinator) == []


def test_failing_makes_the_next_attempts_fail_and_drain_with_scheduled_runs_the_retries(
    tether_coordinator: Coordinator,
):
    job = tether_coordinator.enqueue(CreateFile(path="a.json", content=1), max_attempts=3)
    with failing(tether_coordinator, "create_file", times=2):
        [first] = drain(tether_coordinator)  # the retry waits out its backoff on the fake clock
        assert (first.status, first.attempt) == (JobStatus.PENDING, 1)
        assert first.error and "failed on purpose" in first.error
        rest = drain(tether_coordinator, with_scheduled=True)
    assert [(o.attempt, o.status) for o in rest] == [(2, JobStatus.PENDING), (3, JobStatus.COMPLETED)]
    assert tether_coordinator.get(job.id).status is JobStatus.COMPLETED


def test_drain_with_scheduled_fires_schedules_as_of_the_clock_not_the_century_it_looks_ahead(
    tether_coordinator: Coordinator,
):
    tether_coordinator.schedule("every-minute", "* * * * *", CreateFile(path="tick.json", content=1, overwrite=True))
    tether_coordinator.enqueue(CreateFile(path="later.json", content=1), delay=3600)
    outcomes = drain(tether_coordinator, with_scheduled=True)
    assert "file:later.json" in {o.job.ordering_key for o in outcomes}  # the later job ran now
    fired = [o for o in outcomes if o.job.ordering_key == "file:tick.json"]
    assert len(fired) <= 1  # at most the slot due now, not one for every minute of a century


def test_failing_with_a_permanent_error_fails_the_job_at_once(tether_coordinator: Coordinator):
    tether_coordinator.enqueue(CreateFile(path="a.json", content=1), max_attempts=5)
    with failing(tether_coordinator, "create_file", PermanentError("the disk says no"), times=None):
        [outcome] = drain(tether_coordinator, with_scheduled=True)
    assert (outcome.status, outcome.attempt) == (JobStatus.FAILED, 1)
    assert outcome.error and "the disk says no" in outcome.error


def test_timing_out_ends_the_attempt_as_a_timeout_the_worker_retries(tether_coordinator: Coordinator):
    tether_coordinator.enqueue(CreateFile(path="a.json", content=1))
    with timing_out(tether_coordinator, "create_file", seconds=5):
        [timed_out] = drain(tether_coordinator)
    assert timed_out.status is JobStatus.PENDING
    assert timed_out.error and "ran past its timeout of 5s" in timed_out.error
    assert [o.status for o in drain(tether_coordinator, with_scheduled=True)] == [JobStatus.COMPLETED]


def test_abandon_leaves_a_job_to_the_stale_sweep_with_its_attempt_counted(tether_coordinator: Coordinator):
    job = tether_coordinator.enqueue(CreateFile(path="a.json", content=1), max_attempts=2)
    [reclaimed] = abandon(tether_coordinator)
    assert (reclaimed.id, reclaimed.status, reclaimed.attempts) == (job.id, JobStatus.PENDING, 1)
    [last] = abandon(tether_coordinator)
    assert (last.status, last.attempts) == (JobStatus.FAILED, 2)
    with pytest.raises(AssertionError, match="no job is ready"):
        abandon(tether_coordinator)
