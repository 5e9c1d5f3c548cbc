"""``tether enqueue``: record jobs from the command line."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import typer

from .. import events
from ..clock import SystemClock
from ..errors import ConfigError, InvalidPayload, UnknownJobType
from ..ledger.record import InsertResult, JobRecord
from ..ledger.status import JobStatus
from .app import JSON_OPTION, app, err, open_coordinator, out, print_json
from .output import first_line

if TYPE_CHECKING:
    from ..coordinator import Coordinator


def _load_payload(job_type: str, raw: str) -> dict[str, Any]:
    if raw.startswith("@"):
        source = f"--payload {raw}"
        try:
            text = Path(raw[1:]).read_bytes()
        except OSError as e:
            raise ConfigError(f"{source}: cannot read the file {raw[1:]!r}: {e.strerror}") from e
    else:
        # Arguments that are not UTF-8 arrive with their bytes escaped as surrogates: undone here,
        # so the check below names the byte.
        source, text = "--payload", raw.encode("utf-8", "surrogateescape")
    return _parse_object(job_type, source, text)


def _parse_object(job_type: str, source: str, text: bytes) -> dict[str, Any]:
    """A JSON object from ``text``; InvalidPayload naming ``source`` if it is not UTF-8, not
    JSON, or not an object."""
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidPayload(
            job_type, [f"{source} is not valid UTF-8 (byte 0x{text[e.start]:02x} at position {e.start})"]
        ) from None
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InvalidPayload(job_type, [f"{source} is not valid JSON ({e.msg} at position {e.pos})"]) from e
    if not isinstance(data, dict):
        raise InvalidPayload(job_type, [f"{source} must be a JSON object"])
    return data


def _read_lines(job_type: str, jsonl: str) -> list[tuple[int, bytes]]:
    """The non-blank lines of a --jsonl file (or stdin), as bytes with their line numbers."""
    try:
        if jsonl == "-":
            data = sys.stdin.buffer.read()
        else:
            data = Path(jsonl).read_bytes()
    except OSError as e:
        raise ConfigError(f"--jsonl {jsonl}: cannot read the file {jsonl!r}: {e.strerror}") from e
    return [(n, line) for n, line in enumerate(data.splitlines(), 1) if line.strip()]


@app.command()
def enqueue(
    ctx: typer.Context,
    job_type: str = typer.Argument(..., metavar="TYPE", help="Job type, e.g. create_file or delete_file."),
    payload: str | None = typer.Option(
        None, "--payload", "-p", help="Payload as JSON, or @file to read it from a file."
    ),
    jsonl: str | None = typer.Option(
        None,
        "--jsonl",
        help="File with one JSON payload per line ('-' for stdin); all are enqueued in one transaction.",
    ),
    priority: int = typer.Option(0, "--priority", help="Higher runs first."),
    key: str | None = typer.Option(
        None, "--key", help="Idempotency key: an active job of this type with the same key is returned instead."
    ),
    max_attempts: int = typer.Option(3, "--max-attempts", help="Attempts before the job fails."),
    delay: float | None = typer.Option(None, "--delay", help="Seconds to wait before the job may run."),
    wait: bool = typer.Option(
        False,
        "--wait",
        help="Return when the job(s) finished, run by a worker (this command runs none): exit 0 "
        "completed, 1 failed, 3 not finished within --timeout.",
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", help="With --wait: stop waiting after this many seconds (the job runs on)."
    ),
    job_timeout: float | None = typer.Option(
        None,
        "--job-timeout",
        help="Seconds each attempt may run before it is cancelled and retried (default: its type's).",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not print the queued event (a JSON line on stderr)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Record a job; prints its id (or the id of the active duplicate it matched) on stdout,
    and its `queued` event and any note on stderr.

    Example: tether enqueue create_file --payload '{"path": "notes/a.json", "content": {"a": 1}}'

    Example: id=$(tether --import stamps enqueue stamp --payload @job.json --job-timeout 30 --wait --timeout 60)
    """
    options = dict(priority=priority, key=key, max_attempts=max_attempts, delay=delay, timeout=job_timeout)
    # Check options, read and parse before the ledger is opened: bad input creates nothing.
    _check_options(payload, jsonl, wait, timeout, options)
    items = _items(job_type, payload, jsonl)
    with events.to_stderr(not quiet), open_coordinator(ctx.obj) as coordinator:
        results = _enqueue(coordinator, job_type, items, options)
        if not as_json:
            _print_ids(results)
        finished = [r.job for r in results]
        if wait:
            out.file.flush()
            finished = _wait(coordinator, [r.id for r in results], timeout)
    if as_json:
        duplicate = {r.id: r.duplicate for r in results}
        records = [{**j.to_dict(), "duplicate": duplicate[j.id]} for j in finished]
        print_json(records[0] if payload is not None else records)
    if wait:
        raise typer.Exit(_wait_exit_code(finished))


