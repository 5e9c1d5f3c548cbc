"""Every setting tether reads from the environment, and every default, resolved in one place.

An explicit argument wins; then the ``TETHER_*`` variable; then the default below. The CLI's
global options read the same variables (typer's ``envvar=``) and pass their values in, so a
setting never has two defaults.
"""

from __future__ import annotations

import os

from .errors import ConfigError

DEFAULT_DB = "sqlite:///tether.db"
"""The ledger when neither ``--db`` nor ``TETHER_DB`` names one: SQLite in the working directory."""

DEFAULT_ROOT = "."
"""The data root when neither ``--root`` nor ``TETHER_ROOT`` names one: the working directory."""

DEFAULT_DURABILITY = "full"
"""SQLite ``synchronous=FULL``: a commit survives power loss."""

DEFAULT_LOCK_TIMEOUT = 300.0
"""Seconds after which a claimed job without a heartbeat is stale (docs/design.md, "Statuses and edges")."""

BUSY_TIMEOUT = 30.0
"""Seconds a SQLite connection waits for another's lock before it gives up ("database is locked")."""

DEFAULT_SHUTDOWN_GRACE = 25.0
"""Seconds a worker's running jobs get to finish after SIGTERM (Sidekiq's default: it ends inside
the 30 s Kubernetes, Heroku and most supervisors allow between SIGTERM and SIGKILL, with time left
to give the cancelled jobs back)."""

DEFAULT_BACKLOG_LIMIT = 100
"""The soft backlog limit of ``tether status`` (a verdict, never a refusal)."""

# The alerting rules of `tether status` (docs/design.md, "The operator's questions"): each has a
# warning and an error threshold; None turns that level off.
DEFAULT_ALERT_WINDOW = 3600.0
"""Seconds of finished jobs the success rate and the p95 run time are measured over."""
DEFAULT_PENDING_AGE_WARN: float | None = 3600.0
DEFAULT_PENDING_AGE_ERROR: float | None = None
DEFAULT_SUCCESS_RATE_WARN: float | None = None
DEFAULT_SUCCESS_RATE_ERROR: float | None = 0.95
DEFAULT_P95_WARN: float | None = 10.0
DEFAULT_P95_ERROR: float | None = None
DEFAULT_UNCLAIMED_GRACE = 300.0
"""Seconds a type's ready job may wait with none of its type running before status warns that no
worker may have the type registered."""

ENV_DB = "TETHER_DB"
ENV_ROOT = "TETHER_ROOT"
ENV_SCHEMA = "TETHER_SCHEMA"
ENV_DURABILITY = "TETHER_DURABILITY"
ENV_IMPORT = "TETHER_IMPORT"
ENV_BACKLOG_LIMIT = "TETHER_BACKLOG_LIMIT"
ENV_ALERT_WINDOW = "TETHER_ALERT_WINDOW"
ENV_PENDING_AGE_WARN = "TETHER_PENDING_AGE_WARN"
ENV_PENDING_AGE_ERROR = "TETHER_PENDING_AGE_ERROR"
ENV_SUCCESS_RATE_WARN = "TETHER_SUCCESS_RATE_WARN"
ENV_SUCCESS_RATE_ERROR = "TETHER_SUCCESS_RATE_ERROR"
ENV_P95_WARN = "TETHER_P95_WARN"
ENV_P95_ERROR = "TETHER_P95_ERROR"
ENV_UNCLAIMED_GRACE = "TETHER_UNCLAIMED_GRACE"
ENV_LEDGER_ID = "TETHER_LEDGER_ID"
ENV_AWS_CONCURRENCY = "TETHER_AWS_CONCURRENCY"
ENV_TESTING_DB = "TETHER_TEST_DB"

DEFAULT_AWS_CONCURRENCY = 8
"""How many AWS resources a reconcile reads at once."""

ENV_MAX_PAYLOAD_BYTES = "TETHER_MAX_PAYLOAD_BYTES"

DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
"""The largest payload enqueue accepts, as its stored JSON in bytes (``tether.ledger.limits`` checks it)."""

