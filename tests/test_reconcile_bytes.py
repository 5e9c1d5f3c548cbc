"""A check holds a bounded amount of payload however large the files: a page of ``limit`` targets
carries only the payloads of at most PAGE_BYTES / limit bytes, the larger ones are read by id in
parts that take no more once they hold PAGE_BYTES, and every target is still checked once."""

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
PAGE = 10  # targets a page: it carries payloads of at most 250 bytes
SIZES = [50, 1000, 50, 1000, 1000, 4000, 50, 1000, 1000, 50, 1000]  # the texts; a payload is 48 bytes more


@pytest.fixture(params=["sized", "enqueued before payload_bytes"])
def coordinator(
    request: pytest.FixtureRequest, db_url: str, root: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Coordinator]:
    """Eleven files written by their jobs (texts of SIZES characters), the 11th's target with a job
    pending on it too; PAGE_BYTES of BUDGET. Their payloads' sizes recorded, or not (jobs
    enqueued before tether kept them: their lengths stand in)."""
    monkeypatch.setattr(reads, "PAGE_BYTES", BUDGET)
    with Coordinator.open(db_url, root=root) as c:
        c.enqueue_many([CreateFile(path=f"f/{n:02d}.json", text="x" * size) for n, size in enumerate(SIZES)])
        drain(c)
        c.enqueue(CreateFile(path="f/10.json", text="later"), delay=timedelta(hours=1))
        if request.param != "sized":
            with c.engine.begin() as conn:
                conn.execute(sa.text("UPDATE tether_jobs SET payload_bytes = NULL"))
        yield c


def edited(c: Coordinator, name: str) -> None:
    """Change a file's bytes in place, keeping its size."""
    path = c.root / "f" / name
    data = bytearray(path.read_bytes())
    data[-2] = ord("y")
    path.write_bytes(bytes(data))


def page_payloads(monkeypatch: pytest.MonkeyPatch) -> list[list[str | None]]:
    """The payloads each page the check reads from now on carries."""
    pages: list[list[str | None]] = []
    real = LedgerReads.targets

    def targets(self: LedgerReads, after_key: str, limit: int) -> Any:
        page, in_flight = real(self, after_key, limit)
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


def test_a_full_check_carries_the_small_payloads_with_their_page_and_reads_the_large_in_parts(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = coordinator
    pages = page_payloads(monkeypatch)
    parts = parts_read(monkeypatch)
    report = reconcile(c, content=True, full=True, batch_size=PAGE)
    assert report.counts["in_sync"] == 10 and [f.path for f in report.findings] == ["f/10.json"]  # in flight
    carried = [[len(p) for p in page if p is not None] for page in pages]
    assert carried == [[98] * 4, []], carried  # f/00, 02, 06, 09; then the page of f/10 (in flight)
    assert [[len(p) for p in part] for part in parts] == [[1048] * 3, [4048], [1048] * 2]
    edited(c, "03.json")
    edited(c, "06.json")
    report = reconcile(c, content=True, full=True, batch_size=PAGE)
    assert sorted((f.path, f.status) for f in report.findings if f.status == "modified") == [
        ("f/03.json", "modified"),
        ("f/06.json", "modified"),
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
    assert [len(part) for part in parts] == [5, 1, 4] and within_budget(parts), [
        [len(p) for p in part] for part in parts
    ]
    assert recorded == [5, 1, 3]  # all but the edited file, a part at a time