def _check_options(
    payload: str | None, jsonl: str | None, wait: bool, timeout: float | None, options: dict[str, Any]
) -> None:
    """The flags, alone and together, before anything is read."""
    if timeout is not None and (timeout != timeout or timeout < 0):
        raise ConfigError(f"--timeout: must be a number of seconds >= 0, got {timeout}")
    if timeout is not None and not wait:
        raise ConfigError(
            "--timeout is how long --wait waits, and needs --wait; to limit how long the job may run, use --job-timeout"
        )
    job_timeout = options["timeout"]
    if job_timeout is not None and not 0 < job_timeout < 1e9:
        raise ConfigError(f"--job-timeout: must be a number of seconds > 0, got {job_timeout:g}")
    if (payload is None) == (jsonl is None):
        raise typer.BadParameter("give exactly one of --payload or --jsonl")
    from ..ledger.limits import option_problem

    problem = option_problem(options["priority"], options["max_attempts"], options["delay"], SystemClock().now())
    if problem:  # an option, not the payload: named as the flag the user typed
        name, _, rule = problem.partition(": ")
        raise ConfigError(f"--{name.replace('_', '-')}: {rule}")


def _print_ids(results: list[InsertResult]) -> None:
    """Ids alone on stdout (``id=$(tether enqueue ...)``); notes on stderr."""
    for r in results:
        out.print(r.id)
        if r.duplicate:
            key = r.job.idempotency_key
            err.print(f"{r.id}: duplicate of an active job (--key {key}); nothing new recorded", markup=False)


def _items(job_type: str, payload: str | None, jsonl: str | None) -> list[tuple[int | None, dict[str, Any]]]:
    """The payloads to enqueue, each with its --jsonl line number (None for --payload)."""
    if payload is not None:
        return [(None, _load_payload(job_type, payload))]
    assert jsonl is not None  # exactly one of the two, checked before
    source = "stdin" if jsonl == "-" else f"--jsonl {jsonl}"
    return [(n, _parse_object(job_type, f"{source} line {n}", line)) for n, line in _read_lines(job_type, jsonl)]


def _enqueue(
    coordinator: Coordinator, job_type: str, items: list[tuple[int | None, dict[str, Any]]], options: dict[str, Any]
) -> list[InsertResult]:
    """Build every job, then enqueue them all in one transaction; a bad --jsonl line is named."""
    registry, queue = coordinator.registry, coordinator.queue
    if job_type not in registry.names():  # as reconcile says it: the module that registers it is missing
        raise UnknownJobType(job_type, registry.names(), hint="a type of your own needs --import MODULE")
    jobs = []
    for n, data in items:
        try:
            jobs += queue.enqueuer.build([registry.parse(job_type, data)], **options)
        except InvalidPayload as e:
            if n is None:
                raise
            raise InvalidPayload(job_type, [f"line {n}: {p}" for p in e.problems]) from e
    return queue.enqueuer.enqueue(jobs)


def _wait(coordinator: Any, ids: list[str], timeout: float | None) -> list[JobRecord]:
    """The jobs once every one is completed or failed, or as they are when ``timeout`` passes.
    It only reads: a worker runs them (a job that waits for its retry backoff is waited for too)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    interval = 0.05
    while True:
        jobs = [coordinator.get(i) for i in ids]
        open_ = [j for j in jobs if j.status not in _FINISHED]
        if not open_ or (deadline is not None and time.monotonic() >= deadline):
            break
        pause = interval if deadline is None else min(interval, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)  # polling an operator's wait, not a race: up to 1 s between reads
        interval = min(interval * 2, 1.0)
    for j in jobs:
        line = f"{j.id}: {j.status.value}"
        if j.status is JobStatus.FAILED:
            line += f" after {j.attempts} attempt(s): {first_line(j.last_error, 200)}"
        elif j.status not in _FINISHED:
            line += f" (not finished after {timeout:g}s; is a worker running?)"
        err.print(line, markup=False, soft_wrap=True)
    return jobs


_FINISHED = frozenset({JobStatus.COMPLETED, JobStatus.FAILED})


def _wait_exit_code(jobs: list[JobRecord]) -> int:
    """3 if any job is not finished, else 1 if any failed, else 0."""
    if any(j.status not in _FINISHED for j in jobs):
        return 3
    return 1 if any(j.status is JobStatus.FAILED for j in jobs) else 0
