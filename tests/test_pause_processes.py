"""Pausing a job type under load, on SQLite and PostgreSQL: three ``tether worker`` processes
drain 1,000 jobs of two types; the test's process pauses one of them midway. No job of it is
claimed later than one second after the pause returned, the other type drains, ``tether status``
and the ui show the paused type with its backlog; once resumed, every job completes."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from starlette.testclient import TestClient

from proc_cancel import Tick
from test_cancel_processes import registry, stop, worker
from tether import Coordinator, ui
from tether.jobtypes import CreateFile
from tether.observe.backlog import utc
from workerkit import REPO, TETHER, wait_for


def status_json(db: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    run = subprocess.run([*TETHER, "--db", db, "status", "--json"], cwd=REPO, env=env, capture_output=True, timeout=60)
    return json.loads(run.stdout)


def latest_claim(c: Coordinator, job_type: str) -> datetime | None:
    with c.engine.connect() as conn:
        value = conn.execute(
            sa.text("SELECT max(claimed_at) FROM tether_jobs WHERE type = :t"), {"t": job_type}
        ).scalar()
    return utc(value)  # SQLite keeps times as text


def count(c: Coordinator, where: str) -> int:
    with c.engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM tether_jobs WHERE {where}")).scalar() or 0)


def test_a_type_paused_midway_is_not_claimed_a_second_after_and_completes_once_resumed(
    db_url: str, root: Path, tmp_path: Path
):
    with Coordinator.open(db_url, root=root, registry=registry()) as c:
        mixed = [job for n in range(500) for job in (CreateFile(path=f"f/{n}.json", content=n), Tick(n=n, sleep=0.01))]
        c.enqueue_many(mixed)  # interleaved: both types drain together
        procs = [worker(db_url, root, tmp_path / f"worker{i}.out") for i in range(3)]
        try:
            wait_for(lambda: count(c, "type = 'tick' AND status = 'completed'") >= 50, "the workers to be draining")
            c.pause("tick", "load test")
            returned = c.clock.now()
            wait_for(lambda: count(c, "type = 'create_file' AND status != 'completed'") == 0, "the other type to drain")
            # A worker may still claim within the second a pause promises: read the backlog once
            # that second is over, so the figures compared below cannot move between reads.
            wait_for(lambda: c.clock.now() > returned + timedelta(seconds=1.2), "the pause's second to pass")
            ticks = {b.type: b for b in c.stats().by_type}["tick"]
            last = latest_claim(c, "tick")
            status = status_json(db_url)
            with TestClient(ui.app(c), base_url="http://127.0.0.1:8787") as web:
                page = web.get("/live/overview").text
            c.resume("tick")
            wait_for(lambda: c.stats().outstanding == 0, "every job to complete after the resume")
            completed = count(c, "status = 'completed'")
        finally:
            for p in procs:
                stop(p)
    assert ticks.pending > 0 and ticks.paused, ticks
    assert last is not None and last <= returned + timedelta(seconds=1), (last, returned)
    assert [p["type"] for p in status["paused"]] == ["tick"]
    assert [(b["type"], b["pending"], b["paused"]) for b in status["by_type"]] == [("tick", ticks.pending, True)]
    assert re.search(r">tick</a> <span class=\"badge paused\"", page)
    assert completed == 1000
    print(
        f"\npaused with {ticks.pending} tick jobs waiting; the last tick job was claimed "
        f"{(last - returned).total_seconds():+.3f}s after the pause returned"
    )
