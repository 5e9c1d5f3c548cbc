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
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jobkit import busy_window
from tether import Coordinator, CreateFile, FakeClock, JobContext, JobType, Payload
from tether.errors import ConfigError
from tether.jobtypes import default_registry
from tether.observe import metrics, retention, tally
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


class Paid(Payload):
    job_type: ClassVar[str] = "paid"
    cost: Any
    tokens: int = 0
    model: str | None = None


class PaidType(JobType[Paid]):
    """Returns what an assistant's answer records: cost, tokens and model (claude_extraction's shape)."""

    name = "paid"
    payload_model = Paid

    def run(self, payload: Paid, ctx: JobContext) -> dict[str, Any]:
        result = {"cost_usd": payload.cost, "input_tokens": payload.tokens, "output_tokens": 2 * payload.tokens}
        return result if payload.model is None else {**result, "model": payload.model}


@pytest.fixture
def c(make_coordinator) -> Coordinator:
    registry = default_registry()
    registry.register(NapType())
    registry.register(PaidType())
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


def test_a_scrape_whose_reading_fails_midway_counts_nothing_twice(
    c: Coordinator, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    collector = metrics.LedgerCollector(c, settle=timedelta(0))
    clock.advance(1)  # the jobs finish after the collector started
    for n in range(3):
        c.enqueue(Paid(cost=0.25, tokens=10 + n, model=f"m{n}"))  # a group each on PostgreSQL too
    c.run_until_idle(batch=1)
    clock.advance(1)
    real, calls = tally.FinishedTally._spent, []

    def fails_at_the_second_job(self: Any, job_type: str, model: Any) -> Any:
        calls.append(job_type)
        if len(calls) == 2:  # the connection drops while the finished jobs stream in
            raise sa.exc.OperationalError("SELECT ...", {}, Exception("disk I/O error"))
        return real(self, job_type, model)

    monkeypatch.setattr(tally.FinishedTally, "_spent", fails_at_the_second_job)
    down = scrape(collector)
    assert down[("tether_ledger_up", ())] == 0 and len(calls) == 2
    monkeypatch.setattr(tally.FinishedTally, "_spent", real)
    again = scrape(collector)
    assert again[("tether_ledger_up", ())] == 1
    assert finished(again, "completed", "paid") == 3
    assert again[("tether_job_duration_seconds_count", (("type", "paid"),))] == 3
    assert [spent(again, "paid", f"m{n}") for n in range(3)] == [(1, 0.25, 10 + n, 20 + 2 * n) for n in range(3)]


def test_a_scrape_of_a_ledger_corrupted_under_it_says_the_ledger_is_down(tmp_path: Path, clock: FakeClock) -> None:
    db = tmp_path / "tether.db"
    with Coordinator.open(f"sqlite:///{db}", root=tmp_path / "data", clock=clock) as c:
        c.enqueue(CreateFile(path="a.json", content={"a": 1}))
    engine = sa.create_engine(f"sqlite:///{db}")
    collector = metrics.LedgerCollector(engine, settle=timedelta(0))
    with db.open("r+b") as f:  # every page past the header damaged, as a bad disk would
        f.seek(4096)
        f.write(b"\xde\xad\xbe\xef" * (max(db.stat().st_size - 4096, 16384) // 4))
    try:
        assert scrape(collector)[("tether_ledger_up", ())] == 0
    finally:
        engine.dispose()


def spent(s: dict, job_type: str, model: str) -> tuple[float, float, float, float]:
    """Billed jobs, dollars, input and output tokens of one (type, model) in a scrape."""
    labels = (("model", model), ("type", job_type))
    tokens = [
        s.get(("tether_job_tokens_total", (labels[0], ("token_type", kind), labels[1])), 0.0)
        for kind in ("input", "output")
    ]
    return (
        s.get(("tether_jobs_billed_total", labels), 0.0),
        s.get(("tether_job_cost_usd_total", labels), 0.0),
        *tokens,
    )


def test_spend_is_added_up_from_the_finished_jobs_a_scrape_reads_once_by_type_and_model(
    c: Coordinator, clock: FakeClock
) -> None:
    collector = metrics.LedgerCollector(c, settle=timedelta(seconds=60))
    clock.advance(1)  # what finishes at the collector's start is not its to count
    c.enqueue(Paid(cost=0.25, tokens=100, model="sonnet"))
    c.enqueue(Paid(cost=0.5, tokens=10, model="sonnet"))
    c.enqueue(Paid(cost=0.125, tokens=1, model="opus"))
    c.enqueue(Paid(cost="not a number", tokens=3))  # a result that names no model, and a bad cost
    c.enqueue(Nap(seconds=1))  # records no cost: no spend series
    c.run_until_idle(batch=1)
    clock.advance(61)
    first = scrape(collector)
    assert spent(first, "paid", "sonnet") == (2, 0.75, 110, 220)
    assert spent(first, "paid", "opus") == (1, 0.125, 1, 2)
    assert spent(first, "paid", tally.UNKNOWN_MODEL) == (1, 0, 3, 6)
    assert not [
        k for k in first if k[0].startswith(("tether_job_cost", "tether_jobs_billed")) and ("type", "nap") in k[1]
    ]
    assert (
        first[("tether_job_cost_usd_created", (("model", "opus"), ("type", "paid")))]
        == collector.finished.since.timestamp()
    )
    clock.advance(30)
    assert without_timing(scrape(collector)) == without_timing(first)  # nothing new: nothing read twice
    # The jobs already counted are purged; the counters keep them (they are not a sum over the ledger).
    assert retention.purge(c, older_than=timedelta(seconds=1)).total == 5
    c.enqueue(Paid(cost=1.0, tokens=5, model="sonnet"))
    c.run_until_idle(batch=1)
    clock.advance(61)
    later = scrape(collector)
    assert spent(later, "paid", "sonnet") == (3, 1.75, 115, 230)
    assert spent(later, "paid", "opus") == (1, 0.125, 1, 2)


def test_the_one_off_exposition_shows_the_spend_of_its_window(c: Coordinator, clock: FakeClock) -> None:
    c.enqueue(Paid(cost=0.5, tokens=7, model="sonnet"))
    c.run_until_idle()
    clock.advance(7200)
    c.enqueue(Paid(cost=0.25, tokens=4, model="sonnet"))
    c.run_until_idle()
    s = samples(metrics.exposition(c, window=timedelta(hours=1)).decode())
    assert spent(s, "paid", "sonnet") == (1, 0.25, 4, 8)  # the earlier job is outside the window


def test_the_one_off_exposition_reads_a_sample_of_a_busy_window_and_says_so(c: Coordinator) -> None:
    """100 completed jobs and 3 failed in the window, a sample of 10 per outcome: one completed
    job in 10 is read and counts 10 times; the 3 failed are all read; the reading says so."""
    busy_window(c, 100, took=lambda i: 2.0)
    busy_window(c, 3, status="failed")
    s = samples(metrics.exposition(c, window=timedelta(hours=1), sample=10).decode())
    work = (("type", "work"),)
    assert s[("tether_jobs_finished_total", (("status", "completed"), *work))] == 100
    assert s[("tether_jobs_finished_total", (("status", "failed"), *work))] == 3
    assert s[("tether_jobs_finished_sample_every", (("status", "completed"),))] == 10
    assert s[("tether_jobs_finished_sample_every", (("status", "failed"),))] == 1
    assert s[("tether_job_duration_seconds_count", work)] == 100
    assert s[("tether_job_duration_seconds_sum", work)] == pytest.approx(200.0, abs=0.01)
    exact = samples(metrics.exposition(c, window=timedelta(hours=1), sample=None).decode())
    assert exact[("tether_jobs_finished_total", (("status", "completed"), *work))] == 100
    assert not [name for name, _ in exact if name == "tether_jobs_finished_sample_every"]


def test_durations_sum_spend_per_type_and_skip_a_cost_that_is_not_a_number(c: Coordinator, clock: FakeClock) -> None:
    from tether.observe import billing, durations

    c.enqueue(Paid(cost=0.25, tokens=3, model="sonnet"))
    c.enqueue(Paid(cost=0.5, tokens=1, model="opus"))
    c.enqueue(Paid(cost="free", tokens=2))  # would fail a cast on PostgreSQL
    c.enqueue(Nap(seconds=1))
    c.run_until_idle()
    by_type = {d.type: d for d in durations.durations(c, now=clock.now())}
    assert by_type["paid"].spend == billing.Spend(3, 0.75, 6, 12)
    assert by_type["nap"].spend is None


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


def test_a_cancelled_job_is_counted_finished_as_cancelled(c: Coordinator, clock: FakeClock) -> None:
    collector = metrics.LedgerCollector(c, settle=timedelta(0))
    clock.advance(1)  # cancelled after the collector started
    c.cancel(c.enqueue(Nap(seconds=1)).id)
    clock.advance(1)
    assert finished(scrape(collector), "cancelled", "nap") == 1
