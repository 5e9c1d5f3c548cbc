"""The AWS resource types' own rules, without AWS: which names each accepts, which ARNs the tagging
API lists as each type's, and that the skeleton every type shares lives in the base class only."""

from __future__ import annotations

import re

import pytest

from tether.jobtypes.aws import RESOURCES
from tether.jobtypes.aws.clients import Aws
from tether.jobtypes.aws.resource import Current, IdRule, ResourceConfig, ResourceType, Wanted

NAMES = [
    ("s3_bucket", "tether-logs", True),
    ("s3_bucket", "a.b-c", True),
    ("s3_bucket", "Bad_Name", False),
    ("s3_bucket", "two..dots", False),
    ("s3_bucket", "ab", False),
    ("s3_bucket", "-starts-with-dash", False),
    ("sqs_queue", "orders", True),
    ("sqs_queue", "orders.fifo", True),
    ("sqs_queue", "x" * 76, False),
    ("sqs_queue", "has space", False),
    ("sns_topic", "events", True),
    ("sns_topic", "events.fifo", True),
    ("sns_topic", "dot.ted", False),
    ("dynamodb_table", "sessions.v2", True),
    ("dynamodb_table", "ab", False),
    ("ssm_parameter", "/app/db-host", True),
    ("ssm_parameter", "db-host", True),
    ("ssm_parameter", "/awsome", False),
    ("ssm_parameter", "AWS-thing", False),
    ("ssm_parameter", "ssm", False),
    ("ssm_parameter", "/SSM/x", False),
    ("ssm_parameter", "a b", False),
    ("s3_object", "bucket/key", True),
    ("s3_object", "bucket/dir/key.json", True),
    ("s3_object", "bucket/", False),
    ("s3_object", "/key", False),
    ("s3_object", "bucket", False),
    ("s3_object", "Bad Bucket/key", False),
    ("s3_object", "bad\nbucket/key", False),
    ("s3_object", "logs/a..b/with\nnewline", True),
]


@pytest.mark.parametrize("kind, resource_id, accepted", NAMES, ids=[f"{k}:{r[:20]}" for k, r, _ in NAMES])
def test_each_type_accepts_only_names_aws_allows_and_says_its_rule(kind, resource_id, accepted):
    problem = RESOURCES[kind].check_id(resource_id)
    if accepted:
        assert problem is None
    else:
        assert problem is not None and problem.startswith(("a ", "an "))


# An S3 key may hold any character, a newline too; every other name rule ends at a letter or digit.
NAMED_WITH_A_NEWLINE = [(k, r + "\n") for k, r, accepted in NAMES if accepted and k != "s3_object"]


@pytest.mark.parametrize("kind, resource_id", NAMED_WITH_A_NEWLINE, ids=[k for k, _ in NAMED_WITH_A_NEWLINE])
def test_a_name_ending_in_a_newline_is_refused(kind, resource_id):
    assert RESOURCES[kind].check_id(resource_id) == RESOURCES[kind].id_rule.words


ARNS = [
    ("arn:aws:sns:us-east-1:123456789012:events", "sns_topic", "events"),
    ("arn:aws:sns:us-east-1:123456789012:events:6b0e71bd-7e97-4d97-80ce-4a0994e55286", None, None),
    ("arn:aws:sqs:eu-west-1:123456789012:orders.fifo", "sqs_queue", "orders.fifo"),
    ("arn:aws:dynamodb:us-east-1:123456789012:table/sessions", "dynamodb_table", "sessions"),
    ("arn:aws:dynamodb:us-east-1:123456789012:table/sessions/index/by-user", None, None),
    ("arn:aws:ssm:us-east-1:123456789012:parameter/db-host", "ssm_parameter", "db-host"),
    ("arn:aws:ssm:us-east-1:123456789012:parameter/app/db-host", "ssm_parameter", "/app/db-host"),
    ("arn:aws:s3:::tether-logs", "s3_bucket", "tether-logs"),
    ("arn:aws:s3:::tether-logs/reports/a.json", None, None),
    ("arn:aws:ec2:us-east-1:123456789012:instance/i-0abc", None, None),
]


@pytest.mark.parametrize("arn, kind, resource_id", ARNS, ids=[a.split(":", 2)[2] for a, _, _ in ARNS])
def test_a_listed_arn_is_one_types_resource_or_none(arn, kind, resource_id):
    claimed = {name: rid for name, t in RESOURCES.items() if (rid := t.untracked_id(arn)) is not None}
    assert claimed == ({} if kind is None else {kind: resource_id})


