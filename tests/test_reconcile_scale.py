"""The reconciler at scale and under load: 10,000 jobs, a worker running alongside, query plans."""

from __future__ import annotations

import gc
import os
import re
import shutil
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from unittest.mock import ANY

import orjson
import pytest
import sqlalchemy as sa

from tether import Coordinator, CreateFile, DeleteFile, SystemClock
from tether.cli.reconcile import check_main
from tether.jobtypes import create_file, render
from tether.jobtypes.datafiles import existence, fingerprint
from tether.jobtypes.target import file_key
from tether.ledger import backend
from tether.ledger.catalogue import SQLITE
from tether.ledger.ids import new_id
from tether.ledger.schema import jobs as jobs_table
from tether.reconcile import check
from tether.reconcile.check import reconcile
from tether.reconcile.reads import ACTIVE_ON, COUNT_TARGETS, KNOWN_TARGETS, PAYLOADS, RECHECK, LedgerReads


def completed_rows(coordinator: Coordinator, payloads: list, *, files: bool = True) -> None:
    """Record ``payloads`` as completed jobs in one bulk insert and make the disk agree, the way
    a worker would have left it (ids in order, so the last job on a path is its expectation).
    A real worker runs ~150 jobs/s here (two fsyncs each); this builds 10,000 in a second."""
    now = coordinator.clock.now()
    rows = []
    for p in payloads:
        rows.append(
            {
                "id": new_id(now),
                "type": p.job_type,
                "payload": p.to_json().decode(),
                "status": "completed",
                "priority": 0,
                "attempts": 1,
                "max_attempts": 3,
                "created_at": now,
                "run_at": now,
                "claimed_at": now,
                "completed_at": now,
                "ordering_key": file_key(p.path),
            }
        )
        if not files:
            continue
        target = coordinator.root / p.path
        if isinstance(p, CreateFile):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(render(p))
        else:
            target.unlink(missing_ok=True)
    with coordinator.engine.begin() as conn:
        conn.execute(sa.insert(jobs_table), rows)


