"""claude_extraction with the stand-in assistant (sample_data/stand_in_claude.py): an answer is
landed once, atomically, and paid for once; failures are judged by the envelope."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from jobkit import completed
from tether import CreateFile, JobStatus
from tether.errors import InvalidPayload
from tether.jobtypes import ClaudeExtraction, ClaudeExtractionType, assistant, default_registry
from tether.jobtypes.claude_extraction import prompt_hash, sidecar

REPO = Path(__file__).resolve().parent.parent
STAND_IN = REPO / "sample_data" / "stand_in_claude.py"
PROMPT = "Extract the requirement.\nid: REQ-001\ntitle: Invoices are immutable once issued\n"
SCHEMA = {
    "type": "object",
    "properties": {"requirement_id": {"type": "string"}, "words": {"type": "integer"}},
    "required": ["requirement_id", "words"],
}


@pytest.fixture
def extraction(make_coordinator, tmp_path, monkeypatch):
    """A coordinator whose claude_extraction runs the stand-in; its call log at tmp_path/calls."""
    for name in [n for n in os.environ if n.startswith("CLAUDE_STANDIN_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CLAUDE_STANDIN_LOG", str(tmp_path / "calls"))
    registry = default_registry()
    registry.register(ClaudeExtractionType(command=[sys.executable, str(STAND_IN)], grace=0.5))
    return make_coordinator(registry=registry)


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def payload(prompt: str = PROMPT, target: str = "requirements/REQ-001/extraction.json", **extra) -> ClaudeExtraction:
    return ClaudeExtraction.of(prompt=prompt, target_path=target, requirement_id="REQ-001", **extra)


def gone(pid: int) -> bool:
    """No such process, or only its zombie (an unreaped exit is not a running process)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)
    except (FileNotFoundError, ProcessLookupError):  # the latter: it exited while its status was read
        return True


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until every process in ``pids`` has exited (a zombie has), blocked on their pidfds,
    at most ``timeout`` seconds; returns those still running."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass  # gone already
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    running = dict(fds)
    try:
        while running and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):  # readable once the process has exited
                poller.unregister(fd)
                running.pop(fd)
    finally:
        for fd in fds:
            os.close(fd)
    return sorted(running.values())


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


# -- payload ---------------------------------------------------------------------------------


def test_prompt_hash_is_computed_by_tether_and_a_mismatching_one_is_refused(extraction):
    p = payload()
    assert p.prompt_hash == prompt_hash(PROMPT)
    with pytest.raises(InvalidPayload, match="prompt_hash: .*does not match the sha256 of prompt"):
        payload(prompt_hash="0" * 64)
    raw = {"prompt": PROMPT, "target_path": "x.json", "requirement_id": "R", "prompt_hash": "0" * 64}
    with pytest.raises(InvalidPayload, match="prompt_hash"):
        extraction.registry.parse("claude_extraction", raw)
    forged = ClaudeExtraction.model_construct(prompt=PROMPT, target_path="x.json", requirement_id="R", prompt_hash="f")
    with pytest.raises(InvalidPayload, match="prompt_hash"):
        extraction.enqueue(forged)


def test_target_path_is_checked_like_file_paths_and_a_bad_schema_is_refused(extraction):
    with pytest.raises(InvalidPayload, match="target_path: '../out.json'"):
        extraction.enqueue(payload(target="../out.json"))
    with pytest.raises(InvalidPayload, match="schema: .*not a valid JSON Schema"):
        payload(schema={"type": "bogus"})


def test_a_duplicate_enqueue_returns_the_active_job_and_orders_by_target(extraction):
    first = extraction.enqueue(payload())
    again = extraction.enqueue(payload())
    assert again.duplicate and again.id == first.id
    job = extraction.get(first.id)
    assert job.idempotency_key == f"REQ-001:{prompt_hash(PROMPT)}"
    assert job.ordering_key == "file:requirements/REQ-001/extraction.json"
    other = extraction.enqueue(payload(prompt=PROMPT + "more\n"))
    assert not other.duplicate


