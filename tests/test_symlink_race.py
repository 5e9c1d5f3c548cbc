"""A directory swapped for a symlink to an outside directory, over and over, while a worker
creates and deletes files in it (issue 14, item 1): nothing appears or disappears outside the
root, and every job that completed did so inside it.

The bounded run is part of ``make test`` (a few seconds); ``TETHER_SOAK=1`` runs the long one
and prints its figures.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tether import Coordinator, CreateFile, DeleteFile, JobStatus
from tether.jobtypes import default_registry

# Each test with Linux openat2 (where the kernel has it) and with the portable walk.
pytestmark = pytest.mark.usefixtures("lookup")

SOAK = bool(os.environ.get("TETHER_SOAK"))
JOBS = 3000 if SOAK else 200  # creates, and as many deletes
AT_FDCWD, RENAME_EXCHANGE = -100, 2
_libc = ctypes.CDLL(None, use_errno=True)


def exchange(a: str, b: str) -> None:
    """renameat2(RENAME_EXCHANGE): the two names trade places in one step."""
    if _libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), a)


ATTACKER = """
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
a, b = (p.encode() for p in sys.argv[1:3])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
n = 0
print("swapping", flush=True)
while not stop.is_set():
    for _ in range(2):  # a symlink for a moment, then the directory again for a while, so
        if libc.renameat2(-100, a, -100, b, 2) != 0:  # most checks pass and uses are hit
            sys.exit("renameat2: " + os.strerror(ctypes.get_errno()))
        n += 1
    time.sleep(0.0002)
print("exchanges", n, flush=True)
"""


# Why a job may fail here: the check before the run resolved the path through the symlink, the
# open met the symlink, or the open met the directory mid-swap (a retryable error; one attempt).
REFUSALS = ("through a symlink", "is a symbolic link", "changed while it was being opened", "kept changing")


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


@pytest.mark.skipif(not hasattr(_libc, "renameat2"), reason="no renameat2 in this C library")
def test_swapping_a_directory_for_a_symlink_never_lets_an_effect_out_of_the_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "data", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    outside.mkdir()
    for i in range(JOBS):
        (root / "d" / f"g{i}").write_text("inside: delete me")
        (outside / f"g{i}").write_text("outside: not tether's")
    before = snapshot(outside)
    (root / "link").symlink_to(outside, target_is_directory=True)

    c = Coordinator.open(f"sqlite:///{tmp_path / 'ledger.db'}", root=root, registry=default_registry())
    try:
        # One attempt each: a refused job fails at once, so every outcome is final when the
        # queue is idle.
        creates = [c.enqueue(CreateFile(path=f"d/f{i}", text=f"{i}"), max_attempts=1).id for i in range(JOBS)]
        deletes = [c.enqueue(DeleteFile(path=f"d/g{i}"), max_attempts=1).id for i in range(JOBS)]
        # The attacker: another process, exchanging d and the symlink thousands of times a
        # second (the run: about every millisecond), until told to stop.
        attacker = subprocess.Popen(
            [sys.executable, "-c", ATTACKER, os.fspath(root / "d"), os.fspath(root / "link")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert attacker.stdout is not None and attacker.stdout.readline() == "swapping\n"
        started = time.monotonic()
        try:
            c.run_until_idle(threads=2)
        finally:
            out, _ = attacker.communicate("stop\n", timeout=60)
        elapsed = time.monotonic() - started
        assert attacker.returncode == 0, out
        exchanges = int(out.split()[-1])
        if (root / "d").is_symlink():  # put the real directory back under its name
            exchange(os.fspath(root / "d"), os.fspath(root / "link"))
        real = root / "d"
        assert real.is_dir() and not real.is_symlink()

        after = snapshot(outside)
        assert after == before, (
            f"outside the root: {len(set(after) - set(before))} files appeared, "
            f"{len(set(before) - set(after))} disappeared"
        )
        outcomes: Counter[str] = Counter()
        for kind, ids in (("create", creates), ("delete", deletes)):
            for n, job in enumerate(c.get(job_id) for job_id in ids):
                outcomes[f"{kind} {job.status.value}"] += 1
                if job.status is JobStatus.COMPLETED and kind == "create":
                    assert (real / f"f{n}").read_text() == f"{n}", f"create {n} completed, its file is not in the root"
                if job.status is JobStatus.COMPLETED and kind == "delete":
                    assert not (real / f"g{n}").exists(), f"delete {n} completed, its file is still in the root"
                if job.status is JobStatus.FAILED:
                    error = job.last_error or ""  # refused by the check before the run, or by the open
                    assert any(why in error for why in REFUSALS), error
        assert sum(outcomes.values()) == 2 * JOBS and not any("pending" in k or "claimed" in k for k in outcomes)
        assert exchanges > 10, "the attacker did not get to run"
        print(
            f"\nsymlink race: {JOBS} creates + {JOBS} deletes in {elapsed:.1f} s, "
            f"{exchanges} exchanges; {dict(sorted(outcomes.items()))}; outside: 0 appeared, 0 disappeared"
        )
    finally:
        c.close()


def test_the_attackers_exchange_works_here(tmp_path: Path) -> None:
    """The race test's weapon, checked on its own (so a silent no-op cannot pass the race)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").symlink_to(tmp_path)
    try:
        exchange(os.fspath(tmp_path / "a"), os.fspath(tmp_path / "b"))
    except OSError as e:
        if e.errno == errno.EINVAL:
            pytest.skip("this file system has no RENAME_EXCHANGE")
        raise
    assert (tmp_path / "a").is_symlink() and (tmp_path / "b").is_dir()
