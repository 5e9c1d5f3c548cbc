"""The drift suite: a store built by real jobs, each kind of drift injected by hand, and exactly the
expected statuses reported (on SQLite and PostgreSQL)."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa

from tether import Check, Coordinator, CreateFile, DeleteFile, JobContext, JobType, Payload, Probe
from tether.jobtypes import default_registry, render
from tether.jobtypes.datafiles import content as content_probe
from tether.jobtypes.datafiles import existence, fingerprint
from tether.ledger.schema import jobs as jobs_table
from tether.reconcile.check import reconcile


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree_digest(root: Path) -> str:
    """Every entry under root (tether's own included): path, kind, bytes."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
        h.update(dirpath.encode())
    return h.hexdigest()


def table_dump(c: Coordinator) -> list[tuple[Any, ...]]:
    """Every job row as it is, but for the fingerprint a content check records of a file it read in
    sync (its one write besides its verdict)."""
    columns = [col for col in jobs_table.c if col.name != "fingerprint"]
    with c.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(*columns).order_by(jobs_table.c.id))]


def statuses(report) -> dict[str, str]:
    return {f.path: f.status for f in report.findings}


def body(n: int) -> dict[str, Any]:
    return {"n": n, "name": f"item {n}"}


@pytest.fixture
def unreadable(monkeypatch: pytest.MonkeyPatch):
    """Make named files fail to open/stat with an error. Tests run as root here, where chmod 000
    does not stop a read, so the failure is injected at the probe's one open/stat function."""
    failing: dict[str, int] = {}
    real_open, real_lstat = content_probe.open_data_file, existence.lstat_data_file

    def fail_if_named(path: str) -> None:
        for name, code in failing.items():
            if path.endswith("/" + name):
                raise (
                    OSError(code, os.strerror(code), path)
                    if code != errno.EACCES
                    else PermissionError(code, os.strerror(code), path)
                )

    def fake_open(dir_fd: int, name: str) -> int:
        fail_if_named("/" + name)
        return real_open(dir_fd, name)

    def fake_lstat(name: str, dir_fd: int) -> os.stat_result:
        fail_if_named("/" + name)
        return real_lstat(name, dir_fd)

    def fake_list(path: str, wanted: set[str], dir_fd: int) -> dict[str, int] | None:
        if wanted & set(failing):
            return None  # as if the directory could not be listed: every file gets its own lstat
        return real_list(path, wanted, dir_fd)

    real_list = existence.list_data_dir
    monkeypatch.setattr(content_probe, "open_data_file", fake_open)
    monkeypatch.setattr(existence, "lstat_data_file", fake_lstat)
    monkeypatch.setattr(existence, "list_data_dir", fake_list)
    # The C module's stats would find an unchanged file the same without the fake lstat: the
    # check's own stats, then (the C module's verdicts are tests/test_stamps_in_c.py's).
    monkeypatch.setattr(fingerprint, "matches_in_c", None)
    return failing


@pytest.fixture
def store(coordinator: Coordinator, root: Path) -> dict[str, str]:
    """A store built by real jobs; returns the job id behind each path's expectation."""
    ids: dict[str, str] = {}
    for name in "abcdefghij":
        ids[name] = coordinator.enqueue(CreateFile(path=f"docs/{name}.json", content=body(ord(name)))).id
    coordinator.run_until_idle()
    # d and g: created, then deleted by a job.
    ids["d"] = coordinator.enqueue(DeleteFile(path="docs/d.json")).id
    ids["g"] = coordinator.enqueue(DeleteFile(path="docs/g.json")).id
    # i and j: written twice; the second write is the expectation.
    ids["i"] = coordinator.enqueue(CreateFile(path="docs/i.json", content=body(1000), overwrite=True)).id
    ids["j"] = coordinator.enqueue(CreateFile(path="docs/j.json", content=body(2000), overwrite=True)).id
    assert coordinator.run_until_idle() == 4
    assert reconcile(coordinator).findings == []
    return ids


def test_a_store_built_by_real_jobs_is_in_sync(coordinator: Coordinator, store: dict[str, str]) -> None:
    report = reconcile(coordinator)
    assert report.counts["in_sync"] == 10 and report.drift == 0 and report.exit_code == 0
    assert report.newest_job_id == max(store.values())