# -- the command line ------------------------------------------------------------------------


def test_the_real_command_line_is_built_as_documented(monkeypatch):
    monkeypatch.delenv(assistant.ENV_COMMAND, raising=False)
    t = ClaudeExtractionType()
    assert t.argv(payload()) == ["claude", "-p", "--output-format", "json", "--tools", "", "--no-session-persistence"]
    assert t.argv(payload(schema=SCHEMA, model="sonnet")) == [
        *["claude", "-p", "--output-format", "json", "--tools", "", "--no-session-persistence"],
        *["--json-schema", json.dumps(SCHEMA, separators=(",", ":")), "--model", "sonnet"],
    ]
    monkeypatch.setenv(assistant.ENV_COMMAND, "/opt/bin/claude --max-budget-usd 0.5")
    assert ClaudeExtractionType().argv(payload())[:4] == ["/opt/bin/claude", "--max-budget-usd", "0.5", "-p"]
    assert ClaudeExtractionType(command=["my-claude"]).argv(payload())[0] == "my-claude"


# -- success and paying once -----------------------------------------------------------------


def test_success_lands_the_answer_atomically_and_records_cost_tokens_model_and_session(extraction, root, tmp_path):
    job_id = extraction.enqueue(payload(schema=SCHEMA, model="sonnet")).id
    extraction.run_until_idle()
    job = extraction.get(job_id)
    assert job.status is JobStatus.COMPLETED, job.last_error
    answer = json.loads((root / "requirements/REQ-001/extraction.json").read_text())
    assert answer == {"requirement_id": "REQ-001", "title": "Invoices are immutable once issued", "words": 11}
    result = json.loads(job.result)
    assert result["cost_usd"] > 0 and result["input_tokens"] == 22 and result["output_tokens"] == 40
    assert result["model"] == "sonnet" and result["session_id"].startswith("standin-")
    assert result["assistant_called"] is True and result["prompt_hash"] == prompt_hash(PROMPT)
    record = json.loads((root / sidecar("requirements/REQ-001/extraction.json")).read_text())
    assert record["prompt_hash"] == prompt_hash(PROMPT)
    assert calls(tmp_path) == ["start", "end"]
    assert not [p for p in (root / "requirements/REQ-001").iterdir() if p.name.endswith(".tether-tmp")]


def test_an_answer_already_on_disk_for_the_same_hash_completes_without_calling_the_assistant(extraction, tmp_path):
    extraction.enqueue(payload())
    extraction.run_until_idle()
    assert calls(tmp_path) == ["start", "end"]
    again = extraction.enqueue(payload()).id  # the first completed, so this is not a duplicate
    extraction.run_until_idle()
    job = extraction.get(again)
    assert job.status is JobStatus.COMPLETED
    assert json.loads(job.result)["assistant_called"] is False
    assert calls(tmp_path) == ["start", "end"]  # no second call


def test_a_hand_edited_answer_is_asked_for_again(extraction, root, tmp_path):
    extraction.enqueue(payload())
    extraction.run_until_idle()
    (root / "requirements/REQ-001/extraction.json").write_text('{"edited": true}\n')
    job_id = extraction.enqueue(payload()).id
    extraction.run_until_idle()
    assert json.loads(extraction.get(job_id).result)["assistant_called"] is True
    assert calls(tmp_path).count("start") == 2


def test_the_runner_returns_when_the_assistant_exits_without_polling_for_it(monkeypatch):
    # With a look at the cancel flag only every minute, only the exit itself can end the wait.
    monkeypatch.setattr(assistant, "_CHECK_EVERY", 60.0)
    env = {**assistant.child_env(), "CLAUDE_STANDIN_SLOW": "0.2"}
    argv = [sys.executable, str(STAND_IN), "-p", "--output-format", "json"]
    runs: list[assistant.Run] = []
    runner = threading.Thread(
        target=lambda: runs.append(assistant.run(argv, PROMPT, cancelled=threading.Event(), env=env)), daemon=True
    )
    runner.start()
    runner.join(timeout=30)  # far below the minute a poll would take
    assert runs and runs[0].exit_code == 0 and b'"result"' in runs[0].stdout


