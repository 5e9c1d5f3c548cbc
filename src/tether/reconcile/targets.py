"""The targets of a check, streamed from the ledger a page at a time.

Targets are read in key order through ``ix_tether_jobs_targeted``, in short read-only pages, by
one of two reads (``LedgerReads``). Where targets hold a few jobs each, as most ledgers' do, a page
is the next range of jobs (``jobs``), the cheapest read per row; where they hold many, it is the
next targets' deciding jobs alone (``targets``, a skip scan: a few index seeks per target),
which costs the same per target whatever a target's history holds. The stream chooses from the
jobs per target of the last range it read, and reads a range again now and then to see whether
the histories it meets have become short. Memory holds one page either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import compress, islice
from operator import itemgetter, lt
from typing import Any, NamedTuple

from .reads import LedgerReads


class Targets(NamedTuple):
    """A page's targets whose jobs have all been read, as parallel columns (position ``n`` of each
    is one target), in key order: per target, the one job that decides its check: the latest
    completed job, or, while a job on it is pending or claimed, the first such job (its
    ``job_types`` entry None: in flight, not checked). Columns, not an object per target: a
    page's rows become them in C, and the check reads a column at a time."""

    job_ids: list[str]
    job_types: list[str | None]
    keys: list[str]
    payloads: list[str | None]
    """The deciding job's stored payload, when its type's probe reads it in this check; else None."""
    fingerprints: list[str | None]
    """The deciding job's file fingerprint, when its type's probe checks by them in this check
    (``Probe.fingerprints``) and it has one; else None."""

    def select(self, chosen: Iterable[object]) -> Targets:
        """The targets whose entry in ``chosen`` is true, column by column in C."""
        chosen = list(chosen)
        return Targets(
            list(compress(self.job_ids, chosen)),
            list(compress(self.job_types, chosen)),
            list(compress(self.keys, chosen)),
            list(compress(self.payloads, chosen)),
            list(compress(self.fingerprints, chosen)),
        )


Row = tuple[Any, ...]  # a page's row: id, type (None unless completed), key[, payload[, fingerprint]]

# A field of every page row of a list at once, with ``map``: in C, by position.
JOB_ID, JOB_TYPE, KEY, PAYLOAD, FINGERPRINT = map(itemgetter, range(len(Targets._fields)))


DEEP = 6
"""Jobs per target of a range page from which the next pages are skip scans. A skip scan costs
per target about what a range costs for 4 to 15 jobs (SQLite at the low end, PostgreSQL at the
high); either read costs at most about twice the other around here. Skip-scan pages follow only
a full page of at least this many rows, so each holds more than the one target it starts with
(the one the last page left open) and decides at least that one."""
PROBE_EVERY = 8
"""Skip-scan pages between two range pages that check whether targets are still deep. A range
page over deep targets costs a fraction of a skip-scan page (and its targets count), so the check
costs little where every target is deep."""


class TargetStream:
    """The targets of every job that has a target, a list per page (iterate once). ``read`` is
    the number of targets decided so far, ``newest`` the newest of the jobs that decided them."""

    def __init__(self, reads: LedgerReads, batch_size: int) -> None:
        self.reads = reads
        self.batch_size = batch_size
        self.read = 0
        self.newest: str | None = None

    def __iter__(self) -> Iterator[Targets]:
        """A page may end inside a target's jobs: that target's rows are carried into the next
        page, before its rows, until a page ends on another target or the stream ends. A skip-scan
        page starts again from the carried target (``done_key``, the last target decided, is just
        before it) and reads it whole, so what was carried goes."""
        after_key, after_id, done_key = "", "", ""
        carried: Sequence[Row] = []
        skips = 0  # skip-scan pages to read before the next range page
        while True:
            if skips:
                rows, skips = self.reads.targets(done_key, self.batch_size), skips - 1
                pending: Sequence[Row] = rows
            else:
                rows = self.reads.jobs(after_key, after_id, self.batch_size)
                pending = [*carried, *rows]
                skips = PROBE_EVERY if len(rows) >= DEEP * len(set(map(KEY, rows))) > 0 else 0
            if len(rows) < self.batch_size:
                yield self._decided(pending)
                return
            after_id, after_key = rows[-1][0], rows[-1][2]
            done = len(pending)
            while done and pending[done - 1][2] == after_key:
                done -= 1
            carried = deciding_rows(pending[done:])
            done_key = pending[done - 1][2] if done else done_key
            ready = self._decided(pending[:done])
            del rows, pending  # the page's rows go before its targets are checked: fewer live objects
            yield ready

    def _decided(self, rows: Sequence[Row]) -> Targets:
        """The targets of ``rows``, counted."""
        targets = self._targets(rows)
        if targets.job_ids:
            self.read += len(targets.job_ids)
            newest = max(targets.job_ids)
            self.newest = newest if self.newest is None else max(self.newest, newest)
        return targets

    def _targets(self, rows: Sequence[Row]) -> Targets:
        """The deciding rows of ``rows`` (as ``deciding_rows``) as columns, made in C; a page that
        carries no payloads (fingerprints) gets a column of None. Where each row decides its target (most
        pages), the columns read to find that out are the targets' own: each is read once."""
        keys, types = list(map(KEY, rows)), list(map(JOB_TYPE, rows))
        if not each_decides(keys, types):
            rows = deciding_rows(rows)
            keys, types = list(map(KEY, rows)), list(map(JOB_TYPE, rows))
        payloads = list(map(PAYLOAD, rows)) if self.reads.wide else [None] * len(rows)
        fingerprints = list(map(FINGERPRINT, rows)) if self.reads.fingerprinted else [None] * len(rows)
        return Targets(list(map(JOB_ID, rows)), types, keys, payloads, fingerprints)


def each_decides(keys: Sequence[str], types: Sequence[str | None]) -> bool:
    """Whether each row of a run ordered by key decides its own target, from its columns: none is
    in flight and each has another key (compared in C)."""
    return None not in types and all(map(lt, keys, islice(keys, 1, None)))


def deciding_rows(rows: Sequence[Row]) -> Sequence[Row]:
    """The row that decides each target of ``rows`` (ordered by key and then id, each target's
    rows all there), in key order: its last row, unless one is active (its type is None); then
    its first active one."""
    keys, types = list(map(KEY, rows)), list(map(JOB_TYPE, rows))
    if each_decides(keys, types):
        return rows
    active = None in types
    deciding = dict(zip(keys, rows, strict=True))  # later rows of a key replace earlier ones, in C
    if active:
        first = [row for row in reversed(rows) if row[1] is None]  # the first last, so it stays
        deciding.update(zip(map(KEY, first), first, strict=True))
    return list(deciding.values())
