"""tether: every side effect recorded as a job, performed with retries, and proven on disk."""

from .clock import Clock, FakeClock, SystemClock
from .context import JobContext
from .coordinator import Coordinator
from .errors import (
    Cancelled,
    ConfigError,
    DatabaseUnavailable,
    DuplicateActiveJob,
    InvalidPayload,
    InvalidTransition,
    JobNotFound,
    LostLease,
    PermanentError,
    RetryableError,
    Superseded,
    TetherError,
    UnknownJobType,
    UnsafePath,
)
from .jobtypes import CreateFile, DeleteFile, JobType, Payload, Registry
from .record import InsertResult, JobRecord
from .retry import RetryPolicy
from .status import JobStatus
from .store import InvalidModel, JsonStore, ModelNotFound, NotApplied
from .worker import Worker, WorkerConfig

__all__ = [
    "Cancelled",
    "Clock",
    "ConfigError",
    "Coordinator",
    "CreateFile",
    "DatabaseUnavailable",
    "DeleteFile",
    "DuplicateActiveJob",
    "FakeClock",
    "InsertResult",
    "InvalidPayload",
    "InvalidModel",
    "InvalidTransition",
    "JobContext",
    "JsonStore",
    "ModelNotFound",
    "NotApplied",
    "JobNotFound",
    "JobRecord",
    "JobStatus",
    "JobType",
    "LostLease",
    "Payload",
    "PermanentError",
    "Registry",
    "RetryPolicy",
    "RetryableError",
    "Superseded",
    "SystemClock",
    "TetherError",
    "UnknownJobType",
    "UnsafePath",
    "Worker",
    "WorkerConfig",
]