@pytest.fixture
def fast_root(tmp_path: Path):
    """A data root in memory (tmpfs) where there is one: creating 10,000 files on this shared
    disk takes ~15 s, on tmpfs well under one."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path / "data"
        return
    path = Path(tempfile.mkdtemp(prefix="tether-reconcile-", dir=shm))
    yield path / "data"
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sqlite_coordinator(tmp_path: Path, fast_root: Path):
    c = Coordinator.open(f"sqlite:///{tmp_path / 'ledger' / 'tether.db'}", root=fast_root)
    yield c
    c.close()


def test_ten_thousand_completed_jobs_in_sync_report_zero_drift_and_exit_0(
    sqlite_coordinator: Coordinator, capsys: pytest.CaptureFixture[str]
) -> None:
    c = sqlite_coordinator
    creates = [CreateFile(path=f"d{i % 100}/{i}.json", content={"i": i, "tags": ["a", "b"]}) for i in range(8000)]
    rewrites = [
        CreateFile(path=f"d{i % 100}/{i}.json", content={"i": i, "v": 2}, overwrite=True) for i in range(0, 8000, 8)
    ]
    deletes = [DeleteFile(path=f"d{i % 100}/{i}.json") for i in range(4, 8000, 8)]
    completed_rows(c, creates + rewrites + deletes)
    # ... and the last few by a real worker, so the store is not only hand-made.
    c.enqueue_many([CreateFile(path=f"real/{i}.json", content=i) for i in range(50)])
    assert c.run_until_idle() == 50
    jobs = len(creates) + len(rewrites) + len(deletes) + 50
    assert jobs == 10_050

    started = time.perf_counter()
    report = reconcile(c)
    elapsed = time.perf_counter() - started
    assert report.drift == 0 and report.findings == [] and report.exit_code == 0
    assert report.counts["in_sync"] == 8050
    assert elapsed < 10, f"10,000 jobs took {elapsed:.1f}s"

    with pytest.raises(SystemExit) as exit_:
        check_main(["--db", str(c.engine.url), "--root", str(c.root), "--json", "--quiet"])
    assert exit_.value.code == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["counts"]["in_sync"] == 8050 and out["drift"] == 0 and out["findings"] == []


def test_reconciling_while_a_worker_runs_jobs_reports_no_false_drift(tmp_path: Path) -> None:
    c = Coordinator.open(
        f"sqlite:///{tmp_path / 'tether.db'}", root=tmp_path / "data", clock=SystemClock(), durability="normal"
    )
    try:
        # Each p/ path is created, rewritten, deleted and created again: every state changes under
        # the check; the q/ paths are written once, first, so some paths settle early.
        payloads: list = [CreateFile(path=f"q/{n}.json", content=n) for n in range(10)]
        for round_ in range(4):
            for n in range(25):
                path = f"p/{n}.json"
                payloads.append(
                    DeleteFile(path=path)
                    if round_ == 2
                    else CreateFile(path=path, content={"n": n, "round": round_}, overwrite=True)
                )
        c.enqueue_many(payloads)
        worker = c.worker(threads=2, poll_interval=0.005)
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        reports = []
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                reports.append(report := reconcile(c))
                assert report.drift == 0 and report.counts["unknown"] == 0, report.findings
                if report.counts["not_checked"] == 0 and report.counts["in_sync"] == 35:
                    break
        finally:
            worker.stop()
            thread.join(30)
        assert not thread.is_alive()
        assert any(r.counts["not_checked"] and r.counts["in_sync"] for r in reports), (
            "no check overlapped the worker: the test proved nothing"
        )
        final = reconcile(c)
        assert final.counts["in_sync"] == 35 and final.findings == []
    finally:
        c.close()


@pytest.mark.parametrize("full", [False, True])
def test_a_job_that_lands_between_the_ledger_read_and_the_disk_read_is_in_flight_not_drift(
    sqlite_coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch, full: bool
) -> None:
    """The race the re-check closes, made deterministic: a delete job runs and completes after
    the reconciler read the ledger and before it looks at the disk (its stats by fingerprints,
    or its reads of every file)."""
    c = sqlite_coordinator
    c.enqueue(CreateFile(path="a.json", content=1))
    c.enqueue(CreateFile(path="b.json", content=2))
    c.run_until_idle()

    def delete_a() -> None:
        c.enqueue(DeleteFile(path="a.json"))
        assert c.run_until_idle() == 1

    if full:
        probe = create_file.CreateFileProbe
        real_check_many = probe.check_many

        def check_after_a_delete_lands(self, items, root, *, content):
            if ("file:a.json", ANY) in items:
                delete_a()
            return real_check_many(self, items, root, content=content)

        monkeypatch.setattr(probe, "check_many", check_after_a_delete_lands)
    else:
        real_compare = fingerprint.compare

        def compare_after_a_delete_lands(root, rels, recorded):
            if "a.json" in rels:
                delete_a()
            return real_compare(root, rels, recorded)

        monkeypatch.setattr(fingerprint, "compare", compare_after_a_delete_lands)
    report = reconcile(c, full=full)
    assert {f.path: f.status for f in report.findings} == {"a.json": "not_checked"}
    assert report.drift == 0
    monkeypatch.undo()
    assert reconcile(c).findings == [], "the next check sees the delete as the expectation"


def pages_read(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Each page the reconciler reads from now on: the read (``targets`` or ``in_flight``) and
    its rows (of a ``targets`` page: the targets a completed job names)."""
    pages: list[tuple[str, int]] = []
    for name in ("targets", "in_flight"):
        real = getattr(LedgerReads, name)

        def counted(self: LedgerReads, *args: object, _real=real, _name=name) -> object:
            found = _real(self, *args)
            pages.append((_name, found[0].size if _name == "targets" else len(found)))
            return found

        monkeypatch.setattr(LedgerReads, name, counted)
    return pages


def test_the_ledger_is_read_in_bounded_batches(sqlite_coordinator: Coordinator, monkeypatch) -> None:
    """Streaming: no read returns more than batch_size targets (peak memory itself:
    benchmarks/reconcile.py); progress counts the targets decided."""
    c = sqlite_coordinator
    completed_rows(c, [CreateFile(path=f"m/{i}.json", content=i) for i in range(3000)], files=False)
    pages = pages_read(monkeypatch)
    reads: list[int] = []
    report = reconcile(c, content=False, batch_size=500, progress=reads.append)
    assert pages == [("targets", 500)] * 6 + [("targets", 0), ("in_flight", 0)]
    assert reads == [500, 1000, 1500, 2000, 2500, 3000]
    assert report.counts["missing"] == 3000


