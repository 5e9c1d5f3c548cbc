"""The command line as a script and an operator use it (issue 15): where lifecycle events go,
``enqueue --wait``, notes kept off stdout, option errors named as the flag, shortened ids,
``status`` on an unreadable ledger, and help pages."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tether import Coordinator, CreateFile
from tether.cli import main
from tether.cli.app import err
from tether.cli.reconcile import check_main
from tether.cli.worker import summary


class Run:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def events(self, stream: str) -> list[dict]:
        text = self.out if stream == "stdout" else self.err
        return [json.loads(line) for line in text.splitlines() if line.startswith('{"event"')]


@pytest.fixture
def site(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "data").mkdir()
    site = {"db": f"sqlite:///{tmp_path / 'tether.db'}", "root": str(tmp_path / "data")}
    Coordinator.open(site["db"], root=site["root"]).close()  # the ledger (`tether init` from a shell)
    return site


@pytest.fixture
def tether(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, site: dict[str, str]
) -> Callable[..., Run]:
    monkeypatch.setenv("COLUMNS", "200")
    for name in ("TETHER_DB", "TETHER_ROOT", "TETHER_IMPORT"):
        monkeypatch.delenv(name, raising=False)

    def run(*args: str, entry: Callable[[], None] = main, prefix: tuple[str, ...] | None = None) -> Run:
        capsys.readouterr()
        head = ("--db", site["db"], "--root", site["root"]) if prefix is None else prefix
        monkeypatch.setattr(sys, "argv", ["tether", *head, *args])
        # As the installed script runs: Click names the program from ``__main__``'s package when
        # there is one (``python -m pytest`` has one), and from ``argv[0]`` otherwise.
        monkeypatch.setattr(sys.modules["__main__"], "__package__", None, raising=False)
        try:
            entry()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        return Run(code, captured.out, captured.err)

    return run


def _payload(path: str, n: int = 1) -> str:
    return json.dumps({"path": path, "content": {"n": n}})


# -- 6: lifecycle events ---------------------------------------------------------------------------


def test_enqueue_prints_queued_on_stderr_and_the_worker_its_events_on_stdout(
    tether: Callable[..., Run], site: dict[str, str]
) -> None:
    queued = tether("enqueue", "create_file", "--payload", _payload("a.json"))
    job_id = queued.out.strip()
    assert queued.code == 0 and len(job_id) == 26, "stdout holds the id alone"
    assert [(e["event"], e["job_id"]) for e in queued.events("stderr")] == [("queued", job_id)]
    Path(site["root"], "b.json").write_text("other")  # create_file without overwrite: fails at once
    failing = tether("enqueue", "create_file", "--payload", _payload("b.json")).out.strip()
    ran = tether("worker", "--until-idle")
    assert ran.code == 0
    seen = {(e["event"], e.get("job_id")) for e in ran.events("stdout")}
    assert {("claimed", job_id), ("completed", job_id), ("claimed", failing), ("failed", failing)} <= seen
    assert ran.events("stderr") == [], "the worker's log is its stdout"
    assert "1 completed, 1 failed" in ran.err


def test_reconcile_on_a_terminal_prints_its_report_without_event_lines(
    tether: Callable[..., Run], site: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tether("enqueue", "create_file", "--payload", _payload("a.json"))
    tether("worker", "--until-idle", "-q")
    Path(site["root"], "a.json").unlink()
    logged = tether("reconcile")
    assert logged.code == 2 and {e["event"] for e in logged.events("stderr")} >= {"drift_detected"}
    monkeypatch.setattr(type(err), "is_terminal", property(lambda self: True))
    shown = tether("reconcile")
    assert shown.code == 2 and "missing" in shown.out
    assert '{"event"' not in shown.out + shown.err


# -- 7: enqueue --wait -----------------------------------------------------------------------------


@pytest.fixture
def running_worker(site: dict[str, str]) -> Iterator[None]:
    """A worker in a thread of this process, as a user's would run beside the command."""
    coordinator = Coordinator.open(site["db"], root=site["root"])
    worker = coordinator.worker(poll_interval=0.02)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        yield
    finally:
        worker.stop()
        thread.join(30)
        coordinator.close()