# -- verdicts --------------------------------------------------------------------------------


def test_a_non_zero_exit_is_retried_then_failed_and_last_error_names_verdict_exit_and_stderr(
    extraction, clock, monkeypatch
):
    monkeypatch.setenv("CLAUDE_STANDIN_EXIT", "3")
    job_id = extraction.enqueue(payload(), max_attempts=2).id
    extraction.run_until_idle()
    job = extraction.get(job_id)
    assert job.status is JobStatus.PENDING and job.attempts == 1
    clock.advance(3600)
    extraction.run_until_idle()
    job = extraction.get(job_id)
    assert job.status is JobStatus.FAILED and job.attempts == 2
    assert "verdict=exit_status; exit=3" in job.last_error
    assert "stderr: stand-in: failing as asked" in job.last_error and "second line" not in job.last_error
    assert "REQ-001" not in job.last_error and "Invoices" not in job.last_error  # never the prompt


@pytest.mark.parametrize(
    ("switch", "verdict"),
    [
        ("CLAUDE_STANDIN_GARBAGE", "verdict=no_envelope"),
        ("CLAUDE_STANDIN_TEXT_ANSWER", "verdict=invalid_answer"),
        ("SCHEMA", "verdict=schema_unmet"),
    ],
)
def test_garbage_and_schema_failing_answers_are_never_written(extraction, root, monkeypatch, switch, verdict):
    prompt = PROMPT
    if switch == "SCHEMA":
        prompt += 'ANSWER: {"requirement_id": 7}\n'
    else:
        monkeypatch.setenv(switch, "1")
    job_id = extraction.enqueue(payload(prompt=prompt, schema=SCHEMA), max_attempts=1).id
    extraction.run_until_idle()
    job = extraction.get(job_id)
    assert job.status is JobStatus.FAILED and verdict in job.last_error, job.last_error
    assert not (root / "requirements").exists()  # nothing landed, not even a directory
    if switch != "CLAUDE_STANDIN_GARBAGE":  # an answer came, and was paid for
        assert re.search(r"; paid cost_usd=0\.\d+", job.last_error), job.last_error
    assert '"requirement_id": 7' not in job.last_error  # never the answer


# CLAUDE_STANDIN_NOT_LOGGED_IN: what the real CLI answers logged out (exit 1, is_error, no status).
@pytest.mark.parametrize(
    ("switch", "value"), [("CLAUDE_STANDIN_API_ERROR", "401"), ("CLAUDE_STANDIN_NOT_LOGGED_IN", "1")]
)
def test_an_authentication_failure_is_permanent(extraction, monkeypatch, switch, value):
    monkeypatch.setenv(switch, value)
    job_id = extraction.enqueue(payload(), max_attempts=3).id
    extraction.run_until_idle()
    job = extraction.get(job_id)
    assert job.status is JobStatus.FAILED and job.attempts == 1
    assert "AssistantRefused: verdict=not_authorized; exit=1" in job.last_error


def test_a_command_line_the_assistant_rejects_fails_at_once_instead_of_using_up_attempts(make_coordinator):
    registry = default_registry()
    registry.register(ClaudeExtractionType(command=[sys.executable, str(STAND_IN), "--verbose-typo"]))
    c = make_coordinator(registry=registry)
    job_id = c.enqueue(payload(), max_attempts=3).id
    c.run_until_idle()
    job = c.get(job_id)
    assert job.status is JobStatus.FAILED and job.attempts == 1, job.last_error
    assert "verdict=bad_command_line; exit=1" in job.last_error
    assert "stderr: error: unknown option '--verbose-typo'" in job.last_error