PARAMS = {
    "after_key": "file:m/1.json",
    "through": "file:m/9.json",
    "limit": 500,
    "key": "file:m/1.json",
    "keys": ["file:m/1.json", "file:m/2.json"],
    "ids": ["0" * 26, "1" * 26],
    "want": '["create_file", "sync_aws"]',
    "largest": 8192,
}


def to_qmark(sql: str) -> tuple[str, list]:
    """``:name`` binds as sqlite3 ``?`` with PARAMS (a list expands to ``(?, ?)``)."""
    args: list = []

    def bind(match: re.Match[str]) -> str:
        value = PARAMS[match[1]]
        if isinstance(value, list):
            args.extend(value)
            return "(" + ", ".join("?" * len(value)) + ")"
        args.append(value)
        return "?"

    return re.sub(r"(?<!:):(\w+)", bind, sql), args


_OWN_ROWS = ("SCAN CONSTANT ROW",)
_TARGETS_RANGE = "SEARCH tether_targets USING PRIMARY KEY (key>?)"
_TARGETS_RANGE_T = "SEARCH t USING PRIMARY KEY (key>?)"


@pytest.mark.parametrize(
    "name, statement, index",
    [
        ("targets", SQLITE.RECONCILE_TARGETS, _TARGETS_RANGE),  # one range of tether_targets alone
        ("targets_payloads", SQLITE.RECONCILE_TARGETS_PAYLOADS, _TARGETS_RANGE_T),
        ("targets_fingerprints", SQLITE.RECONCILE_TARGETS_FINGERPRINTS, _TARGETS_RANGE_T),
        ("in_flight", SQLITE.RECONCILE_IN_FLIGHT, "ix_tether_jobs_target_active"),
        ("in_flight_after", SQLITE.RECONCILE_IN_FLIGHT_AFTER, "ix_tether_jobs_target_active"),
        ("payloads", PAYLOADS, "sqlite_autoindex_tether_jobs_1"),
        ("recheck", RECHECK, "ix_tether_jobs_target_active"),
        ("active_on", ACTIVE_ON, "ix_tether_jobs_target_active"),
        ("known_targets", KNOWN_TARGETS, "ix_tether_jobs_on_target"),
        ("count_targets", COUNT_TARGETS, "ix_tether_jobs_target_active"),
    ],
)
def test_reconcile_queries_neither_scan_nor_sort(sqlite_coordinator: Coordinator, name, statement, index) -> None:
    c = sqlite_coordinator
    completed_rows(
        c, [CreateFile(path=f"m/{i % 300}.json", content=i, overwrite=True) for i in range(3000)], files=False
    )
    c.enqueue_many(
        [CreateFile(path=f"m/{i}.json", content=i, overwrite=True) for i in range(0, 300, 3)], delay=timedelta(hours=1)
    )
    sql, args = to_qmark(statement if isinstance(statement, str) else statement.text)
    with c.engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE")
        raw = conn.connection.driver_connection
        assert raw is not None
        steps = [row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + sql, args)]
    # The wanted types' JSON array is walked (once, into the IN list), never the table; the
    # count of targets counts tether_targets' rows (one row per target), as a check reads them.
    counted = "SCAN tether_targets" if name == "count_targets" else None
    # A page's own rows, made by the range below in key order, feed its aggregates: "SCAN (subquery-N)".
    scans = [
        s
        for s in steps
        if s.startswith("SCAN") and s not in (*_OWN_ROWS, counted) and "json_each" not in s and "(subquery-" not in s
    ]
    assert not scans, f"{name} scans: {steps}"
    sorts = [s for s in steps if "TEMP B-TREE" in s and not (name == "count_targets" and "DISTINCT" in s)]
    assert not sorts, f"{name} sorts: {steps}"
    assert any(index in s for s in steps), f"{name} does not use {index}: {steps}"


# -- what a check reads ---------------------------------------------------------------------------