def test_each_injected_drift_is_reported_with_exactly_its_status(
    coordinator: Coordinator, store: dict[str, str], root: Path, unreadable: dict[str, int]
) -> None:
    docs = root / "docs"
    expected_a = render(CreateFile(path="docs/a.json", content=body(ord("a"))))
    (docs / "a.json").unlink()  # deleted file
    b = (docs / "b.json").read_bytes()
    (docs / "b.json").write_bytes(b + b" ")  # one byte more
    c_before = (docs / "c.json").read_bytes()
    c = bytearray(c_before)
    c[5] ^= 0x01  # same size, other bytes
    (docs / "c.json").write_bytes(bytes(c))
    (docs / "d.json").write_text("{}")  # deleted file recreated
    (docs / ".e.json.0123abcd.tether-tmp").write_bytes(b"half a wri")  # interrupted write
    unreadable["f.json"] = errno.EACCES  # permission denied
    os.chmod(docs / "f.json", 0o600)  # as a change of its permissions stamps its ctime
    old_j = render(CreateFile(path="docs/j.json", content=body(ord("j"))))
    (docs / "j.json").write_bytes(old_j)  # first of two writes back
    # h: a job still pending on the path, and the disk already differs: in flight, not drift.
    pending = coordinator.enqueue(CreateFile(path="docs/h.json", content=body(7), overwrite=True), delay=3600).id
    (docs / "h.json").unlink()
    (docs / ".h.json.89abcdef.tether-tmp").write_bytes(b"x")  # a live write's temp file

    report = reconcile(coordinator)

    assert statuses(report) == {
        "docs/a.json": "missing",
        "docs/b.json": "modified",
        "docs/c.json": "modified",
        "docs/d.json": "unexpected",
        "docs/.e.json.0123abcd.tether-tmp": "leftover_temp",
        "docs/f.json": "unknown",
        "docs/h.json": "not_checked",
        "docs/j.json": "modified",
    }
    assert report.counts == {
        "in_sync": 3,
        "missing": 1,
        "modified": 3,
        "unexpected": 1,
        "leftover_temp": 1,
        "untracked": 0,
        "not_checked": 1,
        "unknown": 1,
    }  # e, g, i in sync
    assert report.exit_code == 2 and report.drift == 6
    found = {f.path: f for f in report.findings}
    a = found["docs/a.json"]
    assert (a.job_id, a.expected_size, a.expected_sha256, a.actual_size) == (
        store["a"],
        len(expected_a),
        sha(expected_a),
        None,
    )
    # Sizes differ: decided without reading, so no actual hash.
    assert found["docs/b.json"].actual_size == len(b) + 1 and found["docs/b.json"].actual_sha256 is None
    # Same size: the bytes were read, and the report says what is there instead.
    assert found["docs/c.json"].actual_size == len(c) and found["docs/c.json"].actual_sha256 == sha(bytes(c))
    assert found["docs/c.json"].expected_sha256 == sha(c_before) and found["docs/c.json"].job_id == store["c"]
    assert found["docs/d.json"].job_id == store["d"] and found["docs/d.json"].actual_size == 2
    assert found["docs/f.json"].detail == "Permission denied" and found["docs/f.json"].job_id == store["f"]
    assert found["docs/h.json"].job_id == pending
    j = found["docs/j.json"]
    new_j = render(CreateFile(path="docs/j.json", content=body(2000)))
    assert j.job_id == store["j"] and j.expected_sha256 == sha(new_j) and j.actual_size == len(old_j)


