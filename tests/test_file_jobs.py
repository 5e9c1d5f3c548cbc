"""create_file / delete_file semantics and the one atomic-write path."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import orjson
import pytest

from tether import CreateFile, DeleteFile, JobStatus
from tether.jobtypes import render
from tether.jobtypes.datafiles import durable, fingerprint, locks, paths


def write(root: Path, rel: str, data: bytes) -> None:
    """tether's atomic write of one data file (what write_locked does once it holds the lock)."""
    with durable.data_file(root, rel, create=True) as f:
        f.write(data)


def data_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".tether" not in p.parts)


def test_create_file_writes_exactly_the_rendered_bytes(coordinator, root):
    payload = CreateFile(path="models/a.json", content={"b": [1, 2], "a": "é"})
    job_id = coordinator.enqueue(payload).id
    coordinator.run_until_idle()
    data = (root / "models/a.json").read_bytes()
    assert data == render(payload) == orjson.dumps({"b": [1, 2], "a": "é"}, option=orjson.OPT_INDENT_2) + b"\n"
    result = coordinator.get(job_id).result_data
    st = (root / "models/a.json").stat()
    # Beside the hash: the file as its stat saw it, unless that stat was racily clean.
    assert result.pop("fingerprint") in (None, fingerprint.stamp(st))
    assert result == {"bytes": len(data), "sha256": durable.sha256(data), "written": True}
    assert data_files(root) == ["models/a.json"]


def test_text_is_written_as_utf8_verbatim(coordinator, root):
    coordinator.enqueue(CreateFile(path="notes.txt", text="line\nzwei ü"))
    coordinator.run_until_idle()
    assert (root / "notes.txt").read_bytes() == "line\nzwei ü".encode()


def test_rerun_with_the_same_bytes_already_present_succeeds_without_writing(coordinator, root):
    payload = CreateFile(path="a.json", content=[1])
    (root / "a.json").write_bytes(render(payload))
    before = os.stat(root / "a.json").st_ino
    job_id = coordinator.enqueue(payload).id
    coordinator.run_until_idle()
    assert coordinator.get(job_id).result_data["written"] is False
    assert os.stat(root / "a.json").st_ino == before


def test_without_overwrite_different_content_fails_permanently(coordinator, root):
    (root / "a.json").write_text("theirs")
    job_id = coordinator.enqueue(CreateFile(path="a.json", content=1), max_attempts=5).id
    coordinator.run_until_idle()
    job = coordinator.get(job_id)
    assert job.status is JobStatus.FAILED and job.attempts == 1
    assert "a.json exists with different content and overwrite is false" in job.last_error
    assert (root / "a.json").read_text() == "theirs"


def test_overwrite_replaces_the_file(coordinator, root):
    (root / "a.json").write_text("old")
    coordinator.enqueue(CreateFile(path="a.json", content=2, overwrite=True))
    coordinator.run_until_idle()
    assert (root / "a.json").read_bytes() == b"2\n"


def test_an_attempt_resolves_no_path_when_nothing_on_the_way_is_a_symlink(coordinator, root, monkeypatch):
    # The write follows no symlink; the path checks of the enqueue (a lookup per component)
    # run again only when it meets one (the next test).
    job_id = coordinator.enqueue(CreateFile(path="d/a.json", content=1)).id

    def resolved(root: Path, rel: str) -> str:
        raise AssertionError(f"resolved {rel} at run time")

    monkeypatch.setattr(paths, "canonical", resolved)
    coordinator.run_until_idle()
    assert coordinator.get(job_id).status is JobStatus.COMPLETED
    assert (root / "d/a.json").read_bytes() == b"1\n"


@pytest.mark.parametrize(("link", "to", "lands"), [("d", "real", "real/a.json"), ("d/a.json", "b.json", "d/b.json")])
def test_a_symlink_inside_the_root_made_after_the_enqueue_is_resolved_as_at_enqueue(coordinator, root, link, to, lands):
    (root / "d").mkdir()
    job_id = coordinator.enqueue(CreateFile(path="d/a.json", content=1), max_attempts=1).id
    if link == "d":
        (root / "d").rename(root / to)
    (root / link).symlink_to(to)
    coordinator.run_until_idle()
    assert coordinator.get(job_id).status is JobStatus.COMPLETED, coordinator.get(job_id).last_error
    assert (root / lands).read_bytes() == b"1\n"
    assert (root / link).is_symlink()


