"""What every AWS resource type shares: clients, the ownership tag, canonical forms, error mapping.

boto3 is an optional extra (``tether[aws]``): this module imports it only when a client is made,
so tether without it still loads, and enqueueing ``sync_aws`` says how to install it.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import orjson
from pydantic import BaseModel, ConfigDict, field_validator

from ...errors import ConfigError, PermanentError, RetryableError
from ..base import ADD, NOT_EQUAL, REMOVE, Difference

if TYPE_CHECKING:
    import threading as _threading

OWNER_TAG = "tether:managed-by"
"""Tag on every resource tether creates: the ledger's id (``Coordinator.ledger_id``)."""
TETHER_PREFIX = "tether:"
"""Tags under this prefix are tether's own: never declared in a config, never compared."""

INSTALL_HINT = "sync_aws needs boto3, which is not installed: pip install 'tether[aws]'"


class AwsNotInstalled(ConfigError):
    def __init__(self) -> None:
        super().__init__(INSTALL_HINT)


def require_boto3() -> None:
    try:
        import boto3  # noqa: F401
    except ImportError:
        raise AwsNotInstalled() from None


def default_region() -> str | None:
    """The region boto3's own configuration names (AWS_REGION, AWS_DEFAULT_REGION, ~/.aws/config)."""
    import boto3

    region = boto3.session.Session().region_name
    return None if region is None else str(region)


# -- clients ---------------------------------------------------------------------------------

_client_hooks: list[Callable[[Any], None]] = []


