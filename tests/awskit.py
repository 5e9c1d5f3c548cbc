"""AWS test helpers: dummy credentials, moto in-process, counting and failing botocore calls.

Never a real AWS endpoint: every test that touches AWS runs under ``mock_aws`` (in-process) or
against a moto server on loopback, with dummy credentials.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tether.jobtypes.aws import on_client, reset_clients

READ_PREFIXES = ("Get", "Head", "List", "Describe")

DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}
CLEARED = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


def dummy_environment(mp: pytest.MonkeyPatch, endpoint: str | None = None) -> None:
    for name in CLEARED:
        mp.delenv(name, raising=False)
    for name, value in DUMMY_ENV.items():
        mp.setenv(name, value)
    mp.setenv("AWS_CONFIG_FILE", "/nonexistent/tether-test-aws-config")
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/tether-test-aws-credentials")
    if endpoint is not None:
        mp.setenv("AWS_ENDPOINT_URL", endpoint)


class Calls:
    """Every AWS operation tether's clients send, by name (botocore's ``before-call`` event)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: list[str] = []

    def hook(self, client: Any) -> None:
        client.meta.events.register("before-call.*.*", self._seen)

    def _seen(self, model: Any, **_: Any) -> None:
        with self.lock:
            self.ops.append(model.name)

    def mutating(self) -> list[str]:
        return [op for op in self.ops if not op.startswith(READ_PREFIXES)]

    def count(self) -> Counter[str]:
        return Counter(self.ops)

    def clear(self) -> None:
        with self.lock:
            self.ops.clear()


@contextmanager
def client_hook(hook: Callable[[Any], None]) -> Iterator[None]:
    """Install ``hook`` on every client tether makes inside the block (fresh clients)."""
    reset_clients()
    remove = on_client(hook)
    try:
        yield
    finally:
        remove()
        reset_clients()


def aws_error(code: str, status: int, protocol: str) -> Any:
    """A botocore response for an AWS error in the service's protocol, as the wire would hand it
    back (``before-send``)."""
    from botocore.awsrequest import AWSResponse

    headers = {"x-amz-request-id": f"req-{code}", "x-amzn-RequestId": f"req-{code}"}
    if protocol in ("json", "rest-json"):
        body = f'{{"__type": "com.amazonaws#{code}", "message": "injected"}}'.encode()
        headers["Content-Type"] = "application/x-amz-json-1.0"
    elif protocol == "rest-xml":
        body = (
            f"<Error><Code>{code}</Code><Message>injected</Message><RequestId>req-{code}</RequestId></Error>".encode()
        )
    else:
        body = (
            f'<?xml version="1.0"?><ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code>'
            f"<Message>injected</Message></Error><RequestId>req-{code}</RequestId></ErrorResponse>"
        ).encode()

    class Raw:
        def stream(self, **_: Any) -> Iterator[bytes]:
            yield body

    return AWSResponse("https://injected", status, headers, Raw())


class Faults:
    """Answer matching operations with an AWS error at the wire (inside botocore's retry loop,
    so its standard-mode retries see them), ``times`` times (None: always). Hooked first, so it
    answers before moto does."""

    def __init__(self, operation: str, code: str, status: int, times: int | None) -> None:
        self.operation, self.code, self.status, self.times = operation, code, status, times
        self.sent = 0  # how many times the operation went to the wire, faults included
        self.lock = threading.Lock()

    def hook(self, client: Any) -> None:
        protocol = client.meta.service_model.protocol

        def send(request: Any, event_name: str = "", **_: Any) -> Any:
            if not event_name.endswith(f".{self.operation}"):
                return None
            with self.lock:
                self.sent += 1
                if self.times is None or self.sent <= self.times:
                    # botocore asks every before-send handler and takes the first answer: send
                    # moto (in-process) nowhere, so the faulted call has no effect there.
                    request.url = "http://fault-injected.invalid/"
                    return aws_error(self.code, self.status, protocol)
            return None

        client.meta.events.register_first("before-send", send)
