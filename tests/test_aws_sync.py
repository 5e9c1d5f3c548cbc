"""sync_aws against moto in-process: each resource type's lifecycle, idempotency, ownership, faults."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from awskit import Calls, Faults, client_hook, dummy_environment
from tether import Coordinator, CreateFile, InvalidPayload, JobStatus, RetryPolicy
from tether.jobtypes.aws import OWNER_TAG, SyncAws
from tether.reconcile import check
from tether.reconcile.check import reconcile


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """moto in-process with dummy credentials; every call tether's clients make is counted."""
    dummy_environment(monkeypatch)
    import botocore.retries.standard as standard

    # botocore's standard-mode backoff sleeps up to seconds between retries: not in tests.
    monkeypatch.setattr(standard.ExponentialBackoff, "delay_amount", lambda self, context: 0.0)
    calls = Calls()
    with mock_aws(), client_hook(calls.hook):
        yield calls


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Coordinator]:
    coordinator = Coordinator.open(f"sqlite:///{tmp_path / 'tether.db'}", root=tmp_path / "data")
    yield coordinator
    coordinator.close()


def run(c: Coordinator, payload: SyncAws, **options: Any) -> Any:
    job_id = c.enqueue(payload, **options).id
    c.run_until_idle(retry=RetryPolicy(base=0.0))
    return c.get(job_id)


@dataclass
class Case:
    """One resource type: a config, a change to one field, and how to read that field from AWS."""

    resource_type: str
    resource_id: str
    config: dict[str, Any]
    changed: dict[str, Any]
    exists: Callable[[], bool]
    field_value: Callable[[], Any]
    expected_change: Any
    create_outside: Callable[[], Any]


def _bucket_exists(name: str) -> bool:
    return any(b["Name"] == name for b in boto3.client("s3").list_buckets()["Buckets"])


def _bucket_tags(name: str) -> dict[str, str]:
    tags = boto3.client("s3").get_bucket_tagging(Bucket=name)["TagSet"]
    return {t["Key"]: t["Value"] for t in tags}


def _queue_exists(name: str) -> bool:
    return any(u.endswith(f"/{name}") for u in boto3.client("sqs").list_queues().get("QueueUrls", []))


def _queue_attr(name: str, attr: str) -> str:
    sqs = boto3.client("sqs")
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    return str(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[attr])["Attributes"][attr])


def _topic_arn(name: str) -> str:
    return f"arn:aws:sns:us-east-1:123456789012:{name}"


def _topic_exists(name: str) -> bool:
    return any(t["TopicArn"] == _topic_arn(name) for t in boto3.client("sns").list_topics()["Topics"])


def _table_tags(name: str) -> dict[str, str]:
    ddb = boto3.client("dynamodb")
    arn = ddb.describe_table(TableName=name)["Table"]["TableArn"]
    return {t["Key"]: t["Value"] for t in ddb.list_tags_of_resource(ResourceArn=arn)["Tags"]}


def _table_exists(name: str) -> bool:
    return name in boto3.client("dynamodb").list_tables()["TableNames"]


def _object(bucket: str, key: str) -> Any:
    try:
        return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except boto3.client("s3").exceptions.NoSuchKey:
        return None


