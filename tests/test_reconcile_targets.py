"""The targets stream: every page size gives each target once, decided by the same job as reading
the whole ledger at once would (its latest completed job, or its first pending or claimed one)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tether.reconcile.targets import Targets, TargetStream


class PagedRows:
    """A ledger's target index as the page statement reads it, without a database."""

    def __init__(self, rows: list[tuple[Any, ...]], *, wide: bool, fingerprinted: bool) -> None:
        self.rows, self.wide, self.fingerprinted = sorted(rows, key=lambda r: (r[2], r[0])), wide, fingerprinted

    def jobs(self, after_key: str, after_id: str, limit: int) -> list[tuple[Any, ...]]:
        return [r for r in self.rows if (r[2], r[0]) > (after_key, after_id)][:limit]

    def targets(self, after_key: str, limit: int) -> list[tuple[Any, ...]]:
        """Each target's deciding row, as the skip scan reads it."""
        keys = sorted({r[2] for r in self.rows if r[2] > after_key})[:limit]
        return [deciding([r for r in self.rows if r[2] == key]) for key in keys]


def deciding(mine: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """A target's first active job if there is one, else its latest completed (rows by id)."""
    active = [r for r in mine if r[1] is None]
    return active[0] if active else mine[-1]


def expected(rows: list[tuple[Any, ...]], *, wide: bool, fingerprinted: bool) -> list[tuple[Any, ...]]:
    """Per target, row by row: the first active job if there is one, else the latest completed."""
    out = []
    for key in sorted({r[2] for r in rows}):
        row = deciding(sorted((r for r in rows if r[2] == key), key=lambda r: r[0]))
        out.append((row[0], row[1], row[2], row[3] if wide else None, row[4] if fingerprinted else None))
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
        assert found == expected(rows, wide=wide, fingerprinted=fingerprinted), size
        assert stream.read == len(found)
        assert stream.newest == max((r[0] for r in found), default=None)
