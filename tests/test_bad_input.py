"""Bad input gets a clear error naming the problem; nothing is stored and nothing is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tether import Coordinator, CreateFile, DeleteFile, InvalidPayload, UnknownJobType, UnsafePath
from tether.errors import ConfigError


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
    with pytest.raises(UnknownJobType, match="unknown job type 'send_fax'; known types: create_file, delete_file"):
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
    with pytest.raises(InvalidPayload, match="max_attempts: must be an integer >= 1"):
        coordinator.enqueue(CreateFile(path="a", content=1), max_attempts=0)
    with pytest.raises(InvalidPayload, match="priority: must be an integer"):
        coordinator.enqueue(CreateFile(path="a", content=1), priority="high")
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
    proc = run_cli(tmp_path, *args)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "data").exists() or list((tmp_path / "data").iterdir()) == []


def test_cli_jsonl_enqueues_all_lines_in_one_transaction_or_none(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"path": "a.json", "content": 1}\n\n{"path": "b.json", "text": "hi"}\n')
    proc = run_cli(tmp_path, "enqueue", "create_file", "--jsonl", str(good))
    assert proc.returncode == 0 and len(proc.stdout.split()) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"path": "c.json", "content": 1}\n{"path": "/abs", "content": 1}\n')
    proc = run_cli(tmp_path, "enqueue", "create_file", "--jsonl", str(bad))
    assert proc.returncode == 1 and "line 2: path: '/abs' is absolute" in proc.stderr
    proc = run_cli(tmp_path, "worker", "--until-idle", "--quiet")
    assert proc.returncode == 0
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
