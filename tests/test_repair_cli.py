"""Acting on drift through the CLI on each backend, against a moto server:
``reconcile --plan`` proposes exactly the jobs that restore what was changed by hand, ``repair
apply`` enqueues them (never a stale plan), a worker carries them out and ``reconcile`` then exits
0; ``drift accept`` makes a hand edit the expected state; ignore rules list findings as ignored
without changing the exit code; ``drift`` shows the last run without reading the disk.

The commands run in this process through the console entry point (``clikit.run_split``): what is
under test is what they plan, apply and accept, not how a process starts (each start costs a
second or more, mostly imports). The ledger they act on is made ready, drained and counted
through the library."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import sqlalchemy as sa
from moto.server import ThreadedMotoServer

from awskit import client_hook, dummy_environment
from clikit import run_split
from tether import Coordinator, CreateFile, DeleteFile
from tether.jobtypes.aws import SyncAws

pytestmark = pytest.mark.slow

FILES = 50


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    dummy_environment(monkeypatch, endpoint=url)
    try:
        with client_hook(lambda client: None):
            yield url
    finally:
        server.stop()


class Cli:
    """``tether --db DB --root ROOT ...`` through the console entry point, talking to the moto server
    (the ``endpoint`` fixture points this process's AWS settings at it)."""

    def __init__(
        self, db: str, root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        self.db, self.root = db, root
        self.monkeypatch, self.capsys = monkeypatch, capsys
        # The moto servers of one test process share their resources: each test names its own.
        suffix = secrets.token_hex(3)
        self.bucket, self.queue, self.topic = (
            f"repair-bucket-{suffix}",
            f"repair-queue-{suffix}",
            f"repair-topic-{suffix}",
        )

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = ["--db", self.db, "--root", str(self.root), *args]
        code, out, err = run_split(self.monkeypatch, self.capsys, *argv)
        return subprocess.CompletedProcess(["tether", *argv], code, out, err)

    def json(self, *args: str) -> tuple[int, Any]:
        done = self(*args, "--json")
        assert done.stdout, done.stderr
        return done.returncode, json.loads(done.stdout)

    def ledger(self) -> Coordinator:
        """The ledger these commands act on, opened in this process."""
        return Coordinator.open(self.db, root=self.root)

    def drain(self) -> None:
        """A worker in this process runs every ready job (the AWS ones against the moto server)."""
        with self.ledger() as c:
            c.run_until_idle()

    def jobs(self) -> int:
        with self.ledger() as c, c.engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM tether_jobs")).scalar_one())


def aws_jobs(cli: Cli) -> list[dict[str, Any]]:
    return [
        {"resource_type": "s3_bucket", "resource_id": cli.bucket, "config": {"tags": {"gen": "1"}}},
        {"resource_type": "sqs_queue", "resource_id": cli.queue, "config": {"tags": {"gen": "1"}}},
        {"resource_type": "sns_topic", "resource_id": cli.topic, "config": {"tags": {"gen": "1"}}},
    ]


def set_ready(cli: Cli) -> None:
    """50 files and 3 AWS resources made by jobs; one more file deleted by a job."""
    with cli.ledger() as c:
        c.enqueue_many([CreateFile(path=f"people/{n:02}.json", content={"n": n}) for n in range(FILES)])
        c.enqueue_many([SyncAws(**p) for p in aws_jobs(cli)])
        c.run_until_idle()
        c.enqueue(DeleteFile(path="people/49.json"))
        c.run_until_idle()
        assert c.startup_check().exit_code == 0


def set_tag(bucket: str, key: str, value: str) -> None:
    """One tag set by hand, the others (tether's ownership tag among them) kept, as a console does."""
    s3 = boto3.client("s3")
    tags = {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=bucket)["TagSet"]}
    tags[key] = value
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]})


def change_by_hand(cli: Cli) -> dict[str, tuple[str, str]]:
    """Hand changes, and per target the (finding, job) a plan must answer with."""
    expected: dict[str, tuple[str, str]] = {}
    root = cli.root
    for n in range(5):
        (root / f"people/{n:02}.json").unlink()
        expected[f"people/{n:02}.json"] = ("missing", "create_file")
    for n in range(5, 10):
        (root / f"people/{n:02}.json").write_text('{"edited": true}')
        expected[f"people/{n:02}.json"] = ("modified", "create_file")
    (root / "people/49.json").write_text("{}")  # deleted by its job, made again by hand
    expected["people/49.json"] = ("unexpected", "delete_file")
    set_tag(cli.bucket, "gen", "hand")
    sqs = boto3.client("sqs")
    sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=cli.queue)["QueueUrl"])
    expected[f"s3_bucket:us-east-1:{cli.bucket}"] = ("modified", "sync_aws")
    expected[f"sqs_queue:us-east-1:{cli.queue}"] = ("missing", "sync_aws")
    return expected


