"""tether: every side effect recorded as a job, performed with retries, and proven on disk.

The package is lazy (PEP 562, ``exports.py``): a name below is imported from its module when first
used. The command line imports this package, and ``tether --help`` and ``tether status`` should not
pay for the coordinator, the ledger's table model and SQLAlchemy. The ``if TYPE_CHECKING:`` imports
are the one list of what the package offers: type checkers read them, and ``exports.lazy`` reads
the same statements to know where each name lives (``X as X`` marks an explicit re-export).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import exports

if TYPE_CHECKING:
    from .aio import AsyncCoordinator as AsyncCoordinator
    from .aio import AsyncJsonStore as AsyncJsonStore
    from .clock import Clock as Clock
    from .clock import FakeClock as FakeClock
    from .clock import SystemClock as SystemClock
    from .coordinator import Coordinator as Coordinator
    from .errors import AlreadyRetried as AlreadyRetried
    from .errors import Cancelled as Cancelled
    from .errors import CommitUnknown as CommitUnknown
    from .errors import ConfigError as ConfigError
    from .errors import DatabaseUnavailable as DatabaseUnavailable
    from .errors import Deferred as Deferred
    from .errors import DuplicateActiveJob as DuplicateActiveJob
    from .errors import InvalidPayload as InvalidPayload
    from .errors import InvalidTransition as InvalidTransition
    from .errors import JobNotFound as JobNotFound
    from .errors import JobTimedOut as JobTimedOut
    from .errors import LedgerFault as LedgerFault
    from .errors import LostLease as LostLease
    from .errors import PermanentError as PermanentError
    from .errors import RetryableError as RetryableError
    from .errors import Snooze as Snooze
    from .errors import SnoozedTooOften as SnoozedTooOften
    from .errors import Superseded as Superseded
    from .errors import TetherError as TetherError
    from .errors import TransactionConflict as TransactionConflict
    from .errors import UnknownJobType as UnknownJobType
    from .errors import UnsafePath as UnsafePath
    from .jobtypes import CreateFile as CreateFile
    from .jobtypes import DeleteFile as DeleteFile
    from .jobtypes import JobType as JobType
    from .jobtypes import Payload as Payload
    from .jobtypes import Registry as Registry
    from .jobtypes.base import Check as Check
    from .jobtypes.base import Difference as Difference
    from .jobtypes.base import Probe as Probe
    from .jobtypes.context import JobContext as JobContext
    from .jobtypes.datafiles.effects import delete_locked as delete_locked
    from .jobtypes.datafiles.effects import write_locked as write_locked
    from .jobtypes.datafiles.paths import checked_path as checked_path
    from .jobtypes.target import Target as Target
    from .ledger.record import InsertResult as InsertResult
    from .ledger.record import JobRecord as JobRecord
    from .ledger.status import JobStatus as JobStatus
    from .store import InvalidModel as InvalidModel
    from .store import JsonStore as JsonStore
    from .store import ModelNotFound as ModelNotFound
    from .store import NotApplied as NotApplied
    from .worker.loop import Worker as Worker
    from .worker.loop import WorkerConfig as WorkerConfig
    from .worker.retry import RetryPolicy as RetryPolicy

_exported, __dir__ = exports.lazy(__name__)


def __getattr__(name: str) -> Any:
    """The exports above, and ``__version__``: read from the installed package's metadata on
    first use, which ``import tether`` need not pay for."""
    if name == "__version__":
        from .version import installed

        globals()["__version__"] = value = installed()
        return value
    return _exported(name)
