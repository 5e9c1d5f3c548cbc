"""Running an AI assistant's CLI once: argv (never a shell), prompt on stdin, an empty working
directory, its own process group, a scrubbed environment, a capped stdout; and the verdict read
from its JSON envelope (``claude -p --output-format json``), not from its exit code alone.

The process group is killed as a whole (TERM, then KILL after a grace period) when the job is
cancelled (timeout, shutdown, lost lease), and always once the assistant itself has exited, so a
grandchild it left behind does not outlive the attempt. A small guard leads the group
(``orphan_guard.py``) and ends it if the worker itself dies, SIGKILL included.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from ..errors import ConfigError, Deferred, PermanentError, RetryableError

ENV_COMMAND = "TETHER_ASSISTANT_COMMAND"
"""The assistant's command line (split like a shell would, never run by one); default ``claude``."""
ENV_PASS = "TETHER_ASSISTANT_ENV"
"""Extra environment variable names (comma-separated) passed on to the assistant."""

DEFAULT_COMMAND = ("claude",)
PRINT_JSON = ("-p", "--output-format", "json")
NO_TOOLS = ("--tools", "", "--no-session-persistence")
"""No tool use (an extraction only reads the prompt) and no session left on disk."""

DEFAULT_STDOUT_CAP = 10 << 20
STDERR_CAP = 64 << 10
KILL_GRACE = 2.0
"""Seconds between TERM and KILL of the assistant's process group."""

# What the assistant may see of this process's environment. An allowlist, not a denylist: a
# worker's environment holds AWS credentials, database URLs and TETHER_* settings, and a new
# secret name must not leak by default. ANTHROPIC_* / CLAUDE_* carry the assistant's own
# credentials and settings.
_PASS_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR", "SHELL",
        "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE",
        "SSL_CERT_DIR", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    }
)  # fmt: skip
_PASS_PREFIXES = ("ANTHROPIC_", "CLAUDE_", "LC_")


def base_command(given: Sequence[str] | str | None = None) -> tuple[str, ...]:
    """The assistant's argv before tether's own flags: ``given`` (a list, or a string split like
    a shell would), else ``$TETHER_ASSISTANT_COMMAND``, else ``claude``."""
    raw = given if given is not None else (os.environ.get(ENV_COMMAND) or None)
    if raw is None:
        return DEFAULT_COMMAND
    argv = tuple(shlex.split(raw)) if isinstance(raw, str) else tuple(raw)
    if not argv or not all(isinstance(a, str) and a for a in argv[:1]):
        raise ConfigError(f"the assistant command {raw!r} is empty; set {ENV_COMMAND} to e.g. 'claude'")
    return argv


def command_line(base: Sequence[str], *, schema: Mapping[str, Any] | None, model: str | None) -> list[str]:
    """The full argv: ``<base> -p --output-format json --tools "" --no-session-persistence``,
    plus ``--json-schema <schema>`` and ``--model <model>`` when given."""
    argv = [*base, *PRINT_JSON, *NO_TOOLS]
    if schema is not None:
        argv += ["--json-schema", orjson.dumps(schema).decode()]
    if model is not None:
        argv += ["--model", model]
    return argv


def child_env(environ: Mapping[str, str] | None = None, extra: Sequence[str] = ()) -> dict[str, str]:
    """The assistant's environment: the allowlisted names of ``environ`` (default this process's),
    plus the ``extra`` names and those in ``$TETHER_ASSISTANT_ENV``."""
    environ = os.environ if environ is None else environ
    wanted = set(extra) | {n.strip() for n in (environ.get(ENV_PASS) or "").split(",") if n.strip()}
    return {
        name: value
        for name, value in environ.items()
        if name in _PASS_NAMES or name in wanted or (name.startswith(_PASS_PREFIXES) and not name.startswith("TETHER_"))
    }


@dataclass(frozen=True)
class Run:
    """What one run of the assistant left: its exit status (None if tether killed it), its
    stdout (at most the cap), the first line of its stderr, and why tether stopped it."""

    exit_code: int | None
    stdout: bytes
    stderr_line: str
    stopped: str | None = None  # the cancel reason, or "output_too_large"
    seconds: float = 0.0


def run(
    argv: Sequence[str],
    prompt: str,
    *,
    cancelled: threading.Event,
    reason: Any = None,
    env: Mapping[str, str] | None = None,
    stdout_cap: int = DEFAULT_STDOUT_CAP,
    grace: float = KILL_GRACE,
) -> Run:
    """Run the assistant once with ``prompt`` on stdin until it exits or ``cancelled`` is set
    (``reason()`` then names why). Its whole process group is gone when this returns."""
    start = time.monotonic()
    env = dict(child_env() if env is None else env)
    command = [_resolve(argv[0], env), *argv[1:]]
    # The guard ends the group if this process dies (SIGKILL included): it watches the read end,
    # and only this process holds the write end (os.pipe's ends are not inherited by children).
    watch, held = os.pipe()
    try:
        with tempfile.TemporaryDirectory(prefix="tether-assistant-") as cwd:
            try:
                proc = subprocess.Popen(
                    [*_guard(grace), str(watch), repr(grace), "--", *command],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=cwd,
                    env=env,
                    start_new_session=True,  # its own session and process group: killed as one
                    close_fds=True,
                    pass_fds=(watch,),
                )
            finally:
                os.close(watch)
            code, out, err, stopped = _wait(proc, prompt, cancelled, reason, stdout_cap, grace)
    finally:
        os.close(held)  # a run that failed half-way with the guard still up: it ends the group
    first = err.decode("utf-8", "replace").strip().splitlines()
    return Run(
        None if stopped else code,
        out,
        first[0][:200] if first else "",
        stopped,
        time.monotonic() - start,
    )


