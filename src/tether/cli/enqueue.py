"""``tether enqueue``: record jobs from the command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import typer

from ..errors import InvalidPayload
from .app import app, open_coordinator, out, print_json


def _load_payload(job_type: str, raw: str) -> dict[str, Any]:
    text = Path(raw[1:]).read_bytes() if raw.startswith("@") else raw.encode()
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InvalidPayload(job_type, [f"--payload is not valid JSON ({e.msg} at position {e.pos})"]) from e
    if not isinstance(data, dict):
        raise InvalidPayload(job_type, ["--payload must be a JSON object"])
    return data


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
    with open_coordinator() as coordinator:
        registry, queue = coordinator.registry, coordinator.queue
        if payload is not None:
            jobs = [queue.build(registry.parse(job_type, _load_payload(job_type, payload)), **options)]
        else:
            assert jsonl is not None  # exactly one of the two, checked above
            stream = sys.stdin if jsonl == "-" else open(jsonl, encoding="utf-8")
            with stream:
                lines = [(n, line) for n, line in enumerate(stream, 1) if line.strip()]
            jobs = []
            for n, line in lines:
                try:
                    jobs.append(queue.build(registry.parse(job_type, _load_payload(job_type, line)), **options))
                except InvalidPayload as e:
                    raise InvalidPayload(job_type, [f"line {n}: {p}" for p in e.problems]) from e
        results = queue.enqueue_all(jobs)
    if as_json:
        records = [{**r.job.to_dict(), "duplicate": r.duplicate} for r in results]
        print_json(records[0] if payload is not None else records)
        return
    for r in results:
        out.print(f"{r.id}{'  (duplicate of an active job)' if r.duplicate else ''}")