def test_delete_of_a_missing_file_is_success_unless_required(coordinator, root):
    ok = coordinator.enqueue(DeleteFile(path="gone.json")).id
    strict = coordinator.enqueue(DeleteFile(path="gone2.json", require_exists=True), max_attempts=4).id
    coordinator.run_until_idle()
    assert coordinator.get(ok).result_data == {"deleted": False}
    job = coordinator.get(strict)
    assert job.status is JobStatus.FAILED and "does not exist and require_exists is true" in job.last_error


def test_delete_removes_the_file(coordinator, root):
    (root / "d").mkdir()
    (root / "d/x.json").write_text("x")
    coordinator.enqueue(DeleteFile(path="d/x.json", require_exists=True))
    coordinator.run_until_idle()
    assert not (root / "d/x.json").exists()


def test_create_then_delete_on_one_path_apply_in_order(coordinator, root, clock, monkeypatch):
    # The create fails once and waits out its backoff: the delete, enqueued after it on the same
    # path, must wait too (claimed one at a time, so no batch orders them by accident).
    monkeypatch.setattr(os, "fsync", FailOnce(os.fsync, OSError(5, "injected I/O error")))
    create = coordinator.enqueue(CreateFile(path="a.json", content=1)).id
    delete = coordinator.enqueue(DeleteFile(path="a.json", require_exists=True)).id
    coordinator.run_until_idle(threads=3, batch=1)
    assert coordinator.get(create).status is JobStatus.PENDING  # its retry is not due yet
    assert coordinator.get(delete).status is JobStatus.PENDING  # held behind it
    clock.advance(3600)
    coordinator.run_until_idle(threads=3, batch=1)
    assert coordinator.get(create).status is JobStatus.COMPLETED
    assert coordinator.get(delete).status is JobStatus.COMPLETED
    assert not (root / "a.json").exists()


class FailOnce:
    """A filesystem operation that raises once, then behaves."""

    def __init__(self, real, exc: Exception) -> None:
        self.real, self.exc, self.calls = real, exc, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            raise self.exc
        return self.real(*args, **kwargs)


@pytest.mark.parametrize("op", ["fsync", "replace", "write"])
def test_a_failed_write_leaves_the_old_file_and_no_temp(monkeypatch, root, op):
    target = root / "a.json"
    target.write_bytes(b"old")
    monkeypatch.setattr(os, op, FailOnce(getattr(os, op), OSError(5, "injected I/O error")))
    with pytest.raises(OSError, match="injected"):
        write(root, "a.json", b"new contents")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in root.iterdir()) == ["a.json"]


def test_a_failed_write_is_retried_by_the_job(coordinator, root, clock, monkeypatch):
    job_id = coordinator.enqueue(CreateFile(path="a.json", content={"v": 1})).id
    monkeypatch.setattr(os, "replace", FailOnce(os.replace, OSError(28, "No space left on device")))
    coordinator.run_until_idle()
    job = coordinator.get(job_id)
    assert job.status is JobStatus.PENDING and "No space left on device" in job.last_error
    assert data_files(root) == []
    clock.advance(3600)
    coordinator.run_until_idle()
    assert coordinator.get(job_id).status is JobStatus.COMPLETED
    assert orjson.loads((root / "a.json").read_bytes()) == {"v": 1}


def test_a_retried_write_removes_the_temp_files_its_path_was_left_with(coordinator, root, clock):
    job_id = coordinator.enqueue(CreateFile(path="a.json", content=1)).id
    [job] = coordinator.queue.claim("dead-worker")
    # That worker died mid-write, leaving a temp file; another path's temp is not ours to touch.
    (root / ".a.json.0badf00d.tether-tmp").write_bytes(b"half a fi")
    (root / ".other.json.0badf00d.tether-tmp").write_bytes(b"someone else's")
    clock.advance(coordinator.lock_timeout + 1)
    coordinator.run_until_idle()
    assert coordinator.get(job_id).attempts == 2
    assert sorted(p.name for p in root.iterdir() if p.name != ".tether") == [
        ".other.json.0badf00d.tether-tmp",
        "a.json",
    ]


