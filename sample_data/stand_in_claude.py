#!/usr/bin/env python3
"""A STAND-IN for Claude Code (``claude -p --output-format json``), for tests and ``make demo``.

It is not an AI assistant: it answers deterministically from the prompt, with the same command
line and the same JSON envelope as the real ``claude`` CLI, so tether's runner can be exercised
without an account, a network or a bill. Standard library only.

Command line (what tether passes; anything else is refused like the real CLI refuses it)::

    stand_in_claude.py -p --output-format json [--tools ""] [--no-session-persistence]
                       [--json-schema '<schema>'] [--model <model>]

The prompt is read from stdin. The answer is the JSON object on a line ``ANSWER: {...}`` of the
prompt if there is one (so a test can ask for a schema-failing answer), else
``{"requirement_id", "title", "words"}`` read from the prompt's ``id:`` / ``title:`` lines.

Behaviour switches (environment variables; ``CLAUDE_*`` names, which tether passes on):

- ``CLAUDE_STANDIN_SLOW=<seconds>``: sleep before answering.
- ``CLAUDE_STANDIN_EXIT=<status>``: print a line to stderr and exit with it, no envelope.
- ``CLAUDE_STANDIN_API_ERROR=<status>``: an error envelope with that ``api_error_status``
  (401 authentication, 429 rate limit, 529 overloaded...), exit 1.
- ``CLAUDE_STANDIN_NOT_LOGGED_IN=1``: what the real CLI answers when logged out: exit 1, an
  envelope with ``is_error`` true, subtype ``success``, no ``api_error_status``, ``Not logged in``.
- ``CLAUDE_STANDIN_RATE_LIMIT=<unix time>``: a rate-limit envelope whose result names the reset
  time the way Claude Code does (``Claude AI usage limit reached|<unix time>``), exit 1.
- ``CLAUDE_STANDIN_HANG=1``: never answer.
- ``CLAUDE_STANDIN_GRANDCHILD=<pid file>``: start a grandchild that sleeps for an hour, write its
  pid to the file, then hang too.
- ``CLAUDE_STANDIN_ORPHAN=<pid file>``: start a grandchild that sleeps for an hour, write its pid
  to the file, then answer and exit normally, leaving it behind.
- ``CLAUDE_STANDIN_GARBAGE=1``: print something that is not JSON, exit 0.
- ``CLAUDE_STANDIN_TEXT_ANSWER=1``: a success envelope whose result is prose, not JSON.
- ``CLAUDE_STANDIN_ONCE=<state file>``: the switches above apply only while the file does not
  exist (the first call creates it): fail once, then answer.
- ``CLAUDE_STANDIN_ENV_REPORT=<file>``: write the environment it sees (a JSON object) there.
- ``CLAUDE_STANDIN_LOG=<file>``: append ``start <time> <pid>`` and ``end <time> <pid>`` lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time

USAGE = "usage: stand_in_claude.py -p --output-format json [--json-schema S] [--model M] [--tools T]"


def parse_args(argv: list[str]) -> dict[str, str | None]:
    opts: dict[str, str | None] = {"print": None, "output-format": "text", "json-schema": None, "model": None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-p", "--print"):
            opts["print"] = "1"
        elif arg == "--no-session-persistence":
            pass
        elif arg in ("--output-format", "--json-schema", "--model", "--tools") and i + 1 < len(argv):
            opts[arg[2:]] = argv[i + 1]
            i += 1
        else:
            sys.stderr.write(f"error: unknown option '{arg}'\n")
            sys.exit(1)  # as the real CLI answers one (commander's message, exit 1)
        i += 1
    if opts["print"] is None or opts["output-format"] != "json":
        sys.stderr.write(f"error: the stand-in only answers in print mode with --output-format json\n{USAGE}\n")
        sys.exit(2)
    return opts


def log(event: str) -> None:
    path = os.environ.get("CLAUDE_STANDIN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{event} {time.time():.6f} {os.getpid()}\n")


def answer_for(prompt: str) -> object:
    for line in prompt.splitlines():
        if line.startswith("ANSWER: "):
            return json.loads(line[len("ANSWER: ") :])
    fields = dict(re.findall(r"^(id|title): (.*)$", prompt, flags=re.MULTILINE))
    return {"requirement_id": fields.get("id"), "title": fields.get("title"), "words": len(prompt.split())}


def envelope(prompt: str, model: str, **fields: object) -> dict[str, object]:
    tokens_in, tokens_out = len(prompt.split()) * 2, 40
    cost = round(tokens_in * 3e-6 + tokens_out * 15e-6, 6)
    base: dict[str, object] = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "api_error_status": None,
        "duration_ms": 12,
        "duration_api_ms": 10,
        "num_turns": 1,
        "result": "",
        "stop_reason": "end_turn",
        "session_id": "standin-" + hashlib.sha256(prompt.encode()).hexdigest()[:12],
        "total_cost_usd": cost,
        "usage": {
            "input_tokens": tokens_in,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": tokens_out,
        },
        "modelUsage": {model: {"inputTokens": tokens_in, "outputTokens": tokens_out, "costUSD": cost}},
        "permission_denials": [],
    }
    base.update(fields)
    return base


def hang() -> None:
    while True:
        time.sleep(3600)


def main() -> int:
    opts = parse_args(sys.argv[1:])
    prompt = sys.stdin.read()
    model = opts["model"] or "stand-in-model"
    log("start")
    report = os.environ.get("CLAUDE_STANDIN_ENV_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump({**dict(os.environ), "__cwd__": os.getcwd(), "__cwd_entries__": os.listdir(".")}, f)
    once = os.environ.get("CLAUDE_STANDIN_ONCE")
    misbehave = True
    if once:
        misbehave = not os.path.exists(once)
        open(once, "a").close()
    env = os.environ.get if misbehave else (lambda name: None)
    time.sleep(float(os.environ.get("CLAUDE_STANDIN_SLOW") or 0))
    if env("CLAUDE_STANDIN_GRANDCHILD"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(env("CLAUDE_STANDIN_GRANDCHILD"), "w") as f:  # type: ignore[arg-type]
            f.write(str(child.pid))
        hang()
    if env("CLAUDE_STANDIN_ORPHAN"):
        orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(env("CLAUDE_STANDIN_ORPHAN"), "w") as f:  # type: ignore[arg-type]
            f.write(str(orphan.pid))
    if env("CLAUDE_STANDIN_HANG"):
        hang()
    if env("CLAUDE_STANDIN_EXIT"):
        sys.stderr.write("stand-in: failing as asked\nsecond line\n")
        return int(env("CLAUDE_STANDIN_EXIT"))  # type: ignore[arg-type]
    if env("CLAUDE_STANDIN_GARBAGE"):
        sys.stdout.write("<html>502 Bad Gateway</html>\n")
        return 0
    out: dict[str, object]
    code = 0
    if env("CLAUDE_STANDIN_RATE_LIMIT"):
        reset = env("CLAUDE_STANDIN_RATE_LIMIT")
        out = envelope(prompt, model, is_error=True, api_error_status=429, total_cost_usd=0)
        out["result"] = f"Claude AI usage limit reached|{reset}"
        code = 1
    elif env("CLAUDE_STANDIN_NOT_LOGGED_IN"):
        out = envelope(prompt, model, is_error=True, total_cost_usd=0, result="Not logged in · Please run /login")
        out["modelUsage"] = {}
        code = 1
    elif env("CLAUDE_STANDIN_API_ERROR"):
        status = int(env("CLAUDE_STANDIN_API_ERROR"))  # type: ignore[arg-type]
        out = envelope(prompt, model, is_error=True, api_error_status=status, total_cost_usd=0)
        out["result"] = f"API Error: {status}"
        code = 1
    elif env("CLAUDE_STANDIN_TEXT_ANSWER"):
        out = envelope(prompt, model, result="Here is what I found: the requirement is about invoices.")
    else:
        answer = answer_for(prompt)
        out = envelope(prompt, model, result=json.dumps(answer))
        if opts["json-schema"]:
            out["structured_output"] = answer
    sys.stdout.write(json.dumps(out) + "\n")
    log("end")
    return code


if __name__ == "__main__":
    sys.exit(main())