@pytest.mark.parametrize("command", ["/nonexistent/claude", "no-such-claude-on-path", __file__])
def test_a_missing_or_unrunnable_assistant_command_fails_at_once_as_not_installed(make_coordinator, command):
    registry = default_registry()
    registry.register(ClaudeExtractionType(command=[command]))
    c = make_coordinator(registry=registry)
    job_id = c.enqueue(payload(), max_attempts=3).id
    c.run_until_idle()
    job = c.get(job_id)
    assert job.status is JobStatus.FAILED and job.attempts == 1
    assert f"verdict=not_installed: the assistant command {command!r}" in job.last_error


def test_an_overloaded_assistant_is_retried(extraction, monkeypatch):
    monkeypatch.setenv("CLAUDE_STANDIN_API_ERROR", "529")
    job_id = extraction.enqueue(payload(), max_attempts=3).id
    extraction.run_until_idle()
    job = extraction.get(job_id)
    assert job.status is JobStatus.PENDING and job.attempts == 1 and "verdict=overloaded" in job.last_error


def test_a_rate_limit_holds_back_the_type_until_its_reset_without_burning_attempts_then_completes(
    extraction, clock, monkeypatch, tmp_path
):
    reset = clock.now() + timedelta(minutes=30)
    monkeypatch.setenv("CLAUDE_STANDIN_RATE_LIMIT", str(int(reset.timestamp())))
    monkeypatch.setenv("CLAUDE_STANDIN_ONCE", str(tmp_path / "limited-once"))
    first = extraction.enqueue(payload(), max_attempts=1).id
    second = extraction.enqueue(payload(target="b.json", prompt=PROMPT + "b\n"), max_attempts=1, priority=-1).id
    assert extraction.worker().run_once() == 1  # the first meets the rate limit
    job = extraction.get(first)
    assert job.status is JobStatus.PENDING and job.attempts == 0  # the attempt was given back
    assert job.run_at == reset.replace(microsecond=0) and "verdict=rate_limited" in job.last_error
    assert extraction.get(second).run_at == job.run_at  # the type's other pending job waits too
    assert extraction.run_until_idle() == 0  # nothing runs before the reset
    clock.advance(31 * 60)
    assert extraction.run_until_idle() == 2
    assert {extraction.get(i).status for i in (first, second)} == {JobStatus.COMPLETED}
    assert extraction.get(first).attempts == 1


# -- the process ---------------------------------------------------------------------------


def test_a_hang_is_killed_at_the_timeout_with_its_grandchild_and_no_process_is_left(
    extraction, root, monkeypatch, tmp_path
):
    pidfile = tmp_path / "grandchild.pid"
    monkeypatch.setenv("CLAUDE_STANDIN_GRANDCHILD", str(pidfile))
    job_id = extraction.enqueue(payload(), timeout=1.5, max_attempts=2).id
    start = time.monotonic()
    extraction.run_until_idle()
    assert time.monotonic() - start < 10
    job = extraction.get(job_id)
    assert job.status is JobStatus.PENDING and job.attempts == 1 and "JobTimedOut" in job.last_error
    grandchild = int(pidfile.read_text())
    child = int((tmp_path / "calls").read_text().split()[2])
    deadline = time.monotonic() + 5  # the handler's thread kills the group after the worker moved on
    while not (gone(child) and gone(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(child) and gone(grandchild)
    assert not (root / "requirements").exists()


def test_a_grandchild_left_behind_by_an_assistant_that_answered_is_killed_too(extraction, monkeypatch, tmp_path):
    pidfile = tmp_path / "orphan.pid"
    monkeypatch.setenv("CLAUDE_STANDIN_ORPHAN", str(pidfile))
    job_id = extraction.enqueue(payload()).id
    extraction.run_until_idle()
    assert extraction.get(job_id).status is JobStatus.COMPLETED
    orphan = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not gone(orphan) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(orphan)


def test_the_assistant_sees_its_own_credentials_but_no_aws_database_or_tether_secrets(
    extraction, monkeypatch, tmp_path
):
    report = tmp_path / "env.json"
    monkeypatch.setenv("CLAUDE_STANDIN_ENV_REPORT", str(report))
    secrets = {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "DATABASE_URL": "postgresql://app:pw@db/app",
        "TETHER_DB": "postgresql://tether:pw@db/tether",
        "PGPASSWORD": "pg-secret",
        "GITHUB_TOKEN": "gh-secret",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    extraction.enqueue(payload())
    extraction.run_until_idle()
    seen = json.loads(report.read_text())
    assert seen["ANTHROPIC_API_KEY"] == "sk-ant-test" and "PATH" in seen and "HOME" in seen
    assert not set(secrets) & set(seen)
    assert not any(v in str(seen) for v in secrets.values())
    assert seen["__cwd_entries__"] == [] and "tether-assistant-" in seen["__cwd__"]


def start_worker(tmp_path: Path, root: Path, *args: str, **standin: str) -> tuple[str, subprocess.Popen[bytes]]:
    """A ``tether worker ARGS`` process running the stand-in with ``CLAUDE_STANDIN_<NAME>``
    switches; its events on its stdout (a pipe), its stand-in's calls in tmp_path/calls."""
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "CLAUDE_STANDIN_"))}
    env.update({f"CLAUDE_STANDIN_{name.upper()}": value for name, value in standin.items()})
    env.update(
        TETHER_ASSISTANT_COMMAND=f"{sys.executable} {STAND_IN}",
        CLAUDE_STANDIN_LOG=str(tmp_path / "calls"),
        PYTHONPATH=str(REPO / "src"),
    )
    argv = [sys.executable, "-c", "from tether.cli import main; main()", "--db", ledger, "--root", str(root)]
    return ledger, subprocess.Popen([*argv, "worker", *args], env=env, stdout=subprocess.PIPE)


