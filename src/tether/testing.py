"""Testing an application that uses tether: a pytest plugin, and helpers any test can call.

Installed with tether (the ``pytest11`` entry point), the plugin offers two fixtures:
``tether_clock``, a ``FakeClock``, and ``tether_coordinator``, a coordinator on that clock with a
temporary data root and a ledger of its own: a SQLite file in the test's ``tmp_path``, or, given
``--tether-db URL`` (or ``$TETHER_TEST_DB``), a PostgreSQL schema made for the test and dropped
after it, so tests run in parallel on one database. The helpers take any coordinator:

- ``assert_enqueued(c, "create_file", path="a.json")`` / ``refute_enqueued``: whether an active
  (pending or running) job of a type has those payload fields;
- ``drain(c)``: run the ready jobs in the test's own thread, returning each attempt's outcome;
- ``failing(c, type)``, ``timing_out(c, type)``: the next attempts of a type fail, or run past
  their timeout; ``abandon(c)``: the next ready job's worker dies and the sweep reclaims it.

Only pytest is imported here at start-up: every pytest run of an application with tether
installed loads this module, and a test run that never asks for a fixture pays nothing more.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from unittest import mock

import pytest

if TYPE_CHECKING:
    from .clock import FakeClock
    from .coordinator import Coordinator
    from .jobtypes.context import JobContext
    from .ledger.record import JobRecord
    from .ledger.status import JobStatus


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("tether").addoption(
        "--tether-db",
        default=None,
        metavar="URL",
        help="a PostgreSQL database for tether_coordinator's ledgers, each in a schema of its own "
        "dropped after its test (default: $TETHER_TEST_DB; else a SQLite ledger in each test's tmp_path)",
    )


@pytest.fixture
def tether_clock() -> FakeClock:
    """The clock ``tether_coordinator`` reads: ``tether_clock.advance(seconds=60)`` moves its time."""
    from .clock import FakeClock

    return FakeClock()


@pytest.fixture
def tether_coordinator(
    request: pytest.FixtureRequest, tmp_path: Path, tether_clock: FakeClock
) -> Iterator[Coordinator]:
    """A coordinator with a ledger and a data root of its own (``tmp_path / "tether-data"``), on
    ``tether_clock``; register the application's job types on it (``register``)."""
    from . import config
    from .coordinator import Coordinator

    url = config.testing_db(request.config.getoption("tether_db"))
    root = tmp_path / "tether-data"
    if url is None:
        with Coordinator.open(f"sqlite:///{tmp_path / 'tether.db'}", root=root, clock=tether_clock) as c:
            yield c
        return
    if not url.startswith("postgresql"):
        raise pytest.UsageError(
            f"--tether-db / $TETHER_TEST_DB takes a PostgreSQL URL, not {url.split(':', 1)[0]!r}: "
            "without one, each test gets a SQLite ledger of its own"
        )
    schema = f"tether_test_{secrets.token_hex(6)}"
    try:
        with Coordinator.open(url, root=root, clock=tether_clock, schema=schema) as c:
            yield c
    finally:
        _drop_schema(url, schema)


def _drop_schema(url: str, schema: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.schema.DropSchema(schema, cascade=True, if_exists=True))
    finally:
        engine.dispose()


# -- what was enqueued ---------------------------------------------------------------------------


def _active(coordinator: Coordinator, job_type: str) -> list[JobRecord]:
    from .ledger.status import JobStatus
    from .observe.jobs import jobs

    found = [
        job
        for status in (JobStatus.PENDING, JobStatus.CLAIMED)
        for job in jobs(coordinator, status=status, job_type=job_type, limit=None)
    ]
    return sorted(found, key=lambda job: job.id)  # in enqueue order


def _matches(job: JobRecord, fields: dict[str, Any]) -> bool:
    import orjson

    payload = orjson.loads(job.payload)
    return all(name in payload and payload[name] == _plain(value) for name, value in fields.items())


def _plain(value: Any) -> Any:
    """``value`` as the stored payload holds it (a model as its JSON value)."""
    from pydantic import BaseModel

    return value.model_dump(mode="json", by_alias=True) if isinstance(value, BaseModel) else value


def _listing(jobs: list[JobRecord], fields: dict[str, Any]) -> str:
    """The jobs by id and target, with the values of the fields asked about: never a whole payload
    (it may hold file contents or prompts), since a failure's message lands in CI logs."""
    import orjson

    from .jobtypes.target import display

    def asked(job: JobRecord) -> str:
        payload = orjson.loads(job.payload)
        return " ".join(f"{name}={payload[name]!r}" for name in fields if name in payload)

    shown = [f"  {job.id} {display(job.ordering_key) if job.ordering_key else '-'} {asked(job)}" for job in jobs[:10]]
    return "\n".join(shown + ([f"  ... and {len(jobs) - 10} more"] if len(jobs) > 10 else []))


def assert_enqueued(coordinator: Coordinator, job_type: str, **fields: Any) -> JobRecord:
    """The oldest active (pending or running) ``job_type`` job whose payload has ``fields``
    (each equal; a model compares as its JSON); AssertionError listing that type's active jobs
    if there is none."""
    active = _active(coordinator, job_type)
    for job in active:
        if _matches(job, fields):
            return job
    wanted = ", ".join(f"{k}={v!r}" for k, v in fields.items()) or "any payload"
    seen = f"its active jobs:\n{_listing(active, fields)}" if active else "there is no active job of that type"
    raise AssertionError(f"no active {job_type} job with {wanted}; {seen}")


