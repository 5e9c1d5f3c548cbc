"""The reconciler's reads of the ledger: every statement a check runs, each in a short read-only
transaction, so a long check never holds a snapshot open (which on SQLite would stop WAL
checkpoints for its whole duration)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import orjson
import sqlalchemy as sa

from .. import events
from ..ledger import drivers
from ..ledger.catalogue import READS
from ..ledger.engine import READ_ONLY

PAYLOADS = sa.text(READS.PAYLOADS_BY_ID).bindparams(sa.bindparam("ids", expanding=True))
PAYLOAD_SIZES = sa.text(READS.PAYLOAD_SIZES_BY_ID).bindparams(sa.bindparam("ids", expanding=True))
RECHECK = sa.text(READS.RECONCILE_RECHECK).bindparams(sa.bindparam("keys", expanding=True))
ACTIVE_ON = sa.text(READS.ACTIVE_ON_TARGET)
KNOWN_TARGETS = sa.text(READS.KNOWN_TARGETS).bindparams(sa.bindparam("keys", expanding=True))
COUNT_TARGETS = sa.text(READS.COUNT_TARGETS)
TYPE_TARGETED = sa.text(READS.TYPE_TARGETED)

_LOADS = orjson.loads

KNOWN_CHUNK = 500  # keys per KNOWN_TARGETS read: well under every driver's bound-parameter limit
PAGE_BYTES = 16 << 20
"""The payload bytes one read holds, about: a page of ``limit`` targets carries only payloads of
at most PAGE_BYTES / limit bytes (8 KiB a target for pages of 2,000), and the larger ones are read
by id, in parts that take no more once they hold PAGE_BYTES. A check of large files holds about
as much memory as one of small files, and the small ones, most, still come with their page."""


class Page(NamedTuple):
    """A page of ``LedgerReads.targets``: ``size`` targets up to ``last`` (its last key), as
    columns (position ``n`` of each is one target; in the order the range was read, key order,
    which nothing relies on beyond ``last``): the latest completed job's id, type and key, and
    its payload and fingerprint where the check reads them (else None). The columns are the
    check's own (``targets.Targets``), which marks a target in flight with the type None."""

    size: int
    last: str
    job_ids: list[str]
    job_types: list[str | None]
    keys: list[str]
    payloads: list[str | None]
    fingerprints: list[str | None]


def count_targets(engine: sa.Engine) -> int:
    """How many targets a check streams: those with a pending, claimed or completed job."""
    with engine.connect().execution_options(**READ_ONLY) as conn:
        return int(conn.execute(COUNT_TARGETS).scalar_one())


