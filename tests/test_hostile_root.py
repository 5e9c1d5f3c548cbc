"""The data root against a hostile world (issue 14): no effect outside the root, no hang, no
silent loss. File behaviour does not depend on the ledger, so these run on SQLite only."""

from __future__ import annotations

import errno
import functools
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tether import CreateFile, DeleteFile, InvalidPayload, JobStatus
from tether.jobtypes import create_file, render
from tether.jobtypes.context import JobContext
from tether.jobtypes.datafiles import existence, nofollow, paths
from tether.reconcile.check import reconcile

# Each test with Linux openat2 (where the kernel has it) and with the portable walk.
pytestmark = pytest.mark.usefixtures("lookup")


@pytest.fixture
def db_url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'ledger' / 'tether.db'}"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    return path


def swap_for_symlink(directory: Path, target: Path) -> None:
    """What an attacker does between tether's check and its use: ``directory`` becomes a
    symlink to ``target`` (the real directory is kept aside, still inside the root)."""
    directory.rename(directory.with_name(directory.name + ".real"))
    directory.symlink_to(target, target_is_directory=True)


@pytest.fixture
def swap_at_lease(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[Path, Path]]:
    """Swap a directory for a symlink at the last moment before a handler acts: handlers confirm
    their lease just before the write or unlink, after the path was checked and resolved."""
    plan: dict[str, tuple[Path, Path]] = {}
    real = JobContext.confirm_lease

    def confirm_then_swap(self: JobContext) -> None:
        real(self)
        if "swap" in plan:
            swap_for_symlink(*plan.pop("swap"))

    monkeypatch.setattr(JobContext, "confirm_lease", confirm_then_swap)
    return plan


# -- 1. a directory swapped for a symlink between the check and the use ------------------------


def test_a_directory_swapped_for_a_symlink_before_the_write_cannot_put_the_file_outside(
    coordinator, root, outside, swap_at_lease
):
    (root / "d").mkdir()
    swap_at_lease["swap"] = (root / "d", outside)
    job_id = coordinator.enqueue(CreateFile(path="d/f.json", content=1)).id
    coordinator.run_until_idle()
    assert list(outside.iterdir()) == []
    assert coordinator.get(job_id).status is JobStatus.COMPLETED
    assert (root / "d.real/f.json").read_bytes() == b"1\n"  # where the directory it opened went


def test_a_directory_swapped_for_a_symlink_before_the_unlink_cannot_delete_outside(
    coordinator, root, outside, swap_at_lease
):
    (root / "d").mkdir()
    (root / "d/f.json").write_text("inside")
    (outside / "f.json").write_text("someone else's")
    swap_at_lease["swap"] = (root / "d", outside)
    coordinator.enqueue(DeleteFile(path="d/f.json"))
    coordinator.run_until_idle()
    assert (outside / "f.json").read_text() == "someone else's"
    assert not (root / "d.real/f.json").exists()


def test_a_symlinked_directory_met_at_run_time_fails_the_job_and_touches_nothing_outside(
    coordinator, root, outside, monkeypatch
):
    (root / "d/sub").mkdir(parents=True)
    (outside / "sub").mkdir()
    job_id = coordinator.enqueue(CreateFile(path="d/sub/f.json", content=1), max_attempts=5).id
    swap_for_symlink(root / "d", outside)
    # the run-time prepare resolves d/f.json through the link (outside: refused); skip it to
    # show that the open itself refuses, whatever a check before it said
    monkeypatch.setattr(create_file, "checked_path", lambda job_type, field, root, rel, new_file: rel)
    coordinator.run_until_idle()
    job = coordinator.get(job_id)
    assert job.status is JobStatus.FAILED and job.attempts == 1
    assert "d is a symbolic link" in job.last_error
    assert list((outside / "sub").iterdir()) == []


# -- 2. only regular files are read or replaced; nothing blocks ---------------------------------


