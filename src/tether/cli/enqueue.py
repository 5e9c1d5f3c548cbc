"""``tether enqueue``: record jobs from the command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import typer

from ..clock import SystemClock
from ..errors import InvalidPayload
from ..limits import option_problem
from .app import app, open_coordinator, out, print_json


def _load_payload(job_type: str, raw: str) -> dict[str, Any]:
    if raw.startswith("@"):
        source = f"--payload {raw}"
        try:
            text = Path(raw[1:]).read_bytes()
        except OSError as e:
            raise InvalidPayload(job_type, [f"{source}: cannot read the file ({e.strerror})"]) from e
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
        raise InvalidPayload(job_type, [f"--jsonl {jsonl}: cannot read it ({e.strerror})"]) from e
    return [(n, line) for n, line in enumerate(data.splitlines(), 1) if line.strip()]


@app.command()
def enqueue(
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
    as_json: bool = typer.Option(False, "--json", help="Print the whole job record(s) as JSON."),
) -> None:
    """Record a job; prints its id (or the id of the active duplicate it matched).

    Example: tether enqueue create_file --payload '{"path": "notes/a.json", "content": {"a": 1}}'
    """
    if (payload is None) == (jsonl is None):
        raise typer.BadParameter("give exactly one of --payload or --jsonl")
    options = dict(priority=priority, key=key, max_attempts=max_attempts, delay=delay)
    # Check options, read and parse before the ledger is opened: bad input creates nothing.
    problem = option_problem(priority, max_attempts, delay, SystemClock().now())
    if problem:
        raise InvalidPayload(job_type, [problem])
    items: list[tuple[int | None, dict[str, Any]]]
    if payload is not None:
        items = [(None, _load_payload(job_type, payload))]
    else:
        assert jsonl is not None  # exactly one of the two, checked above
        source = "stdin" if jsonl == "-" else f"--jsonl {jsonl}"
        items = [(n, _parse_object(job_type, f"{source} line {n}", line)) for n, line in _read_lines(job_type, jsonl)]
    with open_coordinator() as coordinator:
        registry, queue = coordinator.registry, coordinator.queue
        jobs = []
        for n, data in items:
            try:
                jobs.append(queue.build(registry.parse(job_type, data), **options))
            except InvalidPayload as e:
                if n is None:
                    raise
                raise InvalidPayload(job_type, [f"line {n}: {p}" for p in e.problems]) from e
        results = queue.enqueue_all(jobs)
    if as_json:
        records = [{**r.job.to_dict(), "duplicate": r.duplicate} for r in results]
        print_json(records[0] if payload is not None else records)
        return
    for r in results:
        out.print(f"{r.id}{'  (duplicate of an active job)' if r.duplicate else ''}")
