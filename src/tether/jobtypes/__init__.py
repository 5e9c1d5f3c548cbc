"""Built-in job types. ``default_registry()`` holds them all."""

from __future__ import annotations

from .aws import SyncAws, SyncAwsType
from .base import JobType, Payload
from .claude_extraction import ClaudeExtraction, ClaudeExtractionType
from .create_file import CreateFile, CreateFileType, render
from .delete_file import DeleteFile, DeleteFileType
from .registry import Registry


def default_registry() -> Registry:
    return Registry([CreateFileType(), DeleteFileType(), ClaudeExtractionType(), SyncAwsType()])


__all__ = [
    "ClaudeExtraction",
    "ClaudeExtractionType",
    "CreateFile",
    "DeleteFile",
    "JobType",
    "Payload",
    "Registry",
    "SyncAws",
    "default_registry",
    "render",
]