def _param(name: str) -> str | None:
    try:
        return str(boto3.client("ssm").get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"])
    except boto3.client("ssm").exceptions.ParameterNotFound:
        return None


CASES = [
    Case(
        "s3_bucket",
        "tether-logs",
        {
            "versioning": True,
            "tags": {"env": "prod", "team": "data"},
            "lifecycle_rules": [{"id": "expire-tmp", "prefix": "tmp/", "expiration_days": 7}],
            "public_access_block": {},
        },
        {"tags": {"env": "staging", "team": "data"}},
        lambda: _bucket_exists("tether-logs"),
        lambda: _bucket_tags("tether-logs").get("env"),
        "staging",
        lambda: boto3.client("s3").create_bucket(Bucket="tether-logs"),
    ),
    Case(
        "sqs_queue",
        "orders",
        {"attributes": {"VisibilityTimeout": 45, "DelaySeconds": 0}, "tags": {"env": "prod"}},
        {"attributes": {"VisibilityTimeout": 90, "DelaySeconds": 0}},
        lambda: _queue_exists("orders"),
        lambda: _queue_attr("orders", "VisibilityTimeout"),
        "90",
        lambda: boto3.client("sqs").create_queue(QueueName="orders", tags={"env": "theirs"}),
    ),
    Case(
        "sns_topic",
        "events",
        {"attributes": {"DisplayName": "Events"}, "tags": {"env": "prod"}, "subscriptions": ["events-inbox"]},
        {"attributes": {"DisplayName": "All events"}},
        lambda: _topic_exists("events"),
        lambda: boto3.client("sns").get_topic_attributes(TopicArn=_topic_arn("events"))["Attributes"]["DisplayName"],
        "All events",
        lambda: boto3.client("sns").create_topic(Name="events"),
    ),
    Case(
        "dynamodb_table",
        "sessions",
        {
            "hash_key": {"name": "id"},
            "billing_mode": "PAY_PER_REQUEST",
            "tags": {"env": "prod"},
            "ttl": {"attribute": "expires"},
        },
        {"tags": {"env": "staging"}},
        lambda: _table_exists("sessions"),
        lambda: _table_tags("sessions").get("env"),
        "staging",
        lambda: boto3.client("dynamodb").create_table(
            TableName="sessions",
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        ),
    ),
    Case(
        "ssm_parameter",
        "/app/db-host",
        {"value": "db.internal", "type": "String", "description": "database host", "tags": {"env": "prod"}},
        {"value": "db2.internal"},
        lambda: _param("/app/db-host") is not None,
        lambda: _param("/app/db-host"),
        "db2.internal",
        lambda: boto3.client("ssm").put_parameter(Name="/app/db-host", Value="theirs", Type="String"),
    ),
    Case(
        "s3_object",
        "tether-objs/reports/a.json",
        {"content": {"n": 1}, "metadata": {"kind": "report"}, "tags": {"env": "prod"}},
        {"content": {"n": 2}},
        lambda: _object("tether-objs", "reports/a.json") is not None,
        lambda: _object("tether-objs", "reports/a.json"),
        b'{\n  "n": 2\n}\n',
        lambda: boto3.client("s3").put_object(Bucket="tether-objs", Key="reports/a.json", Body=b"theirs"),
    ),
]

# What must exist first (a queue a topic subscribes, a bucket an object lives in): tether-managed.
NEEDS = {
    "sns_topic": SyncAws(resource_type="sqs_queue", resource_id="events-inbox"),
    "s3_object": SyncAws(resource_type="s3_bucket", resource_id="tether-objs"),
}


def cases() -> Any:
    return pytest.mark.parametrize("case", CASES, ids=[k.resource_type for k in CASES])


def sync(case: Case, config: dict[str, Any] | None = None) -> SyncAws:
    return SyncAws(resource_type=case.resource_type, resource_id=case.resource_id, config=config or case.config)


@cases()
def test_create_then_rerun_then_update_then_delete_twice(case, aws, c):
    if case.resource_type in NEEDS:
        assert run(c, NEEDS[case.resource_type]).status is JobStatus.COMPLETED
    job = run(c, sync(case))
    assert job.status is JobStatus.COMPLETED, job.last_error
    assert case.exists()
    assert aws.mutating(), "creating makes mutating calls"

    aws.clear()
    again = run(c, sync(case))
    assert again.status is JobStatus.COMPLETED, again.last_error
    assert aws.mutating() == [], f"a re-run changed AWS: {aws.mutating()}"
    assert aws.ops, "the re-run did read AWS"

    aws.clear()
    updated = run(c, sync(case, {**case.config, **case.changed}))
    assert updated.status is JobStatus.COMPLETED, updated.last_error
    assert case.field_value() == case.expected_change
    assert len(aws.mutating()) == 1, f"one field changed, one call: {aws.mutating()}"

    deleted = run(c, sync(case, {"state": "absent"}))
    assert deleted.status is JobStatus.COMPLETED, deleted.last_error
    assert not case.exists()

    aws.clear()
    gone = run(c, sync(case, {"state": "absent"}))
    assert gone.status is JobStatus.COMPLETED
    assert aws.mutating() == []
    assert '"changed":false' in gone.result


@cases()
def test_a_resource_created_outside_tether_is_not_ours_and_is_left_alone(case, aws, c):
    if case.resource_type in NEEDS:
        assert run(c, NEEDS[case.resource_type]).status is JobStatus.COMPLETED
    case.create_outside()
    aws.clear()
    job = run(c, sync(case))
    assert job.status is JobStatus.FAILED and job.attempts == 1
    assert "exists and is not ours" in job.last_error
    assert aws.mutating() == [], "nothing was changed"


def test_the_created_resource_carries_the_ledgers_ownership_tag(aws, c):
    run(c, sync(CASES[0]))
    assert _bucket_tags("tether-logs")[OWNER_TAG] == c.queue.ledger_id


def test_the_result_records_identity_never_config_values(aws, c):
    config = {"attributes": {"VisibilityTimeout": 777}, "tags": {"secretish": "zebra-7731"}}
    job = run(c, sync(CASES[1], config))
    assert '"url":' in job.result and "/orders" in job.result
    assert "zebra-7731" not in job.result and "777" not in job.result and "secretish" not in job.result


# -- validation at enqueue --------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload, problem",
    [
        ({"resource_type": "ec2_instance", "resource_id": "x"}, "resource_type: unknown 'ec2_instance'"),
        (
            {"resource_type": "s3_bucket", "resource_id": "ok-name", "config": {"versionning": True}},
            "config.versionning",
        ),
        ({"resource_type": "s3_bucket", "resource_id": "Bad_Name"}, "resource_id"),
        ({"resource_type": "sqs_queue", "resource_id": "q", "config": {"attributes": {"Visibility": 1}}}, "Visibility"),
        ({"resource_type": "s3_bucket", "resource_id": "ok-name", "config": {"tags": {"tether:x": "1"}}}, "tether"),
        ({"resource_type": "s3_bucket", "resource_id": "ok-name", "config": {"state": "gone"}}, "config.state"),
    ],
)
def test_a_payload_the_resource_type_refuses_is_invalid_and_nothing_is_stored(aws, c, payload, problem):
    with pytest.raises(InvalidPayload, match=problem.replace("(", r"\(")):
        c.enqueue(c.registry.parse("sync_aws", payload))
    assert c.stats().outstanding == 0