def _wait(
    proc: subprocess.Popen[bytes], prompt: str, cancelled: threading.Event, reason: Any, stdout_cap: int, grace: float
) -> tuple[int, bytes, bytes, str | None]:
    """Feed the prompt, drain the output, and wait for the group's leader to exit, or stop the
    group when cancelled or the output is too large; reap it. Returns its exit status, stdout,
    stderr and why it was stopped (None if it exited by itself)."""
    too_big = threading.Event()
    out: list[bytes] = []
    err: list[bytes] = []
    threads = [
        threading.Thread(target=_feed, args=(proc.stdin, prompt.encode()), daemon=True),
        threading.Thread(target=_drain, args=(proc.stdout, out, stdout_cap, too_big), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, err, STDERR_CAP, None), daemon=True),
    ]
    ended = threading.Event()
    threads.append(threading.Thread(target=_watch, args=(proc.pid, ended), daemon=True))
    for t in threads:
        t.start()
    stopped = None
    # Woken at once by the exit; a cancel or an output over the cap is seen within _CHECK_EVERY.
    while not ended.wait(_CHECK_EVERY):
        if cancelled.is_set():
            stopped = str(reason() if callable(reason) else reason or "cancelled")
            _stop_group(proc.pid, grace)
            break
        if too_big.is_set():
            stopped = "output_too_large"
            _stop_group(proc.pid, grace)
            break
    # The leader is a zombie until reaped, so its group id cannot be reused: kill whatever
    # it left in the group (a grandchild holding the pipes open), then reap it.
    _kill_group(proc.pid, signal.SIGKILL)
    code = proc.wait()
    for t in threads:
        t.join(timeout=5)
    return code, b"".join(out), b"".join(err), stopped


GUARD = Path(__file__).with_name("orphan_guard.py")


def _guard(grace: float) -> list[str]:
    """The guard's command line: this interpreter, isolated and without site packages (the
    guard needs the standard library alone, and starts in a few milliseconds so)."""
    if not sys.executable:
        raise ConfigError("cannot run the assistant's guard: Python's sys.executable is unknown")
    return [sys.executable, "-I", "-S", str(GUARD)]


def _resolve(program: str, env: Mapping[str, str]) -> str:
    """``program`` as the guard will run it, found on the assistant's PATH; PermanentError if it
    is missing (the guard would only exit 127, which reads like the assistant's own failure)."""
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if found is not None:
        return os.path.abspath(found)  # the guard runs in the assistant's empty directory
    if os.sep in program and os.path.exists(program):
        raise PermanentError(f"verdict=not_installed: the assistant command {program!r} is not executable")
    raise PermanentError(
        f"verdict=not_installed: the assistant command {program!r} was not found; install it or set {ENV_COMMAND}"
    )


def _feed(pipe: Any, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError):
        pass  # the assistant exited without reading it all; its exit says why


def _drain(pipe: Any, into: list[bytes], cap: int, over: threading.Event | None) -> None:
    size = 0
    while chunk := pipe.read1(1 << 16):
        if size < cap:
            into.append(chunk[: cap - size])
        size += len(chunk)
        if size > cap and over is not None:
            over.set()
    pipe.close()


_CHECK_EVERY = 0.1  # seconds between looks at the cancel flag and the output cap


def _watch(pid: int, ended: threading.Event) -> None:
    """Set ``ended`` when the child exits, without reaping it (WNOWAIT): its group is killed first."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass  # already reaped: it has exited all the same
    finally:
        ended.set()


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (WNOWAIT)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(pgid: int, grace: float) -> None:
    """TERM the group, give the leader ``grace`` seconds, then KILL the group."""
    _kill_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not _exited(pgid):
        time.sleep(0.02)
    _kill_group(pgid, signal.SIGKILL)


# -- the verdict ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A successful envelope: the answer (a JSON value from ``structured_output``, else the
    ``result`` text) and what it cost."""

    value: Any
    spend: dict[str, Any]


class AssistantFailed(RetryableError):
    """The assistant did not answer usefully this time (rate limited, overloaded, no envelope, a
    failing exit, an answer that is not valid): retried until the job's attempts run out."""


class AssistantRefused(PermanentError):
    """The assistant can never answer this job as configured (not logged in, out of budget or
    turns, the command is missing): fix the setting, then ``tether retry`` the job."""