DEFAULT_BATCH_BYTES = 8 * 1024 * 1024
"""The most payload (stored JSON, in bytes) a worker claims in one batch, unless the batch is a
single larger job: what a worker holds follows bytes, not queued jobs (``WorkerConfig.batch_bytes``)."""


def _env(name: str) -> str | None:
    return os.environ.get(name) or None  # an empty variable counts as unset


def db_url(given: str | None = None) -> str:
    """The ledger URL: ``given``, else ``$TETHER_DB``, else ``sqlite:///tether.db``."""
    return given or _env(ENV_DB) or DEFAULT_DB


def root(given: str | os.PathLike[str] | None = None) -> str | os.PathLike[str]:
    """The data root: ``given``, else ``$TETHER_ROOT``, else the working directory."""
    return given or _env(ENV_ROOT) or DEFAULT_ROOT


def named_root(given: str | os.PathLike[str] | None = None) -> str | os.PathLike[str] | None:
    """The data root the caller named (``given``, else ``$TETHER_ROOT``), or None: then a ledger
    uses the root it recorded when it was created."""
    return given or _env(ENV_ROOT)


def testing_db(given: str | None = None) -> str | None:
    """The PostgreSQL database ``tether.testing``'s ledgers go in: ``given`` (``--tether-db``),
    else ``$TETHER_TEST_DB``, else None (each test gets a SQLite ledger of its own)."""
    return given or _env(ENV_TESTING_DB)


def schema(given: str | None = None) -> str | None:
    """The PostgreSQL schema of the ledger: ``given``, else ``$TETHER_SCHEMA``, else the search path's."""
    return given or _env(ENV_SCHEMA)


def durability(given: str | None = None) -> str:
    """SQLite commit durability: ``given``, else ``$TETHER_DURABILITY``, else ``full``."""
    return given or _env(ENV_DURABILITY) or DEFAULT_DURABILITY


def ledger_id(given: str | None = None) -> str | None:
    """This ledger's name in AWS ownership tags: ``given``, else ``$TETHER_LEDGER_ID``, else None
    (the random id recorded in the ledger when it was created, ``meta.settle``)."""
    return given or _env(ENV_LEDGER_ID)


def aws_concurrency(given: int | None = None) -> int:
    """AWS reads a reconcile runs at once: ``given``, else ``$TETHER_AWS_CONCURRENCY``, else 8."""
    if given is not None:
        return max(1, given)
    value = _env(ENV_AWS_CONCURRENCY)
    try:
        return max(1, int(value)) if value else DEFAULT_AWS_CONCURRENCY
    except ValueError:
        raise ConfigError(f"{ENV_AWS_CONCURRENCY} must be a whole number, got {value!r}") from None


def max_payload_bytes(given: int | None = None) -> int:
    """The payload size limit: ``given``, else ``$TETHER_MAX_PAYLOAD_BYTES``, else 16 MiB."""
    value: object = given
    if value is None:
        text = _env(ENV_MAX_PAYLOAD_BYTES)
        if text is None:
            return DEFAULT_MAX_PAYLOAD_BYTES
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{ENV_MAX_PAYLOAD_BYTES} must be a number of bytes, not {text!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"max_payload_bytes must be a positive number of bytes, not {value!r}")
    return value


ENV_DRIFT_RUNS = "TETHER_DRIFT_RUNS"

DEFAULT_DRIFT_RUNS = 10
"""How many reconcile runs' findings the ledger keeps (``tether drift``); older runs' are deleted."""


def drift_runs(given: int | None = None) -> int:
    """Runs whose findings are kept: ``given``, else ``$TETHER_DRIFT_RUNS``, else 10 (at least 1)."""
    if given is not None:
        return max(1, given)
    value = _env(ENV_DRIFT_RUNS)
    try:
        return max(1, int(value)) if value else DEFAULT_DRIFT_RUNS
    except ValueError:
        raise ConfigError(f"{ENV_DRIFT_RUNS} must be a whole number of runs, got {value!r}") from None
