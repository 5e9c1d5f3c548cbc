"""The targets of a check, streamed from the ledger a page at a time.

Each target's deciding job is read in key order through ``ix_tether_jobs_targeted``, in short
read-only batches of targets (RECONCILE_PAGE in the statement catalogue): one row per target,
however many jobs its history holds, so neither time per target nor memory grows with the
number of jobs.
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


class TargetStream:
    """The targets of every job that has a target, a list per page (iterate once). ``read`` is
    the number of rows (targets) read so far, ``newest`` the newest job id among them."""

    def __init__(self, reads: LedgerReads, batch_size: int) -> None:
        self.reads = reads
        self.batch_size = batch_size
        self.read = 0
        self.newest: str | None = None

    def __iter__(self) -> Iterator[Targets]:
        """A target's jobs may run past a page's end: its deciding row is carried into the next
        page, before that page's rows, until a page ends on another target or the stream ends."""
        after_key, after_id = "", ""
        carried: Sequence[Row] = []
        while True:
            rows = self.reads.page(after_key, after_id, self.batch_size)
            self.read += len(rows)
            if rows:
                after_id, after_key = rows[-1][0], rows[-1][2]
                newest = max(map(JOB_ID, rows))
                self.newest = newest if self.newest is None else max(self.newest, newest)
            pending = [*carried, *rows]
            if len(rows) < self.batch_size:
                yield self._targets(pending)
                return
            done = len(pending)
            while done and pending[done - 1][2] == after_key:
                done -= 1
            carried = deciding_rows(pending[done:])
            ready = self._targets(pending[:done])
            del rows, pending  # the page's rows go before its targets are checked: fewer live objects
            yield ready

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
