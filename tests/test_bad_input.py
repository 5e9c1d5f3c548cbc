"""Bad input gets a clear error naming the problem; nothing is stored and nothing is written."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from clikit import run_split
from tether import (
    Coordinator,
    CreateFile,
    DeleteFile,
    InvalidPayload,
    JobType,
    Payload,
    UnknownJobType,
    UnsafePath,
)
from tether.errors import ConfigError
from tether.jobtypes import default_registry
from tether.ledger import limits
from tether.ledger.limits import DEFAULT_MAX_PAYLOAD_BYTES, MAX_DEPTH
from tether.ledger.record import JobRecord


def count_jobs(c: Coordinator) -> int:
    with c.engine.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM tether_jobs")).scalar_one()


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("../x", "contains '..'"),
        ("/etc/x", "is absolute"),
        ("a/../../x", "contains '..'"),
        ("a/../b", "contains '..'"),
        ("a\x00b", "contains a NUL byte"),
        ("", "is empty"),
        (".", "names the data root itself"),
        (".tether/locks/x", "inside tether's own .tether/"),
        ("a/.b.json.0a1b2c3d.tether-tmp", "reserves for its temp files"),
    ],
)
def test_unsafe_paths_are_refused_at_enqueue(coordinator, root, path, rule):
    before = tree(root)
    for payload in (lambda: CreateFile(path=path, content={"x": 1}), lambda: DeleteFile(path=path)):
        with pytest.raises(UnsafePath) as err:
            coordinator.enqueue(payload())
        assert rule in str(err.value) and "path:" in str(err.value)
    assert count_jobs(coordinator) == 0
    assert tree(root) == before


def test_a_path_through_a_symlink_leading_outside_the_root_is_refused(coordinator, root, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    with pytest.raises(UnsafePath, match="resolves \\(through a symlink\\) outside the data root"):
        coordinator.enqueue(CreateFile(path="escape/x.json", content=1))
    assert count_jobs(coordinator) == 0 and list(outside.iterdir()) == []


def test_a_symlink_that_stays_inside_the_root_is_followed(coordinator, root):
    (root / "real").mkdir()
    (root / "alias").symlink_to(root / "real")
    coordinator.enqueue(CreateFile(path="alias/x.json", content=1))
    coordinator.run_until_idle()
    assert (root / "real" / "x.json").read_bytes() == b"1\n"


def test_paths_are_stored_in_canonical_form(coordinator):
    job = coordinator.enqueue(CreateFile(path="./a//b/c.json", content=1)).job
    assert job.payload_data["path"] == "a/b/c.json" and job.ordering_key == "file:a/b/c.json"


def test_unknown_job_type_names_the_known_ones(coordinator):
    with pytest.raises(
        UnknownJobType,
        match="unknown job type 'send_fax'; known types: adopt, claude_extraction, create_file, delete_file",
    ):
        coordinator.registry.parse("send_fax", {"path": "x"})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"content": 1}, "path: Field required"),
        ({"path": 5, "content": 1}, "path: Input should be a valid string (got int)"),
        ({"path": "a", "content": 1, "overwrite": "maybe"}, "overwrite: Input should be a valid boolean"),
        ({"path": "a"}, "give exactly one of 'content'"),
        ({"path": "a", "content": 1, "text": "t"}, "give exactly one of 'content'"),
        ({"path": "a", "content": 1, "targetPath": "b"}, "targetPath: unknown field (payload fields are snake_case)"),
    ],
)
def test_invalid_payload_names_the_field_and_stores_nothing(coordinator, data, message):
    with pytest.raises(InvalidPayload) as err:
        coordinator.enqueue(coordinator.registry.parse("create_file", data))
    assert message in str(err.value)
    assert count_jobs(coordinator) == 0


def test_invalid_enqueue_options_are_refused(coordinator):
    with pytest.raises(InvalidPayload, match="max_attempts: must be between 1 and 2147483647, got 0"):
        coordinator.enqueue(CreateFile(path="a", content=1), max_attempts=0)
    with pytest.raises(InvalidPayload, match="priority: must be an integer"):
        coordinator.enqueue(CreateFile(path="a", content=1), priority="high")
    # equal to the defaults (0, 3) but not integers: the defaults' shortcut must not let them by
    with pytest.raises(InvalidPayload, match="priority: must be an integer, got bool"):
        coordinator.enqueue(CreateFile(path="a", content=1), priority=False)
    with pytest.raises(InvalidPayload, match="max_attempts: must be an integer, got float"):
        coordinator.enqueue(CreateFile(path="a", content=1), max_attempts=3.0)
    assert count_jobs(coordinator) == 0


def test_one_bad_job_in_a_batch_stores_none_of_them(coordinator):
    with pytest.raises(UnsafePath):
        coordinator.enqueue_many([CreateFile(path="ok.json", content=1), CreateFile(path="../bad", content=1)])
    assert count_jobs(coordinator) == 0


def test_error_messages_never_echo_file_contents(coordinator):
    secret = "s3cr3t-body"
    with pytest.raises(InvalidPayload) as err:
        coordinator.registry.parse("create_file", {"path": "a", "text": secret, "content": {"k": secret}})
    assert secret not in str(err.value)


def test_an_in_memory_or_unsupported_database_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="needs a SQLite file"):
        Coordinator.open("sqlite://", root=tmp_path)
    with pytest.raises(ConfigError, match="unsupported database 'mysql'"):
        Coordinator.open("mysql://localhost/x", root=tmp_path)


def test_the_database_file_and_its_directory_are_created(tmp_path):
    with Coordinator.open(f"sqlite:///{tmp_path / 'new' / 'dir' / 'ledger.db'}", root=tmp_path / "data") as c:
        assert count_jobs(c) == 0
    assert (tmp_path / "new" / "dir" / "ledger.db").is_file()


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TETHER_DB": f"sqlite:///{tmp_path / 'cli.db'}", "TETHER_ROOT": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "-m", "tether", *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "create_file", "--payload", '{"path": "../x", "content": 1}'], "path: '../x' contains '..'"),
        (["enqueue", "create_file", "--payload", '{"path": "a"'], "--payload is not valid JSON"),
        (["enqueue", "create_file", "--payload", '{"content": 1}'], "path: Field required"),
        (["enqueue", "fax", "--payload", "{}"], "unknown job type 'fax'"),
    ],
)
def test_cli_bad_payload_exits_non_zero_with_one_clear_line(tmp_path, args, message):
    assert run_cli(tmp_path, "init").returncode == 0
    proc = run_cli(tmp_path, *args)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "data").exists() or list((tmp_path / "data").iterdir()) == []


def test_cli_jsonl_enqueues_all_lines_in_one_transaction_or_none(tmp_path, monkeypatch, capsys):
    # In this process (clikit.run_split): what is under test is the transaction, not a process start.
    monkeypatch.setenv("TETHER_DB", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("TETHER_ROOT", str(tmp_path / "data"))
    good = tmp_path / "good.jsonl"
    good.write_text('{"path": "a.json", "content": 1}\n\n{"path": "b.json", "text": "hi"}\n')
    assert run_split(monkeypatch, capsys, "init")[0] == 0
    code, out, _ = run_split(monkeypatch, capsys, "enqueue", "create_file", "--jsonl", str(good))
    assert code == 0 and len(out.split()) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"path": "c.json", "content": 1}\n{"path": "/abs", "content": 1}\n')
    code, _, err = run_split(monkeypatch, capsys, "enqueue", "create_file", "--jsonl", str(bad))
    assert code == 1 and "line 2: path: '/abs' is absolute" in err
    assert run_split(monkeypatch, capsys, "worker", "--until-idle", "--quiet")[0] == 0
    assert sorted(p.name for p in (tmp_path / "data").iterdir() if p.name != ".tether") == ["a.json", "b.json"]


def test_cli_usage_errors_exit_2_with_usage_and_no_traceback(tmp_path):
    for args in (["enqueue", "create_file", "--bogus"], ["no-such-command"]):
        proc = run_cli(tmp_path, *args)
        assert proc.returncode == 2 and "Usage:" in proc.stderr and "Traceback" not in proc.stderr


def test_two_spellings_of_one_file_share_one_target(coordinator, root):
    (root / "real").mkdir()
    (root / "alias").symlink_to(root / "real")
    a = coordinator.enqueue(CreateFile(path="real/x.json", content=1)).job
    b = coordinator.enqueue(CreateFile(path="alias/x.json", content=2, overwrite=True)).job
    assert a.ordering_key == b.ordering_key == "file:real/x.json"
    assert [j.id for j in coordinator.queue.claim("w", limit=10)] == [a.id]  # b waits its turn


# -- hostile input (issue 14): one clean line, exit 1, nothing stored ----------------------------


def run_cli_bytes(tmp_path: Path, *args: str | bytes, stdin: bytes | None = None, cwd: Path | None = None):
    """``run_cli`` with arguments that may be bytes (not UTF-8), as a shell passes them."""
    env = {**os.environ, "TETHER_DB": f"sqlite:///{tmp_path / 'cli.db'}", "TETHER_ROOT": str(tmp_path / "data")}
    env.pop("TETHER_IMPORT", None)
    return subprocess.run(
        [sys.executable, "-m", "tether", *args], env=env, input=stdin, capture_output=True, timeout=60, cwd=cwd
    )


def assert_one_clean_line(proc: subprocess.CompletedProcess, message: str) -> None:
    err = proc.stderr.decode() if isinstance(proc.stderr, bytes) else proc.stderr
    lines = err.strip().splitlines()
    assert proc.returncode == 1, err
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err, err


ENQUEUE = ["enqueue", "create_file", "--payload", '{"path": "a.json", "text": "x"}']


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--priority", "99999999999999999999"], "priority: must be between -2147483648 and 2147483647"),
        (["--priority", "-99999999999999999999"], "priority: must be between -2147483648 and 2147483647"),
        (["--max-attempts", "99999999999999999999"], "--max-attempts: must be between 1 and 2147483647"),
        (["--delay", "nan"], "delay: must be a number of seconds >= 0, got nan"),
        (["--delay", "inf"], "delay: inf seconds from now is past the last date a run time can hold"),
        (["--delay", "1e300"], "delay: 1e+300 seconds from now is past the last date"),
        (["--delay", "-1e300"], "delay: must be a number of seconds >= 0"),
        (["--delay", "-5"], "delay: must be a number of seconds >= 0, got -5.0"),
    ],
)
def test_cli_out_of_range_options_are_one_line_and_store_nothing(tmp_path, options, message):
    proc = run_cli_bytes(tmp_path, *ENQUEUE, *options)
    assert_one_clean_line(proc, message)
    assert not (tmp_path / "cli.db").exists()  # refused before any ledger was opened or made


def test_cli_invalid_utf8_in_payload_jsonl_or_stdin_is_one_line(tmp_path):
    bad = b'{"path": "a.json", "text": "\xff"}'
    proc = run_cli_bytes(tmp_path, "enqueue", "create_file", "--payload", bad)
    assert_one_clean_line(proc, "--payload is not valid UTF-8 (byte 0xff at position 28)")
    (tmp_path / "bad.json").write_bytes(bad)
    proc = run_cli_bytes(tmp_path, "enqueue", "create_file", "--payload", f"@{tmp_path / 'bad.json'}")
    assert_one_clean_line(proc, "bad.json is not valid UTF-8 (byte 0xff at position 28)")
    (tmp_path / "bad.jsonl").write_bytes(b'{"path": "ok.json", "text": "x"}\n' + bad + b"\n")
    proc = run_cli_bytes(tmp_path, "enqueue", "create_file", "--jsonl", str(tmp_path / "bad.jsonl"))
    assert_one_clean_line(proc, "bad.jsonl line 2 is not valid UTF-8 (byte 0xff at position 28)")
    proc = run_cli_bytes(tmp_path, "enqueue", "create_file", "--jsonl", "-", stdin=bad + b"\n")
    assert_one_clean_line(proc, "stdin line 1 is not valid UTF-8 (byte 0xff at position 28)")
    proc = run_cli_bytes(tmp_path, "enqueue", "create_file", "--payload", f"@{tmp_path / 'nope.json'}")
    assert_one_clean_line(proc, "nope.json': No such file or directory")
    assert not (tmp_path / "cli.db").exists()


@pytest.mark.parametrize(
    ("module", "source", "message"),
    [
        ("no_such_module_here", None, "--import no_such_module_here: cannot import it: ModuleNotFoundError"),
        ("broken_syntax", "def register(registry:\n", "--import broken_syntax: cannot import it: SyntaxError"),
        ("raises_on_load", "raise RuntimeError('no config')\n", "cannot import it: RuntimeError: no config"),
        (
            "raises_in_register",
            "def register(registry):\n    raise ValueError('bad type table')\n",
            "--import raises_in_register: its register(registry) raised ValueError: bad type table",
        ),
    ],
)
def test_cli_import_failures_are_one_line(tmp_path, module, source, message):
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    proc = run_cli_bytes(tmp_path, "--import", module, "worker", "--until-idle", cwd=tmp_path)
    assert_one_clean_line(proc, message)


def test_cli_import_finds_modules_in_the_working_directory(tmp_path):
    (tmp_path / "my_types.py").write_text(
        "def register(registry):\n"
        "    registry.register(registry.get('create_file'))\n"
        "    open('registered', 'w').close()\n"
    )
    # The console script's sys.path does not hold the working directory; python -m's does.
    script = "import sys; sys.path.pop(0); from tether.cli import main; sys.argv[0] = 'tether'; main()"
    env = {**os.environ, "TETHER_DB": f"sqlite:///{tmp_path / 'cli.db'}", "TETHER_ROOT": str(tmp_path / "data")}
    assert run_cli(tmp_path, "init").returncode == 0
    proc = subprocess.run(
        [sys.executable, "-c", script, "--import", "my_types", "worker", "--until-idle", "--quiet"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "registered").exists()


def test_out_of_range_options_are_refused_by_the_api_too(coordinator):
    payload = CreateFile(path="a", content=1)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"priority": 2**31}, "priority: must be between -2147483648 and 2147483647, got 2147483648"),
        ({"max_attempts": 2**31}, "max_attempts: must be between 1 and 2147483647"),
        ({"delay": float("nan")}, "delay: must be a number of seconds >= 0, got nan"),
        ({"delay": -1}, "delay: must be a number of seconds >= 0, got -1"),
        ({"delay": timedelta(seconds=-1)}, "delay: must be a number of seconds >= 0"),
        ({"delay": 1e300}, "delay: 1e+300 seconds from now is past the last date a run time can hold"),
    ]
    for options, message in cases:
        with pytest.raises(InvalidPayload, match=re.escape(message)):
            coordinator.enqueue(payload, **options)
    coordinator.enqueue(payload, priority=2**31 - 1, max_attempts=2**31 - 1, delay=0)
    coordinator.enqueue(payload, priority=-(2**31), delay=timedelta(days=3650))
    assert count_jobs(coordinator) == 2


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_json_nested_up_to_the_limit_runs_and_deeper_is_refused_naming_the_field(coordinator, root):
    # The payload's own object is one level: content may nest 63 more.
    coordinator.enqueue(CreateFile(path="deep.json", content=nested(MAX_DEPTH - 1)))
    assert coordinator.run_until_idle() == 1
    assert (root / "deep.json").read_bytes().count(b"[") == MAX_DEPTH - 1
    for depth in (MAX_DEPTH, 200, 253):
        with pytest.raises(InvalidPayload, match=f"content: JSON nested more than {MAX_DEPTH} levels deep"):
            coordinator.enqueue(CreateFile(path="deeper.json", content=nested(depth)))
    # Brackets inside strings are text, not nesting.
    coordinator.enqueue(CreateFile(path="text.json", content={"a": "[" * 500, "b": ["{" * 500]}))
    assert count_jobs(coordinator) == 2


def test_payload_size_is_limited_in_one_configurable_place(make_coordinator, monkeypatch):
    default = make_coordinator()
    assert default.queue.enqueuer.builder.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES == 16 * 1024 * 1024
    monkeypatch.setenv("TETHER_MAX_PAYLOAD_BYTES", "1000")
    c = make_coordinator()
    c.enqueue(CreateFile(path="small.json", text="x" * 900))
    with pytest.raises(
        InvalidPayload, match="text: the payload is 1047 bytes of JSON, most of them here; at most 1000"
    ):
        c.enqueue(CreateFile(path="big.json", text="x" * 1000))
    with pytest.raises(InvalidPayload, match="content: the payload is"):
        c.enqueue(CreateFile(path="big.json", content=["x"] * 300))
    assert count_jobs(c) == 1
    monkeypatch.setenv("TETHER_MAX_PAYLOAD_BYTES", "lots")
    with pytest.raises(ConfigError, match="TETHER_MAX_PAYLOAD_BYTES must be a number of bytes, not 'lots'"):
        make_coordinator()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (lambda: CreateFile(path="a.json", text="ok \ud800"), "text: holds a lone surrogate (U+D800)"),
        (lambda: CreateFile(path="a\udfff.json", text="x"), "path: holds a lone surrogate (U+DFFF)"),
        (lambda: CreateFile(path="a.json", content={"k": ["x", "\ud83d"]}), "content.k.1: holds a lone surrogate"),
        (lambda: CreateFile(path="a.json", content={"\udc00": 1}), "content: a key holds a lone surrogate"),
        (lambda: DeleteFile(path="\ud800"), "path: holds a lone surrogate (U+D800)"),
    ],
)
def test_strings_that_are_not_unicode_are_invalid_payloads_naming_the_field(coordinator, root, payload, message):
    with pytest.raises(InvalidPayload, match=re.escape(message)):
        coordinator.enqueue(payload())
    with pytest.raises(InvalidPayload, match=re.escape(message)):
        coordinator.enqueue_many([CreateFile(path="fine.json", text="x"), payload()])
    assert count_jobs(coordinator) == 0 and tree(root) == []


def _walk_depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_walk_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_walk_depth(v) for v in value), default=0)
    return 0


_TRICKY = st.text(alphabet='[]{}"\\ab\n', max_size=6)


@settings(max_examples=400, deadline=None)
@given(
    st.recursive(
        st.none() | st.integers(-1000, 1000) | _TRICKY,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY, inner, max_size=3),
        max_leaves=120,
    ),
    st.integers(min_value=0, max_value=80),
)
def test_the_depth_check_counts_nesting_exactly_whatever_the_strings_hold(value, extra):
    value = {"v": value}
    for _ in range(extra):
        value = [value] if extra % 2 else {"k": value}
    text = orjson.dumps(value)
    assert limits._depth(text) == min(_walk_depth(value), MAX_DEPTH + 1)


class Blob(Payload):
    """A type without hooks: nothing but its encoder runs when it is built."""

    job_type: ClassVar[str] = "blob"
    data: Any


class BlobType(JobType[Blob]):
    name = "blob"
    payload_model = Blob

    def run(self, payload: Blob, ctx: Any) -> None:
        return None


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "data",
    [
        "x" * 2000,  # over max_payload_bytes (1000 here)
        _deep(MAX_DEPTH + 1),  # nested too deep
        "\ud800",  # a lone surrogate: no JSON can hold it
    ],
    ids=["too-big", "too-deep", "unencodable"],
)
def test_the_single_enqueue_refuses_what_enqueue_many_refuses_with_the_same_problems(db_url, tmp_path, data):
    registry = default_registry()
    registry.register(BlobType())
    with Coordinator.open(db_url, root=tmp_path / "data", registry=registry, max_payload_bytes=1000) as c:
        c.enqueue(Blob(data="fine"))  # the type's hooks are looked up: later enqueues take the short path
        with pytest.raises(InvalidPayload) as alone:
            c.enqueue(Blob(data=data))
        with pytest.raises(InvalidPayload) as many:
            c.enqueue_many([Blob(data=data)])
        assert alone.value.problems == many.value.problems and alone.value.job_type == "blob"
        assert count_jobs(c) == 1


def apart_from_id_and_times(job: JobRecord) -> dict[str, Any]:
    return {k: v for k, v in job._asdict().items() if k not in ("id", "created_at", "run_at")}


def test_the_single_enqueue_stores_the_row_enqueue_many_stores_and_logs_it(db_url, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tether.events")
    registry = default_registry()
    registry.register(BlobType())
    with Coordinator.open(db_url, root=tmp_path / "data", registry=registry) as c:
        first = c.enqueue(Blob(data={"a": [1, 2]}))
        alone = c.enqueue(Blob(data={"a": [1, 2]}))
        [many] = c.enqueue_many([Blob(data={"a": [1, 2]})])
        assert not alone.duplicate and first.job.id < alone.job.id < many.job.id
        assert apart_from_id_and_times(alone.job) == apart_from_id_and_times(many.job)
        stored = c.get(alone.job.id)
        assert apart_from_id_and_times(stored) == apart_from_id_and_times(alone.job)
        assert stored.created_at == alone.job.created_at == stored.run_at
    queued = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "tether.events"]
    assert [e["job_id"] for e in queued if e["event"] == "queued"] == [first.job.id, alone.job.id, many.job.id]