def test_a_batch_mate_of_a_dead_worker_cleans_up_its_temp_files_though_its_attempt_was_given_back(
    coordinator, root, clock
):
    ids = [coordinator.enqueue(CreateFile(path=f"{n}.json", content=1)).id for n in "ab"]
    assert len(coordinator.queue.claim("dead-worker", limit=10)) == 2
    (root / ".a.json.0badf00d.tether-tmp").write_bytes(b"half a fi")  # it died writing a.json
    clock.advance(coordinator.lock_timeout + 1)
    coordinator.run_until_idle()
    assert [coordinator.get(i).attempts for i in ids] == [1, 1]  # the batch crash was nobody's
    assert sorted(p.name for p in root.iterdir() if p.name != ".tether") == ["a.json", "b.json"]


def test_a_required_delete_that_an_earlier_batch_attempt_did_is_not_failed_on_its_re_run(coordinator, root, clock):
    (root / "x.json").write_text("{}")
    job_id = coordinator.enqueue(DeleteFile(path="x.json", require_exists=True)).id
    coordinator.enqueue(CreateFile(path="mate.json", content=1))
    assert len(coordinator.queue.claim("dead-worker", limit=10)) == 2
    (root / "x.json").unlink()  # its handler deleted the file; the worker died before committing
    clock.advance(coordinator.lock_timeout + 1)
    coordinator.run_until_idle()
    assert (coordinator.get(job_id).status, coordinator.get(job_id).result_data) == (
        JobStatus.COMPLETED,
        {"deleted": False},
    )


def test_readers_never_see_a_torn_file(root):
    target = root / "a.json"
    bodies = [bytes([65 + i]) * 200_000 for i in range(4)]
    write(root, "a.json", bodies[0])
    stop = threading.Event()
    torn: list[int] = []

    def reader():
        while not stop.is_set():
            data = target.read_bytes()
            if data not in bodies:
                torn.append(len(data))

    t = threading.Thread(target=reader)
    t.start()
    for i in range(40):
        write(root, "a.json", bodies[i % 4])
    stop.set()
    t.join()
    assert torn == []


def test_path_lock_serialises_holders_of_one_path(root):
    inside, overlap = [], []
    lock = threading.Lock()

    def hold():
        for _ in range(20):
            with locks.path_lock(root, "a.json"):
                with lock:
                    inside.append(1)
                    if len(inside) > 1:
                        overlap.append(1)
                with lock:
                    inside.pop()

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlap == []
    assert [p.name for p in (root / ".tether/locks").iterdir()] == [locks.LOCK_FILE]


def test_path_locks_of_different_paths_do_not_wait_for_each_other(root):
    held = threading.Event()
    release = threading.Event()

    def hold_a():
        with locks.path_lock(root, "a.json"):
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold_a)
    t.start()
    assert held.wait(10)
    try:
        with locks.path_lock(root, "b.json"):  # would block until release if they shared a lock
            assert t.is_alive() and not release.is_set()
    finally:
        release.set()
        t.join()


def test_a_path_lock_is_released_when_its_process_dies(root):
    import subprocess
    import sys

    code = (
        f"import os, sys; from pathlib import Path; from tether.jobtypes.datafiles import locks\n"
        f"with locks.path_lock(Path({str(root)!r}), 'a.json'):\n"
        f"    print('held', flush=True); os._exit(0)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.stdout == "held\n", child.stderr
    with locks.path_lock(root, "a.json"):  # the dead holder's lock went with it
        pass


def test_a_thread_may_hold_the_locks_of_several_paths_at_once(root):
    def hold_both_twice() -> None:
        with locks.path_lock(root, "a.json"), locks.path_lock(root, "b.json"):
            with locks.path_lock(root, "b.json"), locks.path_lock(root, "a.json"):  # re-entrant
                pass

    holder = threading.Thread(target=hold_both_twice, daemon=True)  # a self-deadlock would hang it
    holder.start()
    holder.join(timeout=30)
    assert not holder.is_alive(), "a thread waited on a lock it already held"
    assert [p.name for p in (root / ".tether/locks").iterdir()] == [locks.LOCK_FILE]


def test_a_path_lock_held_by_another_process_excludes_this_one(root):
    import errno
    import fcntl
    import struct
    import subprocess
    import sys

    code = (
        f"import sys; from pathlib import Path; from tether.jobtypes.datafiles import locks\n"
        f"with locks.path_lock(Path({str(root)!r}), 'a.json'):\n"
        f"    print('held', flush=True); sys.stdin.readline()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == "held\n"
        fd = os.open(root / ".tether/locks" / locks.LOCK_FILE, os.O_RDWR)
        try:
            probe = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, locks._path_hash("a.json"), 1, 0)
            with pytest.raises(OSError) as busy:  # a non-blocking try of the same lock
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, probe)
            assert busy.value.errno in (errno.EAGAIN, errno.EACCES)
            other = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, locks._path_hash("b.json"), 1, 0)
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, other)  # another path's lock is free
        finally:
            os.close(fd)
    finally:
        child.stdin.write("\n")
        child.stdin.close()
        child.wait(60)


