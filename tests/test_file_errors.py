"""File jobs that can never succeed fail at once, saying why (issue 25): one mapping from file
system errors to outcomes, used by every file handler. SQLite only: the ledger plays no part."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tether import CreateFile, DeleteFile, InvalidPayload, JobStatus
from tether.jobtypes import create_file
from tether.jobtypes.datafiles import durable, paths
from tether.worker.completer import STORAGE_WAIT

# Each test with Linux openat2 (where the kernel has it) and with the portable walk.
pytestmark = pytest.mark.usefixtures("lookup")


@pytest.fixture
def db_url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'ledger' / 'tether.db'}"


def first_line(text: str | None) -> str:
    return (text or "").splitlines()[0]


def failed_at_once(coordinator, job_id: str) -> str:
    job = coordinator.get(job_id)
    assert job.status is JobStatus.FAILED and job.attempts == 1, (job.status, job.attempts, job.last_error)
    return first_line(job.last_error)


# -- the table, row by row ---------------------------------------------------------------


def test_create_under_a_path_component_that_is_a_file_fails_at_once_naming_it(coordinator, root):
    job_id = coordinator.enqueue(CreateFile(path="a.json/b.json", content=1), max_attempts=5).id
    (root / "a.json").write_text("{}")  # made after the enqueue: the check before the run finds it
    coordinator.run_until_idle()
    assert failed_at_once(coordinator, job_id) == (
        "InvalidPayload: invalid create_file payload: path: 'a.json/b.json' cannot be made: "
        "a.json is a file, not a directory"
    )
    assert (root / "a.json").read_text() == "{}"


def test_a_file_made_after_every_check_is_still_found_by_the_handler(coordinator, root, monkeypatch):
    # The enqueue-time check is a hint; the handler's own open is the authority.
    unchecked = partial(paths.checked_path, new_file=False)
    monkeypatch.setattr(create_file, "checked_path", lambda *args, new_file: unchecked(*args))
    payload = CreateFile(path="a.json/b.json", content=1)
    job_id = coordinator.enqueue(payload, max_attempts=5).id
    (root / "a.json").write_text("{}")
    coordinator.run_until_idle()
    assert failed_at_once(coordinator, job_id) == (
        "PermanentError: a.json is a file, not a directory (on the way to a.json/b.json)"
    )


def test_a_path_component_that_is_a_file_now_is_refused_at_enqueue_naming_it(coordinator, root):
    (root / "a").mkdir()
    (root / "a/b.json").write_text("{}")
    with pytest.raises(InvalidPayload, match=r"path: .* cannot be made: a/b.json is a file, not a directory"):
        coordinator.enqueue(CreateFile(path="a/b.json/c/d.json", content=1))
    assert coordinator.enqueue(CreateFile(path="a/new/c.json", content=1)).id  # a missing directory is fine


def test_a_file_on_the_way_through_a_symlinked_directory_is_refused_at_enqueue_by_its_own_name(coordinator, root):
    (root / "real").mkdir()
    (root / "real/a.json").write_text("{}")
    (root / "link").symlink_to("real")
    with pytest.raises(InvalidPayload, match=r"path: 'real/a.json/b.json' cannot be made: real/a.json is a file"):
        coordinator.enqueue(CreateFile(path="link/a.json/b.json", content=1))


def test_a_delete_under_a_file_finds_nothing_to_delete_which_is_done_unless_required(coordinator, root):
    # A file on the way means the path cannot exist: for a delete that is the goal already, as a
    # missing file is; the probe says in sync, and so does the job.
    plain = coordinator.enqueue(DeleteFile(path="a/b.json")).id
    required = coordinator.enqueue(DeleteFile(path="a/c.json", require_exists=True), max_attempts=5).id
    (root / "a").write_text("a file now")
    coordinator.run_until_idle()
    done = coordinator.get(plain)
    assert (done.status, done.result_data) == (JobStatus.COMPLETED, {"deleted": False})
    assert failed_at_once(coordinator, required) == (
        "PermanentError: a/c.json does not exist and require_exists is true"
    )
    assert coordinator.enqueue(DeleteFile(path="a/d.json")).id  # accepted at enqueue too


def test_delete_of_a_directory_fails_at_once_saying_delete_file_removes_files(coordinator, root):
    (root / "d").mkdir()
    (root / "d/keep.json").write_text("{}")
    job_id = coordinator.enqueue(DeleteFile(path="d"), max_attempts=5).id
    coordinator.run_until_idle()
    assert failed_at_once(coordinator, job_id) == "PermanentError: d is a directory; delete_file removes files"
    assert (root / "d/keep.json").exists()


def test_delete_of_an_empty_directory_fails_too_and_leaves_it(coordinator, root):
    (root / "d").mkdir()
    job_id = coordinator.enqueue(DeleteFile(path="d"), max_attempts=5).id
    coordinator.run_until_idle()
    assert "d is a directory" in failed_at_once(coordinator, job_id)
    assert (root / "d").is_dir()


def test_create_over_a_directory_without_overwrite_names_the_real_cause(coordinator, root):
    (root / "d").mkdir()
    job_id = coordinator.enqueue(CreateFile(path="d", content=1), max_attempts=5).id
    coordinator.run_until_idle()
    assert failed_at_once(coordinator, job_id) == "PermanentError: d is a directory"


def test_create_over_a_directory_with_overwrite_fails_at_once_and_leaves_it_untouched(coordinator, root):
    (root / "d").mkdir()
    (root / "d/keep.json").write_text("{}")
    job_id = coordinator.enqueue(CreateFile(path="d", content=1, overwrite=True), max_attempts=5).id
    coordinator.run_until_idle()
    assert failed_at_once(coordinator, job_id) == "PermanentError: d is a directory"
    assert sorted(p.name for p in (root / "d").iterdir()) == ["keep.json"]


# -- each errno of the mapping, injected at the file operation itself ----------------------------

PERMANENT = {
    errno.ENOTDIR: "is a file, not a directory",
    errno.EISDIR: "is a directory",
    errno.ENAMETOOLONG: "has a name too long for the file system",
    errno.ELOOP: "is a symbolic link, which tether does not follow inside the data root",
}
RETRYABLE = [errno.EIO, errno.EAGAIN, errno.EBUSY]
FULL = [errno.ENOSPC, errno.EDQUOT]
OPERATOR = [errno.EACCES, errno.EPERM, errno.EROFS]


def inject(monkeypatch: pytest.MonkeyPatch, op: str, code: int) -> None:
    """Make ``os.<op>`` fail with ``code`` on its first call (then behave)."""
    real, calls = getattr(os, op), []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(code, os.strerror(code))
        return real(*args, **kwargs)

    monkeypatch.setattr(os, op, failing)


def run_one(coordinator, root: Path, monkeypatch, kind: str, code: int) -> str:
    """A create_file (failing at its rename) or delete_file (at its unlink) met with ``code``."""
    (root / "d").mkdir()
    if kind == "create_file":
        job_id = coordinator.enqueue(CreateFile(path="d/a.json", content=1), max_attempts=5).id
        inject(monkeypatch, "replace", code)
    else:
        (root / "d/a.json").write_text("x")
        job_id = coordinator.enqueue(DeleteFile(path="d/a.json"), max_attempts=5).id
        inject(monkeypatch, "unlink", code)
    coordinator.run_until_idle()
    return job_id


@pytest.mark.parametrize("kind", ["create_file", "delete_file"])
@pytest.mark.parametrize("code", list(PERMANENT), ids=errno.errorcode.get)
def test_an_error_that_can_never_pass_fails_the_job_at_once_naming_path_and_cause(
    coordinator, root, monkeypatch, kind, code
):
    job_id = run_one(coordinator, root, monkeypatch, kind, code)
    if (kind, code) == ("delete_file", errno.ENOTDIR):
        # Except for a delete: a file on the way means the file cannot be there, which is its goal.
        assert coordinator.get(job_id).result_data == {"deleted": False}
        return
    line = failed_at_once(coordinator, job_id)
    assert line.startswith("PermanentError: d/a.json ") and PERMANENT[code] in line


@pytest.mark.parametrize("kind", ["create_file", "delete_file"])
@pytest.mark.parametrize("code", RETRYABLE, ids=errno.errorcode.get)
def test_a_transient_error_is_retried_with_the_path_and_cause_on_the_first_line(
    coordinator, root, clock, monkeypatch, kind, code
):
    job_id = run_one(coordinator, root, monkeypatch, kind, code)
    job = coordinator.get(job_id)
    assert job.status is JobStatus.PENDING and job.attempts == 1
    assert first_line(job.last_error) == f"RetryableError: d/a.json: {os.strerror(code)} ({errno.errorcode[code]})"
    clock.advance(3600)
    coordinator.run_until_idle()
    assert coordinator.get(job_id).status is JobStatus.COMPLETED


@pytest.mark.parametrize("kind", ["create_file", "delete_file"])
@pytest.mark.parametrize("code", FULL, ids=errno.errorcode.get)
def test_a_full_data_root_gives_the_attempt_back_and_the_job_waits_for_space(
    coordinator, root, clock, monkeypatch, kind, code
):
    job_id = run_one(coordinator, root, monkeypatch, kind, code)
    job = coordinator.get(job_id)
    assert job.status is JobStatus.PENDING and job.attempts == 0 and job.run_at > clock.now()
    assert first_line(job.last_error) == (
        f"StorageFull: d/a.json: {os.strerror(code)} ({errno.errorcode[code]}); waiting for space on the data root"
    )
    clock.advance(STORAGE_WAIT.total_seconds())  # the longest wait for space
    coordinator.run_until_idle()
    assert coordinator.get(job_id).status is JobStatus.COMPLETED and coordinator.get(job_id).attempts == 1


@pytest.mark.parametrize("kind", ["create_file", "delete_file"])
@pytest.mark.parametrize("code", OPERATOR, ids=errno.errorcode.get)
def test_a_permission_error_is_retried_saying_an_operator_can_fix_it(coordinator, root, monkeypatch, kind, code):
    job_id = run_one(coordinator, root, monkeypatch, kind, code)
    job = coordinator.get(job_id)
    assert job.status is JobStatus.PENDING and job.attempts == 1
    assert first_line(job.last_error) == (
        f"RetryableError: d/a.json: {os.strerror(code)} ({errno.errorcode[code]}); "
        "retried: fix the permissions or mount of the data root"
    )


def test_an_error_opening_a_directory_on_the_way_names_that_directory(coordinator, root, monkeypatch):
    coordinator.enqueue(CreateFile(path="d/first.json", content=1))
    coordinator.run_until_idle()  # d/ and tether's own .tether/locks/ exist now
    job_id = coordinator.enqueue(CreateFile(path="d/e/a.json", content=1), max_attempts=5).id
    inject(monkeypatch, "mkdir", errno.EROFS)
    coordinator.run_until_idle()
    assert first_line(coordinator.get(job_id).last_error).startswith(
        f"RetryableError: d/e: {os.strerror(errno.EROFS)} (EROFS) (on the way to d/e/a.json)"
    )


def test_the_mapping_leaves_other_errors_as_they_are():
    from tether.jobtypes.datafiles.effects import file_error

    other = OSError(errno.EEXIST, "File exists")
    assert file_error(other, "a.json") is other
    assert "a.json is not a regular file" in str(
        file_error(durable.NotRegularFile(0, "is not a regular file"), "a.json")
    )
