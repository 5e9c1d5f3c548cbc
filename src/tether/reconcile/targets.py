"""The targets of a check, streamed from the ledger a page at a time.

A page is the next range of ``tether_targets`` (``LedgerReads.targets``): one row per target
that a completed job names, its latest completed job, whatever history the target holds; with
it come the page's targets that a job is in flight on, which that job decides instead. Past the
last such range, the targets only in-flight jobs name (``LedgerReads.in_flight``). Memory holds
one page.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import compress
from typing import Any, NamedTuple

from .reads import LedgerReads


class Targets(NamedTuple):
    """A page's targets as parallel columns (position ``n`` of each is one target), in key order
    (those no job has completed on yet after the others): per target, the one job that decides
    its check: the latest completed job, or, while a job on it is pending or claimed, the first
    such job (its ``job_types`` entry None: in flight, not checked). Columns, not an object per target: a
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


Row = tuple[Any, ...]  # a page's row: id, type (None: in flight), key[, payload[, fingerprint]]


class TargetStream:
    """The targets of every job that has a target, a list per page (iterate once). ``read`` is
    the number of targets decided so far, ``newest`` the newest of the jobs that decided them."""

    def __init__(self, reads: LedgerReads, batch_size: int) -> None:
        self.reads = reads
        self.batch_size = batch_size
        self.read = 0
        self.newest: str | None = None

    def __iter__(self) -> Iterator[Targets]:
        after_key = ""
        while True:
            rows, in_flight = self.reads.targets(after_key, self.batch_size)
            if rows:
                after_key = rows[-1][2]
                yield self._decided(rows, in_flight)
            if len(rows) < self.batch_size:
                break
        while True:  # the targets whose jobs have yet to complete once
            only = self.reads.in_flight(after_key, self.batch_size)
            if only:
                after_key = only[-1][0]
                yield self._decided([], dict(only))
            if len(only) < self.batch_size:
                return

    def _decided(self, rows: Sequence[Row], in_flight: dict[str, str]) -> Targets:
        """The targets of ``rows`` (latest completed jobs) and ``in_flight`` (key -> the first
        active job), counted."""
        targets = self._targets(rows, in_flight)
        if targets.job_ids:
            self.read += len(targets.job_ids)
            newest = max(targets.job_ids)
            self.newest = newest if self.newest is None else max(self.newest, newest)
        return targets

    def _targets(self, rows: Sequence[Row], in_flight: dict[str, str]) -> Targets:
        """Columns made in C, by one transposition of the rows (``zip``: a field a step, where a
        pass of ``map`` per column costs a call a field); a page that carries no payloads
        (fingerprints) gets a column of None. A target in flight is decided by its active job
        (type None): in its row's place, or, for one no job has completed on, after the page's
        others (in key order among them). Its row is as wide as any: ``zip`` stops at the
        narrowest, the statement's."""
        if in_flight:
            pending = dict(in_flight)
            rows = [(pending.pop(row[2]), None, row[2], None, None) if row[2] in pending else row for row in rows]
            rows += [(job_id, None, key, None, None) for key, job_id in pending.items()]
        if not rows:
            return Targets([], [], [], [], [])
        columns = list(map(list, zip(*rows, strict=False)))
        payloads = columns[3] if self.reads.wide else [None] * len(rows)
        fingerprints = columns[4] if self.reads.fingerprinted else [None] * len(rows)
        return Targets(columns[0], columns[1], columns[2], payloads, fingerprints)