_PERMANENT_SUBTYPES = {
    "error_max_turns": "out_of_turns",
    "error_max_budget_usd": "out_of_budget",
    "error_max_structured_output_retries": "schema_unmet",
}
_AUTH_TEXT = re.compile(r"not logged in|invalid api key|authentication|please run /login|oauth token", re.I)
_RESET = re.compile(r"limit reached\|(\d{9,11})")
# What commander (the CLI's argument parser) prints for a command line it rejects, before it does
# any work: the same argv fails the same way on every attempt.
_BAD_ARGV = re.compile(
    r"^error: (unknown option|unknown command|too many arguments|option .* argument missing|required option|"
    r"missing required argument)"
)
_FENCED = re.compile(r"^```(?:json)?\s*\n(.*)\n```\s*$", re.S)


def message(verdict: str, run: Run, detail: str = "") -> str:
    """``last_error``'s text: the verdict, the exit code, stderr's first line and a detail; never
    the prompt or the answer."""
    code = "killed" if run.exit_code is None else str(run.exit_code)
    parts = [f"verdict={verdict}", f"exit={code}"]
    if detail:
        parts.append(detail)
    if run.stderr_line:
        parts.append(f"stderr: {run.stderr_line}")
    return "; ".join(parts)


def judge(run: Run, *, now: datetime) -> Answer:
    """The envelope's verdict: an Answer, or the error that says whether a retry can help."""
    envelope = _envelope(run.stdout)
    if envelope is None:
        if run.exit_code not in (0, None) and _BAD_ARGV.match(run.stderr_line):
            raise AssistantRefused(
                message("bad_command_line", run, f"check the assistant command ({ENV_COMMAND}) and its flags")
            )
        verdict = "no_envelope" if run.exit_code == 0 else "exit_status"
        raise AssistantFailed(message(verdict, run, f"{len(run.stdout)} bytes of stdout, no JSON envelope"))
    subtype = str(envelope.get("subtype") or "")
    status = envelope.get("api_error_status")
    text = envelope.get("result")
    # The envelope's own error text names the failure (``Not logged in``); it is not an answer.
    said = f"said: {str(text)[:160]}" if isinstance(text, str) and envelope.get("is_error") else ""
    if subtype in _PERMANENT_SUBTYPES:
        raise AssistantRefused(message(_PERMANENT_SUBTYPES[subtype], run, f"subtype={subtype}"))
    if envelope.get("is_error") or subtype != "success":
        if status in (401, 403) or (isinstance(text, str) and _AUTH_TEXT.search(text)):
            raise AssistantRefused(message("not_authorized", run, said))
        reset = _RESET.search(text) if isinstance(text, str) else None
        if status == 429 and reset is not None:
            until = datetime.fromtimestamp(int(reset.group(1)), UTC)
            if until > now:
                raise Deferred(message("rate_limited", run, f"resets at {until.isoformat()}"), until)
        if status == 429:
            raise AssistantFailed(message("rate_limited", run, said))
        if isinstance(status, int) and (status >= 500):
            raise AssistantFailed(message("overloaded" if status == 529 else "server_error", run, said))
        raise AssistantFailed(message("assistant_error", run, f"subtype={subtype} {said}".strip()))
    value = envelope["structured_output"] if envelope.get("structured_output") is not None else text
    return Answer(value, spend(envelope))


def parse_answer(value: Any, run: Run, *, as_json: bool) -> Any:
    """The answer as the target needs it: a JSON value for a ``.json`` target (a ``result`` text
    is parsed, a single fenced block unwrapped), else text."""
    if not isinstance(value, str):
        return value
    if not as_json:
        return value
    body = _FENCED.match(value.strip())
    try:
        return orjson.loads(body.group(1) if body else value)
    except orjson.JSONDecodeError as e:
        raise AssistantFailed(message("invalid_answer", run, f"the answer is not JSON ({e.msg})")) from e


def spend(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """What the job's result keeps of the envelope: cost, tokens, duration, model, session."""
    usage: dict[str, Any] = envelope["usage"] if isinstance(envelope.get("usage"), dict) else {}
    models: dict[str, Any] = envelope["modelUsage"] if isinstance(envelope.get("modelUsage"), dict) else {}
    return {
        "cost_usd": envelope.get("total_cost_usd"),
        "input_tokens": usage.get("input_tokens"),
        "output_tokens": usage.get("output_tokens"),
        "cache_read_input_tokens": usage.get("cache_read_input_tokens"),
        "cache_creation_input_tokens": usage.get("cache_creation_input_tokens"),
        "duration_ms": envelope.get("duration_ms"),
        "model": next(iter(models), None),
        "session_id": envelope.get("session_id"),
        "num_turns": envelope.get("num_turns"),
    }


def _envelope(stdout: bytes) -> dict[str, Any] | None:
    """The result envelope: the JSON object on stdout (the last line that is one)."""
    try:
        value = orjson.loads(stdout)
    except orjson.JSONDecodeError:
        value = None
        for line in reversed(stdout.splitlines()):
            try:
                value = orjson.loads(line)
                break
            except orjson.JSONDecodeError:
                continue
    if isinstance(value, dict) and value.get("type") == "result":
        return value
    return None