def _try_lock(fd: int, rel: str) -> bool:
    """A non-blocking try of ``rel``'s path lock through ``fd``; True if it was free (and is now held)."""
    import errno
    import fcntl
    import struct

    try:
        fcntl.fcntl(
            fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, locks._path_hash(rel), 1, 0)
        )
    except OSError as e:
        assert e.errno in (errno.EAGAIN, errno.EACCES)
        return False
    return True


def test_a_path_lock_is_free_for_others_once_released(root):
    with locks.path_lock(root, "a.json"):
        fd = os.open(root / ".tether/locks" / locks.LOCK_FILE, os.O_RDWR)  # another open: another owner
        try:
            assert not _try_lock(fd, "a.json")
        finally:
            os.close(fd)
    fd = os.open(root / ".tether/locks" / locks.LOCK_FILE, os.O_RDWR)
    try:
        assert _try_lock(fd, "a.json")
    finally:
        os.close(fd)


@pytest.fixture
def synced(monkeypatch) -> list[str]:
    """The files and directories fsynced, in order (their real paths)."""
    calls: list[str] = []
    real = durable.fsync_fd

    def record(fd):
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(durable, "fsync_fd", record)
    return calls


def dirs(calls: list[str]) -> list[str]:
    return [c for c in calls if os.path.isdir(c)]


def test_new_directories_are_made_durable_parent_first_before_the_rename(root, synced):
    real = os.path.realpath(root)
    write(root, "a/b/c.json", b"{}")
    # root's entry for a, a's entry for b, then (after the rename) b's entry for c.json
    assert dirs(synced) == [real, f"{real}/a", f"{real}/a/b"]


def test_a_directory_someone_else_just_made_is_made_durable_by_the_first_write_into_it(root, synced):
    # Another thread or process made it and may not have fsynced its parent yet: a file written
    # there is only durable once the directory's own entry is.
    real = os.path.realpath(root)
    os.mkdir(root / "shared")
    write(root, "shared/one.json", b"1")
    assert dirs(synced) == [real, f"{real}/shared"]
    synced.clear()
    write(root, "shared/two.json", b"2")
    assert dirs(synced) == [f"{real}/shared"]  # once per directory per process


def test_a_write_whose_directory_could_not_be_made_durable_leaves_the_target_and_tries_again(root, monkeypatch):
    real = os.path.realpath(root)
    calls: list[str] = []
    original = durable.fsync_fd

    def fail_on_the_root_once(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        calls.append(path)
        if path == real and calls.count(real) == 1:
            raise OSError(5, "injected I/O error")
        original(fd)

    monkeypatch.setattr(durable, "fsync_fd", fail_on_the_root_once)
    with pytest.raises(OSError, match="injected"):
        write(root, "new/a.json", b"1")
    assert not (root / "new/a.json").exists() and os.listdir(root / "new") == []  # no file, no temp file
    write(root, "new/a.json", b"1")
    assert (root / "new/a.json").read_bytes() == b"1" and calls.count(real) == 2  # the walk was not taken as done


def test_a_child_forked_inside_a_path_lock_does_not_believe_it_holds_it(root):
    import multiprocessing

    def child(out):
        out.put(dict(locks._held.__dict__.get("locks", {})))

    with locks.path_lock(root, "a.json"):
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        p = ctx.Process(target=child, args=(out,))
        p.start()
        held = out.get(timeout=60)
        p.join(60)
    assert held == {}, "a child would take its parent's lock as re-entrant and not wait for it"


def test_opening_a_coordinator_makes_a_new_data_root_durably(tmp_path, synced):
    from tether import Coordinator
    from tether.jobtypes import default_registry

    base = os.path.realpath(tmp_path)
    Coordinator.open(f"sqlite:///{base}/ledger.db", root=f"{base}/new/root", registry=default_registry()).close()
    # tether counts a data root as durable from then on, so its entries must already be
    assert synced[:2] == [base, f"{base}/new"]
