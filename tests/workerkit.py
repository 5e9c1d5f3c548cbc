"""Real ``tether worker`` processes on any ledger, for the pause and kill tests: start one with
the test hooks of tests/proc_pause.py (as a new process, or forked from one that has imported
tether: ``Zygote``), read its event lines, see whether it is stopped."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_SCRIPT = Path(sys.executable).with_name("tether")
TETHER = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from tether.cli import main; main()"]
# The job types real worker processes load (``--import proc_jobtypes``), loaded here by path under
# the same name, for the tests that enqueue them.
_spec = importlib.util.spec_from_file_location("proc_jobtypes", Path(__file__).with_name("proc_jobtypes.py"))
assert _spec is not None and _spec.loader is not None
pj = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pj)
DEADLINE = 60.0  # for a worker to reach a point it must reach; generous on a busy machine
_HOOKS = (
    "TETHER_TEST_STOP_AT",
    "TETHER_TEST_STOP_MARKER",
    "TETHER_TEST_STOP_PATH",
    "TETHER_TEST_CLOCK_STOPS",
    "TETHER_TEST_EFFECT_LOG",
)


class WorkerProc:
    """One ``tether worker`` subprocess whose output (JSON event lines, errors) goes to a file."""

    def __init__(self, popen: subprocess.Popen[bytes], output: Path) -> None:
        self.popen = popen
        self.output = output

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def events(self, name: str | None = None, job_id: str | None = None) -> list[dict]:
        found = []
        for line in self.text().split("\n")[:-1]:  # complete lines only: it may be mid-write
            if line.startswith("{"):
                event = json.loads(line)
                if (name is None or event["event"] == name) and (job_id is None or event.get("job_id") == job_id):
                    found.append(event)
        return found

    def stopped(self) -> bool:
        """Whether the process is stopped by a signal (state T in /proc)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rpartition(")")[2].split()[0] == "T"

    def wait(self, timeout: float = DEADLINE) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise AssertionError(
                f"worker {self.pid} did not exit within {timeout}s; output tail:\n{self.text()[-2000:]}"
            ) from None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


def start_worker(
    db: str,
    root: Path,
    output: Path,
    *args: str,
    env: dict[str, str] | None = None,
    quiet: bool = False,
    module: str = "tests.proc_pause",
) -> WorkerProc:
    """``tether --db DB --root ROOT --import MODULE worker ARGS``, its output to ``output``."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("TETHER_DB", "TETHER_ROOT", *_HOOKS)}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    full_env.update(env or {})
    argv = [*TETHER, "--db", db, "--root", str(root), "--import", module, "worker", *args]
    if quiet:
        argv.append("--quiet")
    with open(output, "ab") as out:
        popen = subprocess.Popen(argv, cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    return WorkerProc(popen, output)


def wait_for(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


class Zygote:
    """tests/proc_zygote.py: worker processes started by fork from one that has imported tether."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        full_env = {k: v for k, v in os.environ.items() if k not in ("TETHER_DB", "TETHER_ROOT", *_HOOKS)}
        full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        full_env.update(env or {})
        self.popen = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "proc_zygote.py")],
            cwd=REPO,
            env=full_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _ask(self, line: str) -> int:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()
        answer = self.popen.stdout.readline()
        assert answer.strip().lstrip("-").isdigit(), f"zygote answered {answer!r} to {line!r}"
        return int(answer)

    def start(self, db: str, root: Path, output: Path, *args: str, quiet: bool = False) -> ForkedWorker:
        """A forked ``tether --db DB --root ROOT --import tests.proc_pause worker ARGS``."""
        argv = ["--db", db, "--root", str(root), "--import", "tests.proc_pause", "worker", *args]
        argv += ["--quiet"] if quiet else []
        return ForkedWorker(self, self._ask(shlex.join(["start", str(output), *argv])))

    def close(self) -> None:
        if self.popen.poll() is None:
            assert self.popen.stdin is not None
            self.popen.stdin.close()
            self.popen.wait(timeout=DEADLINE)


class ForkedWorker:
    """A worker process forked by a Zygote: signalled by pid, waited for through the zygote."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = self.zygote._ask(f"wait {self.pid}")
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            self.send_signal(signal.SIGKILL)
            self.wait()
