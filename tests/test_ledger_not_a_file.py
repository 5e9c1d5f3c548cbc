"""A SQLite ledger path that holds a FIFO or a directory: every command, and ``Coordinator.open``,
says it is not a regular file, and none blocks on it (opening a FIFO to read it would)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tether import Coordinator
from tether.errors import NoLedger

# One command per way of opening the ledger: status's sqlite3 path, the read commands' read-only
# engine, Coordinator.open (enqueue, worker, retry), reconcile's check before it opens.
COMMANDS = [
    ["status"],
    ["jobs"],
    ["enqueue", "create_file", "--payload", '{"path": "a.json", "text": "x"}'],
    ["worker", "--until-idle"],
    ["retry", "01M8GPDVAW6PHWNM7PD65H582J"],
    ["reconcile"],
]

WHAT = {"fifo": "it is not a regular file", "directory": "it is a directory, not a ledger file"}


def make(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_every_command_says_the_ledger_path_is_not_a_regular_file_without_blocking(kind, tmp_path):
    db = tmp_path / "tether.db"
    make(kind, db)
    procs = [
        (
            command,
            subprocess.Popen(
                [sys.executable, "-m", "tether", "--db", f"sqlite:///{db}", "--root", str(tmp_path), *command],
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for command in COMMANDS
    ]
    try:
        for command, proc in procs:
            _, err = proc.communicate(timeout=120)  # a command blocked on the FIFO never returns
            expected = 3 if command == ["status"] else 1
            assert proc.returncode == expected, (command, err)
            assert f"no ledger at {db} ({WHAT[kind]}; check --db or TETHER_DB)" in err.strip().splitlines()[-1], (
                command,
                err,
            )
            assert "Traceback" not in err and "empty" not in err, (command, err)
    finally:
        for _, proc in procs:
            proc.kill()
            proc.wait()
    mode = db.stat().st_mode
    assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISDIR(mode)  # left as it was


def test_coordinator_open_refuses_a_fifo_as_no_ledger_without_opening_it(tmp_path):
    db = tmp_path / "tether.db"
    os.mkfifo(db)
    raised: list[BaseException] = []

    def open_it() -> None:
        try:
            Coordinator.open(f"sqlite:///{db}", root=tmp_path).close()
        except BaseException as e:  # handed to the test's thread
            raised.append(e)

    opener = threading.Thread(target=open_it, daemon=True)
    opener.start()
    opener.join(60)
    if opener.is_alive():  # blocked in open(2) of the FIFO: unblock it by opening the other end
        with open(db, "wb"):
            pass
        opener.join(10)
        pytest.fail("Coordinator.open blocked on a FIFO at the ledger path")
    assert len(raised) == 1 and isinstance(raised[0], NoLedger), raised
    assert str(raised[0]) == f"no ledger at {db} (it is not a regular file; check --db or TETHER_DB)"