def test_existence_only_mode_reads_no_file_and_sees_only_presence(
    coordinator: Coordinator, store: dict[str, str], root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = root / "docs"
    (docs / "a.json").unlink()
    (docs / "c.json").write_bytes(b"changed bytes")
    (docs / "d.json").write_text("{}")

    def no_reads(dir_fd: int, name: str) -> int:
        raise AssertionError(f"existence-only check opened {name}")

    monkeypatch.setattr(content_probe, "open_data_file", no_reads)
    report = reconcile(coordinator, content=False)
    assert statuses(report) == {"docs/a.json": "missing", "docs/d.json": "unexpected"}
    assert report.findings[0].expected_size is not None  # the record still says what was expected


def test_a_read_error_is_unknown_never_missing(
    coordinator: Coordinator, store: dict[str, str], unreadable: dict[str, int]
) -> None:
    unreadable.update({"a.json": errno.EIO, "b.json": errno.EACCES, "d.json": errno.EIO})
    for content in (True, False):
        report = reconcile(coordinator, content=content)
        assert statuses(report) == {"docs/a.json": "unknown", "docs/b.json": "unknown", "docs/d.json": "unknown"}
        assert report.exit_code == 1, "could not check is not drift"


def test_untracked_files_are_reported_only_on_request_and_tethers_own_files_never(
    coordinator: Coordinator, store: dict[str, str], root: Path
) -> None:
    (root / "notes").mkdir()
    (root / "notes" / "hand-made.txt").write_text("by hand")
    (root / ".tether" / "stray").parent.mkdir(exist_ok=True)
    (root / ".tether" / "stray").write_text("tether's own")
    assert list((root / ".tether" / "locks").iterdir()), "the jobs left their path locks"
    assert reconcile(coordinator).findings == []
    report = reconcile(coordinator, untracked=True)
    assert statuses(report) == {"notes/hand-made.txt": "untracked"}
    assert report.exit_code == 2
    # A path only a failed or deleted job named is known to the ledger, so not untracked.
    assert "docs/g.json" not in statuses(report)


def test_reconcile_changes_no_job_nor_file_and_answers_the_same_twice(
    coordinator: Coordinator, store: dict[str, str], root: Path
) -> None:
    (root / "docs" / "a.json").unlink()
    (root / "docs" / "d.json").write_text("{}")
    (root / "stray.txt").write_text("x")
    coordinator.enqueue(CreateFile(path="docs/h.json", content=1, overwrite=True), delay=60)
    tree, table = tree_digest(root), table_dump(coordinator)
    first = reconcile(coordinator, untracked=True)
    second = reconcile(coordinator, untracked=True)
    reconcile(coordinator, content=False)
    assert first.findings == second.findings and first.counts == second.counts
    assert tree_digest(root) == tree and table_dump(coordinator) == table


def test_batches_that_split_one_paths_jobs_give_the_same_answer(
    coordinator: Coordinator, store: dict[str, str], root: Path
) -> None:
    for n in range(5):  # one path with many jobs, so a small batch ends inside its group
        coordinator.enqueue(CreateFile(path="docs/many.json", content=body(n), overwrite=True))
    coordinator.run_until_idle()
    coordinator.enqueue(DeleteFile(path="docs/many.json"))
    coordinator.run_until_idle()
    (root / "docs" / "many.json").write_text("back")
    (root / "docs" / "i.json").unlink()
    whole = reconcile(coordinator)
    assert statuses(whole) == {"docs/many.json": "unexpected", "docs/i.json": "missing"}
    with coordinator.engine.connect() as conn:
        targets = conn.execute(sa.text("SELECT count(DISTINCT ordering_key) FROM tether_jobs")).scalar_one()
    for size in (1, 2, 3, 4, 7):
        seen: list[int] = []
        split = reconcile(coordinator, batch_size=size, progress=seen.append)
        assert (split.findings, split.counts, split.newest_job_id) == (
            whole.findings,
            whole.counts,
            whole.newest_job_id,
        )
        # progress: targets decided so far, once per batch of at most ``size`` rows
        assert seen[-1] == targets and all(0 <= b - a <= size for a, b in zip([0, *seen], seen, strict=False))


def test_startup_check_reclaims_stale_locks_then_reports_their_paths_in_flight(
    coordinator: Coordinator, store: dict[str, str], root: Path, clock
) -> None:
    job = coordinator.enqueue(CreateFile(path="docs/b.json", content=body(5), overwrite=True)).id
    assert [j.id for j in coordinator.queue.claim("dead-worker")] == [job]  # ... and the worker died
    (root / "docs" / "b.json").write_text("the dead worker's half")
    clock.advance(seconds=coordinator.lock_timeout + 1)
    report = coordinator.startup_check()
    assert coordinator.get(job).status.value == "pending"
    assert statuses(report) == {"docs/b.json": "not_checked"}
    assert report.exit_code == 0


class Widget(Payload):
    job_type: ClassVar[str] = "widget"
    name: str


class WidgetProbe(Probe):
    def check(self, target: str, payload: str, root: Path, *, content: bool) -> Check:
        return Check("missing", detail=f"no widget (content={content})")


class WidgetType(JobType[Widget]):
    name = "widget"
    payload_model = Widget
    probe: ClassVar[Probe | None] = WidgetProbe()

    def ordering_key(self, payload: Widget) -> str:
        return f"widget:{payload.name}"

    def run(self, payload: Widget, ctx: JobContext) -> None:
        return None


class GadgetType(WidgetType):
    name = "gadget"
    probe = None


class Gadget(Widget):
    job_type: ClassVar[str] = "gadget"


GadgetType.payload_model = Gadget


def test_each_job_type_is_checked_by_its_own_probe_and_types_without_one_are_reported_not_checked(
    make_coordinator, root: Path
) -> None:
    registry = default_registry()
    registry.register(WidgetType())
    registry.register(GadgetType())
    c = make_coordinator(registry=registry)
    c.enqueue(Widget(name="w1"))
    c.enqueue(Gadget(name="g1"))
    c.enqueue(CreateFile(path="x.json", content=1))
    c.run_until_idle()
    report = reconcile(c, content=False)
    assert statuses(report) == {"w1": "missing", "g1": "not_checked"}
    found = {f.path: f for f in report.findings}
    assert found["w1"].detail == "no widget (content=False)" and report.counts["in_sync"] == 1
    assert found["g1"].detail == "type 'gadget' has no probe: its effect cannot be checked"
    assert report.counts["not_checked"] == 1


def test_a_directory_or_symlink_where_a_file_was_written_is_modified(
    coordinator: Coordinator, store: dict[str, str], root: Path
) -> None:
    (root / "docs" / "a.json").unlink()
    (root / "docs" / "a.json").mkdir()
    (root / "docs" / "b.json").unlink()
    (root / "docs" / "b.json").symlink_to(root / "docs" / "c.json")
    report = reconcile(coordinator)
    assert {(f.path, f.status, f.detail) for f in report.findings} == {
        ("docs/a.json", "modified", "is a directory"),
        ("docs/b.json", "modified", "is a symbolic link"),
    }
    # Existence only: a symlink is no regular file either (tether reads and writes only those).
    assert statuses(reconcile(coordinator, content=False)) == {"docs/a.json": "modified", "docs/b.json": "modified"}


def test_existence_checks_agree_whether_a_directory_is_listed_or_each_file_stat(
    coordinator: Coordinator, store: dict[str, str], root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "docs" / "a.json").unlink()
    (root / "docs" / "d.json").write_text("{}")
    (root / "docs" / "e.json").unlink()
    (root / "docs" / "e.json").mkdir()
    lists: list[str] = []
    real_list = existence.list_data_dir
    monkeypatch.setattr(
        existence, "list_data_dir", lambda path, wanted, fd: lists.append(path) or real_list(path, wanted, fd)
    )
    monkeypatch.setattr(existence, "_BYTES_PER_WANTED", 10**6)  # list any directory with 8+ of the paths
    listed = reconcile(coordinator, content=False)
    assert lists == [str(root / "docs")]
    monkeypatch.setattr(existence, "_LIST_AT", 10**9)  # never list: one lstat per file
    stat_each = reconcile(coordinator, content=False)
    assert len(lists) == 1
    assert (
        statuses(listed)
        == statuses(stat_each)
        == {"docs/a.json": "missing", "docs/d.json": "unexpected", "docs/e.json": "modified"}
    )
    assert listed.findings == stat_each.findings


def test_leftover_temp_files_are_found_in_directories_the_probe_listed_and_below_them(
    coordinator: Coordinator, store: dict[str, str], root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "docs" / ".a.json.0123abcd.tether-tmp").write_bytes(b"x")
    (root / "docs" / "old").mkdir()
    (root / "docs" / "old" / ".z.json.89abcdef.tether-tmp").write_bytes(b"yy")
    scans: list[str] = []
    real_scandir = os.scandir

    def scandir(fd: int) -> Iterator[os.DirEntry[str]]:
        scans.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_scandir(fd)

    real_listdir = os.listdir

    def listdir(fd: int) -> list[str]:  # a directory without subdirectories: names are enough
        scans.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_listdir(fd)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(existence, "_BYTES_PER_WANTED", 10**6)  # list any directory with 8+ of the paths
    report = reconcile(coordinator, content=False)
    assert statuses(report) == {
        "docs/.a.json.0123abcd.tether-tmp": "leftover_temp",
        "docs/old/.z.json.89abcdef.tether-tmp": "leftover_temp",
    }
    real = os.path.realpath(root)
    assert scans.count(f"{real}/docs") == 1  # listed once, for the probe; the walk reused it
    assert f"{real}/docs/old" in scans
    monkeypatch.setattr(existence, "_LIST_AT", 10**9)  # no listing by the probe: the walk reads docs/
    assert statuses(reconcile(coordinator, content=False)) == statuses(report)


def test_targets_of_job_types_this_process_does_not_know_are_reported_not_checked(make_coordinator, root: Path) -> None:
    registry = default_registry()
    registry.register(WidgetType())
    c = make_coordinator(registry=registry)
    c.enqueue(Widget(name="w1"))
    c.enqueue(CreateFile(path="x.json", content=1))
    c.run_until_idle()
    bare = make_coordinator()  # opened without the application's job types (no --import)
    report = reconcile(bare, content=False)
    assert statuses(report) == {"w1": "not_checked"}
    assert "not registered here (pass --import MODULE)" in (report.findings[0].detail or "")
    assert report.exit_code == 0
