"""boto3 clients for the AWS resource types, made once per process, and what one job's calls need.

boto3 is an optional extra (``tether[aws]``): this module imports it only when a client is made,
so tether without it still loads, and enqueueing ``sync_aws`` says how to install it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import tracing
from ...errors import ConfigError

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
        tracing.instrument_botocore()  # each AWS call a span, when the otel extra is installed
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
    cancelled: threading.Event | None = None

    def client(self, service: str) -> Any:
        return self.clients.get(service, self.region)

    def arn(self, service: str, resource: str) -> str:
        return f"arn:aws:{service}:{self.region}:{self.clients.account(self.region)}:{resource}"

    def pause(self, seconds: float) -> None:
        if self.cancelled is not None:
            self.cancelled.wait(seconds)
        else:
            time.sleep(seconds)
