"""``tether ui``: every route, filter and action through Starlette's test client, and the
page's security (Host check, sign-in, CSRF, headers, escaping, read-only by default)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

import httpx
import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from jobkit import Note, NoteType, registry_with, seed_states
from tether import Coordinator, FakeClock, ui
from tether.errors import ConfigError
from tether.jobtypes import CreateFile, DeleteFile
from tether.ledger.status import JobStatus
from tether.observe.health import health
from tether.observe.jobs import paused_types
from tether.observe.verdict import Thresholds
from tether.reconcile.check import reconcile
from tether.ui import web as web_module

BASE = "http://127.0.0.1:8787"
EVIL = "<script>alert(1)</script>"


@pytest.fixture
def ledger(tmp_path, clock: FakeClock):
    c = Coordinator.open(
        f"sqlite:///{tmp_path / 'ui.db'}", root=tmp_path / "data", clock=clock, registry=registry_with(NoteType())
    )
    yield c
    c.close()


@pytest.fixture
def any_ledger(make_coordinator):
    """A ledger on each backend (SQLite, PostgreSQL)."""
    return make_coordinator(registry_with(NoteType()))


def fill(c: Coordinator, clock: FakeClock) -> dict[str, str]:
    """A small ledger: written files, two failures with different errors, a pending job."""
    ids = {}
    for i in range(3):
        ids[f"file{i}"] = c.enqueue(CreateFile(path=f"notes/{i}.json", content={"n": i})).id
        clock.advance(1)
    ids["boom"] = c.enqueue(Note(name="boom", fail_times=9, permanent=True, target="note:boom")).id
    ids["evil"] = c.enqueue(Note(name=EVIL, fail_times=9, permanent=True)).id
    c.run_until_idle()
    clock.advance(1)
    ids["pending"] = c.enqueue(DeleteFile(path="notes/0.json"), delay=3600).id
    return ids


def client(c: Coordinator, **options) -> TestClient:
    return TestClient(ui.app(c, **options), base_url=BASE)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)


# -- pages -----------------------------------------------------------------------------------------


def counters_of(page: str) -> dict[str, int]:
    found = re.findall(r'data-state="(\w+)"><a href="[^"]*"><span class="n">(-|\d+)</span>', page)
    return {state: -1 if n == "-" else int(n) for state, n in found}


def test_overview_leads_with_a_counter_per_state_each_linking_to_its_jobs(any_ledger, clock):
    ledger = any_ledger
    expected = seed_states(ledger, clock)
    with client(ledger) as web:
        page = web.get("/").text
        listed = {
            state: re.findall(r'<a class="id" href="/jobs/([0-9A-Z]{26})">', web.get(f"/jobs?status={state}").text)
            for state in expected
            if state != "drift"
        }
    assert counters_of(page) == expected
    assert {state: len(ids) for state, ids in listed.items()} == {k: v for k, v in expected.items() if k != "drift"}
    assert 'href="/jobs?status=retrying"' in page and 'href="/drift"' in page
    # By type too: the two scheduled jobs are delete_file's, the one retrying a note.
    assert 'href="/jobs?status=scheduled&amp;type=delete_file">2</a>' in page
    assert 'href="/jobs?status=retrying&amp;type=note">1</a>' in page


def test_the_drift_counter_says_when_no_check_was_recorded(ledger, clock):
    fill(ledger, clock)
    with client(ledger) as web:
        page = web.get("/").text
    assert counters_of(page)["drift"] == -1 and "no reconcile check recorded yet" in page


def test_overview_shows_rates_and_run_times_as_numbers_not_zero(ledger, clock, monkeypatch):
    run = NoteType.run
    monkeypatch.setattr(NoteType, "run", lambda self, payload, ctx: (clock.advance(1.5), run(self, payload, ctx))[1])
    ledger.enqueue(Note(name="ok"))
    ledger.enqueue(Note(name="no", fail_times=9, permanent=True))
    ledger.run_until_idle()
    with client(ledger) as web:
        page = web.get("/").text
    assert re.search(r'success_rate</td><td class="num">50.0%</td>', page), page
    assert 'p95_duration</td><td class="num">1.50s · note</td>' in page


def test_the_checks_fold_per_type_run_times_into_one_row_unless_one_is_past_its_threshold(ledger, clock, monkeypatch):
    run = NoteType.run
    monkeypatch.setattr(NoteType, "run", lambda self, payload, ctx: (clock.advance(1.5), run(self, payload, ctx))[1])
    ledger.enqueue(CreateFile(path="a.json", content={}))
    ledger.run_until_idle()
    ledger.enqueue(Note(name="slow"))  # apart: a batch's run time counts its batch-mates'
    ledger.run_until_idle()
    with client(ledger, thresholds=Thresholds(p95_warn=3600)) as web:
        folded = web.get("/").text
    with client(ledger, thresholds=Thresholds(p95_warn=1.0)) as web:
        apart = web.get("/").text
    assert folded.count("p95_duration") == 1 and "1.50s · note (slowest of 2 types)</td>" in folded
    assert ">p95_duration:note</td>" in apart and 'p95_duration</td><td class="num">0.0ms · create_file</td>' in apart


def test_the_throughput_chart_draws_each_minute_completed_and_failed(ledger, clock):
    ledger.enqueue(Note(name="ok"))
    ledger.run_until_idle()
    clock.advance(120)
    ledger.enqueue(Note(name="no", fail_times=9, permanent=True))
    ledger.run_until_idle()
    with client(ledger) as web:
        page = web.get("/").text
    chart = page.split('<svg class="chart throughput"', 1)[1].split("</svg>", 1)[0]
    assert chart.count('<rect class="completed"') == 1 and chart.count('<rect class="failed"') == 1
    assert chart.count("<title>") == 60 and "1 completed, 0 failed" in chart and "0 completed, 1 failed" in chart


def test_overview_shows_the_health_verdict_backlog_and_last_hour(ledger, clock):
    fill(ledger, clock)
    with client(ledger) as web:
        page = web.get("/")
        live = web.get("/live/overview")
    verdict = health(ledger)  # what `tether status` judges, alerting rules included
    assert page.status_code == 200
    assert f"<strong>{verdict.verdict.label.upper()}</strong>" in page.text and "2 failed" in page.text
    assert all(f">{c.name}</td>" in page.text for c in verdict.checks if not c.name.startswith("p95_duration:"))
    assert "delete_file" in page.text  # outstanding by type
    assert 'hx-get="/live/overview"' in page.text and "/static/htmx-2.0.11.min.js" in page.text
    assert live.status_code == 200 and "<html" not in live.text and "2 failed" in live.text
    assert "3 completed" in live.text.replace("</span>", "").replace('<span class="num">', "")


def test_jobs_filters_by_status_type_target_key_and_window(ledger, clock):
    ids = fill(ledger, clock)
    with client(ledger) as web:
        failed = web.get("/jobs", params={"status": "failed"}).text
        notes = web.get("/jobs", params={"type": "note"}).text
        target = web.get("/jobs", params={"target": "notes/1.json"}).text
        window = web.get("/jobs", params={"window": "1s"}).text
        keyless = web.get("/jobs", params={"key": "k"})
        bad = web.get("/jobs", params={"status": "done"})
    assert ids["boom"] in failed and ids["evil"] in failed and ids["file0"] not in failed
    assert ids["boom"] in notes and ids["file1"] not in notes
    assert ids["file1"] in target and ids["file2"] not in target
    assert ids["pending"] in window and ids["file0"] not in window
    assert keyless.status_code == 400 and "needs a type" in keyless.text
    assert bad.status_code == 400 and "is not one of" in bad.text


def test_jobs_page_tells_scheduled_and_retrying_from_ready_with_a_run_at_column(ledger, clock):
    seed_states(ledger, clock)
    with client(ledger) as web:
        page = web.get("/jobs").text
    rows = re.findall(
        r'<span class="badge (\w+)">\1</span>.*?<td class="time">[^<]*</td>\s*<td class="time">([^<]*)</td>', page, re.S
    )
    states = [state for state, _ in rows]
    assert {"ready": 2, "scheduled": 2, "retrying": 1, "running": 1, "stuck": 1}.items() <= {
        s: states.count(s) for s in set(states)
    }.items()
    assert all(run_at for state, run_at in rows if state in ("ready", "scheduled", "retrying"))
    assert "<th>runs at</th>" in page


def test_a_completed_jobs_earlier_error_is_history_not_its_state(ledger, clock):
    job = ledger.enqueue(Note(name="flaky", fail_times=1)).id
    ledger.run_until_idle()
    clock.advance(3600)
    ledger.run_until_idle()
    assert ledger.get(job).status is JobStatus.COMPLETED and ledger.get(job).last_error
    with client(ledger) as web:
        page = web.get("/jobs").text
    row = page.split(f'href="/jobs/{job}"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="history"' in row and "earlier: " in row and 'class="err"' not in row


def test_the_workers_view_shows_each_worker_its_jobs_with_progress_and_the_gone_ones(ledger, clock):
    from tether.ledger import workers as register

    register.register(ledger.queue, "dead-host:7:aaaaaa", 4)
    clock.advance(ledger.lock_timeout + 1)
    register.register(ledger.queue, "live-host:8:bbbbbb", 2)
    job = ledger.enqueue(Note(name="busy")).id
    [held] = ledger.queue.claim("live-host:8:bbbbbb")
    ledger.queue.record_progress(held, "live-host:8:bbbbbb", '{"done": 40, "total": 100, "note": "copying"}')
    with client(ledger) as web:
        page = web.get("/workers").text
        live = web.get("/live/workers").text
    rows = dict(re.findall(r'<tr data-worker="([^"]+)">(.*?)</tr>', page, re.S))
    assert '<span class="badge gone">gone</span>' in rows["dead-host:7:aaaaaa"]
    live_row = rows["live-host:8:bbbbbb"]
    assert '<span class="badge running">running</span>' in live_row and job in live_row
    assert "40/100 (40%) copying" in live_row and ">2</td>" in live_row
    assert "<html" not in live and "live-host:8:bbbbbb" in live


def test_jobs_filter_by_key_finds_the_keyed_job(ledger, clock):
    kept = ledger.enqueue(CreateFile(path="k.json", content={}), key="the-key").id
    other = ledger.enqueue(CreateFile(path="j.json", content={}), key="other").id
    with client(ledger) as web:
        page = web.get("/jobs", params={"type": "create_file", "key": "the-key"}).text
    assert kept in page and other not in page


def test_jobs_filter_by_tag_on_each_backend_and_a_job_shows_its_tags_and_meta_not_its_payload(any_ledger, clock):
    acme = any_ledger.enqueue(
        CreateFile(path="t.json", content={"secret": 1}), tags=["tenant:acme"], meta={"ticket": "OPS-7"}
    )
    other = any_ledger.enqueue(CreateFile(path="u.json", content={}), tags=["tenant:globex"]).id
    with client(any_ledger) as web:
        page = web.get("/jobs", params={"tag": "tenant:acme"}).text
        failed_of_tag = web.get("/jobs", params={"tag": "tenant:acme", "status": "failed"}).text
        shown = web.get(f"/jobs/{acme.id}").text
    assert acme.id in page and other not in page
    assert acme.id not in failed_of_tag
    assert "tenant:acme" in shown and "OPS-7" in shown and "secret" not in shown


@pytest.mark.parametrize("listing", ["type=create_file", "status=pending", ""])
def test_keyset_pages_stay_stable_while_jobs_are_added(any_ledger, clock, listing):
    ledger = any_ledger
    first = [ledger.enqueue(CreateFile(path=f"p{i}.json", content={})).id for i in range(120)]
    seen: list[str] = []
    with client(ledger) as web:
        url = f"/jobs?{listing}"
        while url:
            page = web.get(url).text
            seen += re.findall(r'<a class="id" href="/jobs/([0-9A-Z]{26})">', page)
            clock.advance(1)
            ledger.enqueue(CreateFile(path=f"new{len(seen)}.json", content={}))  # lands before page 1
            nxt = re.search(r'rel="next" href="([^"]+)"', page)
            url = nxt.group(1).replace("&amp;", "&") if nxt else ""
    assert seen == list(reversed(first)), "a page repeated or skipped a job while jobs were added"


def test_keyset_pages_of_finished_jobs_follow_finish_time(any_ledger, clock):
    ledger = any_ledger
    done = []
    for i in range(60):
        done.append(ledger.enqueue(CreateFile(path=f"f{i}.json", content={})).id)
        ledger.run_until_idle()
        clock.advance(1)
    with client(ledger) as web:
        one = web.get("/jobs", params={"status": "completed"}).text
        found = re.search(r'rel="next" href="[^"]*after=([^"&]+)', one)
        assert found, "no next page"
        after = found.group(1)
        two = web.get(f"/jobs?status=completed&after={after}").text
        oldest = web.get("/jobs", params={"status": "completed", "order": "oldest"}).text
    listed = re.findall(r'href="/jobs/([0-9A-Z]{26})"', one) + re.findall(r'href="/jobs/([0-9A-Z]{26})"', two)
    assert listed == list(reversed(done))
    assert re.findall(r'href="/jobs/([0-9A-Z]{26})"', oldest)[:3] == done[:3]


def test_one_job_shows_error_timings_target_neighbours_and_hides_the_payload(ledger, clock):
    ids = fill(ledger, clock)
    with client(ledger) as web:
        failed = web.get(f"/jobs/{ids['boom']}").text
        written = web.get(f"/jobs/{ids['file0']}").text
        missing = web.get("/jobs/01NOTAJOB")
    assert "can never work" in failed and "last attempt took" in failed
    assert "&#34;n&#34;: 0" not in written and "hidden: payloads" in written  # payload off by default
    assert ids["pending"] in written  # the later delete on the same target
    assert "<h2>Result</h2>" in written and "&#34;sha256&#34;" in written
    assert missing.status_code == 404


def test_a_jobs_page_shows_its_attempts_and_its_targets_history(ledger, clock):
    first = ledger.enqueue(Note(name="flaky", fail_times=1, target="file:notes/flaky.json")).id
    worker = ledger.worker()
    worker.run_once()
    clock.advance(3600)
    worker.run_once()
    later = ledger.enqueue(Note(name="after", target="file:notes/flaky.json")).id
    with client(ledger) as web:
        page = web.get(f"/jobs/{first}").text
        unrun = web.get(f"/jobs/{later}").text
    attempts = page.split("<h2>Attempts</h2>", 1)[1].split("</section>", 1)[0]
    assert attempts.count("<tr>") == 3  # the header, the failed attempt, the completing one
    assert "RuntimeError: flaky failed on run 1" in attempts and worker.id in attempts
    assert '<span class="badge error">error</span>' in attempts
    assert '<span class="badge completed">completed</span>' in attempts
    told = page.split("<h2>History of this target</h2>", 1)[1].split("</section>", 1)[0]
    assert told.index(first) < told.index(later) and "tether history notes/flaky.json" in told
    assert "not run yet" in unrun


def test_payloads_are_shown_only_with_show_payloads(ledger, clock):
    ids = fill(ledger, clock)
    with client(ledger, show_payloads=True) as web:
        page = web.get(f"/jobs/{ids['file0']}").text
    assert "&#34;n&#34;: 0" in page


def test_a_script_in_a_payload_or_error_is_rendered_inert(ledger, clock):
    ids = fill(ledger, clock)
    with client(ledger, show_payloads=True) as web:
        pages = [web.get(f"/jobs/{ids['evil']}").text, web.get("/failed").text, web.get("/jobs").text]
    for page in pages:
        assert EVIL not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_failed_groups_jobs_by_error_message(ledger, clock):
    for name in ("a", "b"):
        ledger.enqueue(Note(name="same", fail_times=9, permanent=True, target=f"note:{name}"))
    ledger.enqueue(Note(name="other", fail_times=9, permanent=True))
    ledger.run_until_idle()
    with client(ledger) as web:
        page = web.get("/failed").text
        only = web.get("/failed", params={"type": "create_file"}).text
    rows = re.findall(r'<td class="num">(\d+)</td>\s*<td class="err">([^<]*)</td>', page)
    assert rows == [("2", "PermanentError: same can never work"), ("1", "PermanentError: other can never work")]
    assert "no failed jobs" in only


def test_durations_lists_percentiles_and_draws_a_chart(ledger, clock):
    fill(ledger, clock)
    with client(ledger) as web:
        page = web.get("/durations").text
        bad = web.get("/durations", params={"window": "soon"})
    assert "<svg" in page and 'class="p99"' in page and "create_file" in page
    assert "sampled" not in page  # 3 completed jobs: each measured
    assert bad.status_code == 400 and "is not a duration" in bad.text


def test_durations_page_says_when_a_busy_window_was_sampled(ledger, clock, monkeypatch):
    fill(ledger, clock)
    monkeypatch.setattr(web_module, "DURATIONS_SAMPLE", 1)  # 3 completed jobs: a busy window for a sample of 1
    with client(ledger) as web:
        page = web.get("/durations").text
    assert "<strong>sampled</strong>" in page and "of the window's 3 completed jobs measured (1 in 3" in page


def test_drift_runs_in_the_background_and_shows_differences(ledger, clock):
    ids = fill(ledger, clock)
    (ledger.root / "notes" / "1.json").write_text('{"n": "changed"}')
    web_app = ui.app(ledger)
    with TestClient(web_app, base_url=BASE) as web:
        empty = web.get("/drift").text
        token = csrf_of(empty)
        started = web.post("/drift/run", data={"csrf": token, "mode": "content"}, follow_redirects=False)
        web_app.state.pages.drift.join(30)
        page = web.get("/drift").text
        live = web.get("/live/drift").text
    assert "no check has been recorded" in empty
    assert started.status_code == 303
    assert "DRIFT" in page and "notes/1.json" in page and ids["file1"] in page
    assert "<td>size</td><td>NOT_EQUAL</td>" in page  # the probe's differences, field by field
    assert "last report" in live and "<html" not in live


def test_the_run_button_is_enabled_again_in_the_part_htmx_swaps_when_the_check_ends(ledger, clock):
    fill(ledger, clock)
    web_app = ui.app(ledger)
    with TestClient(web_app, base_url=BASE) as web:
        token = csrf_of(web.get("/drift").text)
        web.post("/drift/run", data={"csrf": token, "mode": "content"}, follow_redirects=False)
        web_app.state.pages.drift.join(30)
        live = web.get("/live/drift").text
    assert re.search(r'<button type="submit">run a check</button>', live), live


def test_the_drift_page_shows_the_last_recorded_check_on_load(ledger, clock):
    from tether.reconcile.check import reconcile

    fill(ledger, clock)
    (ledger.root / "notes" / "1.json").write_text('{"n": "changed"}')
    reconcile(ledger)  # as `tether reconcile` or another page's process would
    with client(ledger) as web:
        page = web.get("/drift").text
    assert "last report" in page and "1 drifted" in page and "1 modified" in page and "notes/1.json" in page


def test_findings_are_sorted_naturally_and_the_in_flight_ones_folded_into_a_count(ledger, clock):
    from tether.reconcile.check import reconcile

    for n in (10, 2, 1):
        ledger.enqueue(CreateFile(path=f"notes/n{n}.json", content={"n": n}))
    ledger.run_until_idle()
    for n in (10, 2, 1):
        (ledger.root / "notes" / f"n{n}.json").write_text("edited\n")
    for n in (3, 4):
        ledger.enqueue(CreateFile(path=f"notes/m{n}.json", content={"n": n}))  # pending: in flight
    web_app = ui.app(ledger)
    with TestClient(web_app, base_url=BASE) as web:
        token = csrf_of(web.get("/drift").text)
        web.post("/drift/run", data={"csrf": token, "mode": "content"}, follow_redirects=False)
        web_app.state.pages.drift.join(30)
        page = web.get("/drift").text
    shown = re.findall(r'<td class="path">notes/(\w+)\.json</td>', page.split("<details", 1)[0])
    assert shown == ["n1", "n2", "n10"]
    assert "<summary>2 not checked" in page and reconcile(ledger).counts.get("not_checked") == 2


def test_drift_and_overview_show_the_ledger_s_last_run_on_load(ledger, clock):
    fill(ledger, clock)
    (ledger.root / "notes" / "2.json").unlink()
    reconcile(ledger)  # another process's check, recorded in the ledger
    with client(ledger) as web:
        drift = web.get("/drift").text
        overview = web.get("/").text
    assert "DRIFT" in drift and "notes/2.json" in drift and "no check recorded" not in drift
    assert "last reconcile" in overview and "1 drifted" in overview


def test_repair_from_the_drift_page_is_shown_then_applied_on_a_confirmed_post(ledger, clock):
    ids = fill(ledger, clock)
    (ledger.root / "notes" / "2.json").unlink()
    reconcile(ledger)
    with client(ledger, allow_actions=True) as web:
        assert "plan repairs" in web.get("/drift").text
        confirm = web.get("/actions/repair")
        assert "notes/2.json" in confirm.text and f'repair of <a class="id" href="/jobs/{ids["file2"]}"' in confirm.text
        assert "&#34;n&#34;" not in confirm.text and '"n"' not in confirm.text  # the payloads stay on the server
        plan = re.search(r'name="plan" value="([0-9a-f]{64})"', confirm.text)
        assert plan is not None
        forged = web.post("/actions/repair", data={"plan": plan.group(1), "csrf": "0" * 64})
        assert forged.status_code == 403
        made_up = web.post("/actions/repair", data={"plan": "f" * 64, "csrf": csrf_of(confirm.text)})
        assert made_up.status_code == 409 and "no such plan" in made_up.text
        done = web.post("/actions/repair", data={"plan": plan.group(1), "csrf": csrf_of(confirm.text)})
        assert done.status_code == 200 and "enqueued" in done.text
        again = web.post("/actions/repair", data={"plan": plan.group(1), "csrf": csrf_of(confirm.text)})
    assert again.status_code == 409 and "no such plan" in again.text  # applied once, then let go
    ledger.run_until_idle()
    clock.advance(1)
    assert reconcile(ledger).exit_code == 0


def test_drift_refuses_a_post_without_the_csrf_token(ledger, clock):
    with client(ledger) as web:
        web.get("/drift")
        refused = web.post("/drift/run", data={"mode": "content"})
    assert refused.status_code == 403 and "CSRF" in refused.text


def test_the_favicon_is_served_not_a_404(ledger):
    with client(ledger) as web:
        icon = web.get("/favicon.ico")
        page = web.get("/").text
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert 'rel="icon" href="/favicon.ico"' in page


def test_metrics_are_served_behind_the_same_guard(ledger, clock):
    fill(ledger, clock)
    with client(ledger) as web:
        text = web.get("/metrics").text
        rebound = web.get("/metrics", headers={"Host": "evil.example:8787"})
    assert 'tether_jobs{status="failed",type="note"} 2.0' in text
    assert rebound.status_code == 421 and "tether_jobs" not in rebound.text


def test_metrics_keep_one_collector_counting_what_finishes_while_the_page_runs(ledger, clock):
    """The scrape endpoint is tether.observe.metrics' long-lived collector (as `tether metrics --serve`):
    its counters start when the app starts and grow by what finishes between scrapes."""
    fill(ledger, clock)  # 3 completed, 2 failed before the app exists: not counted as finished
    with client(ledger) as web:
        first = web.get("/metrics").text
        clock.advance(1)
        ledger.enqueue(CreateFile(path="notes/late.json", content={"late": True}))
        ledger.run_until_idle()
        clock.advance(120)  # past metrics.SETTLE: the collector reads that far behind now
        second = web.get("/metrics").text
    done = 'tether_jobs_finished_total{status="completed",type="create_file"}'
    assert done not in first
    assert f"{done} 1.0" in second
    assert 'tether_job_duration_seconds_count{type="create_file"} 1.0' in second


# -- actions ---------------------------------------------------------------------------------------


def test_actions_are_refused_without_allow_actions(ledger, clock):
    ids = fill(ledger, clock)
    with client(ledger) as web:
        job = web.get(f"/jobs/{ids['boom']}").text
        confirm = web.get("/actions/retry", params={"job": ids["boom"]})
        post = web.post("/actions/retry", data={"job": ids["boom"], "csrf": "x"})
        purge = web.post("/actions/purge", data={"older_than": "0s", "completed": "1"})
    assert "retry this job" not in job
    assert confirm.status_code == post.status_code == purge.status_code == 403
    assert "read-only" in post.text
    assert ledger.get(ids["boom"]).status is JobStatus.FAILED


def test_retry_is_confirmed_then_needs_the_csrf_token(ledger, clock):
    ids = fill(ledger, clock)
    with client(ledger, allow_actions=True) as web:
        assert "retry this job" in web.get(f"/jobs/{ids['boom']}").text
        confirm = web.get("/actions/retry", params={"job": ids["boom"]})
        assert ledger.get(ids["boom"]).status is JobStatus.FAILED  # showing the question changes nothing
        forged = web.post("/actions/retry", data={"job": ids["boom"], "csrf": "0" * 64})
        assert forged.status_code == 403 and ledger.get(ids["boom"]).status is JobStatus.FAILED
        done = web.post("/actions/retry", data={"job": ids["boom"], "csrf": csrf_of(confirm.text)})
    assert done.status_code == 200 and "pending" in done.text
    assert ledger.get(ids["boom"]).status is JobStatus.PENDING


def test_a_csrf_token_from_another_browser_is_refused(ledger, clock):
    ids = fill(ledger, clock)
    web_app = ui.app(ledger, allow_actions=True)
    with TestClient(web_app, base_url=BASE) as a, TestClient(web_app, base_url=BASE) as b:
        token_a = csrf_of(a.get("/actions/retry", params={"job": ids["boom"]}).text)
        b.get("/")
        refused = b.post("/actions/retry", data={"job": ids["boom"], "csrf": token_a})
    assert refused.status_code == 403
    assert ledger.get(ids["boom"]).status is JobStatus.FAILED


def test_retry_all_failed_of_a_type(ledger, clock):
    ids = fill(ledger, clock)
    broken = ledger.enqueue(CreateFile(path="notes/1.json", content={"n": 9}, overwrite=False)).id
    ledger.run_until_idle()
    with client(ledger, allow_actions=True) as web:
        confirm = web.get("/actions/retry-failed", params={"type": "note"})
        assert "Retry 2 failed note job(s)?" in confirm.text
        done = web.post("/actions/retry-failed", data={"type": "note", "csrf": csrf_of(confirm.text)})
    assert done.status_code == 200 and "retried" in done.text
    assert {ledger.get(ids[k]).status for k in ("boom", "evil")} == {JobStatus.PENDING}
    assert ledger.get(broken).status is JobStatus.FAILED  # another type: untouched


def test_purge_previews_then_deletes_finished_jobs_older_than_the_cutoff(ledger, clock):
    ids = fill(ledger, clock)
    clock.advance(2 * 86400)
    with client(ledger, allow_actions=True) as web:
        preview = web.get("/actions/purge", params={"older_than": "1d", "failed": "1"})
        assert "Purge 2 failed job(s)" in preview.text
        assert ledger.get(ids["boom"]).status is JobStatus.FAILED
        done = web.post("/actions/purge", data={"older_than": "1d", "failed": "1", "csrf": csrf_of(preview.text)})
    assert done.status_code == 200 and "deleted" in done.text
    with client(ledger) as web:
        assert web.get(f"/jobs/{ids['boom']}").status_code == 404
        assert web.get(f"/jobs/{ids['file0']}").status_code == 200  # completed: not asked for


# -- security --------------------------------------------------------------------------------------


def test_every_answer_carries_a_strict_csp_and_refuses_framing(ledger, clock):
    with client(ledger) as web:
        for path in ("/", "/jobs", "/failed", "/durations", "/drift", "/static/tether.css", "/nope"):
            headers = web.get(path).headers
            assert "script-src 'self'" in headers["content-security-policy"], path
            assert "unsafe-inline" not in headers["content-security-policy"], path
            assert headers["x-frame-options"] == "DENY", path


def test_pages_hold_no_inline_script_or_style(ledger, clock):
    ids = fill(ledger, clock)
    with client(ledger, allow_actions=True) as web:
        pages = [web.get(p).text for p in ("/", "/jobs", f"/jobs/{ids['boom']}", "/failed", "/durations", "/drift")]
    for page in pages:
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page)
        assert " style=" not in page and "<style" not in page and " on" + "click=" not in page


def test_a_foreign_host_header_is_refused(ledger):
    with TestClient(ui.app(ledger), base_url="http://evil.example:8787") as web:
        refused = web.get("/")
    with TestClient(ui.app(ledger), base_url="http://localhost:8787") as web:
        allowed = web.get("/")
    assert refused.status_code == 421 and allowed.status_code == 200


def test_a_non_loopback_bind_needs_a_token(tmp_path):
    with pytest.raises(ConfigError, match="--token-file"):
        ui.bind_hosts("192.0.2.10", None)
    with pytest.raises(ConfigError, match="--allowed-host"):
        ui.bind_hosts("0.0.0.0", "t" * 20)
    assert ui.bind_hosts("192.0.2.10", "t" * 20) == ("192.0.2.10",)
    short = tmp_path / "token"
    short.write_text("short\n")
    with pytest.raises(ConfigError, match="at least 16"):
        ui.read_token(str(short))


def test_with_a_token_pages_need_the_bearer_header_or_the_login_cookie(ledger, clock):
    token = "s3cret-token-of-some-length"
    web_app = ui.app(ledger, token=token, allowed_hosts=["192.0.2.10"])
    with TestClient(web_app, base_url="http://192.0.2.10:8787") as web:
        anonymous = web.get("/", follow_redirects=False)
        fragment = web.get("/live/overview", headers={"HX-Request": "true"})
        bearer = web.get("/", headers={"Authorization": f"Bearer {token}"})
        wrong = web.post("/login", data={"token": "nope"})
        login = web.post("/login", data={"token": token}, follow_redirects=False)
        cookie = login.headers["set-cookie"]
        after = web.get("/")
    assert anonymous.status_code == 303 and anonymous.headers["location"] == "/login"
    assert fragment.status_code == 401
    assert bearer.status_code == 200 and "Overview" in bearer.text
    assert wrong.status_code == 401
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower() and token not in cookie
    assert after.status_code == 200 and "Overview" in after.text


def test_the_database_url_is_shown_with_its_password_masked(ledger):
    secret = sa.create_engine("postgresql+psycopg://app:hunter2@db.example/ledger")  # never connected
    pages = ui.web.Pages(
        secret, allow_actions=False, show_payloads=False, thresholds=Thresholds(), token=None, key=b"k"
    )
    assert pages.env.globals["ledger_url"] == "postgresql+psycopg://app:***@db.example/ledger"
    with client(ledger) as web:
        assert f"sqlite:///{ledger.engine.url.database}" in web.get("/").text


def test_mounted_inside_an_application_the_links_keep_its_prefix(ledger, clock):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    ids = fill(ledger, clock)
    host = Starlette(routes=[Mount("/ops/tether", app=ui.app(ledger))])
    with TestClient(host, base_url=BASE) as web:
        page = web.get("/ops/tether/jobs").text
        one = web.get(f"/ops/tether/jobs/{ids['boom']}")
    assert f'href="/ops/tether/jobs/{ids["boom"]}"' in page and "/ops/tether/static/tether.css" in page
    assert one.status_code == 200


def test_a_traceback_is_grouped_by_its_exception_line():
    from tether.observe import finished

    trace = 'Traceback (most recent call last):\n  File "h.py", line 3, in run\nValueError: bad row\n'
    assert finished.error_summary(trace) == "ValueError: bad row"
    assert finished.error_summary("PermanentError: no\nmore detail") == "PermanentError: no"
    assert finished.error_summary(None) == "(no error recorded)"


def test_one_job_shows_its_progress(ledger, clock):
    job = ledger.enqueue(CreateFile(path="p.json", content={})).id
    with ledger.engine.begin() as conn:  # what ctx.progress() leaves on a running job
        conn.execute(
            sa.text("UPDATE tether_jobs SET progress = :p WHERE id = :id"),
            {"p": '{"done": 40, "total": 100, "note": "copying"}', "id": job},
        )
    with client(ledger) as web:
        page = web.get(f"/jobs/{job}").text
    assert "<th>progress</th><td>40/100 (40%) copying</td>" in page


def test_tether_ui_refuses_a_public_address_without_a_token_before_serving(tmp_path, ledger):
    from typer.testing import CliRunner

    from tether.cli import app

    url = f"sqlite:///{ledger.engine.url.database}"
    result = CliRunner().invoke(app, ["--db", url, "--root", str(ledger.root), "ui", "--host", "192.0.2.1"])
    assert isinstance(result.exception, ConfigError) and "--token-file" in str(result.exception)
    token = tmp_path / "token"
    token.write_text("x" * 8)
    result = CliRunner().invoke(
        app, ["--db", url, "ui", "--host", "192.0.2.1", "--token-file", str(token)], catch_exceptions=True
    )
    assert isinstance(result.exception, ConfigError) and "at least 16" in str(result.exception)


# -- the command ---------------------------------------------------------------------------------


def test_tether_ui_on_a_busy_port_says_so_in_one_line_and_exits_1_before_any_banner(ledger, monkeypatch, capsys):
    from clikit import run_split

    url = f"sqlite:///{ledger.engine.url.database}"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out, err = run_split(monkeypatch, capsys, "--db", url, "ui", "--port", str(port))
    assert code == 1 and "http://" not in out + err
    assert err.strip().count("\n") == 0 and f"port {port}" in err and err.startswith("tether: error:")


def test_tether_ui_prints_the_port_it_got_and_writes_the_events_of_its_actions(ledger, clock, tmp_path):
    """The real command in its own process: ``--port 0`` names the port the system chose, and a
    retry from the page is a ``ui_action`` event on stderr (the command installs the events'
    handler; no test raises the logger's level for it)."""
    ids = fill(ledger, clock)
    url = f"sqlite:///{ledger.engine.url.database}"
    argv = [sys.executable, "-m", "tether", "--db", url, "ui", "--port", "0", "--allow-actions"]
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"}) as proc:
        try:
            assert proc.stderr is not None
            banner = proc.stderr.readline()
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", banner)
            assert found and int(found.group(1)) != 0, banner
            with httpx.Client(base_url=f"http://127.0.0.1:{found.group(1)}") as web:
                confirm = web.get("/actions/retry", params={"job": ids["boom"]})
                done = web.post("/actions/retry", data={"job": ids["boom"], "csrf": csrf_of(confirm.text)})
            assert done.status_code == 200
        finally:
            proc.send_signal(signal.SIGINT)
            _, rest = proc.communicate(timeout=30)
    events = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    assert any(e["event"] == "ui_action" and e.get("job_id") == ids["boom"] for e in events), rest


def test_cancel_is_confirmed_then_needs_the_csrf_token_and_a_paused_type_is_shown(ledger, clock):
    ids = fill(ledger, clock)
    with client(ledger, allow_actions=True) as web:
        assert "cancel this job" in web.get(f"/jobs/{ids['pending']}").text
        assert "cancel this job" not in web.get(f"/jobs/{ids['boom']}").text  # failed: nothing to cancel
        confirm = web.get("/actions/cancel", params={"job": ids["pending"]})
        assert ledger.get(ids["pending"]).status is JobStatus.PENDING  # showing the question changes nothing
        forged = web.post("/actions/cancel", data={"job": ids["pending"], "csrf": "0" * 64})
        assert forged.status_code == 403 and ledger.get(ids["pending"]).status is JobStatus.PENDING
        done = web.post("/actions/cancel", data={"job": ids["pending"], "csrf": csrf_of(confirm.text), "reason": "r"})
        assert done.status_code == 200 and "cancelled" in done.text
        refused = web.post("/actions/cancel", data={"job": ids["boom"], "csrf": csrf_of(confirm.text)})
        assert refused.status_code == 409 and "only a pending or running job can be cancelled" in refused.text
        ledger.enqueue(Note(name="waiting"))
        ledger.pause("note", "quota")
        live = web.get("/live/overview").text
    assert ledger.get(ids["pending"]).status is JobStatus.CANCELLED
    assert re.search(r">note</a> <span class=\"badge paused\"", live), live


def test_a_type_is_paused_and_resumed_from_the_overview_after_a_confirmation(ledger, clock):
    fill(ledger, clock)
    ledger.enqueue(Note(name="waiting"))
    with client(ledger, allow_actions=True) as web:
        assert "/actions/pause?type=note" in web.get("/live/overview").text
        confirm = web.get("/actions/pause", params={"type": "note"})
        assert "Pause <code>note</code>?" in confirm.text and paused_types(ledger) == []  # asking changes nothing
        assert web.post("/actions/pause", data={"type": "note", "do": "pause", "csrf": "0" * 64}).status_code == 403
        done = web.post("/actions/pause", data={"type": "note", "do": "pause", "csrf": csrf_of(confirm.text)})
        assert done.status_code == 200
        assert [p["type"] for p in paused_types(ledger)] == ["note"]
        again = web.get("/actions/pause", params={"type": "note"})
        assert "Resume <code>note</code>?" in again.text and "paused from the ui" in again.text
        web.post("/actions/pause", data={"type": "note", "do": "resume", "csrf": csrf_of(again.text)})
    assert paused_types(ledger) == []