def test_enqueue_wait_exits_3_when_no_worker_finishes_it_in_time(tether: Callable[..., Run]) -> None:
    r = tether("enqueue", "create_file", "--payload", _payload("a.json"), "--wait", "--timeout", "0.3")
    assert r.code == 3 and "pending (not finished after 0.3s" in r.err
    assert tether("jobs", "--json").out.count('"status": "pending"') == 1, "--wait never runs the job itself"


def test_enqueue_wait_exits_0_completed_and_1_failed(
    tether: Callable[..., Run], site: dict[str, str], running_worker: None
) -> None:
    done = tether("enqueue", "create_file", "--payload", _payload("a.json"), "--wait", "--timeout", "30")
    assert done.code == 0 and f"{done.out.strip()}: completed" in done.err
    Path(site["root"], "b.json").write_text("other")
    failed = tether("enqueue", "create_file", "--payload", _payload("b.json"), "--wait", "--timeout", "30")
    assert failed.code == 1 and f"{failed.out.strip()}: failed after 1 attempt(s)" in failed.err


# -- 10: the smaller things ------------------------------------------------------------------------


def test_a_deduplicated_enqueue_keeps_its_note_off_stdout(tether: Callable[..., Run]) -> None:
    first = tether("enqueue", "create_file", "--key", "k", "--payload", _payload("a.json"))
    again = tether("enqueue", "create_file", "--key", "k", "--payload", _payload("a.json"))
    assert again.code == 0 and again.out == first.out == first.out.strip() + "\n"
    assert "duplicate of an active job" in again.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--max-attempts", "0"), "tether: error: --max-attempts: must be between 1 and"),
        (("--delay", "-5"), "tether: error: --delay: must be a number of seconds >= 0, got -5"),
        (("--payload", "@nofile.json"), "tether: error: --payload @nofile.json: cannot read the file 'nofile.json'"),
    ],
)
def test_bad_options_are_named_as_the_flag_not_as_the_payload(
    tether: Callable[..., Run], args: tuple[str, ...], message: str
) -> None:
    payload = () if "--payload" in args else ("--payload", _payload("a.json"))
    r = tether("enqueue", "create_file", *payload, *args)
    assert r.code == 1 and r.err.startswith(message) and "payload:" not in r.err


def test_a_bad_jsonl_line_names_the_file_and_the_line(tether: Callable[..., Run], tmp_path: Path) -> None:
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(_payload("a.json") + "\nnot json\n")
    r = tether("enqueue", "create_file", "--jsonl", str(lines))
    assert r.code == 1 and f"--jsonl {lines} line 2 is not valid JSON" in r.err


def test_a_ledger_url_naming_a_directory_says_so(tether: Callable[..., Run], tmp_path: Path) -> None:
    r = tether("jobs", prefix=("--db", f"sqlite:///{tmp_path}"))
    assert r.code == 1 and "is a directory, not a ledger file" in r.err


def test_show_takes_any_case_and_any_unique_prefix_or_suffix(tether: Callable[..., Run]) -> None:
    ids = [tether("enqueue", "create_file", "--payload", _payload(f"{n}.json")).out.strip() for n in range(2)]
    for text in (ids[0].lower(), ids[0][-6:].lower(), ids[0][-6:], ids[0][:24]):
        r = tether("show", text, "--json")
        assert r.code == 0 and json.loads(r.out)["id"] == ids[0], text
    common = ids[0][:2]
    ambiguous = tether("show", common)
    assert ambiguous.code == 1 and "matches more than one job" in ambiguous.err
    assert ids[0] in ambiguous.err and ids[1] in ambiguous.err
    assert tether("show", "ZZZZZZ").code == 1