def wait_for_call(tmp_path: Path, worker: subprocess.Popen[bytes]) -> int:
    """The pid of the stand-in once it has started."""
    deadline = time.monotonic() + 30
    while "start" not in calls(tmp_path):
        assert time.monotonic() < deadline and worker.poll() is None, "the stand-in never started"
        time.sleep(0.02)
    return int((tmp_path / "calls").read_text().split()[2])


def shutdown_events(out: bytes) -> list[tuple[str, str | None]]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith(b"{")]
    return [(e["mode"], e.get("reason")) for e in lines if e["event"] == "shutdown"]


def test_sigterm_lets_an_extraction_that_answers_within_the_shutdown_grace_land_its_answer(tmp_path, root):
    from tether import Coordinator

    with Coordinator.open(f"sqlite:///{tmp_path / 'ledger.db'}", root=root) as c:
        job_id = c.enqueue(payload()).id
    ledger, worker = start_worker(tmp_path, root, slow="1.5")
    try:
        wait_for_call(tmp_path, worker)
        worker.send_signal(signal.SIGTERM)  # stop claiming; the call in flight (paid for) may finish
        out, _ = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0
    assert shutdown_events(out) == [("finish running jobs", None)]
    with Coordinator.open(ledger, root=root) as c:
        job = c.get(job_id)
    assert job.status is JobStatus.COMPLETED and job.attempts == 1
    assert json.loads((root / "requirements/REQ-001/extraction.json").read_text())["requirement_id"] == "REQ-001"
    assert calls(tmp_path) == ["start", "end"]


def test_an_extraction_still_running_when_the_shutdown_grace_ends_is_given_back_without_counting_the_attempt(
    tmp_path, root
):
    from tether import Coordinator

    with Coordinator.open(f"sqlite:///{tmp_path / 'ledger.db'}", root=root) as c:
        job_id = c.enqueue(payload()).id
    ledger, worker = start_worker(tmp_path, root, "--shutdown-grace", "0.5", hang="1")
    try:
        child = wait_for_call(tmp_path, worker)
        worker.send_signal(signal.SIGTERM)  # one signal: the hanging call is cancelled when the grace ends
        out, _ = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, out.decode()[-2000:]
    assert shutdown_events(out) == [("finish running jobs", None), ("cancel running jobs", "grace period over")]
    assert b'"event": "released"' in out or b'"event":"released"' in out
    with Coordinator.open(ledger, root=root) as c:
        job = c.get(job_id)
    assert job.status is JobStatus.PENDING and job.attempts == 0 and job.locked_by is None
    assert wait_gone([child], timeout=10) == []


