"""Imported by a ``tether worker`` in tests (``--import aws_counting``): log every successful
create call tether's AWS clients make, one line per call, to ``$TETHER_TEST_AWS_LOG``. A line is
written after AWS answered, with O_APPEND, so a SIGKILL never leaves half a line."""

from __future__ import annotations

import os
from typing import Any

from tether.jobtypes.aws import on_client

# The operation that creates each resource type, and the parameter that names it.
CREATES = {
    "CreateBucket": "Bucket",
    "CreateQueue": "QueueName",
    "CreateTopic": "Name",
    "CreateTable": "TableName",
    "PutParameter": "Name",
    "PutObject": "Key",
}


def _before_call(model: Any, params: Any, context: Any, **_: Any) -> None:
    name = CREATES.get(model.name)
    if name is None or (model.name == "PutParameter" and params.get("Overwrite")):
        return  # not a create (an overwriting PutParameter is an update)
    context["tether_test_created"] = params[name]


def _after_call(model: Any, http_response: Any, context: Any, **_: Any) -> None:
    created = context.get("tether_test_created")
    if created is None or http_response.status_code >= 300:
        return
    line = f"{model.name} {created}\n".encode()
    fd = os.open(os.environ["TETHER_TEST_AWS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _hook(client: Any) -> None:
    client.meta.events.register("before-parameter-build.*.*", _before_call)
    client.meta.events.register("after-call.*.*", _after_call)


def register(registry: Any) -> None:
    """``--import aws_counting``: no job types of its own; start counting."""
    if os.environ.get("TETHER_TEST_AWS_LOG"):
        on_client(_hook)
