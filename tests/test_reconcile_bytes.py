"""A check holds a bounded amount of payload however large the files: each page of targets, and
each part of the payloads read by id, carries at most PAGE_BYTES of them (one larger payload
alone), and every target is still checked once."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tether import Coordinator, CreateFile
from tether.reconcile import reads
from tether.reconcile.check import reconcile
from tether.reconcile.reads import PAYLOADS, LedgerReads
from tether.testing import drain

BUDGET = 2500
SIZES = [1000] * 7 + [4000] + [1000] * 3  # one payload larger than a page's budget, alone


@pytest.fixture
def coordinator(db_url: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Coordinator]:
    """Eleven files written by their jobs (payloads of about SIZES bytes), the 11th's target with a
    job pending on it too; a page's budget of BUDGET bytes."""
    monkeypatch.setattr(reads, "PAGE_BYTES", BUDGET)
    with Coordinator.open(db_url, root=root) as c:
        c.enqueue_many([CreateFile(path=f"f/{n:02d}.json", text="x" * size) for n, size in enumerate(SIZES)])
        drain(c)
        c.enqueue(CreateFile(path="f/10.json", text="later"), delay=timedelta(hours=1))
        yield c


def edited(c: Coordinator, name: str) -> None:
    """Change a file's bytes in place, keeping its size."""
    path = c.root / "f" / name
    data = bytearray(path.read_bytes())
    data[-2] = ord("y")
    path.write_bytes(bytes(data))


def page_payloads(monkeypatch: pytest.MonkeyPatch, limits: list[int]) -> list[list[str | None]]:
    """The payloads of each page the check reads from now on; ``limits`` gets the number of
    targets each page asked for."""
    pages: list[list[str | None]] = []
    real = LedgerReads.targets

    def targets(self: LedgerReads, after_key: str, limit: int) -> Any:
        limits.append(limit)
        page, in_flight = real(self, after_key, limit)
        if page.size:
            pages.append(page.payloads)
        return page, in_flight

    monkeypatch.setattr(LedgerReads, "targets", targets)
    return pages


def parts_read(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The payloads of each read of payloads by id from now on."""
    parts: list[list[str]] = []
    real = LedgerReads._read

    def read(self: LedgerReads, statement: sa.TextClause, params: dict[str, Any]) -> Any:
        rows = real(self, statement, params)
        if statement is PAYLOADS:
            parts.append([payload for _, payload in sorted(rows)])  # in the order the sizes cut them
        return rows

    monkeypatch.setattr(LedgerReads, "_read", read)
    return parts


def within_budget(groups: list[list[Any]]) -> bool:
    """Each group's payloads before its last add up to less than the budget: it took the next
    one only while it held less."""
    return all(sum(len(p or "") for p in group[:-1]) < BUDGET for group in groups)


def test_a_full_check_reads_pages_of_bounded_payload_bytes_and_still_checks_every_target(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = coordinator
    limits: list[int] = []
    pages = page_payloads(monkeypatch, limits)
    report = reconcile(c, content=True, full=True)
    assert report.counts["in_sync"] == 10 and [f.path for f in report.findings] == ["f/10.json"]  # in flight
    assert [len(page) for page in pages] == [3, 3, 2, 2, 1] and within_budget(pages), [
        [len(p or "") for p in page] for page in pages
    ]
    # The first page asks for FIRST_PAGE; after one cut short, as many as it held; after one
    # that was not, twice as many.
    assert limits == [64, 3, 6, 2, 4]
    edited(c, "03.json")
    edited(c, "07.json")
    report = reconcile(c, content=True, full=True)
    assert sorted((f.path, f.status) for f in report.findings if f.status == "modified") == [
        ("f/03.json", "modified"),
        ("f/07.json", "modified"),
    ]


def test_a_check_by_fingerprints_reads_the_payloads_of_the_files_it_reads_in_parts_of_bounded_bytes(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No file has a fingerprint (as after an upgrade): the check reads them all, their payloads
    by id a part at a time, and records the new fingerprints of each part in a transaction of its
    own (a fingerprint recorded rewrites its job's row, payload and all)."""
    c = coordinator
    with c.engine.begin() as conn:
        conn.execute(sa.text("UPDATE tether_jobs SET fingerprint = NULL"))
    edited(c, "07.json")
    parts = parts_read(monkeypatch)
    recorded: list[int] = []
    real_refresh = LedgerReads.refresh
    monkeypatch.setattr(
        LedgerReads, "refresh", lambda self, renewed: recorded.append(len(renewed)) or real_refresh(self, renewed)
    )
    report = reconcile(c, content=True)
    assert report.counts["in_sync"] == 9
    assert [(f.path, f.status) for f in report.findings] == [("f/07.json", "modified"), ("f/10.json", "not_checked")]
    assert [len(part) for part in parts] == [3, 3, 2, 2] and within_budget(parts), [
        [len(p) for p in part] for part in parts
    ]
    assert recorded == [3, 3, 1, 2]  # all but the edited file, a part at a time
