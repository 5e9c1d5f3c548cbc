"""The command line as scripts use it, through real processes: a reader that closes stdout early
(``| head -1``) leaves the command's own exit code and nothing on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether import Coordinator, CreateFile


def tether(tmp: Path, *args: str, stdout: int | None = subprocess.PIPE, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(TETHER_DB=f"sqlite:///{tmp}/tether.db", TETHER_ROOT=str(tmp / "data"), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "tether", *args], env=env, cwd=tmp, stdout=stdout, stderr=subprocess.PIPE, **kw
    )


def closed_reader(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """Run with stdout a pipe whose reader has already gone (what ``head -1`` leaves behind)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return tether(tmp, *args, stdout=write)
    finally:
        os.close(write)


@pytest.fixture
def drifted(tmp_path: Path) -> Path:
    """A ledger with two completed writes (one file deleted by hand since) and two pending jobs,
    made in this process: the commands under test are the ones run through real processes."""
    with Coordinator.open(f"sqlite:///{tmp_path}/tether.db", root=tmp_path / "data") as c:
        for name in ("a", "b"):
            c.enqueue(CreateFile(path=f"{name}.json", content={"n": 1}))
        c.run_until_idle()
        (tmp_path / "data" / "a.json").unlink()
        for name in ("c", "d"):
            c.enqueue(CreateFile(path=f"{name}.json", content={"n": 1}), delay=3600)
    return tmp_path


def test_closed_stdout_keeps_the_exit_code_of_status_and_reconcile(drifted: Path) -> None:
    status = closed_reader(drifted, "status", "--backlog-limit", "2")
    assert (status.returncode, status.stderr.decode()) == (2, "")
    report = closed_reader(drifted, "reconcile", "--quiet")
    assert (report.returncode, report.stderr.decode()) == (2, "")
    # The same commands with a reader that stays: the exit codes the closed pipe must keep.
    assert tether(drifted, "status", "--backlog-limit", "2").returncode == 2
    assert tether(drifted, "reconcile", "--quiet").returncode == 2


def test_head_one_of_a_long_listing_ends_quietly(drifted: Path) -> None:
    shell = subprocess.run(
        f'{sys.executable} -m tether jobs --limit 0 | head -1; echo "exit ${{PIPESTATUS[0]}}"',
        shell=True,
        executable="/bin/bash",
        cwd=drifted,
        env={**os.environ, "TETHER_DB": f"sqlite:///{drifted}/tether.db", "TETHER_ROOT": str(drifted / "data")},
        capture_output=True,
        text=True,
    )
    assert shell.stdout.splitlines()[-1] == "exit 0" and shell.stderr == ""
