"""Prometheus metrics: the served collector counts each finished job once across scrapes, shows the
last reconcile verdict, and answers a real HTTP client on loopback (SQLite and PostgreSQL)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import ClassVar

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tether import Coordinator, CreateFile, FakeClock, JobContext, JobType, Payload
from tether.errors import ConfigError
from tether.jobtypes import default_registry
from tether.observe import metrics
from tether.reconcile import runs as reconcile_runs
from tether.reconcile.check import reconcile


class Nap(Payload):
    job_type: ClassVar[str] = "nap"
    seconds: float


class NapType(JobType[Nap]):
    """Takes ``seconds`` of fake time."""

    name = "nap"
    payload_model = Nap

    def run(self, payload: Nap, ctx: JobContext) -> None:
        ctx.clock.advance(payload.seconds)  # type: ignore[attr-defined]


@pytest.fixture
def c(make_coordinator) -> Coordinator:
    registry = default_registry()
    registry.register(NapType())
    return make_coordinator(registry=registry)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition, parsed by prometheus-client's own parser."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(collector: metrics.LedgerCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return samples(generate_latest(reg).decode())


def without_timing(s: dict) -> dict:
    return {k: v for k, v in s.items() if k[0] != "tether_ledger_scrape_duration_seconds"}


def finished(s: dict, status: str, job_type: str) -> float:
    return s.get(("tether_jobs_finished_total", (("status", status), ("type", job_type))), 0.0)


def test_a_served_collector_counts_each_finished_job_once_across_scrapes(c: Coordinator, clock: FakeClock) -> None:
    c.enqueue(Nap(seconds=3))
    c.run_until_idle(batch=1)  # finished before the collector started: not its to count
    clock.advance(5)
    collector = metrics.LedgerCollector(c, settle=timedelta(seconds=60))
    for seconds in (0.5, 2, 7):
        c.enqueue(Nap(seconds=seconds))
    c.run_until_idle(batch=1)
    assert finished(scrape(collector), "completed", "nap") == 0  # younger than the settle margin
    clock.advance(61)
    first = scrape(collector)
    assert finished(first, "completed", "nap") == 3
    assert first[("tether_job_duration_seconds_bucket", (("le", "1.0"), ("type", "nap")))] == 1
    assert first[("tether_job_duration_seconds_bucket", (("le", "2.5"), ("type", "nap")))] == 2
    assert first[("tether_job_duration_seconds_count", (("type", "nap"),))] == 3
    assert first[("tether_job_duration_seconds_sum", (("type", "nap"),))] == 9.5
    clock.advance(30)
    assert without_timing(scrape(collector)) == without_timing(first)  # nothing new: nothing read twice
    c.enqueue(Nap(seconds=40))
    c.run_until_idle(batch=1)
    clock.advance(61)
    later = scrape(collector)
    assert finished(later, "completed", "nap") == 4  # counters only grow: rate() works on them
    assert later[("tether_job_duration_seconds_bucket", (("le", "30.0"), ("type", "nap")))] == 3
    assert later[("tether_job_duration_seconds_bucket", (("le", "60.0"), ("type", "nap")))] == 4


def test_the_last_reconcile_verdict_and_its_drift_are_exposed(c: Coordinator, root: Path) -> None:
    assert ("tether_reconcile_last_verdict", ()) not in scrape(metrics.LedgerCollector(c))  # never checked
    c.enqueue(CreateFile(path="a.json", content={"v": 1}))
    c.enqueue(CreateFile(path="b.json", content={"v": 2}))
    c.run_until_idle()
    reconcile(c)
    s = scrape(metrics.LedgerCollector(c))
    assert s[("tether_reconcile_last_verdict", ())] == 0 and s[("tether_reconcile_last_drift", ())] == 0
    (root / "a.json").write_text("changed by hand")
    (root / "b.json").unlink()
    report = reconcile(c)
    s = scrape(metrics.LedgerCollector(c))
    assert s[("tether_reconcile_last_verdict", ())] == 2 and s[("tether_reconcile_last_drift", ())] == 2
    assert s[("tether_reconcile_last_targets", (("status", "missing"),))] == 1
    assert report.finished_at is not None
    assert s[("tether_reconcile_last_run_timestamp_seconds", ())] == report.finished_at.timestamp()


def test_only_the_newest_reconcile_verdicts_are_kept(c: Coordinator, clock: FakeClock) -> None:
    for _ in range(reconcile_runs.KEEP + 5):
        reconcile(c)
        clock.advance(1)
    with c.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM tether_reconcile_runs")).scalar_one() == reconcile_runs.KEEP
        newest = reconcile_runs.last(conn)
        assert newest is not None and newest.checked_at == clock.now() - timedelta(seconds=1)


def test_the_server_answers_a_real_http_scrape_on_a_free_port(c: Coordinator, clock: FakeClock) -> None:
    collector_start = clock.now()
    server, thread = metrics.serve(c, "127.0.0.1", 0)  # port 0: the system picks a free one
    try:
        c.enqueue(Nap(seconds=2))
        delayed = c.enqueue(Nap(seconds=0), delay=300)
        c.run_until_idle(batch=1)
        clock.advance(61)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    s = samples(text)
    assert s[("tether_jobs", (("status", "pending"), ("type", "nap")))] == 1
    assert s[("tether_jobs_outstanding", ())] == 1
    assert s[("tether_oldest_pending_age_seconds", ())] == (clock.now() - c.get(delayed.id).created_at).total_seconds()
    assert s[("tether_jobs_finished_total", (("status", "completed"), ("type", "nap")))] == 1
    assert (
        s[("tether_jobs_finished_created", (("status", "completed"), ("type", "nap")))] == collector_start.timestamp()
    )
    assert s[("tether_job_queue_wait_seconds_count", (("type", "nap"),))] == 1
    assert s[("tether_ledger_up", ())] == 1
    assert ("process_cpu_seconds_total", ()) in s  # the serving process's own collector
    thread.join(5)
    assert not thread.is_alive()


def test_a_non_loopback_address_needs_allow_remote(c: Coordinator) -> None:
    with pytest.raises(ConfigError, match="0.0.0.0 is not a loopback address.*--allow-remote"):
        metrics.serve(c, "0.0.0.0", 0)
    assert metrics.is_loopback("localhost") and metrics.is_loopback("::1")
    assert not metrics.is_loopback("0.0.0.0")


def test_metrics_serve_runs_until_sigterm(c: Coordinator, db_url: str) -> None:
    c.enqueue(Nap(seconds=1))
    env = {**os.environ, "TETHER_DB": db_url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", "metrics", "--serve", "--port", "0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        found = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", proc.stderr.readline())
        assert found, "the server did not say where it listens"
        port = int(found.group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            s = samples(r.read().decode())
        assert s[("tether_jobs", (("status", "pending"), ("type", "nap")))] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
    refused = subprocess.run(
        [sys.executable, "-m", "tether", "metrics", "--serve", "--host", "0.0.0.0", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "--allow-remote" in refused.stderr
