"""What a caller attaches to a job besides its payload: tags to find it by, meta to show beside
it, and, for a retry with a corrected payload, the failed job it replaces. Bounded and checked
before a transaction opens; written in the job's own transaction, and only when given, so a job
without them costs its enqueue nothing more.

Tags live in ``tether_job_tags`` (schema.py says why a table of their own); meta and
``retry_of`` are columns of the job's row that no JobRecord carries: only the read commands show
them. tether never reads meta: it is the caller's, shown as given (never the payload).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from ..errors import InvalidPayload
from .record import JobRecord

MAX_TAGS = 16
MAX_TAG_CHARS = 64
MAX_META_BYTES = 4096
# A tag is a word an operator types on a command line: no spaces, no quotes, no commas.
_TAG = re.compile(r"[A-Za-z0-9_.:/=@+-]+")
TAG_RULE = f"1 to {MAX_TAG_CHARS} of letters, digits and _ . : / = @ + -"


class Note(NamedTuple):
    """What one job carries besides its row: its tags, its meta (JSON text), the job it retries."""

    tags: tuple[str, ...] = ()
    meta: str | None = None
    retry_of: str | None = None


def note(job_type: str, tags: Iterable[str] | None, meta: Mapping[str, Any] | None) -> Note | None:
    """The checked note of an enqueue's ``tags`` and ``meta`` (None when it has none); raises
    InvalidPayload naming the rule that one of them breaks, and nothing is stored."""
    if not tags and meta is None:
        return None
    problem = tags_problem(tags or ())
    if problem:
        raise InvalidPayload(job_type, [problem])
    text = None
    if meta is not None:
        if not isinstance(meta, Mapping):
            raise InvalidPayload(job_type, [f"meta: must be a JSON object, got {type(meta).__name__}"])
        try:
            text = orjson.dumps(meta, option=orjson.OPT_SORT_KEYS).decode()
        except TypeError as e:
            raise InvalidPayload(job_type, [f"meta: cannot be stored as JSON ({e})"]) from e
        if len(text.encode()) > MAX_META_BYTES:
            raise InvalidPayload(job_type, [f"meta: at most {MAX_META_BYTES} bytes of JSON, got {len(text.encode())}"])
    return Note(tuple(dict.fromkeys(tags or ())), text)


def notes_for(
    jobs: Sequence[JobRecord], tags: Iterable[str] | None, meta: Mapping[str, Any] | None
) -> dict[str, Note] | None:
    """The note of each of ``jobs`` enqueued together with ``tags`` and ``meta`` (None: none)."""
    if not jobs or (not tags and meta is None):
        return None
    shared = note(jobs[0].type, tags, meta)
    return None if shared is None else {job.id: shared for job in jobs}


def tags_problem(tags: Iterable[str]) -> str | None:
    """What is wrong with ``tags`` (too many, one too long or holding a character a tag may not), or None."""
    if isinstance(tags, str):
        return f"tags: a list of tags, got the string {tags!r}"
    tags = list(tags)
    if len(set(tags)) > MAX_TAGS:
        return f"tags: at most {MAX_TAGS} per job, got {len(set(tags))}"
    for tag in tags:
        if not isinstance(tag, str) or len(tag) > MAX_TAG_CHARS or not _TAG.fullmatch(tag):
            return f"tags: {tag!r} is not a tag; a tag is {TAG_RULE}"
    return None


def write_notes(cur: Any, sql: Any, notes: Mapping[str, Note]) -> None:
    """Record the notes of jobs just inserted in this transaction (``notes`` by job id, each
    for a job that was inserted, not one found by its idempotency key)."""
    tags = [{"tag": tag, "job_id": job_id} for job_id, n in notes.items() for tag in n.tags]
    if tags:
        cur.executemany(sql.TAG, tags)
    marked = [
        {"id": job_id, "meta": n.meta, "retry_of": n.retry_of}
        for job_id, n in notes.items()
        if n.meta is not None or n.retry_of is not None
    ]
    if marked:
        cur.executemany(sql.NOTE, marked)
