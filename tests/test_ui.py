"""``tether ui``: every route, filter and action through Starlette's test client, and the
page's security (Host check, sign-in, CSRF, headers, escaping, read-only by default)."""

from __future__ import annotations

import html
import re

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from jobkit import Note, NoteType, registry_with
from tether import Coordinator, FakeClock, ui
from tether.errors import ConfigError
from tether.jobtypes import CreateFile, DeleteFile
from tether.ledger.status import JobStatus
from tether.observe.health import health
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


def test_overview_shows_the_health_verdict_backlog_and_last_hour(ledger, clock):
    fill(ledger, clock)
    with client(ledger) as web:
        page = web.get("/")
        live = web.get("/live/overview")
    verdict = health(ledger)  # what `tether status` judges, alerting rules included
    assert page.status_code == 200
    assert f"<strong>{verdict.verdict.label.upper()}</strong>" in page.text and "2 failed" in page.text
    assert all(f"<td>{c.name}</td>" in page.text for c in verdict.checks)
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


def test_jobs_filter_by_key_finds_the_keyed_job(ledger, clock):
    kept = ledger.enqueue(CreateFile(path="k.json", content={}), key="the-key").id
    other = ledger.enqueue(CreateFile(path="j.json", content={}), key="other").id
    with client(ledger) as web:
        page = web.get("/jobs", params={"type": "create_file", "key": "the-key"}).text
    assert kept in page and other not in page


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
    assert "no check recorded" in empty
    assert started.status_code == 303
    assert "DRIFT" in page and "notes/1.json" in page and ids["file1"] in page
    assert "<td>size</td><td>NOT_EQUAL</td>" in page  # the probe's differences, field by field
    assert "last report" in live and "<html" not in live


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
        plan = re.search(r'name="plan" value="([^"]+)"', confirm.text)
        assert plan is not None
        forged = web.post("/actions/repair", data={"plan": html.unescape(plan.group(1)), "csrf": "0" * 64})
        assert forged.status_code == 403
        done = web.post("/actions/repair", data={"plan": html.unescape(plan.group(1)), "csrf": csrf_of(confirm.text)})
        assert done.status_code == 200 and "enqueued" in done.text
        again = web.post("/actions/repair", data={"plan": html.unescape(plan.group(1)), "csrf": csrf_of(confirm.text)})
    assert again.status_code == 409 and "stale" in again.text  # its own jobs made the plan stale
    ledger.run_until_idle()
    clock.advance(1)
    assert reconcile(ledger).exit_code == 0


def test_drift_refuses_a_post_without_the_csrf_token(ledger, clock):
    with client(ledger) as web:
        web.get("/drift")
        refused = web.post("/drift/run", data={"mode": "content"})
    assert refused.status_code == 403 and "CSRF" in refused.text


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


def test_retry_is_confirmed_then_needs_the_csrf_token(ledger, clock, caplog):
    ids = fill(ledger, clock)
    with client(ledger, allow_actions=True) as web:
        assert "retry this job" in web.get(f"/jobs/{ids['boom']}").text
        confirm = web.get("/actions/retry", params={"job": ids["boom"]})
        assert ledger.get(ids["boom"]).status is JobStatus.FAILED  # showing the question changes nothing
        forged = web.post("/actions/retry", data={"job": ids["boom"], "csrf": "0" * 64})
        assert forged.status_code == 403 and ledger.get(ids["boom"]).status is JobStatus.FAILED
        with caplog.at_level("INFO", logger="tether.events"):
            done = web.post("/actions/retry", data={"job": ids["boom"], "csrf": csrf_of(confirm.text)})
    assert done.status_code == 200 and "pending" in done.text
    assert ledger.get(ids["boom"]).status is JobStatus.PENDING
    assert any('"event":"ui_action"' in r.getMessage() and ids["boom"] in r.getMessage() for r in caplog.records)


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
