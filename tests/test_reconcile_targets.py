"""The targets stream: every page size gives each target once, decided by the same job as reading
the whole ledger at once would (its latest completed job, or its first pending or claimed one),
a target with only in-flight jobs included wherever its key falls."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from tether.reconcile.reads import Page
from tether.reconcile.targets import Targets, TargetStream


class PagedRows:
    """A ledger's targets table and in-flight jobs as the page statements read them, without a
    database."""

    def __init__(self, rows: list[tuple[Any, ...]], *, wide: bool, fingerprinted: bool) -> None:
        rows = sorted(rows, key=lambda r: (r[2], r[0]))
        self.latest = {r[2]: r for r in rows if r[1] is not None}  # a later row of a key replaces
        self.first_active: dict[str, str] = {}
        for r in rows:
            if r[1] is None:
                self.first_active.setdefault(r[2], r[0])
        self.wide, self.fingerprinted = wide, fingerprinted

    def targets(self, after_key: str, limit: int) -> tuple[Page, dict[str, str]]:
        rows = [self.latest[key] for key in sorted(self.latest) if key > after_key][:limit]
        if not rows:
            return Page(0, after_key, [], [], [], [], []), {}
        through = rows[-1][2]
        n = len(rows)
        columns = [list(column) for column in zip(*rows, strict=True)]
        payloads = columns[3] if self.wide else [None] * n
        fingerprints = columns[-1] if self.fingerprinted else [None] * n
        page = Page(n, through, columns[0], columns[1], columns[2], payloads, fingerprints)
        return page, {k: i for k, i in sorted(self.first_active.items()) if after_key < k <= through}

    def in_flight(self, after_key: str, limit: int) -> list[tuple[str, str]]:
        return [(k, i) for k, i in sorted(self.first_active.items()) if k > after_key][:limit]


def deciding(mine: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """A target's first active job if there is one, else its latest completed (rows by id)."""
    active = [r for r in mine if r[1] is None]
    return active[0] if active else mine[-1]


def expected(rows: list[tuple[Any, ...]], *, wide: bool, fingerprinted: bool) -> list[tuple[Any, ...]]:
    """Per target, row by row: the first active job if there is one (without payload or
    fingerprint: it is not checked), else the latest completed."""
    out = []
    for key in sorted({r[2] for r in rows}):
        row = deciding(sorted((r for r in rows if r[2] == key), key=lambda r: r[0]))
        checked = row[1] is not None
        payload = row[3] if wide and checked else None
        out.append((row[0], row[1], row[2], payload, row[4] if fingerprinted and checked else None))
    return out


def ledger(seed: int, *, wide: bool, fingerprinted: bool) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    rows = []
    for n in range(rng.randint(0, 60)):
        key = f"file:{rng.choice('abcdefg')}.json"
        job_type = None if rng.random() < 0.2 else rng.choice(["create_file", "delete_file"])
        row = (f"{n:04d}", job_type, key) + ((f"payload {n}",) if wide else ())
        row += (f"fingerprint {n}",) if fingerprinted else ()
        rows.append(row)
    return rows


@pytest.mark.parametrize("columns", ["narrow", "wide", "fingerprinted"])
@pytest.mark.parametrize("seed", range(40))
def test_every_page_size_decides_each_target_by_the_same_job(seed: int, columns: str) -> None:
    wide, fingerprinted = columns != "narrow", columns == "fingerprinted"
    rows = ledger(seed, wide=wide, fingerprinted=fingerprinted)
    for size in (1, 2, 3, 5, 8, 100):
        paged = PagedRows(rows, wide=wide, fingerprinted=fingerprinted)
        stream = TargetStream(paged, size)  # type: ignore[arg-type]  # a stand-in for LedgerReads
        pages = list(stream)
        assert all(isinstance(page, Targets) and len({len(column) for column in page}) == 1 for page in pages)
        found = [target for page in pages for target in zip(*page, strict=True)]  # a target per row
        assert sorted(found, key=lambda t: t[2]) == expected(rows, wide=wide, fingerprinted=fingerprinted), size
        assert len({t[2] for t in found}) == len(found), size
        assert stream.read == len(found)
        assert stream.newest == max((r[0] for r in found), default=None)


class Watched(PagedRows):
    """PagedRows telling which thread read each page, and when the second page's read began."""

    def __init__(self, rows: list[tuple[Any, ...]], *, fail_at: int | None = None) -> None:
        super().__init__(rows, wide=False, fingerprinted=False)
        self.threads: list[str] = []
        self.second_read = threading.Event()
        self.fail_at = fail_at

    def targets(self, after_key: str, limit: int) -> tuple[Page, dict[str, str]]:
        self.threads.append(threading.current_thread().name)
        if len(self.threads) == 2:
            self.second_read.set()
        if len(self.threads) == self.fail_at:
            raise sa.exc.OperationalError("SELECT", {}, Exception("disk I/O error"))
        return super().targets(after_key, limit)


def many_targets(n: int) -> list[tuple[Any, ...]]:
    return [(f"{i:04d}", "create_file", f"file:{i:04d}.json") for i in range(n)]


def test_the_next_page_is_read_on_the_streams_thread_while_the_check_holds_this_one() -> None:
    reads = Watched(many_targets(10))
    pages = iter(TargetStream(reads, 4))  # type: ignore[arg-type]  # a stand-in for LedgerReads
    first = next(pages)
    # Still holding the first page, the check finds the second already being read (not waited
    # for: a stream that read only when asked would never set it here).
    assert reads.second_read.wait(10), "the second page was not read ahead"
    assert first.keys == ["file:0000.json", "file:0001.json", "file:0002.json", "file:0003.json"]
    assert [len(page.keys) for page in pages] == [4, 2]
    assert reads.threads and threading.current_thread().name not in reads.threads


def test_a_failed_read_ahead_is_raised_where_its_page_is_wanted_and_the_reader_ends() -> None:
    reads = Watched(many_targets(10), fail_at=2)
    pages = iter(TargetStream(reads, 4))  # type: ignore[arg-type]
    assert len(next(pages).keys) == 4  # its own read succeeded: the next one's error waits
    with pytest.raises(sa.exc.OperationalError, match="disk I/O error"):
        next(pages)
    assert not [t for t in threading.enumerate() if t.name.startswith("tether-reconcile-read")]


def test_a_check_that_stops_early_leaves_no_reader_behind() -> None:
    reads = Watched(many_targets(10))
    pages = TargetStream(reads, 4)  # type: ignore[arg-type]
    for _ in pages:
        break
    assert not [t for t in threading.enumerate() if t.name.startswith("tether-reconcile-read")]
    assert len(reads.threads) <= 2  # the page given and at most the one read ahead
