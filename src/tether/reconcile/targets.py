"""The targets of a check, streamed from the ledger a page at a time.

A page is the next range of ``tether_targets`` (``LedgerReads.targets``): one row per target
that a completed job names, its latest completed job, whatever history the target holds; with
it come the page's targets that a job is in flight on, which that job decides instead. Past the
last such range, the targets only in-flight jobs name (``LedgerReads.in_flight``). Memory holds
two pages: the one being checked and the one read ahead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import compress
from typing import NamedTuple

from .reads import LedgerReads, Page


class Targets(NamedTuple):
    """A page's targets as parallel columns (position ``n`` of each is one target), in key order
    (those no job has completed on yet after the others): per target, the one job that decides
    its check: the latest completed job, or, while a job on it is pending or claimed, the first
    such job (its ``job_types`` entry None: in flight, not checked). Columns, not an object per target: a
    page's JSON arrays become them in C, and the check reads a column at a time."""

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


class TargetStream:
    """The targets of every job that has a target, a list per page (iterate once). ``read`` is
    the number of targets decided so far, ``newest`` the newest of the jobs that decided them.

    While the check looks at one page's targets, a thread of the stream reads the next page: the
    ledger's part of a page (the statement's one step, ``LedgerReads.targets``) runs on the
    other core without the interpreter's lock, beside the check's stats. At most one page is
    read ahead; the thread ends with the stream, a read's error is raised where the page is
    wanted."""

    def __init__(self, reads: LedgerReads, batch_size: int) -> None:
        self.reads = reads
        self.batch_size = batch_size
        self.read = 0
        self.newest: str | None = None

    def __iter__(self) -> Iterator[Targets]:
        after_key = ""
        with ThreadPoolExecutor(1, thread_name_prefix="tether-reconcile-read") as reader:
            ahead = reader.submit(self.reads.targets, after_key, self.batch_size)
            while True:
                page, in_flight = ahead.result()
                full = page.size == self.batch_size
                if full:
                    ahead = reader.submit(self.reads.targets, page.last, self.batch_size)
                if page.size:
                    after_key = page.last
                    yield self._decided(page, in_flight)
                if not full:
                    break
        while True:  # the targets whose jobs have yet to complete once
            only = self.reads.in_flight(after_key, self.batch_size)
            if only:
                after_key = only[-1][0]
                yield self._decided(Page(0, after_key, [], [], [], [], []), dict(only))
            if len(only) < self.batch_size:
                return

    def _decided(self, page: Page, in_flight: dict[str, str]) -> Targets:
        """The targets of ``page`` (latest completed jobs) and ``in_flight`` (key -> the first
        active job), counted."""
        targets = _targets(page, in_flight)
        if targets.job_ids:
            self.read += len(targets.job_ids)
            newest = max(targets.job_ids)
            self.newest = newest if self.newest is None else max(self.newest, newest)
        return targets


def _targets(page: Page, in_flight: dict[str, str]) -> Targets:
    """The page's columns as the check's targets. A target in flight is decided by its active
    job (type None): in its place in the page, or, for one no job has completed on, after the
    page's others (in key order among them)."""
    targets = Targets(page.job_ids, page.job_types, page.keys, page.payloads, page.fingerprints)
    if not in_flight:
        return targets
    pending = dict(in_flight)
    for n, key in enumerate(page.keys):
        job_id = pending.pop(key, None)
        if job_id is not None:
            targets.job_ids[n], targets.job_types[n] = job_id, None
            targets.payloads[n] = targets.fingerprints[n] = None
    for key, job_id in pending.items():
        targets.job_ids.append(job_id)
        targets.job_types.append(None)
        targets.keys.append(key)
        targets.payloads.append(None)
        targets.fingerprints.append(None)
    return targets
