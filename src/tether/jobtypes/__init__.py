"""Built-in job types. ``default_registry()`` holds them all."""

from __future__ import annotations

from .adopt import Adopt, AdoptType
from .aws import SyncAws, SyncAwsType
from .base import JobType, Payload
from .claude_extraction import ClaudeExtraction, ClaudeExtractionType
from .create_file import CreateFile, CreateFileType, render
from .delete_file import DeleteFile, DeleteFileType
from .registry import Registry
from .remove_temp import RemoveTemp, RemoveTempType


def default_registry() -> Registry:
    return Registry(
        [CreateFileType(), DeleteFileType(), ClaudeExtractionType(), SyncAwsType(), AdoptType(), RemoveTempType()]
    )


__all__ = [
    "Adopt",
    "AdoptType",
    "ClaudeExtraction",
    "ClaudeExtractionType",
    "CreateFile",
    "DeleteFile",
    "JobType",
    "Payload",
    "Registry",
    "RemoveTemp",
    "RemoveTempType",
    "SyncAws",
    "default_registry",
    "render",
]
