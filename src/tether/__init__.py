"""tether: every side effect recorded as a job, performed with retries, and proven on disk.

Names are imported when first used (PEP 562): the command line imports this package, and
``tether --help`` should not pay for the ledger's table model and SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import lazy

if TYPE_CHECKING:
    from .clock import Clock, FakeClock, SystemClock
    from .coordinator import Coordinator
    from .errors import (
        Cancelled,
        CommitUnknown,
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
        TransactionConflict,
        UnknownJobType,
        UnsafePath,
    )
    from .jobtypes import CreateFile, DeleteFile, JobType, Payload, Registry
    from .jobtypes.base import Check, Difference, Probe
    from .jobtypes.context import JobContext
    from .jobtypes.files import checked_path, delete_locked, write_locked
    from .jobtypes.target import Target
    from .record import InsertResult, JobRecord
    from .status import JobStatus
    from .store import InvalidModel, JsonStore, ModelNotFound, NotApplied
    from .worker.loop import Worker, WorkerConfig
    from .worker.retry import RetryPolicy

_WHERE = {
    "Clock": ".clock",
    "FakeClock": ".clock",
    "SystemClock": ".clock",
    "JobContext": ".jobtypes.context",
    "Coordinator": ".coordinator",
    "Cancelled": ".errors",
    "CommitUnknown": ".errors",
    "ConfigError": ".errors",
    "DatabaseUnavailable": ".errors",
    "DuplicateActiveJob": ".errors",
    "InvalidPayload": ".errors",
    "InvalidTransition": ".errors",
    "JobNotFound": ".errors",
    "JobTimedOut": ".errors",
    "LedgerFault": ".errors",
    "LostLease": ".errors",
    "PermanentError": ".errors",
    "RetryableError": ".errors",
    "Superseded": ".errors",
    "TetherError": ".errors",
    "TransactionConflict": ".errors",
    "UnknownJobType": ".errors",
    "UnsafePath": ".errors",
    "CreateFile": ".jobtypes",
    "DeleteFile": ".jobtypes",
    "JobType": ".jobtypes",
    "Payload": ".jobtypes",
    "Registry": ".jobtypes",
    "Check": ".jobtypes.base",
    "Difference": ".jobtypes.base",
    "Probe": ".jobtypes.base",
    "checked_path": ".jobtypes.files",
    "delete_locked": ".jobtypes.files",
    "write_locked": ".jobtypes.files",
    "Target": ".jobtypes.target",
    "InsertResult": ".record",
    "JobRecord": ".record",
    "RetryPolicy": ".worker.retry",
    "JobStatus": ".status",
    "InvalidModel": ".store",
    "JsonStore": ".store",
    "ModelNotFound": ".store",
    "NotApplied": ".store",
    "Worker": ".worker.loop",
    "WorkerConfig": ".worker.loop",
}


__getattr__ = lazy.exports(__name__, _WHERE)


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = [
    "Cancelled",
    "Check",
    "Clock",
    "CommitUnknown",
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
    "TransactionConflict",
    "UnknownJobType",
    "UnsafePath",
    "Worker",
    "WorkerConfig",
    "checked_path",
    "delete_locked",
    "write_locked",
]