class LedgerReads:
    """The reads of one check. ``wanting``: the job types whose payloads the page carries (their
    probes read them in this mode); the others' rows are never read from the table.
    ``fingerprinted``: the job types whose fingerprints it carries (a content check by
    fingerprints: ``Probe.fingerprints``)."""

    def __init__(self, engine: sa.Engine, wanting: Sequence[str], fingerprinted: Sequence[str] = ()) -> None:
        self.engine = engine
        self.backend = drivers.for_engine(engine)
        # The page statement: a page without payloads or fingerprints reads tether_targets alone.
        sql = self.backend.sql
        wide = bool(wanting) or bool(fingerprinted)
        if fingerprinted:
            self._targets = sql.RECONCILE_TARGETS_FINGERPRINTS
        else:
            self._targets = sql.RECONCILE_TARGETS_PAYLOADS if wide else sql.RECONCILE_TARGETS
        self._wanted = {"want": sql.types(wanting)} if wide else {}

    # On the driver cursor, as the hot path: the stream is most of a check's reading.

    def targets(self, after_key: str, limit: int) -> tuple[Page, dict[str, str]]:
        """Up to ``limit`` targets after ``after_key`` that a completed job names, as one ``Page``
        of columns, each target's latest completed job (id, type, key and the payload of a
        ``wanting`` type and, with ``fingerprinted`` types, the fingerprint, of any type); and
        the targets up to the page's last that a job is in flight on, each with its first pending
        or claimed job's id (key -> id). Two statements on one connection: a job that completes
        between them leaves its target decided by the job before it, which the check's second
        look at a disagreeing target (``recheck``) finds, as it finds any job landing mid-check.
        Safe to call from another thread than the check's (``TargetStream`` reads ahead)."""
        sql = self.backend.sql
        with self.backend.read() as cur:
            params = {"after_key": after_key, "limit": limit, **self._wanted}
            if self._wanted:
                params["largest"] = max(1, PAGE_BYTES // limit)
            size, last, *arrays = cur.rows(self._targets, params)[0]
            if not size:
                return Page(0, after_key, [], [], [], [], []), {}
            in_flight = dict(cur.rows(sql.RECONCILE_IN_FLIGHT, {"after_key": after_key, "through": last}))
        columns: list[list[Any]] = [_LOADS(a) if a is not None else [None] * size for a in arrays]
        return Page(size, last, *columns), in_flight

    def in_flight(self, after_key: str, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` targets after ``after_key`` that a job is in flight on, in key order,
        each with its first pending or claimed job's id (key, id): past the last target a
        completed job names, the targets of jobs that have not yet completed once."""
        with self.backend.read() as cur:
            return cur.rows(self.backend.sql.RECONCILE_IN_FLIGHT_AFTER, {"after_key": after_key, "limit": limit})

    def refresh(self, fingerprints: dict[str, str]) -> bool:
        """Record new fingerprints of completed jobs (job id -> fingerprint) whose files a check
        read in sync, in one short write transaction; False (and a ``fingerprints_not_recorded``
        event) when the ledger refused the write (a read-only user): the check still stands."""
        if not fingerprints:
            return True
        return self._record([(self.backend.sql.RECORD_FINGERPRINTS, fingerprints)])

    def clean_dirs(self, parent: str) -> dict[str, str]:
        """The clean leaf directories under ``parent`` (a walk's prefix), name -> fingerprint
        (``clean_dirs.py``)."""
        with self.backend.read() as cur:
            return dict(cur.rows(self.backend.sql.CLEAN_DIRS, {"parent": parent}))

    def keep_clean_dirs(self, clean: list[tuple[str, str, str]], gone: list[tuple[str, str]]) -> bool:
        """Record clean leaf directories (parent, name, fingerprint) and forget others (parent,
        name), in one short write transaction; False as ``refresh``."""
        sql = self.backend.sql
        return self._record([(sql.RECORD_CLEAN_DIRS, clean), (sql.FORGET_CLEAN_DIRS, gone)])

    def _record(self, writes: list[tuple[str, Any]]) -> bool:
        """Each statement of ``writes`` with its rows as one JSON parameter (none for empty
        rows), in one write transaction; a refusal is an event, not an error."""
        params = [(statement, {"rows": orjson.dumps(rows).decode()}) for statement, rows in writes if rows]
        if not params:
            return True

        def write(cur: Any) -> None:
            for statement, rows in params:
                cur.execute(statement, rows)

        try:
            self.backend.transact(write)
        except sa.exc.DBAPIError as e:
            events.emit("fingerprints_not_recorded", reason=" ".join(str(e.orig).split()))
            return False
        return True

    def _read(self, statement: sa.TextClause, params: dict[str, Any]) -> Sequence[Any]:
        with self.engine.connect().execution_options(**READ_ONLY) as conn:
            return conn.execute(statement, params).fetchall()

    def payloads(self, ids: list[str]) -> Iterator[dict[str, str]]:
        """The payloads of jobs, by id, in parts that take no more once they hold PAGE_BYTES, each
        read when the one before is done with; a job removed meanwhile is absent. Their sizes are
        read first, in one statement: the payloads only as each part is wanted."""
        if not ids:
            return
        sizes = self._read(PAYLOAD_SIZES, {"ids": ids})
        part: list[str] = []
        held = 0
        for job_id, size in sizes:
            if held >= PAGE_BYTES:
                yield dict(self._read(PAYLOADS, {"ids": part}))
                part, held = [], 0
            part.append(job_id)
            held += size
        if part:
            yield dict(self._read(PAYLOADS, {"ids": part}))

    def recheck(self, keys: list[str]) -> dict[str, tuple[str | None, int]]:
        """Per target, its latest completed job now and whether one is active now; a target
        without a completed job now is absent."""
        return {key: (latest, active) for key, latest, active in self._read(RECHECK, {"keys": keys})}

    def active_on(self, key: str) -> bool:
        """Whether a job on the target is pending or claimed now."""
        return bool(self._read(ACTIVE_ON, {"key": key}))

    def known(self, keys: Sequence[str]) -> set[str]:
        """The ``keys`` some job has ever named as its target."""
        found: set[str] = set()
        for start in range(0, len(keys), KNOWN_CHUNK):
            found.update(row[0] for row in self._read(KNOWN_TARGETS, {"keys": keys[start : start + KNOWN_CHUNK]}))
        return found

    def type_targeted(self, job_type: str) -> bool:
        """Whether a job of ``job_type`` has ever had a target in this ledger."""
        return bool(self._read(TYPE_TARGETED, {"type": job_type}))