def bounded(call: Callable[[], Any], seconds: float = 20) -> Any:
    """``call()`` in a thread; fail (instead of hanging the suite) if it does not return."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(call()), daemon=True)
    t.start()
    t.join(seconds)
    assert out, "blocked on what is at the target (or raised: see the thread's traceback)"
    return out[0]


def _run_bounded(coordinator) -> None:
    bounded(coordinator.run_until_idle)


def _socket_at(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.fspath(path))
    return s


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_fifo_at_the_target_fails_the_job_at_once_without_blocking(coordinator, root, overwrite):
    os.mkfifo(root / "f")
    job_id = coordinator.enqueue(CreateFile(path="f", text="", overwrite=overwrite), max_attempts=5).id
    _run_bounded(coordinator)
    job = coordinator.get(job_id)
    assert job.status is JobStatus.FAILED and job.attempts == 1
    assert "f is not a regular file" in job.last_error
    assert stat.S_ISFIFO(os.lstat(root / "f").st_mode)  # left as it was


def test_a_socket_at_the_target_fails_the_job_at_once(coordinator, root):
    with _socket_at(root / "s"):
        job_id = coordinator.enqueue(CreateFile(path="s", text="x", overwrite=True), max_attempts=5).id
        _run_bounded(coordinator)
    job = coordinator.get(job_id)
    assert job.status is JobStatus.FAILED and "s is not a regular file" in job.last_error


def test_a_character_device_at_the_target_is_neither_read_nor_taken_as_written(coordinator, root):
    try:
        os.mknod(root / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero: reads never end
        os.mknod(root / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null: writes vanish
    except PermissionError:
        pytest.skip("this container may not make device nodes (no CAP_MKNOD)")
    zero = coordinator.enqueue(CreateFile(path="zero", text="", overwrite=True), max_attempts=5).id
    null = coordinator.enqueue(CreateFile(path="null", text="", overwrite=False), max_attempts=5).id
    _run_bounded(coordinator)
    for job_id, name in ((zero, "zero"), (null, "null")):
        job = coordinator.get(job_id)
        assert job.status is JobStatus.FAILED and f"{name} is not a regular file" in job.last_error


def test_reconcile_reports_a_fifo_where_a_file_was_written_as_modified_without_blocking(coordinator, root):
    coordinator.enqueue(CreateFile(path="f.json", content=1))
    coordinator.run_until_idle()
    (root / "f.json").unlink()
    os.mkfifo(root / "f.json")
    for content in (True, False):
        report = bounded(functools.partial(reconcile, coordinator, content=content))
        assert [(f.path, f.status, f.detail) for f in report.findings] == [
            ("f.json", "modified", "is not a regular file")
        ]


def test_load_refuses_a_fifo_instead_of_blocking(coordinator, root):
    from tether import JsonStore, ModelNotFound

    os.mkfifo(root / "m.json")

    def load() -> Exception | None:
        try:
            JsonStore(coordinator).load_json("m.json")
        except Exception as e:
            return e
        return None

    assert isinstance(bounded(load), ModelNotFound)


# -- 4. durable after a failed fsync ------------------------------------------------------------


class FsyncRecorder:
    """os.fsync, recording the real path of every descriptor synced; fails the ``fail_at``-th
    call (1-based) once with EIO."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.real, self.fail_at, self.calls = os.fsync, fail_at, 0
        self.paths: list[str] = []

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError(errno.EIO, "injected I/O error")
        self.paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        self.real(fd)


def _fsyncs_of_one_create(coordinator, root, monkeypatch) -> int:
    recorder = FsyncRecorder()
    monkeypatch.setattr(os, "fsync", recorder)
    coordinator.enqueue(CreateFile(path="probe/a.json", content=0))
    coordinator.run_until_idle()
    monkeypatch.undo()
    return recorder.calls


@pytest.mark.parametrize("fail_at", [1, 2, 3])
def test_after_any_failed_fsync_of_a_create_the_retry_syncs_the_file_and_its_directory(
    coordinator, root, clock, monkeypatch, fail_at
):
    # a write into a new directory fsyncs: the temp file, the root (the new directory's entry),
    # then, after the rename, the directory (the file's entry)
    assert _fsyncs_of_one_create(coordinator, root, monkeypatch) == 3
    job_id = coordinator.enqueue(CreateFile(path="new/a.json", content={"v": 1})).id
    monkeypatch.setattr(os, "fsync", FsyncRecorder(fail_at))
    coordinator.run_until_idle()
    job = coordinator.get(job_id)
    assert job.status is JobStatus.PENDING and "injected I/O error" in job.last_error
    retry = FsyncRecorder()
    monkeypatch.setattr(os, "fsync", retry)
    clock.advance(3600)
    coordinator.run_until_idle()
    assert coordinator.get(job_id).status is JobStatus.COMPLETED
    real = os.path.realpath(root)
    assert f"{real}/new/a.json" in retry.paths or any(p.endswith(".tether-tmp") for p in retry.paths)
    assert f"{real}/new" in retry.paths, "completed without the directory entry made durable"
    assert (root / "new/a.json").read_bytes() == render(CreateFile(path="x", content={"v": 1}))


