"""What a ledger knows about itself: its id, the data root it was created for, its schema version.

The root is recorded when the ledger is created. A command that names no root uses it; one that
names another is refused with both paths named, unless the operator says the data moved (then
the new root is recorded). So a mistyped ``--root`` is an error, never a new empty data root
written into, and a plain ``tether reconcile`` checks the directory the application writes to.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import sqlalchemy as sa

from .. import events
from ..errors import ConfigError
from .engine import READ_ONLY, ensure_schema, layout, opening_error, require_ledger
from .schema import meta

SCHEMA_VERSION = 16
"""tether's ledger layout: 1 the first table, 2 partial indexes, 3 timeout/progress and tether_meta,
4 quarantine (a job a dead worker held is claimed alone), 5 blocked (a job waiting behind an
older one on its target is kept apart from the claim), 6 tether_workers (each worker process
registers itself and its heartbeat), 7 tether_attempts (how each attempt that did not complete
its job ended), 8 the ``cancelled`` status in the status CHECK, ``cancel_reason`` (an operator's
cancel of a running job) and ``tether_paused`` (job types no worker claims), 9 snoozes (a job's
count of snoozes, which the worker caps), meta and retry_of (what a caller attached; the failed
job a corrected retry replaces) and the tether_job_tags table, 10 tether_repairs (a repair job's
link to the job it runs again) and tether_drift_findings (the findings of the newest reconcile
runs), 11 fingerprint (a completed file job's file as a stat saw it, so a content check reads only
the files whose stat changed), 12 traceparent on tether_jobs and tether_attempts (the trace
context of a job's enqueue and of each attempt that did not complete it: tether.tracing), 13
tether_targets and its triggers (each target's latest completed job, which a reconcile check
reads: ledger/targets.py), filled from the jobs on the first open; 14 tether_clean_dirs (the leaf
directories a check's walk found without temp files, as an fstat saw them: reconcile/clean_dirs.py),
15 one trigger on completed_at rather than two on status keeping tether_targets (a claim wakes
none) and the status CHECK spelled as comparisons (schema.py says why), 16 ix_tether_jobs_on_target
in place of ix_tether_jobs_targeted, without ``status`` (a claim and a completion leave it alone);
``ensure_schema`` brings an older ledger to each, adding a column only where it is missing."""

ROOT = "root"
LEDGER_ID = "ledger_id"
VERSION = "schema_version"
LAYOUT = "layout"  # engine.layout() of the last open that ensured the schema

_t = meta


class RootMismatch(ConfigError):
    """The data root given is not the one the ledger was created for."""

    def __init__(self, recorded: str, given: str) -> None:
        self.recorded, self.given = recorded, given
        super().__init__(
            f"this ledger's data root is {recorded}, not {given}; omit --root (TETHER_ROOT) to use "
            f"the recorded one, or, if the data moved, pass --moved to record {given} as its new root"
        )


class OlderLedger(ConfigError):
    """A reader met a ledger whose schema this tether has not yet brought forward."""

    def __init__(self, version: int) -> None:
        self.version = version
        super().__init__(
            f"this ledger has schema version {version} and this tether reads version {SCHEMA_VERSION}: "
            "run `tether init` (or start a worker) once to upgrade it in place; readers never write"
        )


def older_version(engine: sa.Engine) -> int | None:
    """The ledger's schema version when it is older than this tether's, else None; None too when
    it cannot be read (the caller's own error then stands). What a reader that met a missing
    column asks, to say why."""
    try:
        with engine.connect().execution_options(**READ_ONLY) as conn, conn.begin():
            known = read(conn)
    except sa.exc.SQLAlchemyError:
        return None
    version = int(known.get(VERSION, "0"))
    return version if version < SCHEMA_VERSION else None


def read(conn: sa.Connection) -> dict[str, str]:
    # Plain text: building and compiling a select cold would cost every open more than this read.
    return {key: value for key, value in conn.exec_driver_sql(f"SELECT key, value FROM {_t.name}")}


def _put(conn: sa.Connection, key: str, value: str) -> None:
    if conn.execute(sa.update(_t).where(_t.c.key == key).values(value=value)).rowcount == 0:
        conn.execute(sa.insert(_t).values(key=key, value=value))


def _root(recorded: str | None, given: str | os.PathLike[str] | None) -> Path:
    if given is None:
        return Path(recorded) if recorded else Path(".").absolute()
    return Path(os.path.abspath(Path(given).expanduser()))


def settled(engine: sa.Engine, given: str | os.PathLike[str] | None, layout: str) -> tuple[Path, str, bool] | None:
    """What ``settle`` would return, read without the write lock, when the ledger needs nothing
    done or recorded: its schema ensured at ``layout`` (``engine.layout()``) and this version,
    ``given`` the recorded root as spelled, its id recorded. None otherwise, or on any database
    error: the caller then ensures the schema and settles, which say what is wrong.

    One read (a handful of rows) instead of ``ensure_schema``'s inspection and two write
    transactions: the cost of opening a coordinator, paid by every process that enqueues."""
    try:
        with engine.connect().execution_options(**READ_ONLY) as conn, conn.begin():
            known = read(conn)
    except sa.exc.SQLAlchemyError:
        return None
    recorded, ledger_id = known.get(ROOT), known.get(LEDGER_ID)
    if known.get(LAYOUT) != layout or known.get(VERSION) != str(SCHEMA_VERSION) or not recorded or not ledger_id:
        return None
    root = _root(recorded, given)
    if str(root) != recorded:
        return None  # another root (refused, or recorded as moved), or another spelling of it
    return root, ledger_id, False


def ready(
    engine: sa.Engine, given: str | os.PathLike[str] | None, *, moved: bool, create: bool
) -> tuple[Path, str, bool]:
    """What ``settle`` returns, for a coordinator opening the ledger: one read when this tether
    set the ledger up and ``given`` is its root (``settled``); else its schema ensured (created,
    unless ``create`` is false: then NoLedger when there is none) and the root recorded."""
    found = settled(engine, given, layout())
    if found is not None:
        return found
    if not create:
        require_ledger(engine)
    ensure_schema(engine)
    try:
        return settle(engine, given, moved=moved, layout=layout())
    except sa.exc.SQLAlchemyError as e:
        raise opening_error(engine, e) from e


def settle(
    engine: sa.Engine, given: str | os.PathLike[str] | None, *, moved: bool = False, layout: str | None = None
) -> tuple[Path, str, bool]:
    """The data root to use, the ledger's id, and whether this open recorded the root first (a
    new ledger, or one from before roots were recorded), recording what the ledger lacks.

    ``given`` is the root the caller named (None: use the recorded one, else the working
    directory). A root that differs from the recorded one is refused (RootMismatch) unless
    ``moved``; a ledger from before roots were recorded adopts the one given. ``layout``, when
    the caller has just ensured the schema, is recorded for ``settled``."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":  # two first opens must not record two roots
            conn.execute(sa.text("LOCK TABLE tether_meta IN SHARE ROW EXCLUSIVE MODE"))
        known = read(conn)
        recorded = known.get(ROOT)
        root = _root(recorded, given)
        if recorded and not _same(recorded, root):
            if not moved:
                raise RootMismatch(recorded, str(root))
            events.emit("root_moved", previous=recorded, root=str(root))
        if recorded is None or str(root) != recorded:
            _put(conn, ROOT, str(root))
        ledger_id = known.get(LEDGER_ID)
        if ledger_id is None:
            ledger_id = secrets.token_hex(8)
            _put(conn, LEDGER_ID, ledger_id)
        version = int(known.get(VERSION, "0"))
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"this ledger was last opened by a newer tether (schema {version}, this one knows "
                f"{SCHEMA_VERSION}); upgrade tether before using it"
            )
        if version < SCHEMA_VERSION:
            _put(conn, VERSION, str(SCHEMA_VERSION))
        if layout is not None and known.get(LAYOUT) != layout:
            _put(conn, LAYOUT, layout)
    return root, ledger_id, recorded is None


def _same(recorded: str, root: Path) -> bool:
    """Whether two spellings name one directory (a symlinked path counts as the same)."""
    if recorded == str(root):
        return True
    try:
        return os.path.samefile(recorded, root)
    except OSError:
        return os.path.realpath(recorded) == os.path.realpath(root)
