"""AWS resources as job effects: ``sync_aws`` and one module per resource type.

Adding a type is adding a module with a ``ResourceType`` subclass, registered (``register``), and
importing it here.
"""

from __future__ import annotations

from . import dynamodb_table, s3_bucket, s3_object, sns_topic, sqs_queue, ssm_parameter  # noqa: F401  # each registers its resource type
from .common import OWNER_TAG, RESOURCES, AwsNotInstalled, on_client, reset_clients
from .sync import SyncAws, SyncAwsProbe, SyncAwsType

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