def test_a_check_reads_one_row_per_target_however_long_its_history(coordinator: Coordinator, monkeypatch) -> None:
    """300 completed jobs on 3 targets, then 2 pending on one of them: the check reads each
    target's deciding job alone (its latest completed one, or its first pending one): 3 rows in
    all, not 302."""
    c = coordinator
    completed_rows(c, [CreateFile(path=f"m/{i % 3}.json", content=i, overwrite=True) for i in range(300)])
    first, _ = c.enqueue_many(
        [CreateFile(path="m/1.json", content=n, overwrite=True) for n in (-1, -2)], delay=timedelta(hours=1)
    )
    pages = pages_read(monkeypatch)
    seen: list[int] = []
    report = reconcile(c, content=True, batch_size=2, progress=seen.append)
    assert pages == [("targets", 2), ("targets", 1), ("in_flight", 0)]
    assert seen == [2, 3] and report.counts["in_sync"] == 2
    [in_flight] = [f for f in report.findings if f.status == "not_checked"]
    assert (in_flight.path, in_flight.job_id) == ("m/1.json", first.id)


@pytest.mark.parametrize("content", [False, True])
def test_each_in_flight_target_is_decided_by_its_first_active_job_wherever_pages_end(
    coordinator: Coordinator, content: bool
) -> None:
    """The active jobs are read once per page, as a range of keys: a target in flight is one
    whichever place it has in its page (first, last, alone), one with only active jobs too
    (between targets with completed jobs, or after them all), and one whose older job was put
    back to pending behind a newer completed one (a manual retry): each is decided by its first
    active job, at every page size."""
    c = coordinator
    completed_rows(c, [CreateFile(path=f"m/{i % 12:02d}.json", content=i, overwrite=True) for i in range(48)])
    first: dict[str, str] = {}
    for path in [f"m/{t:02d}.json" for t in (0, 3, 4, 7, 11, 12)] + ["m/06-new.json"]:
        jobs = c.enqueue_many(
            [CreateFile(path=path, content=-n, overwrite=True) for n in (1, 2)], delay=timedelta(hours=1)
        )
        first[path] = jobs[0].id
    with c.engine.begin() as conn:  # target 5's oldest completed job, back to pending
        oldest = conn.execute(
            sa.text("SELECT min(id) FROM tether_jobs WHERE ordering_key = :k"), {"k": file_key("m/05.json")}
        ).scalar_one()
        conn.execute(sa.text("UPDATE tether_jobs SET status = 'pending' WHERE id = :id"), {"id": oldest})
    first["m/05.json"] = oldest
    for size in (1, 2, 3, 4, 7, 100):
        report = reconcile(c, content=content, batch_size=size)
        in_flight = {f.path: f.job_id for f in report.findings if f.status == "not_checked"}
        assert in_flight == first, f"batch size {size}"
        assert report.counts["in_sync"] == 12 - 6 and len(report.findings) == len(first), f"batch size {size}"
        # Said to be in flight, also on a page of nothing else (size 1), not of an unknown type.
        assert {f.detail for f in report.findings} == {"a job on this path is pending or claimed"}, f"size {size}"


