"""Built-in job types. ``default_registry()`` holds them all."""

from __future__ import annotations

from .aws import SyncAws, SyncAwsType
from .base import JobType, Payload
from .create_file import CreateFile, CreateFileType, render
from .delete_file import DeleteFile, DeleteFileType
from .registry import Registry


def default_registry() -> Registry:
    return Registry([CreateFileType(), DeleteFileType(), SyncAwsType()])


__all__ = ["CreateFile", "DeleteFile", "JobType", "Payload", "Registry", "SyncAws", "default_registry", "render"]