def test_two_syncs_of_one_resource_share_one_ordering_key(aws, c):
    one = c.enqueue(SyncAws(resource_type="sqs_queue", resource_id="q1", config={}, region="eu-west-1"))
    two = c.enqueue(SyncAws(resource_type="sqs_queue", resource_id="q1", config={"state": "absent"}))
    assert c.get(one.id).ordering_key == "aws:sqs_queue:eu-west-1:q1"
    assert c.get(two.id).ordering_key == "aws:sqs_queue:us-east-1:q1"  # the default region, resolved at enqueue


def test_without_boto3_enqueueing_says_how_to_install_it(aws, c, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_boto3(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "boto3" or name.startswith("boto3."):
            raise ImportError("No module named 'boto3'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_boto3)
    with pytest.raises(Exception, match=r"pip install 'tether\[aws\]'"):
        c.enqueue(SyncAws(resource_type="sqs_queue", resource_id="q1", config={}))
    monkeypatch.undo()
    assert c.stats().outstanding == 0


# -- faults -----------------------------------------------------------------------------------


def test_throttling_n_minus_one_times_then_success_completes_after_exactly_n_calls(aws, c):
    faults = Faults("CreateQueue", "Throttling", 400, times=2)
    with client_hook(faults.hook), client_hook(aws.hook):
        job = run(c, sync(CASES[1]))
    assert job.status is JobStatus.COMPLETED, job.last_error
    assert faults.sent == 3
    assert job.attempts == 1  # botocore's standard retries absorbed it


def test_persistent_throttling_is_retried_then_failed_never_completed(aws, c):
    faults = Faults("CreateQueue", "ThrottlingException", 400, times=None)
    with client_hook(faults.hook):
        job = run(c, sync(CASES[1]), max_attempts=3)
    assert job.status is JobStatus.FAILED and job.attempts == 3
    assert faults.sent == 9  # 3 botocore tries in each of 3 tether attempts
    assert "ThrottlingException" in job.last_error and "request id" in job.last_error
    assert not _queue_exists("orders")


def test_access_denied_fails_on_the_first_attempt_with_code_and_request_id(aws, c):
    faults = Faults("CreateBucket", "AccessDenied", 403, times=None)
    with client_hook(faults.hook):
        job = run(c, sync(CASES[0]), max_attempts=5)
    assert job.status is JobStatus.FAILED and job.attempts == 1 and faults.sent == 1
    assert "AccessDenied" in job.last_error and "req-AccessDenied" in job.last_error


def test_no_credentials_fails_at_once(aws, c, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    with client_hook(lambda client: None):
        job = run(c, sync(CASES[1]), max_attempts=5)
    assert job.status is JobStatus.FAILED and job.attempts == 1
    assert "NoCredentialsError" in job.last_error


def test_an_endpoint_that_refuses_connections_is_retried(aws, c, monkeypatch):
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    with _no_moto(), client_hook(lambda client: None):
        job = run(c, sync(CASES[1]), max_attempts=2)
    assert job.status is JobStatus.FAILED and job.attempts == 2, "retried, then failed"
    assert "EndpointConnectionError" in job.last_error and "RetryableError" in job.last_error


class _no_moto:
    """moto answers in-process whatever the endpoint: step outside it so the connection is real."""

    def __enter__(self) -> None:
        from moto.core.models import botocore_stubber

        self.stubber, self.enabled = botocore_stubber, botocore_stubber.enabled
        botocore_stubber.enabled = False

    def __exit__(self, *_: object) -> None:
        self.stubber.enabled = self.enabled


# -- the data-model layer ----------------------------------------------------------------------


def test_a_model_and_its_bucket_and_queue_are_recorded_in_one_transaction(aws, c):
    from sqlalchemy.orm import Session

    from tether import JsonStore

    store = JsonStore(c, retry=RetryPolicy(base=0.0))
    with Session(c.engine) as session:
        store.save("projects/apollo.json", {"name": "apollo"}, session=session)
        store.sync_aws("s3_bucket", "apollo-assets", {"tags": {"project": "apollo"}}, session=session)
        store.sync_aws("sqs_queue", "apollo-jobs", {"attributes": {"VisibilityTimeout": 60}}, session=session)
        session.rollback()  # the application changed its mind: no job exists
    assert c.stats().outstanding == 0

    with Session(c.engine) as session:
        store.save("projects/apollo.json", {"name": "apollo"}, session=session)
        store.sync_aws("s3_bucket", "apollo-assets", {"tags": {"project": "apollo"}}, session=session)
        store.sync_aws("sqs_queue", "apollo-jobs", {"attributes": {"VisibilityTimeout": 60}}, session=session)
        session.commit()
    assert c.stats().outstanding == 3
    store.flush()
    assert store.load_json("projects/apollo.json") == {"name": "apollo"}
    assert _bucket_tags("apollo-assets")["project"] == "apollo"
    assert _queue_attr("apollo-jobs", "VisibilityTimeout") == "60"


def test_store_refuses_a_bad_config_before_anything_is_enqueued(aws, c):
    from tether import JsonStore

    with pytest.raises(InvalidPayload, match="config.versioning"):
        JsonStore(c).sync_aws("s3_bucket", "ok-bucket", {"versioning": "sometimes"})
    assert c.stats().outstanding == 0


def test_a_check_runs_the_garbage_collector_while_it_asks_aws_and_pauses_it_for_files(aws, c, monkeypatch):
    """An AWS client leaves reference cycles behind each call: a long check of AWS targets must
    not pile them up while the collector is paused for the file checks."""
    run(c, SyncAws(resource_type="sqs_queue", resource_id="q1", config={}))
    c.enqueue(CreateFile(path="a.json", content=1))
    c.run_until_idle()
    collecting: dict[str, bool] = {}
    real = check._Reconciler._check_with

    def spy(self: check._Reconciler, probe: Any, job_type: str, *rest: Any) -> None:
        collecting[job_type] = gc.isenabled()
        real(self, probe, job_type, *rest)

    monkeypatch.setattr(check._Reconciler, "_check_with", spy)
    assert reconcile(c).counts["in_sync"] == 2
    assert collecting == {"sync_aws": True, "create_file": False}
    assert gc.isenabled()