def on_client(hook: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``hook(client)`` on every boto3 client tether makes from now on (tests count calls
    and inject faults through botocore's event hooks). Returns a function that removes it."""
    _client_hooks.append(hook)
    return lambda: _client_hooks.remove(hook)


class Clients:
    """boto3 clients by (service, region), made once. Credentials come only from boto3's default
    chain, the endpoint from boto3's own ``AWS_ENDPOINT_URL[_<SERVICE>]``; retries in botocore's
    ``standard`` mode (throttling, 5xx, timeouts), under tether's own job retries."""

    def __init__(self, *, max_attempts: int = 3, connect_timeout: float = 5.0, read_timeout: float = 30.0) -> None:
        require_boto3()
        import boto3
        from botocore.config import Config

        self._session = boto3.session.Session()
        self._config = Config(
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=32,
        )
        self._clients: dict[tuple[str, str], Any] = {}
        self._accounts: dict[str, str] = {}
        self._lock = threading.Lock()  # a boto3 Session is not thread-safe; its clients are

    def account(self, region: str) -> str:
        """The account the credentials belong to (for ARNs that name it), asked once."""
        account = self._accounts.get(region)
        if account is None:
            account = self._accounts[region] = str(self.get("sts", region).get_caller_identity()["Account"])
        return account

    def get(self, service: str, region: str) -> Any:
        client = self._clients.get((service, region))
        if client is None:
            with self._lock:
                client = self._clients.get((service, region))
                if client is None:
                    client = self._session.client(service, region_name=region, config=self._config)
                    for hook in list(_client_hooks):
                        hook(client)
                    self._clients[(service, region)] = client
        return client


_shared: Clients | None = None
_shared_lock = threading.Lock()


def shared_clients() -> Clients:
    """One client cache per process (clients hold connection pools)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Clients()
        return _shared


def reset_clients() -> None:
    """Forget cached clients (after the environment changed: a new endpoint, new credentials)."""
    global _shared
    with _shared_lock:
        _shared = None


@dataclass
class Aws:
    """What a resource type's calls need: clients for one region, the job (for client tokens and
    cancellation), and the ledger's id for the ownership tag."""

    clients: Clients
    region: str
    owner: str = ""
    root: Path | None = None
    job_id: str = ""
    cancelled: _threading.Event | None = None

    def client(self, service: str) -> Any:
        return self.clients.get(service, self.region)

    def arn(self, service: str, resource: str) -> str:
        return f"arn:aws:{service}:{self.region}:{self.clients.account(self.region)}:{resource}"

    def pause(self, seconds: float) -> None:
        if self.cancelled is not None:
            self.cancelled.wait(seconds)
        else:
            time.sleep(seconds)


# -- errors ----------------------------------------------------------------------------------

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
ACCESS = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "AuthorizationError",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "403",
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


# -- canonical forms and differences ---------------------------------------------------------


def tags_from_list(items: Iterable[Mapping[str, Any]] | None, key: str = "Key", value: str = "Value") -> dict[str, str]:
    """AWS's ``[{"Key": k, "Value": v}]`` as a sorted dict."""
    return {str(i[key]): str(i[value]) for i in sorted(items or (), key=lambda i: str(i[key]))}


def tags_to_list(tags: Mapping[str, str], key: str = "Key", value: str = "Value") -> list[dict[str, str]]:
    return [{key: k, value: v} for k, v in sorted(tags.items())]


def user_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """Tags without tether's own (compared and reported: the ownership tag is tether's business)."""
    return {k: v for k, v in sorted(tags.items()) if not k.startswith(TETHER_PREFIX)}


def diff(
    expected: Mapping[str, Any], actual: Mapping[str, Any], *, partial: Iterable[str] = ()
) -> tuple[Difference, ...]:
    """The differences between the declared state and AWS's, both canonical, over the declared
    keys only. A declared mapping is compared key by key (``tags.env``); for one named in
    ``partial`` (attributes, where AWS fills in defaults) only its declared keys are, for the
    others (tags) every key is, so a tag added by hand is ADD."""
    out: list[Difference] = []
    partial = frozenset(partial)
    for name, want in expected.items():
        have = actual.get(name)
        if isinstance(want, dict):
            have = have if isinstance(have, dict) else {}
            keys = want.keys() if name in partial else want.keys() | have.keys()
            for k in sorted(keys):
                path = f"{name}.{k}"
                if k not in have:
                    out.append(Difference(path, want[k], None, REMOVE))
                elif k not in want:
                    out.append(Difference(path, None, have[k], ADD))
                elif want[k] != have[k]:
                    out.append(Difference(path, want[k], have[k], NOT_EQUAL))
        elif name not in actual or have is None:
            if want is not None:
                out.append(Difference(name, want, None, REMOVE))
        elif want != have:
            out.append(Difference(name, want, have, NOT_EQUAL))
    return tuple(out)


def changed_fields(differences: Iterable[Difference]) -> set[str]:
    """The top-level config fields the differences touch (``tags.env`` -> ``tags``)."""
    return {d.path.split(".", 1)[0] for d in differences}


# -- resource types --------------------------------------------------------------------------


class ResourceConfig(BaseModel):
    """A resource's desired state. Unknown fields are refused; ``tags`` never holds tether's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state: Literal["present", "absent"] = "present"
    tags: dict[str, str] | None = None

    @field_validator("tags")
    @classmethod
    def _no_tether_tags(cls, tags: dict[str, str] | None) -> dict[str, str] | None:
        if tags and any(k.startswith(TETHER_PREFIX) for k in tags):
            raise ValueError(f"tags under {TETHER_PREFIX!r} are tether's own and cannot be declared")
        return tags


@dataclass
class Current:
    """What AWS holds for one resource: its canonical facts (same shape as the desired state),
    the ownership tag's value, and its identity (ARN, URL, version id) for the job's result."""

    facts: dict[str, Any]
    owner: str | None
    identity: dict[str, Any] = field(default_factory=dict)
    created_at: float | None = None  # epoch seconds, where AWS says


class ResourceType(ABC):
    """One kind of AWS resource. A type is a module with a subclass, registered in ``RESOURCES``."""

    name: ClassVar[str]
    service: ClassVar[str]
    config_model: ClassVar[type[ResourceConfig]]
    partial: ClassVar[frozenset[str]] = frozenset()
    """Declared mappings compared only on their declared keys (AWS fills in the rest)."""

    def check_id(self, resource_id: str) -> str | None:
        """A problem with the resource id (AWS's naming rules), or None."""
        return None

    def check_config(self, config: ResourceConfig, root: Path) -> list[str]:
        """Problems the model cannot see alone (a body file's path against the data root)."""
        return []

    def desired(self, config: Mapping[str, Any], root: Path | None = None) -> dict[str, Any]:
        """The declared state in canonical form: only the keys the config declared (``root``: the
        data root, for a body read from a data file)."""
        return {k: v for k, v in config.items() if k != "state"}

    def diff(self, desired: Mapping[str, Any], current: Current) -> tuple[Difference, ...]:
        return diff(desired, current.facts, partial=self.partial)

    def describe(self, aws: Aws, resource_id: str) -> str:
        return f"{self.name} {resource_id} in {aws.region}"

    @abstractmethod
    def read(self, aws: Aws, resource_id: str, *, full: bool = True) -> Current | None:
        """AWS's state of the resource, None only on a definite NotFound. ``full`` false: enough
        to know it exists and whose it is. Raises botocore's errors for anything else."""

    @abstractmethod
    def create(self, aws: Aws, resource_id: str, desired: dict[str, Any], config: Mapping[str, Any]) -> None:
        """Create it in the desired state, with the ownership tag in the creating call where the
        API allows (so a crash never leaves an untagged resource of ours)."""

    @abstractmethod
    def update(
        self,
        aws: Aws,
        resource_id: str,
        desired: dict[str, Any],
        current: Current,
        fields: set[str],
        config: Mapping[str, Any],
    ) -> None:
        """Change only ``fields`` (those that differ) to their desired value."""

    @abstractmethod
    def delete(self, aws: Aws, resource_id: str, current: Current) -> None: ...

    def adopt_untagged(self, current: Current, enqueued_at: float, attempt: int) -> bool:
        """Whether an untagged resource is ours after all: only for types whose create cannot
        tag in the same call (an earlier attempt died between the two)."""
        return False

    def untracked_id(self, arn: str) -> str | None:
        """The resource id in an ARN the tagging API listed, None if the ARN is not this type's."""
        return None

    def tagging_filter(self) -> str | None:
        """This type's ResourceTypeFilters value for the Resource Groups Tagging API."""
        return None


RESOURCES: dict[str, ResourceType] = {}


def register(resource_type: ResourceType) -> ResourceType:
    RESOURCES[resource_type.name] = resource_type
    return resource_type


def tag_value(tags: Mapping[str, str]) -> str | None:
    return tags.get(OWNER_TAG)


def owner_tags(aws: Aws, tags: Mapping[str, str] | None) -> dict[str, str]:
    """The tags a created resource carries: the declared ones and tether's ownership tag."""
    return {**(tags or {}), OWNER_TAG: aws.owner}


def remove_keys(tags: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """User tags present but not wanted (tether's own are kept)."""
    return [k for k in tags if k not in wanted and not k.startswith(TETHER_PREFIX)]


def attributes_as_aws_returns_them(attributes: Mapping[str, Any], json_names: frozenset[str]) -> dict[str, Any]:
    """SNS/SQS attributes in the shape their Get*Attributes calls answer, sorted: strings, booleans
    lowercase, and the JSON documents (policies) parsed, so desired and current compare as equal."""

    def value(name: str, v: Any) -> Any:
        if name in json_names:
            return (orjson.loads(v) if v else None) if isinstance(v, str) else v
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v)

    return {k: value(k, v) for k, v in sorted(attributes.items())}