def test_after_a_failed_fsync_of_a_delete_the_retry_syncs_the_directory(coordinator, root, clock, monkeypatch):
    (root / "d").mkdir()
    (root / "d/a.json").write_text("x")
    job_id = coordinator.enqueue(DeleteFile(path="d/a.json")).id
    monkeypatch.setattr(os, "fsync", FsyncRecorder(1))
    coordinator.run_until_idle()
    assert coordinator.get(job_id).status is JobStatus.PENDING
    assert not (root / "d/a.json").exists()  # unlinked; only the fsync failed
    retry = FsyncRecorder()
    monkeypatch.setattr(os, "fsync", retry)
    clock.advance(3600)
    coordinator.run_until_idle()
    assert coordinator.get(job_id).status is JobStatus.COMPLETED
    assert f"{os.path.realpath(root)}/d" in retry.paths, "completed without the removal made durable"


# -- 7. tether's own files are not reachable through symlinks ----------------------------------


def test_tethers_own_directory_reached_through_a_symlink_is_refused_at_enqueue(coordinator, root):
    coordinator.enqueue(CreateFile(path="x.json", content=1))
    coordinator.run_until_idle()  # .tether/locks/ exists now
    (root / "tl").symlink_to(".tether")
    with pytest.raises(InvalidPayload, match="resolves .*'.tether/locks/paths.lock'.*tether's own"):
        coordinator.enqueue(CreateFile(path="tl/locks/paths.lock", text="", overwrite=True))


def test_a_symlink_to_a_temp_file_name_is_refused_at_enqueue(coordinator, root):
    (root / ".a.json.0badf00d.tether-tmp").write_text("half")
    (root / "link").symlink_to(".a.json.0badf00d.tether-tmp")
    with pytest.raises(InvalidPayload, match="tether-tmp"):
        coordinator.enqueue(DeleteFile(path="link"))


def test_a_symlinked_tether_directory_never_puts_the_lock_file_outside_the_root(make_coordinator, root, outside):
    (root / ".tether").symlink_to(outside, target_is_directory=True)
    coordinator = make_coordinator()
    job_id = coordinator.enqueue(CreateFile(path="a.json", content=1), max_attempts=3).id
    coordinator.run_until_idle()
    assert list(outside.iterdir()) == []
    job = coordinator.get(job_id)
    assert job.status is JobStatus.FAILED and ".tether is a symbolic link" in job.last_error
    assert not (root / "a.json").exists()


# -- 8. names the file system would refuse, refused at enqueue -----------------------------------


def test_a_file_name_too_long_for_its_temp_file_is_refused_at_enqueue(coordinator, root):
    longest = "n" * (paths.NAME_MAX - paths.TEMP_OVERHEAD)
    with pytest.raises(InvalidPayload, match=r"path: .* has a file name of 235 bytes; at most 234"):
        coordinator.enqueue(CreateFile(path=longest + "x", content=1))
    job_id = coordinator.enqueue(CreateFile(path=f"d/{longest}", content=1)).id  # the longest that can run
    coordinator.run_until_idle()
    assert coordinator.get(job_id).status is JobStatus.COMPLETED
    assert (root / "d" / longest).exists()


def test_a_component_over_name_max_and_a_path_over_path_max_are_refused_at_enqueue(coordinator):
    with pytest.raises(InvalidPayload, match="path: .* has a component of 256 bytes; at most 255"):
        coordinator.enqueue(DeleteFile(path="d" * 256 + "/a.json"))
    with pytest.raises(InvalidPayload, match="has a component of 256 bytes"):  # bytes, not characters
        coordinator.enqueue(DeleteFile(path="é" * 128 + "/a.json"))
    with pytest.raises(InvalidPayload, match="path: .* is 4199 bytes long; at most 4095"):
        coordinator.enqueue(DeleteFile(path="/".join(["d" * 199] * 21)))