def refute_enqueued(coordinator: Coordinator, job_type: str, **fields: Any) -> None:
    """AssertionError naming them if active ``job_type`` jobs have ``fields`` (any, without fields)."""
    found = [job for job in _active(coordinator, job_type) if _matches(job, fields)]
    if found:
        wanted = ", ".join(f"{k}={v!r}" for k, v in fields.items()) or "any payload"
        raise AssertionError(f"{len(found)} active {job_type} job(s) with {wanted}:\n{_listing(found, fields)}")


# -- running jobs --------------------------------------------------------------------------------


class Outcome(NamedTuple):
    """What one attempt came to: its job's status after it (``completed``, ``pending`` again for
    a retry or a snooze, ``failed``, ``cancelled``), the attempt's number, and its error line."""

    job_id: str
    type: str
    attempt: int
    status: JobStatus
    error: str | None
    job: JobRecord


DRAIN_LIMIT = 10_000
"""Attempts after which ``drain`` stops with an error: jobs that enqueue each other forever."""


def drain(coordinator: Coordinator, *, with_scheduled: bool = False, **worker_config: Any) -> list[Outcome]:
    """Run ready jobs in the calling thread until none is ready; returns each attempt's outcome in
    the order they ran. A retry waits out its backoff on the coordinator's clock, so by default it
    is left pending (advance the clock and drain again); ``with_scheduled`` also runs jobs
    scheduled later (delays, retries' backoffs) without moving the clock, until every job has
    finished or is held back. ``worker_config``: ``WorkerConfig`` fields."""
    from .ledger.status import JobStatus

    worker = coordinator.worker(**worker_config)
    ran: list[str] = []
    run = worker.executor.run

    def recording(job: JobRecord, ctx: JobContext) -> Any:
        ran.append(job.id)
        return run(job, ctx)

    # The worker reads its executor's ``run`` for each batch: seeing which jobs it ran, in order,
    # needs no hook of its own in the worker.
    setattr(worker.executor, "run", recording)  # noqa: B010  (typed as a method: mypy refuses the assignment)
    outcomes: list[Outcome] = []
    while True:
        # Jobs scheduled later are claimed as if their time had come; schedules fire as of the
        # clock (firing them a century ahead would walk every slot in between).
        ahead = coordinator.clock.now() + timedelta(days=36500) if with_scheduled else None
        if worker.run_once(claim_at=ahead) == 0:
            return outcomes
        for job_id in ran:
            job = coordinator.get(job_id)
            error = (job.last_error or "").strip().splitlines()[-1:] if job.status is not JobStatus.COMPLETED else []
            outcomes.append(Outcome(job.id, job.type, job.attempts, job.status, error[0] if error else None, job))
        ran.clear()
        if len(outcomes) > DRAIN_LIMIT:
            raise AssertionError(
                f"drain ran {len(outcomes)} attempts and jobs are still ready: jobs enqueue jobs forever?"
            )


# -- faults --------------------------------------------------------------------------------------


@contextmanager
def _replacing_run(coordinator: Coordinator, job_type: str, fake: Any, times: int | None) -> Iterator[None]:
    """Within the block, the next ``times`` attempts of ``job_type`` (all of them with None) run
    ``fake(payload, ctx)`` instead of its handler."""
    handler = coordinator.registry.get(job_type)
    real = handler.run
    left = [times]
    lock = threading.Lock()

    def run(payload: Any, ctx: JobContext) -> Any:
        with lock:
            use_fake = left[0] is None or left[0] > 0
            if left[0] is not None and use_fake:
                left[0] -= 1
        return fake(payload, ctx) if use_fake else real(payload, ctx)

    with mock.patch.object(handler, "run", run):
        yield


def failing(
    coordinator: Coordinator, job_type: str, error: BaseException | None = None, *, times: int | None = 1
) -> AbstractContextManager[None]:
    """``with failing(c, "create_file"):`` the next ``times`` attempts of the type (every one, with
    None) raise ``error`` instead of running: a RetryableError by default; a PermanentError
    fails the job at once."""
    from .errors import RetryableError

    def fake(payload: Any, ctx: JobContext) -> Any:
        raise error if error is not None else RetryableError(f"{job_type} failed on purpose (tether.testing.failing)")

    return _replacing_run(coordinator, job_type, fake, times)


def timing_out(
    coordinator: Coordinator, job_type: str, *, times: int | None = 1, seconds: float = 30.0
) -> AbstractContextManager[None]:
    """``with timing_out(c, "sync_aws"):`` the next ``times`` attempts of the type run past a
    timeout of ``seconds``: each is cancelled and ends as the worker ends one that overran
    (JobTimedOut, retried), at once rather than after ``seconds``."""
    from .errors import JobTimedOut
    from .jobtypes.context import TIMEOUT

    def fake(payload: Any, ctx: JobContext) -> Any:
        ctx.cancel(TIMEOUT)
        raise JobTimedOut(ctx.job.type, ctx.job.id, seconds)

    return _replacing_run(coordinator, job_type, fake, times)


def abandon(coordinator: Coordinator, *, limit: int = 1, worker: str = "tether-testing:dead") -> list[JobRecord]:
    """Claim the next ``limit`` ready jobs as a ``worker`` that then dies, and sweep them as the
    stale-lock sweep does once the lock timeout has passed (without moving the clock): each is
    pending again with its attempt counted, or failed if it was its last. Returns them."""
    claimed = coordinator.queue.claim(worker, limit=limit)
    if not claimed:
        raise AssertionError("abandon: no job is ready to be claimed")
    later = coordinator.clock.now() + timedelta(seconds=coordinator.lock_timeout + 1)
    ids = {job.id for job in claimed}
    return [job for job in coordinator.reclaim_stale(now=later) if job.id in ids]
