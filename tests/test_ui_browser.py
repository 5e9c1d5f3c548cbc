"""A real browser on ``tether ui``: headless Chromium (the distribution's, /usr/bin/chromium)
driven by Playwright against a real uvicorn server. It opens the overview, filters failed jobs,
opens one, retries it (actions enabled) and sees it pending; it runs a drift check; the page's
own script (htmx) must run under the Content-Security-Policy without one violation.

Another test opens every page of a ledger with jobs in every state, on a fake clock the page
reads, and checks the overview's counters against the jobs each one links to.

Screenshots go to ``$TETHER_UI_SHOTS`` (default: the test's temporary directory), never to git;
the README's (docs/ui-*.png) are copied from them by hand.
Without Chromium the test is skipped, unless ``TETHER_TEST_BROWSER=1`` (set by .ci/run, which
installs Chromium), where it fails.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from jobkit import Note, NoteType, registry_with, seed_states
from tether import Coordinator, FakeClock, ui
from tether.jobtypes import CreateFile
from tether.ledger.status import JobStatus
from tether.observe import finished
from tether.observe.health import health

CHROMIUM = "/usr/bin/chromium"

pytestmark = pytest.mark.browser


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("TETHER_TEST_BROWSER") == "1":
            pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium); .ci/run installs it and fails without it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def shots(tmp_path) -> Path:
    path = Path(os.environ.get("TETHER_UI_SHOTS") or tmp_path / "shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def ledger(tmp_path) -> Iterator[tuple[Coordinator, str]]:
    """A ledger with written files, one drifted, a few failures and some waiting jobs."""
    c = Coordinator.open(f"sqlite:///{tmp_path / 'ui.db'}", root=tmp_path / "data", registry=registry_with(NoteType()))
    for i in range(40):
        c.enqueue(CreateFile(path=f"notes/{i:02d}.json", content={"n": i, "title": f"note {i}"}))
    c.enqueue(Note(name="invoice-7", fail_times=9, permanent=True, target="note:invoice-7"))
    c.enqueue(Note(name="<script>alert(1)</script>", fail_times=9, permanent=True))
    for i in range(3):
        c.enqueue(CreateFile(path=f"locked/{i}.json", content={"n": i}, overwrite=False))
        (c.root / "locked").mkdir(exist_ok=True)
        (c.root / "locked" / f"{i}.json").write_text("someone else's\n")
    c.run_until_idle()
    (c.root / "notes" / "03.json").write_text('{"n": 3, "title": "edited by hand"}\n')
    for i in range(12):
        c.enqueue(CreateFile(path=f"later/{i}.json", content={"n": i}), delay=600)
    failed = [j for j in finished.failed(c) if j.type == "note" and "invoice-7" in (j.last_error or "")]
    yield c, failed[0].id
    c.close()


@pytest.fixture
def seeded(tmp_path) -> Iterator[tuple[Coordinator, dict[str, int]]]:
    """A ledger with jobs in every state the overview counts, on a fake clock the page reads."""
    clock = FakeClock()
    c = Coordinator.open(
        f"sqlite:///{tmp_path / 'states.db'}", root=tmp_path / "states", clock=clock, registry=registry_with(NoteType())
    )
    expected = seed_states(c, clock)
    yield c, expected
    c.close()


def serve(coordinator: Coordinator) -> Iterator[str]:
    app = ui.app(coordinator, allow_actions=True, allowed_hosts=ui.bind_hosts("127.0.0.1", None))
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    started = threading.Event()
    for _ in range(500):  # until uvicorn has bound its socket (port 0: the OS picks one)
        if srv.started:
            started.set()
            break
        started.wait(0.01)
    assert srv.started, "uvicorn did not start"
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


@pytest.fixture
def server(ledger) -> Iterator[str]:
    yield from serve(ledger[0])


@pytest.fixture
def seeded_server(seeded) -> Iterator[str]:
    yield from serve(seeded[0])


def test_every_page_shows_a_ledger_in_every_state_and_the_counters_count_it(browser, seeded_server, seeded, shots):
    from playwright.sync_api import expect

    server = seeded_server
    _, expected = seeded
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)

    page.goto(server + "/")
    counters = {
        li.get_attribute("data-state"): int(li.locator(".n").inner_text().replace("-", "-1"))
        for li in page.locator("li.counter").all()
    }
    assert counters == expected
    expect(page.locator("svg.throughput rect.completed")).not_to_have_count(0)
    page.screenshot(path=str(shots / "states-overview.png"), full_page=True)
    for state, n in expected.items():
        if state == "drift":
            continue
        page.goto(server + "/")
        page.click(f"li.counter[data-state={state}] a")
        page.wait_for_url(f"{server}/jobs?status={state}")
        expect(page.locator("table.jobs tbody tr")).to_have_count(n)
        assert set(page.locator("table.jobs .badge").all_inner_texts()) == {state}
    page.goto(server + "/jobs")
    page.screenshot(path=str(shots / "states-jobs.png"), full_page=True)
    page.click("nav >> text=workers")
    expect(page.locator("tr[data-worker] .badge")).to_have_text(
        ["running", "stopped", "gone"]
    )  # run_until_idle stopped
    expect(page.locator("tr[data-worker='live-host:2:alive']")).to_contain_text("40/100 (40%) copying")
    page.screenshot(path=str(shots / "states-workers.png"), full_page=True)
    page.goto(server + "/")
    page.click("li.counter[data-state=drift] a")
    expect(page.locator("#drift")).to_contain_text("last report")
    page.click("button:has-text('run a check')")
    expect(page.locator("#drift")).to_contain_text("last report", timeout=30_000)
    expect(page.locator("#drift button[type=submit]")).to_be_enabled()  # ready for another check
    expect(page.locator("#drift")).to_contain_text("notes/n9.json")
    page.screenshot(path=str(shots / "states-drift.png"), full_page=True)
    for path in ("/failed", "/durations", "/jobs?status=failed"):
        page.goto(server + path)
    assert problems == []


def test_an_operator_filters_failed_jobs_opens_one_and_retries_it(browser, server, ledger, shots):
    from playwright.sync_api import expect

    coordinator, failed_id = ledger
    page = browser.new_page(viewport={"width": 1200, "height": 860})
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda e: violations.append(str(e)))

    def go(link: str, url: str) -> None:
        page.click(link)
        page.wait_for_url(server + url)

    page.goto(server + "/")
    expect(page.locator("h1")).to_have_text("Overview")
    expect(page.locator(".verdict strong")).to_have_text(health(coordinator).verdict.label.upper())
    with page.expect_response(lambda r: r.url.endswith("/live/overview"), timeout=15_000) as live:
        pass  # htmx refreshes the live part on its own: the vendored script runs under the CSP
    assert live.value.status == 200
    page.screenshot(path=str(shots / "overview.png"), full_page=True)

    go("nav >> text=jobs", "/jobs")
    page.select_option("select[name=status]", "failed")
    go("form.filters button[type=submit]", "/jobs?status=failed**")
    expect(page.locator("table.jobs tbody tr")).to_have_count(5)
    assert set(page.locator("table.jobs .badge").all_inner_texts()) == {"failed"}
    expect(page.get_by_text("<script>alert(1)</script>")).to_have_count(1)  # shown as text, never run
    page.screenshot(path=str(shots / "jobs-failed.png"), full_page=True)

    go(f"a.id >> text={failed_id}", f"/jobs/{failed_id}")
    expect(page.locator("pre.error")).to_contain_text("invoice-7 can never work")
    page.screenshot(path=str(shots / "job-failed.png"), full_page=True)
    go("text=retry this job…", f"/actions/retry?job={failed_id}")
    page.screenshot(path=str(shots / "retry-confirm.png"), full_page=True)
    assert coordinator.get(failed_id).status is JobStatus.FAILED  # asked, not yet done
    go("button:has-text('confirm: retry')", "/actions/retry")
    expect(page.locator("h1")).to_have_text("Done: retry")
    go(f"a.id >> text={failed_id}", f"/jobs/{failed_id}")
    expect(page.locator("h1 .badge")).to_have_text("pending")
    assert coordinator.get(failed_id).status is JobStatus.PENDING
    page.screenshot(path=str(shots / "job-retried.png"), full_page=True)

    go("nav >> text=failed", "/failed")
    expect(page.locator("td.err").first).to_be_visible()
    page.screenshot(path=str(shots / "failed.png"), full_page=True)
    go("nav >> text=durations", "/durations")
    expect(page.locator("svg.chart rect.p50")).to_have_count(1)  # create_file: the one type that completed
    page.screenshot(path=str(shots / "durations.png"), full_page=True)

    go("nav >> text=drift", "/drift")
    go("button:has-text('run a check')", "/drift")
    expect(page.locator("#drift")).to_contain_text("last report", timeout=30_000)  # htmx polls until done
    expect(page.locator("#drift")).to_contain_text("notes/03.json")
    page.screenshot(path=str(shots / "drift.png"), full_page=True)
    assert violations == []