def test_a_name_too_long_for_its_temp_file_in_four_byte_characters_is_refused(coordinator):
    # Paths short enough that no encoding can break a limit skip the byte count: the first one
    # long enough to break the file name's limit in 4-byte characters is counted and refused.
    fits = paths.NAME_MAX - paths.TEMP_OVERHEAD
    with pytest.raises(InvalidPayload, match=f"has a file name of {(fits // 4 + 1) * 4} bytes; at most {fits}"):
        coordinator.enqueue(CreateFile(path="\N{GRINNING FACE}" * (fits // 4 + 1), content=1))
    assert paths.normalize("\N{GRINNING FACE}" * (fits // 4)) == "\N{GRINNING FACE}" * (fits // 4)


# -- 9. a data directory named like a temp file is data ----------------------------------------


@pytest.mark.parametrize("files_in_docs", [1, 12])  # one: docs/ is walked; twelve: the probe lists it
def test_a_data_directory_named_like_a_temp_file_is_not_a_leftover_temp(coordinator, root, files_in_docs, monkeypatch):
    monkeypatch.setattr(existence, "_BYTES_PER_WANTED", 10**6)  # list any directory with 8+ of the paths
    for n in range(files_in_docs):
        coordinator.enqueue(CreateFile(path=f"docs/{n}.json", content=n))
    coordinator.run_until_idle()
    (root / "docs/x.tether-tmp").mkdir()
    (root / "docs/x.tether-tmp/inner.json").write_text("{}")
    (root / "y.tether-tmp").mkdir()
    for content in (True, False):  # existence only: the probe lists docs/ and the walk reuses it
        assert reconcile(coordinator, content=content).findings == []
        assert [(f.path, f.status) for f in reconcile(coordinator, content=content, untracked=True).findings] == [
            ("docs/x.tether-tmp/inner.json", "untracked")
        ]


# -- what a swap in the middle of a lookup looks like ---------------------------------------------


def test_a_component_met_as_a_symlink_is_classified_by_what_it_is_now(tmp_path):
    # O_DIRECTORY | O_NOFOLLOW on a symlink says ENOTDIR; the walk looks again to say why.
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        met = OSError(errno.ENOTDIR, "Not a directory")
        assert nofollow._classified(met, "link", fd, "a/link").errno == errno.ELOOP
        assert nofollow._classified(met, "file", fd, "a/file").errno == errno.ENOTDIR
        swapped_back = nofollow._classified(met, "dir", fd, "a/dir")  # a directory again by now
        assert swapped_back.errno == errno.EAGAIN and swapped_back.filename == "a/dir"
    finally:
        os.close(fd)


def test_a_symlink_swapped_away_while_it_is_resolved_is_resolved_again_then_refused(root, monkeypatch):
    (root / "real").mkdir()
    (root / "link").symlink_to("real")
    real_realpath, fails = os.path.realpath, list[str]()

    def realpath_racing(path, *args, **kwargs):
        if os.fspath(path).endswith(".json") and len(fails) < fails_wanted:
            fails.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")  # readlink of what is a directory now
        return real_realpath(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", realpath_racing)
    fails_wanted = 2
    assert paths.canonical(root, "link/a.json") == "real/a.json"
    fails.clear()
    fails_wanted = 3
    with pytest.raises(paths.PathRejected, match="kept changing"):
        paths.canonical(root, "link/b.json")


def _kernel_has_openat2() -> bool:
    release = tuple(int(n) for n in os.uname().release.split(".")[:2] if n.isdigit())
    return os.uname().sysname == "Linux" and release >= (5, 6) and not os.environ.get("TETHER_NO_OPENAT2")


@pytest.mark.skipif(not _kernel_has_openat2(), reason="openat2 needs Linux 5.6")
def test_openat2_itself_opens_beneath_the_root_and_refuses_a_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the kernel has openat2, tether's call of it works (a call that went wrong, through
    ctypes, would pass every other test on the walk instead, a lookup per component slower)."""
    monkeypatch.setattr(nofollow, "_usable", None)
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    root_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = nofollow._openat2(root_fd, "a/b", nofollow.DIR_FLAGS, 0)
        assert fd >= 0, "openat2 refused a plain directory beneath the root"
        try:
            assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "a" / "b"))
        finally:
            os.close(fd)
        assert nofollow._openat2(root_fd, "link/b", nofollow.DIR_FLAGS, 0) == -1  # ELOOP: the walk names it
    finally:
        os.close(root_fd)