@pytest.fixture
def cli(
    db_url: str, tmp_path: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Cli:
    """The command line on this test's ledger and data root, against the moto server at ``endpoint``."""
    root = tmp_path / "data"
    root.mkdir(exist_ok=True)
    cli = Cli(db_url, root, monkeypatch, capsys)
    assert cli("init").returncode == 0  # the command line creates a ledger only when asked
    return cli


def test_plan_lists_exactly_the_changed_targets_and_apply_restores_them(cli: Cli, tmp_path: Path) -> None:
    set_ready(cli)
    expected = change_by_hand(cli)
    plan_file = tmp_path / "plan.json"
    code, plan = cli.json("reconcile", "-q", "--plan", "--out", str(plan_file))
    assert code == 2
    assert {s["path"]: (s["finding"], s["job_type"]) for s in plan["steps"]} == expected
    assert all(s["repair_of"] for s in plan["steps"])
    table = cli("reconcile", "-q", "--plan")
    assert "people/49.json" in table.stdout and "delete_file again" in table.stdout
    before = cli.jobs()
    applied = cli("repair", "apply", str(plan_file))
    assert applied.returncode == 0, applied.stderr
    assert cli.jobs() == before + len(expected)
    cli.drain()
    final = cli("reconcile", "-q")
    assert final.returncode == 0, final.stdout


def test_a_plan_made_stale_by_a_new_job_is_refused_naming_its_target(cli: Cli, tmp_path: Path) -> None:
    set_ready(cli)
    change_by_hand(cli)
    plan_file = tmp_path / "plan.json"
    assert cli("reconcile", "-q", "--plan", "--out", str(plan_file)).returncode == 2
    payload = json.dumps({"path": "people/07.json", "content": {"n": 7}, "overwrite": True})
    assert cli("enqueue", "create_file", "-q", "-p", payload).returncode == 0
    before = cli.jobs()
    refused = cli("repair", "apply", str(plan_file))
    assert refused.returncode == 1
    assert "stale" in refused.stderr and "people/07.json" in refused.stderr
    assert "people/01.json" not in refused.stderr  # only the target that moved is named
    assert cli.jobs() == before  # nothing enqueued


def test_accepted_hand_edit_and_ignored_findings_leave_the_check_in_sync(cli: Cli) -> None:
    payload = json.dumps({"path": "tmp/scratch.json", "content": {"a": 1}})
    assert cli("enqueue", "create_file", "-q", "-p", payload).returncode == 0
    set_ready(cli)
    (cli.root / "people/20.json").write_text('{"fixed": "by hand"}')
    accepted = cli("drift", "accept", "people/20.json", "--reason", "fixed during the outage")
    assert accepted.returncode == 0, accepted.stderr
    assert cli("reconcile", "-q").returncode == 0
    (cli.root / "tmp/scratch.json").write_text("{}")
    set_tag(cli.bucket, "LastModifiedBy", "ops")
    assert cli("reconcile", "-q").returncode == 2  # drift, before any rule
    rules = "# the operator's\ntmp/*.json\naws:s3_bucket:*:tags.LastModifiedBy\n"
    (cli.root / ".tether" / "drift-ignore").write_text(rules)
    code, report = cli.json("reconcile", "-q")
    assert code == 0
    assert {(f["path"], f["rule"]) for f in report["ignored_findings"]} == {
        ("tmp/scratch.json", "tmp/*.json"),
        (f"s3_bucket:us-east-1:{cli.bucket}", "aws:s3_bucket:*:tags.LastModifiedBy"),
    }
    code, last = cli.json("drift")
    assert code == 0 and last["exit_code"] == 0 and len(last["ignored"]) == 2
    code, seen = cli.json("drift", "--target", "tmp/scratch.json")
    assert seen["drifted_runs"] == 2  # the run before the rule and the one it ignored
    # AWS: a tag changed and a queue deleted by hand, accepted as they are
    set_tag(cli.bucket, "gen", "hand")
    sqs = boto3.client("sqs")
    sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=cli.queue)["QueueUrl"])
    assert cli("reconcile", "-q").returncode == 2
    bucket, queue = f"s3_bucket:us-east-1:{cli.bucket}", f"sqs_queue:us-east-1:{cli.queue}"
    code, accepted_aws = cli.json("drift", "accept", bucket, queue, "--reason", "changed in the console")
    assert code == 0
    configs = [j["payload"]["aws"]["config"] for j in accepted_aws["accepted"]]
    assert configs[0]["tags"] == {"gen": "hand", "LastModifiedBy": "ops"} and configs[1] == {"state": "absent"}
    assert cli("reconcile", "-q").returncode == 0