def test_a_sigkilled_worker_takes_the_assistant_and_its_grandchild_with_it(tmp_path, root):
    from tether import Coordinator

    with Coordinator.open(f"sqlite:///{tmp_path / 'ledger.db'}", root=root) as c:
        c.enqueue(payload())
    pidfile = tmp_path / "grandchild.pid"
    # The stand-in starts a grandchild that sleeps for an hour, then hangs itself.
    _, worker = start_worker(tmp_path, root, grandchild=str(pidfile))
    left: list[int] = []
    try:
        assistant = wait_for_call(tmp_path, worker)
        deadline = time.monotonic() + 30
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline and worker.poll() is None, "the stand-in never started its grandchild"
            time.sleep(0.02)
        grandchild = int(pidfile.read_text())
        guard = parent_of(assistant)  # the process between the worker and the assistant, if any
        attempt = [p for p in (guard, assistant, grandchild) if p != worker.pid]
        worker.kill()  # SIGKILL: no handler, no cleanup in the worker runs
        worker.wait(timeout=10)
        left = wait_gone(attempt, timeout=10)
        assert left == [], f"still running after the worker was killed: {left}"
    finally:
        if worker.poll() is None:
            worker.kill()
        for pid in left:  # the test failed: leave nothing behind
            os.kill(pid, signal.SIGKILL)


# -- the real CLI ------------------------------------------------------------------------------


@pytest.fixture
def real_claude(monkeypatch, tmp_path) -> Path:
    """The real ``claude`` CLI at ``$TETHER_REAL_CLAUDE``, run logged out (an empty HOME) and
    without its background traffic. Skips without it, but fails under CI=true (.ci/run installs it
    with ``npm install --prefix .cache/claude-cli @anthropic-ai/claude-code``)."""
    given = os.environ.get("TETHER_REAL_CLAUDE")
    if not given:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail("CI is set but TETHER_REAL_CLAUDE is not: .ci/run installs the claude CLI and sets it")
        pytest.skip("set TETHER_REAL_CLAUDE=<path to claude> (npm install --prefix DIR @anthropic-ai/claude-code)")
    real = Path(given).absolute()
    assert os.access(real, os.X_OK), f"TETHER_REAL_CLAUDE={given} is not an executable file"
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # logged out, whatever the machine's own login
    monkeypatch.setenv("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")  # no telemetry, no self-update
    return real


def test_real_claude_documents_every_flag_tether_passes(real_claude):
    shown = subprocess.run(
        [str(real_claude), "--help"], capture_output=True, text=True, timeout=60, env=assistant.child_env()
    )
    assert shown.returncode == 0, shown.stderr
    options = set(re.findall(r"(?:^|[\s,])(--?[a-z][a-z-]*)", shown.stdout))
    argv = ClaudeExtractionType(command=[str(real_claude)]).argv(payload(schema=SCHEMA, model="sonnet"))
    flags = [a for a in argv[1:] if a.startswith("-")]
    assert "--json-schema" in flags and "--model" in flags and len(flags) == 6
    assert [f for f in flags if f not in options] == [], shown.stdout


def test_real_claude_accepts_the_command_line_and_not_logged_in_is_permanent(real_claude, make_coordinator):
    """Logged out and offline, the real CLI still parses tether's argv (schema and model
    included) and answers with an envelope (``is_error``, ``Not logged in``): permanent."""
    registry = default_registry()
    registry.register(ClaudeExtractionType(command=[str(real_claude)]))
    c = make_coordinator(registry=registry)
    job_id = c.enqueue(payload(schema=SCHEMA, model="sonnet"), max_attempts=3).id
    c.run_until_idle()
    job = c.get(job_id)
    assert job.status is JobStatus.FAILED and job.attempts == 1, job.last_error
    assert "verdict=not_authorized; exit=1; said: Not logged in" in job.last_error


