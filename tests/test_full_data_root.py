"""A data root that fills and frees during a drain, on a real 2 MiB tmpfs (the ledger on another
file system): the writes that do not fit wait with ENOSPC named, without spending their attempts
however long the disk stays full, no file is torn and no temp file stays behind, none is marked
failed, and every job completes once space returns.

Needs root to mount the tmpfs; it fails, never skips, when it cannot.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether import Coordinator, FakeClock
from tether.jobtypes.create_file import CreateFile
from tether.jobtypes.datafiles.paths import TEMP_SUFFIX
from tether.reconcile.check import reconcile

BODY = 48 * 1024  # bytes of each new version: a few fit in the space left, most do not
OLD = [f"old/{n}.txt" for n in range(6)]  # written before the fill, overwritten during it
NEW = [f"new/d{n % 3}/{n}.txt" for n in range(14)]  # first written during the fill


@pytest.fixture
def small_root(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for this test, unmounted after it."""
    mount_point = tmp_path / "root"
    mount_point.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(f"cannot mount a 2 MiB tmpfs at {mount_point} (this test needs root): {proc.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)  # detached once its files close


def body(rel: str, version: str) -> str:
    """A version of ``rel`` that tells where it stops: torn text fails ``whole``."""
    head = f"{rel} {version}\n"
    return head + "x" * (BODY - len(head) - 4) + "end\n"


def whole(path: Path, rel: str) -> str | None:
    """Which complete version ``path`` holds (None: absent); fails on anything else."""
    if not path.exists():
        return None
    text = path.read_text()
    for version in ("old", "new"):
        if text == body(rel, version) or (version == "old" and text == f"{rel} old\n"):
            return version
    raise AssertionError(f"{rel} is torn: {len(text)} bytes, starting {text[:40]!r}")


def fill(path: Path, leave: int) -> None:
    """Fill the file system of ``path`` with ``path``, then give back ``leave`` bytes."""
    chunk = b"\0" * 65536
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
        size = os.fstat(fd).st_size
        os.ftruncate(fd, max(0, size - leave))
    finally:
        os.close(fd)


def statuses(coordinator: Coordinator, ids: list[str]) -> dict[str, str]:
    return {job_id: coordinator.get(job_id).status for job_id in ids}


def test_a_data_root_that_fills_and_frees_mid_drain_retries_then_completes_every_job(
    small_root: Path, tmp_path: Path
) -> None:
    clock = FakeClock()
    db = tmp_path / "ledger" / "tether.db"
    with Coordinator.open(f"sqlite:///{db}", root=small_root, clock=clock) as coordinator:
        assert os.stat(db).st_dev != os.stat(small_root).st_dev  # the ledger is not on the full disk
        for rel in OLD:
            coordinator.enqueue(CreateFile(path=rel, text=f"{rel} old\n"))
        assert coordinator.run_until_idle() == len(OLD)

        filler = small_root / "filler.bin"  # another program's file, filling the disk
        fill(filler, leave=3 * BODY)
        ids = [coordinator.enqueue(CreateFile(path=rel, text=body(rel, "new"), overwrite=True)).id for rel in OLD + NEW]
        worker = coordinator.worker()
        for _ in range(3 * 3):  # full for three times more tries than any job has attempts
            while worker.run_once():  # every ready job, once: the others wait for space
                pass
            clock.advance(seconds=61)  # past the longest wait for space

        jobs = {job_id: coordinator.get(job_id) for job_id in ids}
        assert {job.status for job in jobs.values()} <= {"completed", "pending"}, [j.last_error for j in jobs.values()]
        waiting = [job for job in jobs.values() if job.status == "pending"]
        assert waiting and len(waiting) < len(ids), "some writes fit, the rest must meet a full disk"
        for job in waiting:
            assert job.attempts == 0 and job.last_error is not None  # each attempt given back
            assert job.last_error.startswith("StorageFull: ") and "No space left on device (ENOSPC)" in job.last_error
        for rel in OLD + NEW:
            version = whole(small_root / rel, rel)
            assert version in (("old", "new") if rel in OLD else (None, "new")), (rel, version)
        temps = [p for p in small_root.rglob("*") if p.name.endswith(TEMP_SUFFIX)]
        assert temps == [], temps
        assert reconcile(coordinator).counts["leftover_temp"] == 0

        filler.unlink()  # space returns
        clock.advance(seconds=3600)  # past every backoff
        assert coordinator.run_until_idle() == len(waiting)

        assert set(statuses(coordinator, ids).values()) == {"completed"}
        assert {coordinator.get(job.id).attempts for job in waiting} == {1}
        for rel in OLD + NEW:
            assert whole(small_root / rel, rel) == "new", rel
        report = reconcile(coordinator)
        assert report.exit_code == 0 and report.counts["in_sync"] == len(OLD + NEW), report.summary()
        assert [p for p in small_root.rglob("*") if p.name.endswith(TEMP_SUFFIX)] == []