def test_an_existence_check_reads_no_payload_of_a_type_whose_probe_does_not_want_one(
    sqlite_coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sync_aws's probe reads payloads in either mode; create_file's not when checking existence:
    the file jobs' rows are not read for it (the page holds NULL for them)."""
    c = sqlite_coordinator
    aws_probe = c.registry.get("sync_aws").probe
    assert aws_probe is not None and aws_probe.wants_payload(content=False)
    completed_rows(c, [CreateFile(path=f"m/{i}.json", content=i) for i in range(50)])
    pages: list[list] = []
    real_rows = backend._Cursor.rows

    def rows(self: backend._Cursor, statement: str, params: dict | None = None) -> list:
        found = real_rows(self, statement, params)
        if "FROM tether_targets" in statement:  # a page of the stream
            pages.append(found)
        return found

    monkeypatch.setattr(backend._Cursor, "rows", rows)
    assert reconcile(c, content=False, batch_size=20).counts["in_sync"] == 50
    # A page is one row: its size, its last key, then a JSON array per column (RECONCILE_TARGETS*).
    assert len(pages) == 3 and all(row[5] is not None for (row,) in pages)  # a payload column...
    assert payload_column(pages) == [None] * 50  # ...empty for create_file
    pages.clear()
    assert reconcile(c, content=True, full=True, batch_size=20).counts["in_sync"] == 50
    assert None not in payload_column(pages)  # reading every file: read
    pages.clear()
    assert reconcile(c, content=True, batch_size=20).counts["in_sync"] == 50
    assert payload_column(pages) == [None] * 50  # by fingerprints: read by id, if at all


def payload_column(pages: list[list]) -> list[str | None]:
    """The payloads of the pages' targets, in order (each page one row of JSON arrays)."""
    return [payload for (row,) in pages for payload in orjson.loads(row[5])]


def test_the_garbage_collector_is_paused_for_the_ledger_pass_and_restored_as_it_was(
    sqlite_coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = sqlite_coordinator
    completed_rows(c, [CreateFile(path=f"m/{i}.json", content=i) for i in range(5)])
    during: list[bool] = []
    real_pass = check._Reconciler._ledger_pass
    monkeypatch.setattr(
        check._Reconciler, "_ledger_pass", lambda self: during.append(gc.isenabled()) or real_pass(self)
    )
    assert gc.isenabled()
    assert reconcile(c).counts["in_sync"] == 5
    assert during == [False] and gc.isenabled()
    gc.disable()
    try:
        reconcile(c)
        assert not gc.isenabled(), "an application that turned it off keeps it off"
    finally:
        gc.enable()


@pytest.mark.parametrize("content", [False, True])
def test_a_ledger_row_naming_a_path_outside_the_root_is_unknown_among_paths_checked_in_bulk(
    sqlite_coordinator: Coordinator, content: bool
) -> None:
    """Rows changed by hand: paths that escape are answered one by one, the rest in bulk."""
    c = sqlite_coordinator
    completed_rows(c, [CreateFile(path=f"m/{i:02d}.json", content=i) for i in range(30)])
    escapes = {"m/03.json": "../03.json", "m/11.json": "m/../../11.json", "m/20.json": "/etc/20.json"}
    with c.engine.begin() as conn:
        for rel, bad in escapes.items():
            payload = orjson.dumps({"path": bad, "content": 0}).decode()
            conn.execute(
                sa.text("UPDATE tether_jobs SET ordering_key = :bad, payload = :payload WHERE ordering_key = :key"),
                {"bad": file_key(bad), "payload": payload, "key": file_key(rel)},
            )
    report = reconcile(c, content=content)
    assert {f.path: (f.status, f.detail) for f in report.findings} == {
        bad: ("unknown", "the ledger names a path outside the data root") for bad in escapes.values()
    }
    assert report.counts["in_sync"] == 27


def test_a_directory_whose_paths_a_subdirectory_splits_is_still_listed_once(
    sqlite_coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In key order ``d/000b/x.json`` sorts between ``d/000a.json`` and ``d/001a.json``: d's paths
    come in many runs, and are still answered from one listing of d."""
    c = sqlite_coordinator
    paths = [p for i in range(20) for p in (f"d/{i:03d}a.json", f"d/{i:03d}b/x.json")]
    completed_rows(c, [CreateFile(path=p, content=p) for p in paths])
    lists: list[str] = []
    real_list = existence.list_data_dir
    monkeypatch.setattr(
        existence, "list_data_dir", lambda path, wanted, fd: lists.append(path) or real_list(path, wanted, fd)
    )
    monkeypatch.setattr(existence, "_BYTES_PER_WANTED", 10**6)  # list any directory with 8+ of the paths
    (c.root / "d/007a.json").unlink()
    report = reconcile(c, content=False)
    assert lists == [str(c.root / "d")]
    assert {f.path: f.status for f in report.findings} == {"d/007a.json": "missing"}
    assert report.counts["in_sync"] == 39


def test_payloads_changed_by_hand_are_unknown_in_a_content_check_and_the_rest_still_checked(
    sqlite_coordinator: Coordinator,
) -> None:
    c = sqlite_coordinator
    completed_rows(c, [CreateFile(path=f"m/{i}.json", content=i) for i in range(6)])
    (c.root / "m/4.json").write_text("other")
    with c.engine.begin() as conn:
        for rel in ("m/1.json", "m/5.json"):
            conn.execute(
                sa.text("UPDATE tether_jobs SET payload = '{not json' WHERE ordering_key = :key"),
                {"key": file_key(rel)},
            )
    report = reconcile(c, content=True)
    assert {f.path: (f.status, f.detail) for f in report.findings} == {
        "m/1.json": ("unknown", "the job's stored payload could not be read"),
        "m/4.json": ("modified", None),
        "m/5.json": ("unknown", "the job's stored payload could not be read"),
    }
    assert report.counts["in_sync"] == 3
