"""AWS drift through ``tether reconcile``, against a moto server on loopback (the CLI runs in its
own process, as an operator would run it)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import orjson
import pytest
from moto.server import ThreadedMotoServer

from awskit import DUMMY_ENV, client_hook, dummy_environment
from tether import Coordinator, JobStatus
from tether.jobtypes.aws import OWNER_TAG, SyncAws


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A moto server on a free loopback port; this process's boto3 points at it."""
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


@pytest.fixture
def site(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "data").mkdir()
    return {"db": f"sqlite:///{tmp_path / 'tether.db'}", "root": str(tmp_path / "data")}


def apply(c: Coordinator, *payloads: SyncAws) -> None:
    ids = [c.enqueue(p).id for p in payloads]
    c.run_until_idle()
    for job_id in ids:
        job = c.get(job_id)
        assert job.status is JobStatus.COMPLETED, job.last_error


def cli(site: dict[str, str], endpoint: str, *args: str, credentials: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(DUMMY_ENV if credentials else {"AWS_DEFAULT_REGION": "us-east-1"})
    env["AWS_ENDPOINT_URL"] = endpoint
    env["AWS_CONFIG_FILE"] = env["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent/tether-test-aws"
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # no credentials means none, not a wait on 169.254.169.254
    return subprocess.run(
        [sys.executable, "-m", "tether", "--db", site["db"], "--root", site["root"], "reconcile", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def findings(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    report = orjson.loads(proc.stdout)
    return {f["path"]: f for f in report["findings"]}


def test_hand_made_drift_is_modified_missing_unexpected_and_untracked(endpoint, site):
    with Coordinator.open(site["db"], root=site["root"]) as c:
        apply(
            c,
            SyncAws(resource_type="s3_bucket", resource_id="drift-bucket", config={"tags": {"env": "prod"}}),
            SyncAws(resource_type="sqs_queue", resource_id="drift-queue", config={"attributes": {"DelaySeconds": 5}}),
            SyncAws(resource_type="sqs_queue", resource_id="drift-gone", config={"state": "absent"}),
            SyncAws(resource_type="sqs_queue", resource_id="drift-same", config={"tags": {"a": "1"}}),
            SyncAws(resource_type="sns_topic", resource_id="drift-topic", config={}),
        )
        apply(c, SyncAws(resource_type="sns_topic", resource_id="drift-topic", config={"state": "absent"}))
        owner = c.queue.ledger_id
    assert cli(site, endpoint).returncode == 0, "in sync before anyone touches AWS"

    s3, sqs = boto3.client("s3"), boto3.client("sqs")
    s3.put_bucket_tagging(
        Bucket="drift-bucket", Tagging={"TagSet": [{"Key": "env", "Value": "dev"}, {"Key": OWNER_TAG, "Value": owner}]}
    )
    sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName="drift-queue")["QueueUrl"])
    sqs.create_queue(QueueName="drift-gone")
    boto3.client("sns").create_topic(Name="drift-topic")  # deleted by its latest job, recreated by hand
    s3.create_bucket(Bucket="drift-extra")
    s3.put_bucket_tagging(Bucket="drift-extra", Tagging={"TagSet": [{"Key": OWNER_TAG, "Value": owner}]})

    proc = cli(site, endpoint, "--untracked")
    assert proc.returncode == 2, proc.stderr
    found = findings(proc)
    bucket = found["s3_bucket:us-east-1:drift-bucket"]
    assert bucket["status"] == "modified"
    assert bucket["differences"] == [{"path": "tags.env", "expected": "prod", "actual": "dev", "kind": "NOT_EQUAL"}]
    assert found["sqs_queue:us-east-1:drift-queue"]["status"] == "missing"
    assert found["sqs_queue:us-east-1:drift-gone"]["status"] == "unexpected"
    assert found["sns_topic:us-east-1:drift-topic"]["status"] == "unexpected"
    assert found["s3_bucket:us-east-1:drift-extra"]["status"] == "untracked"
    assert "sqs_queue:us-east-1:drift-same" not in found  # in sync

    blind = cli(site, endpoint, credentials=False)
    assert blind.returncode == 1, blind.stderr
    statuses = {f["status"] for f in findings(blind).values()}
    assert statuses == {"unknown"}, "no credentials is never missing"
    assert "NoCredentialsError" in findings(blind)["sqs_queue:us-east-1:drift-queue"]["detail"]


def test_no_aws_leaves_aws_alone_and_says_so(endpoint, site):
    with Coordinator.open(site["db"], root=site["root"]) as c:
        apply(c, SyncAws(resource_type="sqs_queue", resource_id="left-alone", config={}))
    sqs = boto3.client("sqs")
    sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName="left-alone")["QueueUrl"])
    proc = cli(site, "http://127.0.0.1:9", "--no-aws")  # nothing listens there: never asked
    assert proc.returncode == 0, proc.stderr
    [finding] = findings(proc).values()
    assert finding["status"] == "not_checked" and "--no-aws" in finding["detail"]