def test_status_on_an_unreadable_ledger_prints_unknown_on_stdout(tether: Callable[..., Run], tmp_path: Path) -> None:
    r = tether("status", prefix=("--db", f"sqlite:///{tmp_path / 'nope.db'}"))
    assert r.code == 3 and r.out.startswith("UNKNOWN  no ledger at")


def test_status_on_a_terminal_names_an_unreadable_ledger_once(
    tether: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stdout and stderr on one screen: the UNKNOWN line once, not again as an error line."""
    monkeypatch.setattr(type(err), "is_terminal", property(lambda self: True))  # out and err alike
    r = tether("status", prefix=("--db", f"sqlite:///{tmp_path / 'nope.db'}"))
    assert r.code == 3
    assert (r.out + r.err).count("no ledger at") == 1, r.out + r.err


def test_a_read_command_on_a_ledger_damaged_past_its_header_names_the_ledger_of_its_db_and_exits_74(
    tether: Callable[..., Run], site: dict[str, str]
) -> None:
    """The ledger opens (its schema is whole), then a read meets the damage: the fault is
    named by the command line, which alone knows the --db it was given."""
    with Coordinator.open(site["db"], root=site["root"]) as c:
        c.enqueue_many([CreateFile(path=f"f{i}.json", content={"pad": "x" * 200}) for i in range(100)])
    path = Path(site["db"].removeprefix("sqlite:///"))
    # Every page but the schema's (its first page and, once the schema outgrows it, the pages it
    # spills onto): the ledger opens, and the read meets the damage.
    with sqlite3.connect(path) as conn:
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        schema = {n for (n,) in conn.execute("SELECT pageno FROM dbstat WHERE name = 'sqlite_schema'")}
    conn.close()
    with open(path, "r+b") as f:
        for page in range(2, path.stat().st_size // size + 1):
            if page not in schema:
                f.seek((page - 1) * size)
                f.write(b"\xde\xad\xbe\xef" * (size // 4))
    r = tether("jobs")
    assert r.code == 74, r.err
    assert r.err.startswith(f"tether: ledger fault: the ledger at {site['db']} is corrupt ("), r.err


def test_reconcile_checks_the_ledger_and_root_named_after_it_not_the_global_ones(
    tether: Callable[..., Run], site: dict[str, str], tmp_path: Path
) -> None:
    with Coordinator.open(site["db"], root=site["root"]) as c:
        c.enqueue(CreateFile(path="a.json", content=1))
        c.run_until_idle()
    elsewhere = ("--db", f"sqlite:///{tmp_path / 'none.db'}", "--root", str(tmp_path / "none"))
    r = tether("reconcile", "--db", site["db"], "--root", site["root"], "--quiet", prefix=elsewhere)
    assert r.code == 0 and "checked 1 path(s)" in r.out and "1 in_sync" in r.out, r.err


def test_help_pages_show_no_bool_metavars_or_doubled_brackets(tether: Callable[..., Run]) -> None:
    retry = tether("retry", "--help", prefix=())
    assert retry.code == 0 and "Usage: tether retry [OPTIONS] [ID]..." in retry.out
    worker = tether("worker", "--help", prefix=())
    assert "<bool>" not in worker.out + retry.out and "[[" not in retry.out


def test_reconcile_check_has_its_own_usage_and_takes_import(tether: Callable[..., Run]) -> None:
    page = tether("--help", entry=check_main, prefix=())
    assert page.out.startswith("Usage: tether-reconcile-check [OPTIONS]") and "--import" in page.out
    r = tether("--import", "tether.demo.app", "--quiet", entry=check_main, prefix=())
    assert r.code == 1 and "no ledger at" in r.err  # the option is taken; the ledger is what is missing


def test_the_worker_summary_counts_outcomes_not_attempts_given_back() -> None:
    assert summary({"release": 1}) == "1 given back"
    assert summary({"complete": 2, "retry": 1, "fail": 1}) == "2 completed, 1 to retry, 1 failed"
    assert summary({}) == "no jobs run"
