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
    JobTimedOut,
    LedgerFault,
    LostLease,
    PermanentError,
    RetryableError,
    Superseded,
    TetherError,
    UnknownJobType,
    UnsafePath,
)
from .jobtypes import CreateFile, DeleteFile, JobType, Payload, Registry
from .jobtypes.base import Check, Difference, Probe
from .jobtypes.files import checked_path, delete_locked, write_locked
from .jobtypes.target import Target
from .record import InsertResult, JobRecord
from .retry import RetryPolicy
from .status import JobStatus
from .store import InvalidModel, JsonStore, ModelNotFound, NotApplied
from .worker import Worker, WorkerConfig

__all__ = [
    "Cancelled",
    "Check",
    "Clock",
    "ConfigError",
    "Coordinator",
    "CreateFile",
    "DatabaseUnavailable",
    "DeleteFile",
    "Difference",
    "DuplicateActiveJob",
    "FakeClock",
    "InsertResult",
    "InvalidModel",
    "InvalidPayload",
    "InvalidTransition",
    "JobContext",
    "JobNotFound",
    "JobRecord",
    "JobStatus",
    "JobTimedOut",
    "JobType",
    "JsonStore",
    "LedgerFault",
    "LostLease",
    "ModelNotFound",
    "NotApplied",
    "Payload",
    "PermanentError",
    "Probe",
    "Registry",
    "RetryPolicy",
    "RetryableError",
    "Superseded",
    "SystemClock",
    "Target",
    "TetherError",
    "UnknownJobType",
    "UnsafePath",
    "Worker",
    "WorkerConfig",
    "checked_path",
    "delete_locked",
    "write_locked",
]
