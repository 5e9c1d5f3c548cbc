"""AWS resources as job effects: ``sync_aws`` and one module per resource type.

Adding a type is adding a module with a ``ResourceType`` subclass (``resource.py``: the skeleton
every type shares, and the hooks a type implements), registered (``register``), and importing it here.
"""

from __future__ import annotations

from . import dynamodb_table, s3_bucket, s3_object, sns_topic, sqs_queue, ssm_parameter  # noqa: F401  # each registers its resource type
from .clients import AwsNotInstalled, on_client, reset_clients
from .resource import RESOURCES
from .sync import SyncAws, SyncAwsProbe, SyncAwsType
from .tags import OWNER_TAG

__all__ = [
    "OWNER_TAG",
    "RESOURCES",
    "AwsNotInstalled",
    "SyncAws",
    "SyncAwsProbe",
    "SyncAwsType",
    "on_client",
    "reset_clients",
]
