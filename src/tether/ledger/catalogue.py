"""The statement catalogue: every statement of the hot path, named once per dialect.

The statements live in ``statements/sqlite.sql`` and ``statements/postgresql.sql``, each complete
as it is sent (the dialect's own placeholders, SQLite's index pins written in), in named blocks
(``-- name: CLAIM``), as procrastinate keeps its statements: a reader opens one file and sees
every statement and why it is so. SQL files rather than Python strings, so that no statement can
be assembled from pieces: what the file says is what the database runs. Each file is read once,
into a frozen ``Statements`` whose fields are the names, so a name missing from a file, or one
no caller knows, fails at import and a typo fails the type check.

The statements that vary by a set of job types (CLAIM by those a worker has registered, the
reconciler's reads by those whose probes read payloads) take that set as a parameter
(``Statements.types``), so they too are fixed text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

INLINE_PAYLOAD = 16 * 1024
"""CLAIM returns the payloads of up to this many bytes with its rows (written as 16384 in both
files; tests/test_catalogue.py keeps them one); larger ones come back NULL and are read after it
(PAYLOAD)."""

STATEMENTS = Path(__file__).with_name("statements")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Statements:
    """The statements of one dialect, by name (see the file ``statements/<dialect>.sql``)."""

    dialect: str
    INSERT_UNKEYED: str
    INSERT_ON_TARGET: str
    INSERT: str
    INSERT_PAYLOADS: str
    INSERT_TARGETED: str
    INSERT_ROWS: str
    TAG: str
    NOTE: str
    ACTIVE_BY_KEY: str
    RETRIED_AS: str
    NOTE_OF: str
    GET: str
    PAYLOAD: str
    CLAIM_PLAN: str
    CLAIM: str
    COMPLETE: str
    COMPLETE_MANY: str
    RETRY: str
    FAIL: str
    CANCEL_RUNNING: str
    RELEASE: str
    DEFER: str
    COMPLETE_NO_RETURN: str
    RETRY_NO_RETURN: str
    FAIL_NO_RETURN: str
    CANCEL_RUNNING_NO_RETURN: str
    RELEASE_NO_RETURN: str
    DEFER_NO_RETURN: str
    INSERT_ATTEMPT: str
    ATTEMPT_TRACE: str
    DEFER_TYPE: str
    CANCEL: str
    REQUEST_CANCEL: str
    CANCEL_REQUESTS: str
    PAUSED_TYPES: str
    HEARTBEAT: str
    PROGRESS: str
    HOLDS: str
    STANDING: str
    NEWER_ON_TARGET: str
    MANUAL_RETRY: str
    UNBLOCK_NEXT: str
    ANY_BLOCKED: str
    LOST_HEADS: str
    UNBLOCK_HEAD: str
    BLOCK_WAITING: str
    STALE: str
    RECLAIM: str
    RECLAIM_EXHAUSTED: str
    ACQUIT: str
    RUNNING_OF_TYPE: str
    LOCK_TYPE_CLAIMS: str
    LOCK_FOR_REPAIR: str
    WAITING_TYPES: str
    PENDING_OF_TYPES: str
    JOBS_COUNTED: str
    ANALYZE_JOBS: str
    DATABASE_TIME: str
    COMMITS_UNSYNCED: str
    COMMITS_SYNCED: str
    WORKER_START: str
    WORKER_BEAT: str
    WORKER_STOP: str
    WORKER_FORGET: str
    RECONCILE_TARGETS: str
    RECONCILE_TARGETS_PAYLOADS: str
    RECONCILE_TARGETS_FINGERPRINTS: str
    RECONCILE_IN_FLIGHT: str
    RECONCILE_IN_FLIGHT_AFTER: str
    RECORD_FINGERPRINTS: str
    CLEAN_DIRS: str
    RECORD_CLEAN_DIRS: str
    FORGET_CLEAN_DIRS: str
    TARGETS_FUNCTION: str
    TARGETS_ON_INSERT: str
    TARGETS_ON_UPDATE: str
    TARGETS_ON_DELETE: str
    TARGETS_TRIGGERS: str
    TARGETS_CLEAR: str
    TARGETS_FILL: str

    def types(self, names: Iterable[str]) -> Any:
        """A set of job type names as CLAIM binds ``types`` and the reconciler's reads ``want``:
        a JSON array on SQLite (read by json_each), a list on PostgreSQL (an array, ``= ANY``)."""
        ordered = sorted(names)
        return ordered if self.dialect == "postgresql" else orjson.dumps(ordered).decode()

    def named(self) -> dict[str, str]:
        """Every statement by its name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "dialect"}


def parse(text: str) -> dict[str, str]:
    """The named blocks of a statement file: each ``-- name: NAME`` line starts one, which runs to
    the next; whole-line ``--`` comments are left out of the statement, which is sent as written."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("-- name: "):
            name = line.removeprefix("-- name: ").strip()
            if name in blocks:
                raise ValueError(f"statement {name} is named twice")
            current = blocks[name] = []
        elif current is not None and not line.lstrip().startswith("--"):
            current.append(line)
    return {name: "\n".join(lines).strip() for name, lines in blocks.items()}


@dataclass(frozen=True, slots=True)
class Reads:
    """Reconcile's reads through SQLAlchemy, on either database (``statements/reads.sql``)."""

    PAYLOADS_BY_ID: str
    PAYLOAD_SIZES_BY_ID: str
    RECONCILE_RECHECK: str
    ACTIVE_ON_TARGET: str
    KNOWN_TARGETS: str
    COUNT_TARGETS: str
    TYPE_TARGETED: str


def load(file: str, kind: type[_T], **extra: str) -> _T:
    """The statements of ``statements/<file>.sql`` as a ``kind`` (Statements, Reads), whose
    fields besides ``extra`` must be exactly the file's names."""
    path = STATEMENTS / f"{file}.sql"
    named = parse(path.read_text(encoding="utf-8"))
    wanted = {f.name for f in dataclasses.fields(kind)} - extra.keys()  # type: ignore[arg-type]
    if named.keys() != wanted:
        missing, unknown = sorted(wanted - named.keys()), sorted(named.keys() - wanted)
        raise ValueError(f"{path}: statements missing {missing}, not known {unknown}")
    return kind(**named, **extra)


SQLITE = load("sqlite", Statements, dialect="sqlite")
POSTGRESQL = load("postgresql", Statements, dialect="postgresql")
READS = load("reads", Reads)


def catalogue_for(dialect: str) -> Statements:
    """The statements of ``dialect`` (an engine's ``dialect.name``)."""
    return POSTGRESQL if dialect == "postgresql" else SQLITE
