"""Every read and operator command through the real entry point (``tether.cli:main``), on a
ledger built by real jobs, as a table and as ``--json``; the exit codes of ``status``.

The CLI reads the system clock, so the ledger's fake clock starts far enough in the past to
end at about now: the stuck job's lock is then ~400 s old and everything finished within 1 h.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup, TyperOption

from jobkit import busy_window
from test_observe import Ledger, Work, WorkType, build_ledger
from tether import Coordinator, FakeClock, SystemClock
from tether.cli import app, main
from tether.cli.app import JSON_OPTION

NO_FILE = "the file does not exist; check --db or TETHER_DB, or create a ledger there with `tether init`"
# The fake time the ledger builder spends: 3600 s backoff, 19 s of work, 400 s stuck.
_BUILD_SECONDS = 3600 + 19 + 400


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(SystemClock().now() - timedelta(seconds=_BUILD_SECONDS + 5))


@pytest.fixture
def ledger(make_coordinator: Callable[..., Coordinator], clock: FakeClock) -> Ledger:
    return build_ledger(make_coordinator, clock)


@pytest.fixture
def db(db_url: str) -> str:
    return db_url


class Run:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> dict:
        return json.loads(self.out)


@pytest.fixture
def tether(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, db: str) -> Callable[..., Run]:
    """Run ``tether --db <ledger> ARGS`` through ``main()``: exit code, stdout, stderr."""
    monkeypatch.setenv("COLUMNS", "250")  # wide tables: ids and errors are not folded
    monkeypatch.delenv("TETHER_DB", raising=False)

    def run(*args: str, db_url: str | None = None) -> Run:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["tether", "--db", db_url or db, *args])
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        return Run(code, captured.out, captured.err)

    return run


# -- help ----------------------------------------------------------------------------------------


def test_every_command_has_help_with_an_example() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    names = sorted(group.commands)
    assert {
        "status",
        "failed",
        "stuck",
        "durations",
        "duplicates",
        "recent",
        "jobs",
        "show",
        "retry",
        "purge",
        "metrics",
        "enqueue",
    } <= set(names)
    for name in names:
        command = group.commands[name]
        assert command.help and command.help.strip(), f"tether {name} has no help"
        assert "Example: tether" in command.help, f"tether {name} help has no example"
        for param in command.params:
            if param.param_type_name == "option":
                assert isinstance(param, TyperOption) and param.help, f"tether {name} {param.opts[0]} has no help"


def test_every_command_that_prints_json_takes_the_one_shared_json_option() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    commands = dict(group.commands)
    schedules = group.commands["schedules"]
    assert isinstance(schedules, TyperGroup)
    commands |= {f"schedules {name}": command for name, command in schedules.commands.items()}
    with_json = {}
    for name, command in commands.items():
        for param in command.params:
            if "--json" in param.opts:
                assert isinstance(param, TyperOption)
                with_json[name] = (param.opts, param.help, param.default)
    assert {"status", "enqueue", "reconcile", "retry", "show", "purge", "schedules", "jobs"} <= set(with_json)
    shared = (["--json"], JSON_OPTION.help, False)
    assert {name: declared for name, declared in with_json.items() if declared != shared} == {}


# -- status --------------------------------------------------------------------------------------


def test_status_shows_the_verdict_counts_and_thresholds_and_exits_2_on_a_stuck_job(ledger: Ledger, tether) -> None:
    r = tether("status")
    assert r.code == 2
    assert r.out.startswith("ERROR  4 outstanding (3 pending, 1 claimed), 2 failed, 1 stuck")
    assert "stuck 1: claimed with a lock older than 300s; any stuck job is an error" in r.out
    assert "failed 2: any failed job is a warning" in r.out
    assert "under 80 (warn) / 100 (error)" in r.out
    assert "│ work │       3 │       1 │           4 │" in r.out
    assert re.search(r"largest pending payload \d+ B\n", r.out), r.out  # the later jobs: a few dozen bytes


def test_status_json_has_the_documented_schema(ledger: Ledger, tether) -> None:
    r = tether("status", "--json")
    assert r.code == 2
    data = r.json()
    assert set(data) == {
        "verdict",
        "exit_code",
        "reasons",
        "checks",
        "thresholds",
        "now",
        "lock_timeout",
        "pending",
        "claimed",
        "outstanding",
        "ready",
        "scheduled",
        "retrying",
        "running",
        "failed",
        "stuck",
        "quarantined",
        "deepest_target",
        "paused",
        "oldest_pending_at",
        "oldest_pending_age",
        "largest_pending_payload",
        "by_type",
    }
    assert (data["verdict"], data["exit_code"], data["stuck"], data["failed"]) == ("error", 2, 1, 2)
    assert data["quarantined"] == 0
    # The ledger was written on a fake clock the command does not share: which state a pending
    # job is in depends on the real time, but the states always add up to their status.
    assert data["ready"] + data["scheduled"] + data["retrying"] == data["pending"] == 3
    assert (data["running"], data["stuck"]) == (0, 1)
    assert data["deepest_target"] is None  # nothing outstanding has a target
    [work] = data["by_type"]
    assert {k: work[k] for k in ("type", "pending", "claimed", "outstanding")} == {
        "type": "work",
        "pending": 3,
        "claimed": 1,
        "outstanding": 4,
    }
    assert data["thresholds"]["backlog_limit"] == 100


def test_status_exit_codes_follow_the_monitoring_plugin_convention(
    make_coordinator: Callable[..., Coordinator], clock: FakeClock, tether, tmp_path: Path
) -> None:
    registry_c = make_coordinator()
    assert tether("status").code == 0  # empty ledger: ok
    registry_c.register(WorkType())
    for i in range(4):
        registry_c.enqueue(Work(name=f"p{i}"))
    # The jobs were enqueued on the fake clock, months before the CLI's real now: age is not judged here.
    assert tether("status").code == 1  # ...except by this: the oldest pending job waited over 1 h
    young = ("--pending-age-warn", "off", "--unclaimed-grace", "off")
    assert tether("status", *young).code == 0  # 4 outstanding, limit 100
    assert tether("status", *young, "--backlog-limit", "5").code == 1  # 4 >= 80% of 5: warning
    assert tether("status", *young, "--backlog-limit", "4").code == 2  # 4 >= 100% of 4: error
    r = tether("status", *young, "--backlog-limit", "4", "--warn-ratio", "0.5", "--json")
    assert r.json()["thresholds"]["backlog_warn"] == 2
    r = tether("status", db_url=f"sqlite:///{tmp_path / 'missing.db'}")
    assert r.code == 3 and r.out.startswith("UNKNOWN  no ledger at")  # stdout: what monitoring plugins read
    assert r.err.strip() == f"tether: UNKNOWN: no ledger at {tmp_path / 'missing.db'} ({NO_FILE})"
    assert not (tmp_path / "missing.db").exists()
    r = tether("status", "--json", db_url="postgresql://nobody@127.0.0.1:1/none")
    assert r.code == 3 and r.json()["verdict"] == "unknown"
    assert r.json()["error"].startswith("cannot open the database at") and "\n" not in r.json()["error"]


def test_status_names_the_target_with_the_most_outstanding_jobs(make_coordinator, tether) -> None:
    from tether import CreateFile

    c = make_coordinator()
    for n in range(3):
        c.enqueue(CreateFile(path="index.json", content={"n": n}, overwrite=True))
    c.enqueue(CreateFile(path="other.json", content={}))
    c.queue.claim("w")  # one of them running: outstanding too
    r = tether("status")
    assert "deepest target: file:index.json with 3 outstanding jobs, which run one at a time in enqueue order" in r.out
    deepest = tether("status", "--json").json()["deepest_target"]
    assert deepest == {"key": "file:index.json", "outstanding": 3}


def test_status_is_a_warning_when_only_failed_jobs_remain(make_coordinator, tether) -> None:
    registry_c = make_coordinator()
    registry_c.register(WorkType())
    registry_c.enqueue(Work(name="bad", fail_times=1, permanent=True))
    registry_c.run_until_idle()
    r = tether("status")
    assert r.code == 1 and r.out.startswith("WARNING  0 outstanding")


# -- the questions -------------------------------------------------------------------------------


def test_failed_lists_first_error_lines_and_show_gives_the_whole_error(ledger: Ledger, tether) -> None:
    r = tether("failed")
    assert r.code == 0
    assert ledger.ids["bad"] in r.out and ledger.ids["flaky"] in r.out
    assert "PermanentError: bad can never work" in r.out and "second line" not in r.out
    assert "2/2" in r.out
    data = tether("failed", "--json").json()
    assert [j["id"] for j in data["jobs"]] == [ledger.ids["bad"], ledger.ids["flaky"]]
    assert data["jobs"][0]["last_error"] == "PermanentError: bad can never work\nsecond line of detail"
    assert "payload" not in data["jobs"][0]
    assert tether("failed", "--type", "create_file").out.strip() == "Failed jobs: no failed jobs"
    shown = tether("show", ledger.ids["bad"])
    assert "second line of detail" in shown.out and '"fail_times"' not in shown.out
    with_payload = tether("show", ledger.ids["bad"], "--payload", "--json").json()
    assert with_payload["payload"]["name"] == "bad" and with_payload["status"] == "failed"


def test_stuck_names_the_worker_and_since_when(ledger: Ledger, tether) -> None:
    r = tether("stuck")
    assert r.code == 0 and ledger.ids["hang"] in r.out and "w-dead" in r.out
    data = tether("stuck", "--json").json()
    [job] = data["jobs"]
    assert job["locked_by"] == "w-dead" and 400 <= job["held_for"] < 460
    assert tether("stuck", "--lock-timeout", "3600", "--json").json()["jobs"] == []


def test_durations_per_type_as_table_and_json(ledger: Ledger, tether) -> None:
    r = tether("durations", "--since", "2h")
    assert r.code == 0 and "work" in r.out and "5.00s" in r.out
    types = {d["type"]: d for d in tether("durations", "--since", "2h", "--json").json()["types"]}
    assert types["work"]["count"] == 8 and types["work"]["p95"] == 5.0
    assert set(types["work"]) == {"type", "count", "p50", "p95", "p99", "max", "mean", "spend"}
    assert types["work"]["spend"] is None  # no cost recorded by this type


def test_durations_samples_a_busy_window_and_says_so_and_exact_measures_every_job(make_coordinator, tether) -> None:
    # 100 jobs, one in 10 of them (microsecond a multiple of 10: the sample's) took 7 s, the rest 1 s.
    busy_window(make_coordinator(), 100, took=lambda i: 7.0 if i % 10 == 0 else 1.0)
    r = tether("durations", "--sample", "10")
    assert r.code == 0 and "measured" in r.out and "7.00s" in r.out
    assert "sampled: 10 of the window's 100 completed jobs measured (1 in 10, by completion time)" in r.out
    data = tether("durations", "--sample", "10", "--json").json()
    assert data["sample"] == {"total": 100, "every": 10, "measured": 10} and data["types"][0]["p50"] == 7.0
    exact = tether("durations", "--exact", "--sample", "10", "--json").json()
    assert exact["sample"] == {"total": 100, "every": 1, "measured": 100} and exact["types"][0]["p50"] == 1.0
    assert "sampled" not in tether("durations", "--exact", "--sample", "10").out


def test_duplicates_shows_keys_with_their_statuses(ledger: Ledger, tether) -> None:
    r = tether("duplicates")
    assert r.code == 0 and "nightly" in r.out and "2 completed" in r.out
    [group] = tether("duplicates", "--json").json()["keys"]
    assert group["idempotency_key"] == "nightly" and group["count"] == 2
    assert [j["status"] for j in group["jobs"]] == ["completed", "completed"]


def test_recent_shows_what_finished_in_the_window(ledger: Ledger, tether) -> None:
    r = tether("recent", "--since", "1h")
    assert r.code == 0 and r.out.startswith("11 completed, 2 failed since")
    data = tether("recent", "--since", "1h", "--json").json()
    assert (data["completed"], data["failed"], len(data["jobs"])) == (11, 2, 13)
    assert tether("recent", "--since", "30s", "--json").json()["jobs"] == []


def test_jobs_lists_with_filters(ledger: Ledger, tether) -> None:
    data = tether("jobs", "--status", "pending", "--json").json()
    assert [j["id"] for j in data["jobs"]] == [ledger.ids[f"later{i}"] for i in (2, 1, 0)]
    r = tether("jobs", "--type", "create_file")
    assert r.code == 0 and all(ledger.ids[f"file_{n}"] in r.out for n in "abc")
    assert len(tether("jobs", "--limit", "0", "--json").json()["jobs"]) == 17
    assert len(tether("jobs", "--since", "2h", "--limit", "5", "--json").json()["jobs"]) == 5


def test_metrics_prints_prometheus_text(ledger: Ledger, tether) -> None:
    r = tether("metrics")
    assert r.code == 0
    assert 'tether_jobs{status="pending",type="work"} 3.0' in r.out.splitlines()
    assert "# TYPE tether_jobs_stuck gauge" in r.out


# -- operator actions ----------------------------------------------------------------------------


def test_retry_by_id_and_all_failed_of_a_type(ledger: Ledger, tether) -> None:
    r = tether("retry", ledger.ids["bad"])
    assert r.code == 0 and ledger.ids["bad"] in r.out and "1 job(s) back to pending" in r.out
    assert ledger.coordinator.get(ledger.ids["bad"]).attempts == 0
    again = tether("retry", ledger.ids["bad"])  # now pending: not retryable
    assert again.code == 1 and again.out == ""
    assert again.err.strip() == f"tether: error: job {ledger.ids['bad']} is pending; it cannot become pending"
    data = tether("retry", "--failed", "--type", "work", "--json").json()
    assert [j["id"] for j in data["retried"]] == [ledger.ids["flaky"]] and data["errors"] == []
    assert tether("failed", "--json").json()["jobs"] == []


def test_purge_dry_run_then_delete(ledger: Ledger, tether) -> None:
    plan = tether("purge", "--completed", "--older-than", "5m", "--dry-run", "--json").json()
    # 8 completed work jobs finished ~400 s ago; the 3 files are the latest of their paths.
    assert plan["dry_run"] is True and plan["by_type"] == [{"status": "completed", "type": "work", "count": 8}]
    r = tether("purge", "--completed", "--older-than", "5m")
    assert r.code == 0 and r.out.startswith("deleted 8 job(s)")
    assert tether("jobs", "--status", "completed", "--json").json()["jobs"].__len__() == 3
    assert tether("purge", "--older-than", "7d").code == 1


# -- errors are one line -------------------------------------------------------------------------


def test_bad_input_is_one_clear_line_and_a_nonzero_exit(ledger: Ledger, tether, tmp_path: Path) -> None:
    cases = {
        ("show", "01NOTAJOB"): "tether: error: no job with id '01NOTAJOB'",
        (
            "recent",
            "--since",
            "an hour",
        ): "tether: error: --since: 'an hour' is not a duration; use a number and a unit, e.g. 90s, 15m, 1h30m, 7d",
        (
            "jobs",
            "--status",
            "done",
        ): "tether: error: --status: 'done' is not a status; use one of pending, claimed, completed, failed, cancelled",
        ("retry",): "tether: error: give job ids or --failed (not both, not neither)",
        (
            "purge",
            "--completed",
            "--older-than",
            "7",
        ): "tether: error: --older-than: '7' is not a duration; use a number and a unit, e.g. 90s, 15m, 1h30m, 7d",
    }
    for args, line in cases.items():
        r = tether(*args)
        assert (r.code, r.err.strip()) == (1, line), args
    missing = tmp_path / "nope" / "tether.db"
    for command in (
        ["failed"],
        ["stuck"],
        ["durations"],
        ["duplicates"],
        ["recent"],
        ["jobs"],
        ["show", "X"],
        ["metrics"],
        ["retry", "X"],
        ["purge", "--completed", "--older-than", "7d"],
        # Write commands too: a typo in --db is refused, never a new ledger (only `tether init` makes one).
        ["enqueue", "create_file", "--payload", '{"path": "a.json", "content": 1}'],
        ["worker", "--until-idle"],
        ["schedules"],
    ):
        r = tether(*command, db_url=f"sqlite:///{missing}")
        assert r.code == 1, command
        assert r.err.strip().splitlines()[-1] == f"tether: error: no ledger at {missing} ({NO_FILE})", command
    assert not missing.parent.exists()


def test_every_json_field_printed_is_documented(ledger: Ledger, tether) -> None:
    doc = (Path(__file__).parent.parent / "docs" / "cli-json.md").read_text()
    outputs = {
        "status": tether("status", "--json").json(),
        "failed": tether("failed", "--json").json(),
        "stuck": tether("stuck", "--json").json(),
        "durations": tether("durations", "--json").json(),
        "duplicates": tether("duplicates", "--json").json(),
        "recent": tether("recent", "--json").json(),
        "jobs": tether("jobs", "--json").json(),
        "show": tether("show", ledger.ids["nightly1"], "--json").json(),
        "purge": tether("purge", "--completed", "--older-than", "1d", "--dry-run", "--json").json(),
        "enqueue": tether("enqueue", "create_file", "--payload", '{"path": "e.json", "content": 1}', "--json").json(),
        "init": tether("init", "--json").json(),
        "history": tether("history", "notes/a.json", "--json").json(),
    }
    for command, data in outputs.items():
        assert f"## `tether {command}" in doc
        fields = set(data)
        for value in data.values():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                fields |= set(value[0])
        undocumented = [f for f in fields if f"`{f}`" not in doc and f'"{f}"' not in doc]
        assert undocumented == [], (command, undocumented)