def _md5(body: bytes) -> str:
    import hashlib

    return hashlib.md5(body, usedforsecurity=False).hexdigest()


DESIRED = [
    (
        "sns_topic",
        {"attributes": {"DisplayName": "E", "Policy": '{"a": 1}'}, "tags": {"b": "2"}, "subscriptions": ["q2", "q1"]},
        {"attributes": {"DisplayName": "E", "Policy": {"a": 1}}, "tags": {"b": "2"}, "subscriptions": ["q1", "q2"]},
    ),
    (
        "sqs_queue",
        {
            "attributes": {"VisibilityTimeout": 45, "FifoQueue": True},
            "dead_letter": {"queue": "dlq", "max_receive_count": 3},
        },
        {
            "attributes": {"FifoQueue": "true", "VisibilityTimeout": "45"},
            "dead_letter": {"queue": "dlq", "max_receive_count": 3},
        },
    ),
    ("sqs_queue", {"state": "absent"}, {}),
    (
        "dynamodb_table",
        {"hash_key": {"name": "id"}, "billing_mode": "PAY_PER_REQUEST", "tags": {"env": "prod"}},
        {
            "hash_key": {"name": "id", "type": "S"},
            "range_key": None,
            "billing_mode": "PAY_PER_REQUEST",
            "tags": {"env": "prod"},
        },
    ),
    (
        "s3_bucket",
        {"versioning": True, "lifecycle_rules": [{"id": "b"}, {"id": "a", "expiration_days": 7}]},
        {
            "versioning": True,
            "lifecycle_rules": [
                {"id": "a", "prefix": "", "enabled": True, "expiration_days": 7, "noncurrent_expiration_days": None},
                {"id": "b", "prefix": "", "enabled": True, "expiration_days": None, "noncurrent_expiration_days": None},
            ],
        },
    ),
    (
        "ssm_parameter",
        {"value": "x", "description": None},
        {"value": "sha256:2d711642b726b044", "type": "String", "description": None},
    ),
    ("ssm_parameter", {"state": "absent"}, {"type": "String"}),
    (
        "s3_object",
        {"content": {"n": 1}, "metadata": {"kind": "report"}, "tags": {}},
        {
            "md5": _md5(b'{\n  "n": 1\n}\n'),
            "content_type": "application/json",
            "metadata": {"kind": "report"},
            "tags": {},
        },
    ),
    ("s3_object", {"state": "absent"}, {}),
]


@pytest.mark.parametrize("kind, config, desired", DESIRED, ids=[k for k, _, _ in DESIRED])
def test_the_desired_state_holds_only_what_was_declared_in_aws_canonical_form(kind, config, desired):
    assert RESOURCES[kind].desired(config) == desired


SKELETON = {"check_id", "desired", "read", "diff", "update", "untracked_id", "describe"}


def test_no_resource_type_rewrites_the_skeleton_its_base_holds():
    """Each kind's module holds its own API calls and rules; reading with NotFound as absent, the
    canonical desired state, the comparison and the re-tagging stay in ``ResourceType``."""
    rewritten = {kind: sorted(SKELETON & vars(type(t)).keys()) for kind, t in RESOURCES.items()}
    assert {kind: names for kind, names in rewritten.items() if names} == {}


class _AwsError(Exception):
    def __init__(self, code: str) -> None:
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": 400}}


class _Unreadable(ResourceType[ResourceConfig]):
    """A kind whose reads answer one AWS error code (a resource deleted between two of them)."""

    name = "unreadable"
    id_rule = IdRule(re.compile(".+"), "anything")

    def __init__(self, code: str) -> None:
        self.code = code

    def fetch(self, aws: Aws, resource_id: str, *, full: bool) -> Current:
        raise _AwsError(self.code)

    def create(self, aws: Aws, wanted: Wanted) -> None: ...

    def change(self, aws: Aws, wanted: Wanted, current: Current, fields: set[str]) -> None: ...

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None: ...


@pytest.mark.parametrize("code", ["NoSuchBucket", "ResourceNotFoundException", "ParameterNotFound", "404"])
def test_a_not_found_from_any_of_a_kinds_reads_means_absent(code):
    assert _Unreadable(code).read(Aws(None, "us-east-1"), "x") is None  # type: ignore[arg-type]


def test_any_other_error_from_a_read_is_raised_never_absent():
    with pytest.raises(_AwsError):
        _Unreadable("AccessDenied").read(Aws(None, "us-east-1"), "x")  # type: ignore[arg-type]
