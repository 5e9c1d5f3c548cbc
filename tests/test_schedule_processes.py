"""Real worker processes share an every-second schedule, one is SIGKILLed and restarted midway:
each second's slot has exactly one job. 6 s by default; TETHER_SCHEDULE_SOAK=20 for the 20 s run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tether.observe import schedules
from tether.observe.readonly import open_ledger

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
_SCRIPT = Path(sys.executable).with_name("tether")
TETHER = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from tether.cli import main; main()"]
SECONDS = int(os.environ.get("TETHER_SCHEDULE_SOAK", "6"))
DEADLINE = 60.0


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger' / 'tether.db'}"
    return str(request.getfixturevalue("pg_database"))


def test_every_second_slot_has_one_job_across_processes_and_a_kill(ledger: str, tmp_path: Path) -> None:
    if ledger.startswith("postgresql"):
        import sqlalchemy as sa

        engine = sa.create_engine(ledger)
        with engine.begin() as conn:
            for table in ("tether_jobs", "tether_meta", "tether_schedules"):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        engine.dispose()
    root = tmp_path / "data"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    subprocess.run([*TETHER, "--db", ledger, "--root", str(root), "init"], env=env, check=True, timeout=60)
    argv = [*TETHER, "--db", ledger, "--root", str(root), "--import", "tests.proc_schedules", "worker"]
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        with open(tmp_path / f"worker-{len(procs)}.stderr", "wb") as err:
            procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err))

    def counts() -> Counter[str]:
        try:
            engine = open_ledger(ledger)
        except Exception:  # not created yet by the first worker
            return Counter()
        try:
            return Counter(str(j.idempotency_key) for j in schedules.runs(engine, "every-second", limit=None))
        except Exception:
            return Counter()
        finally:
            engine.dispose()

    def wait_for_slots(n: int) -> None:
        deadline = time.monotonic() + DEADLINE
        while len(counts()) < n:
            assert time.monotonic() < deadline, f"fewer than {n} slots enqueued after {DEADLINE}s"
            assert all(p.poll() is None for p in procs), "a worker exited"
            time.sleep(0.2)

    try:
        for _ in range(3):
            start()
        wait_for_slots(SECONDS // 2)
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].wait()
        procs.pop(0)
        start()  # the replacement
        wait_for_slots(SECONDS)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    found = counts()
    slots = sorted(datetime.fromisoformat(k.rpartition("@")[2]) for k in found)  # keys read schedule:NAME@SLOT
    every = [slots[0] + timedelta(seconds=i) for i in range(int((slots[-1] - slots[0]).total_seconds()) + 1)]
    print(f"{len(found)} slots from {slots[0]} to {slots[-1]}; jobs per slot: {Counter(found.values())}")
    assert set(found.values()) == {1}, [k for k, n in found.items() if n > 1]
    assert slots == every  # no second skipped, the kill and restart included
    assert len(slots) >= SECONDS