def test_real_claude_refusing_an_unknown_flag_fails_the_job_at_once_with_its_stderr(real_claude, make_coordinator):
    # What a broken command line would get: no envelope, exit 1, commander's message; so the
    # not-logged-in envelope above shows the real CLI took tether's argv.
    registry = default_registry()
    registry.register(ClaudeExtractionType(command=[str(real_claude), "--no-such-flag"]))
    c = make_coordinator(registry=registry)
    job_id = c.enqueue(payload(), max_attempts=2).id
    c.run_until_idle()
    job = c.get(job_id)
    assert job.status is JobStatus.FAILED and job.attempts == 1, job.last_error  # a retry would fail alike
    assert "AssistantRefused: verdict=bad_command_line; exit=1" in job.last_error
    assert "stderr: error: unknown option '--no-such-flag'" in job.last_error


def test_reconcile_reports_a_hand_edited_answer_modified_and_a_deleted_one_missing(extraction, root):
    from tether.reconcile.check import reconcile

    extraction.enqueue(payload())
    extraction.enqueue(payload(target="b.json", prompt=PROMPT + "b\n"))
    extraction.run_until_idle()
    report = reconcile(extraction, untracked=True)
    assert report.counts["in_sync"] == 2 and report.exit_code == 0  # the sidecars are not untracked files
    (root / "requirements/REQ-001/extraction.json").write_text('{"edited": true}\n')
    (root / "b.json").unlink()
    report = reconcile(extraction)
    found = {f.path: f.status for f in report.findings}
    assert found == {"requirements/REQ-001/extraction.json": "modified", "b.json": "missing"}
    assert report.exit_code == 2


def test_store_extract_renders_a_requirement_into_the_frozen_prompt_and_returns_the_duplicate(extraction, root):
    import shutil

    from tether.jobtypes.claude_extraction import REQUIREMENT_TEMPLATE, render_prompt
    from tether.store import JsonStore

    shutil.copytree(REPO / "sample_data/data/requirements/REQ-001", root / "requirements/REQ-001")
    store = JsonStore(extraction)
    first = store.extract("requirements/REQ-001/requirement.json", "requirements/REQ-001/extraction.json")
    again = store.extract("requirements/REQ-001/requirement.json", "requirements/REQ-001/extraction.json")
    assert again.duplicate and again.id == first.id
    fields = json.loads((root / "requirements/REQ-001/requirement.json").read_text())
    stored = ClaudeExtraction.model_validate_json(extraction.get(first.id).payload)
    assert stored.prompt == render_prompt(REQUIREMENT_TEMPLATE, fields) and stored.requirement_id == "REQ-001"
    assert "tags: invoices, audit" in stored.prompt and "title: Invoices are immutable once issued" in stored.prompt
    other = store.extract("requirements/REQ-001/requirement.json", "x.txt", template="Summarise {title}.")
    assert not other.duplicate
    with pytest.raises(InvalidPayload, match="the template names {budget}"):
        store.extract("requirements/REQ-001/requirement.json", "y.json", template="{budget}")
    store.flush()
    answer = json.loads((root / "requirements/REQ-001/extraction.json").read_text())
    assert answer["requirement_id"] == "REQ-001"


# -- concurrency limit -------------------------------------------------------------------------


def test_max_running_is_enforced_by_the_claim_across_workers(make_coordinator):
    registry = default_registry()
    registry.register(ClaudeExtractionType(command=[sys.executable, str(STAND_IN)], max_running=2))
    c = make_coordinator(registry=registry)
    ids = [c.enqueue(payload(target=f"out/{n}.json", prompt=f"{PROMPT}{n}\n")).id for n in range(5)]
    c.enqueue(CreateFile(path="other.json", content={}))
    first = c.queue.claim("worker-a", limit=10)
    assert sorted(j.type for j in first) == ["claude_extraction", "claude_extraction", "create_file"]
    assert c.queue.claim("worker-b", limit=10) == []  # the type is at its limit, whoever asks
    done = next(j for j in first if j.type == "claude_extraction")
    c.queue.finish_and_claim("worker-a", [completed(done, {})])
    [taken] = c.queue.claim("worker-b", limit=10)
    assert taken.id in ids and taken.id != done.id


