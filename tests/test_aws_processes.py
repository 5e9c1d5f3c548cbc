"""A ``tether worker`` process applies sync_aws jobs against a moto server and is SIGKILLed in
the middle: a second worker finishes; every resource ends as its latest job says, none created
twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from awskit import DUMMY_ENV, client_hook, dummy_environment
from tether import Coordinator, JobStatus
from tether.jobtypes.aws import OWNER_TAG, SyncAws

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
DEADLINE = 240.0


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


def worker(db: str, root: str, endpoint: str, log: Path, stderr: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(DUMMY_ENV)
    env.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_CONFIG_FILE="/nonexistent/tether-test-aws",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent/tether-test-aws",
        TETHER_TEST_AWS_LOG=str(log),
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
    )
    args = ["--db", db, "--root", root, "--import", "aws_counting", "worker", "--threads", "4"]
    args += ["--lock-timeout", "4", "--poll-interval", "0.2"]
    with open(stderr, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-c", "from tether.cli import main; main()", *args], env=env, stderr=err
        )


def plan() -> list[SyncAws]:
    """200 resources of five types; then, for some, a second job that changes or deletes them."""
    out: list[SyncAws] = []
    kinds: list[tuple[str, Callable[[int], str], Callable[[str], dict[str, Any]]]] = [
        ("sqs_queue", lambda n: f"mp-queue-{n}", lambda g: {"attributes": {"DelaySeconds": 1}, "tags": {"gen": g}}),
        ("s3_bucket", lambda n: f"mp-bucket-{n}", lambda g: {"versioning": True, "tags": {"gen": g}}),
        ("sns_topic", lambda n: f"mp-topic-{n}", lambda g: {"tags": {"gen": g}}),
        ("ssm_parameter", lambda n: f"/mp/param-{n}", lambda g: {"value": f"v{g}", "tags": {"gen": g}}),
        ("dynamodb_table", lambda n: f"mp-table-{n}", lambda g: {"hash_key": {"name": "id"}, "tags": {"gen": g}}),
    ]
    for n in range(40):
        for kind, name, config in kinds:
            out.append(SyncAws(resource_type=kind, resource_id=name(n), config=config("1")))
    for n in range(0, 40, 4):
        for kind, name, config in kinds:
            out.append(SyncAws(resource_type=kind, resource_id=name(n), config=config("2")))
            out.append(SyncAws(resource_type=kind, resource_id=name(n + 1), config={"state": "absent"}))
    return out


def latest(payloads: list[SyncAws]) -> dict[tuple[str, str], dict[str, Any]]:
    final: dict[tuple[str, str], dict[str, Any]] = {}
    for p in payloads:
        final[(p.resource_type, p.resource_id)] = dict(p.config)
    return final


def gen_tag(kind: str, rid: str) -> str | None:
    """The resource's ``gen`` tag in AWS, None if it does not exist (and its owner tag is ours)."""
    try:
        if kind == "sqs_queue":
            sqs = boto3.client("sqs")
            tags = sqs.list_queue_tags(QueueUrl=sqs.get_queue_url(QueueName=rid)["QueueUrl"]).get("Tags", {})
        elif kind == "s3_bucket":
            tags = {t["Key"]: t["Value"] for t in boto3.client("s3").get_bucket_tagging(Bucket=rid)["TagSet"]}
        elif kind == "sns_topic":
            arn = f"arn:aws:sns:us-east-1:123456789012:{rid}"
            tags = {t["Key"]: t["Value"] for t in boto3.client("sns").list_tags_for_resource(ResourceArn=arn)["Tags"]}
        elif kind == "ssm_parameter":
            listed = boto3.client("ssm").list_tags_for_resource(ResourceType="Parameter", ResourceId=rid)
            tags = {t["Key"]: t["Value"] for t in listed["TagList"]}
        else:
            ddb = boto3.client("dynamodb")
            arn = ddb.describe_table(TableName=rid)["Table"]["TableArn"]
            tags = {t["Key"]: t["Value"] for t in ddb.list_tags_of_resource(ResourceArn=arn)["Tags"]}
    except Exception as e:
        code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
        if code in (
            "QueueDoesNotExist",
            "AWS.SimpleQueueService.NonExistentQueue",
            "NoSuchBucket",
            "NotFound",
            "ParameterNotFound",
            "ResourceNotFoundException",
            "ResourceNotFound",
            "InvalidResourceId",
        ):
            return None
        raise
    assert OWNER_TAG in tags, f"{kind} {rid} lost tether's ownership tag"
    return tags.get("gen")


def test_a_worker_sigkilled_mid_run_leaves_every_resource_as_its_latest_job_says(endpoint, tmp_path):
    db, root, log = f"sqlite:///{tmp_path / 'tether.db'}", str(tmp_path / "data"), tmp_path / "creates.log"
    payloads = plan()
    with Coordinator.open(db, root=root) as c:
        ids = [r.id for r in c.enqueue_many(payloads)]
    assert len({(p.resource_type, p.resource_id) for p in payloads}) == 200

    first = worker(db, root, endpoint, log, tmp_path / "w1.err")
    deadline = time.monotonic() + DEADLINE
    with Coordinator.open(db, root=root) as c:
        while not log.exists() or log.read_text().count("\n") < 60:
            assert first.poll() is None, (tmp_path / "w1.err").read_text()
            assert c.stats().failed == 0, "a job failed before the kill"
            assert time.monotonic() < deadline, "the first worker made no progress"
            time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    created_before_kill = log.read_text().count("\n")

    second = worker(db, root, endpoint, log, tmp_path / "w2.err")
    try:
        with Coordinator.open(db, root=root) as c:
            while True:
                jobs = [c.get(i) for i in ids]
                failed = [j for j in jobs if j.status is JobStatus.FAILED]
                assert not failed, failed[0].last_error
                if all(j.status is JobStatus.COMPLETED for j in jobs):
                    break
                assert second.poll() is None, (tmp_path / "w2.err").read_text()
                assert time.monotonic() < deadline, (
                    f"{sum(j.status is not JobStatus.COMPLETED for j in jobs)} jobs left"
                )
                time.sleep(0.2)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)

    assert 60 <= created_before_kill < 200, "the kill came in the middle"
    creates = Counter(line.split(" ", 1)[1] for line in log.read_text().splitlines())
    twice = {name: n for name, n in creates.items() if n > 1}
    assert not twice, f"created more than once: {twice}"

    for (kind, rid), config in latest(payloads).items():
        want = None if config.get("state") == "absent" else config["tags"]["gen"]
        assert gen_tag(kind, rid) == want, f"{kind} {rid}"
