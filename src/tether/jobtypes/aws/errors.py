"""What an AWS error means for a job: not found, worth another try, or refused; and how it is told.

Never the error's message: AWS echoes parameter values in it, and config values are not shown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ...errors import PermanentError, RetryableError
from .clients import Aws
from .tags import OWNER_TAG

THROTTLING = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "OperationAborted",
        "ResourceInUseException",
        "AWS.SimpleQueueService.QueueDeletedRecently",  # a queue's name is free again after 60 s
        "QueueDeletedRecently",
    }
)
NOT_FOUND = frozenset(
    {
        "404",
        "NoSuchBucket",
        "NoSuchKey",
        "NotFound",
        "NotFoundException",
        "ResourceNotFoundException",
        "ResourceNotFound",
        "ParameterNotFound",
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue",
        "NoSuchEntity",
    }
)


def error_code(e: BaseException) -> str | None:
    """The AWS error code of a botocore ClientError, else None."""
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return None
    return str(response.get("Error", {}).get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


def is_not_found(e: BaseException) -> bool:
    return error_code(e) in NOT_FOUND


def describe(e: BaseException) -> str:
    """An AWS error for ``last_error`` and reports: operation, code, HTTP status and request id.
    Never the message: AWS echoes parameter values in it, and config values are not shown."""
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        meta = response.get("ResponseMetadata", {})
        request_id = meta.get("RequestId") or meta.get("HTTPHeaders", {}).get("x-amz-request-id") or "-"
        op = getattr(e, "operation_name", "?")
        return f"{op}: AWS error {error_code(e)} (HTTP {meta.get('HTTPStatusCode', '?')}, request id {request_id})"
    from botocore import exceptions as bx

    if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return f"{type(e).__name__}: no usable AWS credentials in boto3's default chain (environment, ~/.aws, role)"
    if isinstance(e, bx.ParamValidationError):
        return "ParamValidationError: botocore refused the request's parameters before sending it"
    if isinstance(e, bx.NoRegionError):
        return "NoRegionError: no AWS region given or configured"
    if isinstance(e, (bx.EndpointConnectionError, bx.ConnectionError, bx.HTTPClientError)):
        return f"{type(e).__name__}: the AWS endpoint could not be reached"
    return type(e).__name__


def is_transient(e: BaseException) -> bool:
    """Worth trying again later: throttling, a 5xx, a connection that failed or timed out."""
    from botocore import exceptions as bx

    if isinstance(e, (bx.EndpointConnectionError, bx.ConnectionError, bx.HTTPClientError)):
        return True
    code = error_code(e)
    if code is None:
        return False
    status = getattr(e, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return code in THROTTLING or code in NOT_FOUND or int(status) >= 500


def as_job_error(e: BaseException, resource: str) -> BaseException:
    """The job outcome of an AWS error: throttling, 5xx, not-found-yet and connection errors are
    retried; credentials, parameter, access and validation errors fail at once."""
    from botocore import exceptions as bx

    if not isinstance(e, (bx.BotoCoreError, bx.ClientError)):
        return e
    text = f"{resource}: {describe(e)}"
    if is_transient(e):
        return RetryableError(text)
    return PermanentError(text)


class NotOurs(PermanentError):
    """A resource of that name exists and does not carry this ledger's ownership tag."""

    def __init__(self, resource: str, owner: str | None) -> None:
        whose = "carries no tether ownership tag" if owner is None else "is managed by another tether ledger"
        super().__init__(
            f"{resource} exists and is not ours: it {whose} ({OWNER_TAG}); nothing was changed. "
            "Pick another name, or tag it with this ledger's id to let tether adopt it"
        )


def with_not_found_retry(aws: Aws, read: Callable[[], Any], *, seconds: float = 10.0) -> Any:
    """``read()`` right after a create: AWS may answer NotFound for a moment (eventual consistency)."""
    deadline = time.monotonic() + seconds
    pause = 0.1
    while True:
        try:
            return read()
        except Exception as e:
            if not is_not_found(e) or time.monotonic() >= deadline:
                raise
        aws.pause(pause)
        pause = min(pause * 2, 1.0)