def test_ten_slow_extractions_on_three_worker_processes_never_run_more_than_two_at_once(tmp_path, root):
    from tether import Coordinator

    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    log = tmp_path / "calls"
    with Coordinator.open(ledger, root=root) as c:
        ids = [c.enqueue(payload(target=f"out/{n}.json", prompt=f"{PROMPT}{n}\n")).id for n in range(10)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "CLAUDE_STANDIN_"))}
    env.update(
        TETHER_ASSISTANT_COMMAND=f"{sys.executable} {STAND_IN}",
        TETHER_ASSISTANT_MAX_RUNNING="2",
        CLAUDE_STANDIN_SLOW="0.4",
        CLAUDE_STANDIN_LOG=str(log),
        PYTHONPATH=str(REPO / "src"),
    )
    argv = [sys.executable, "-c", "from tether.cli import main; main()", "--db", ledger, "--root", str(root)]
    workers = [
        subprocess.Popen([*argv, "worker", "--poll-interval", "0.05"], env=env, stdout=subprocess.DEVNULL)
        for _ in range(3)
    ]
    try:
        deadline = time.monotonic() + 60
        with Coordinator.open(ledger, root=root) as c:  # done when the ledger says so, not the log
            while (done := sum(c.get(i).status is JobStatus.COMPLETED for i in ids)) < 10:
                assert time.monotonic() < deadline, f"only {done} of 10 extractions completed"
                time.sleep(0.1)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=30)
    events = sorted((float(t), kind) for kind, t, _ in (line.split() for line in log.read_text().splitlines()))
    running = peak = 0
    for _, kind in events:  # at equal times an end sorts before a start
        running += 1 if kind == "start" else -1
        peak = max(peak, running)
    assert peak == 2  # never more than two; and the limit is reached, so the workers did share the work
    assert calls(tmp_path).count("start") == 10  # each extraction asked once


def test_durations_and_metrics_show_cost_and_tokens_per_type_and_model(extraction, clock):
    from prometheus_client.parser import text_string_to_metric_families

    from tether.observe import durations, jobs, metrics

    for n in range(2):
        extraction.enqueue(payload(target=f"out/{n}.json", prompt=f"{PROMPT}{n}\n"))
    extraction.enqueue(payload(target="out/s.json", prompt=f"{PROMPT}s\n", model="sonnet"))
    extraction.enqueue(CreateFile(path="plain.json", content={}))
    extraction.run_until_idle()
    by_type = {d.type: d for d in durations.durations(extraction, now=clock.now())}
    spent = by_type["claude_extraction"].spend
    results = [json.loads(j.result or "{}") for j in jobs.jobs(extraction, limit=None) if j.type == "claude_extraction"]
    assert spent is not None and spent.jobs == 3
    assert spent.cost_usd == pytest.approx(sum(r["cost_usd"] for r in results))
    assert spent.input_tokens == sum(r["input_tokens"] for r in results) and spent.output_tokens == 120
    assert by_type["create_file"].spend is None
    # tether metrics: the same, by model, from the reading that counts the finished jobs
    exposed = {
        (s.name, s.labels.get("model"), s.labels.get("token_type")): s.value
        for family in text_string_to_metric_families(metrics.exposition(extraction).decode())
        for s in family.samples
        if s.labels.get("type") == "claude_extraction" and not s.name.endswith("_created")
    }
    for model in ("stand-in-model", "sonnet"):
        paid = [r for r in results if r["model"] == model]
        assert exposed["tether_jobs_billed_total", model, None] == len(paid)
        assert exposed["tether_job_cost_usd_total", model, None] == pytest.approx(sum(r["cost_usd"] for r in paid))
        assert exposed["tether_job_tokens_total", model, "input"] == sum(r["input_tokens"] for r in paid)
        assert exposed["tether_job_tokens_total", model, "output"] == sum(r["output_tokens"] for r in paid)
