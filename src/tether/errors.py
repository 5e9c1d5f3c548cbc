"""Every error tether raises: one base class, messages that say what to do."""

from __future__ import annotations

from datetime import datetime, timedelta


class TetherError(Exception):
    """Base class of every tether error."""


class ConfigError(TetherError):
    """A setting is wrong (database URL, data root, durability...)."""


class DatabaseUnavailable(TetherError):
    """The database could not be opened or reached."""


class CommitUnknown(TetherError):
    """The connection to the database was lost while the commit was under way: the job(s) may
    or may not have been recorded. Not a DatabaseUnavailable (whose "nothing was enqueued" a
    caller may retry blindly): enqueueing the same job again without an idempotency key can
    record it twice. Look the ids up, or retry with the same key (it returns the first job while
    that job is still pending or running)."""

    def __init__(self, job_ids: list[str], reason: str) -> None:
        self.job_ids = job_ids
        shown = ", ".join(job_ids[:3]) + (f" and {len(job_ids) - 3} more" if len(job_ids) > 3 else "")
        super().__init__(
            f"the connection to the database was lost during the commit ({reason}): job(s) {shown} may or "
            "may not have been recorded. Look them up (tether show ID) before enqueueing again; a retry with "
            "the same idempotency key is safe while the first job is still pending or running, one "
            "without a key can record the job twice"
        )


class NoLedger(DatabaseUnavailable):
    """The database named does not exist or holds no tether ledger; nothing was created."""


class LedgerFault(DatabaseUnavailable):
    """The ledger itself is corrupt, full, read-only, unreadable or gone: retrying cannot mend
    it, so a worker stops (see ``tether.ledger.faults``). The message says what to do."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class TransactionConflict(TetherError):
    """The database ended a transaction to break a conflict with another one (PostgreSQL: a
    deadlock, or a serialization failure). Nothing in it was recorded, and running the same
    transaction again normally succeeds: tether does so with its own transactions; an
    application's own (``session=``) is the application's to roll back and run again."""


class UnknownJobType(TetherError):
    """No job type of this name is registered; ``hint`` says how to register one where it is raised."""

    def __init__(self, name: str, known: list[str], hint: str | None = None) -> None:
        self.name = name
        text = f"unknown job type {name!r}; known types: {', '.join(sorted(known)) or '(none)'}"
        super().__init__(f"{text}; {hint}" if hint else text)


class InvalidPayload(TetherError):
    """A payload does not match its job type's model; nothing was stored."""

    def __init__(self, job_type: str, problems: list[str]) -> None:
        self.job_type = job_type
        self.problems = problems
        super().__init__(f"invalid {job_type} payload: " + "; ".join(problems))


class UnsafePath(InvalidPayload):
    """A path in a payload is absolute, climbs out of the data root, or holds a NUL."""

    def __init__(self, job_type: str, field: str, path: str, rule: str) -> None:
        self.path = path
        super().__init__(
            job_type,
            [f"{field}: {path!r} {rule}; paths must be relative to the data root and stay inside it"],
        )


class JobNotFound(TetherError):
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id!r}")


class UnknownTarget(TetherError):
    """No job in the ledger has touched the target named."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"no job has touched the target {name!r}; name it as reconcile and jobs print it: a data "
            "path (notes/a.json) or an AWS resource (s3_bucket:eu-west-1:logs)"
        )


class AmbiguousJobId(TetherError):
    """A shortened job id matches more than one job: give more of it."""

    def __init__(self, text: str, candidates: list[str]) -> None:
        self.text, self.candidates = text, candidates
        shown = ", ".join(candidates[:5]) + (", ..." if len(candidates) > 5 else "")
        super().__init__(f"{text!r} matches more than one job ({shown}): give more of the id")


class InvalidTransition(TetherError):
    """A status change the lifecycle does not allow (see docs/lifecycle.md)."""

    def __init__(self, job_id: str, current: str, wanted: str) -> None:
        super().__init__(f"job {job_id} is {current}; it cannot become {wanted}")


class NotCancellable(TetherError):
    """Only a pending or running job can be cancelled: a finished one keeps its outcome."""

    def __init__(self, job_id: str, current: str) -> None:
        self.current = current
        super().__init__(f"job {job_id} is {current}; only a pending or running job can be cancelled")


class JobKeptChanging(TetherError):
    """Workers moved a job each time a cancel read it; the cancel can be asked again."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} kept changing while it was cancelled; try again")


class CancelRefused(TetherError):
    """The cancel of one job was refused; the message says why."""


class DuplicateActiveJob(TetherError):
    """A job cannot become active while another active job holds its idempotency key."""

    def __init__(self, job_id: str, other_id: str, key: str) -> None:
        super().__init__(
            f"job {job_id} cannot be retried: job {other_id} is already active with idempotency key {key!r}"
        )


class Superseded(TetherError):
    """A failed job cannot be retried once a newer job on its target has run or is queued."""

    def __init__(self, job_id: str, newer_id: str, target: str) -> None:
        super().__init__(
            f"job {job_id} cannot be retried: job {newer_id}, enqueued after it for {target}, is already "
            "queued or done, and retrying the older one would undo it; enqueue the change anew if you "
            "still want it"
        )


class AlreadyRetried(TetherError):
    """A failed job was already retried with a corrected payload: look at that job (``tether
    show``), and retry it instead if it failed too."""

    def __init__(self, job_id: str, retry_id: str) -> None:
        super().__init__(
            f"job {job_id} was already retried with a corrected payload as job {retry_id}; "
            f"see tether show {retry_id}, and retry that one if it failed too"
        )


class LostLease(TetherError):
    """This worker no longer owns the job (its lock was reclaimed); its outcome was not recorded."""

    def __init__(self, job_id: str, worker: str, attempt: int) -> None:
        self.job_id = job_id
        super().__init__(
            f"job {job_id} attempt {attempt} is no longer held by worker {worker}: "
            "its lock was reclaimed, so this outcome was discarded"
        )


# Outcomes a handler may raise. Any other exception is treated as retryable.


class JobError(TetherError):
    """Base of the errors a handler raises to choose its outcome."""


class RetryableError(JobError):
    """The attempt failed but may succeed later: retried with backoff until attempts run out."""


class StorageFull(RetryableError):
    """The data root has no room for the write (ENOSPC, EDQUOT): a condition of the storage, not
    of the job. The attempt is given back and the job waits a while (the ``snooze`` edge), so a
    full disk never spends a job's attempts; it runs once space returns. Its message names the
    path and the error; free space on the data root's file system."""


class PermanentError(JobError):
    """The job can never succeed as given: it fails at once, without retry."""


class JobTimedOut(RetryableError):
    """An attempt ran past its job's timeout: it was cancelled and is retried like any error."""

    def __init__(self, job_type: str, job_id: str, timeout: float) -> None:
        self.timeout = timeout
        super().__init__(f"{job_type} job {job_id} ran past its timeout of {timeout:g}s and was cancelled")


class Snooze(JobError):
    """Raised by a handler: the job goes back to pending until ``until`` (or ``seconds`` from now)
    without spending an attempt, as River's and Oban's snooze. ``scope`` says who waits with it:
    "job" (the job alone; the later jobs on its target wait behind it anyway, by the order per
    target) or "type" (every pending job of its type too: a limit the type's jobs share, such as
    an API's rate limit). Each snooze is counted on the job; one that snoozes more often than its
    worker allows (``WorkerConfig.max_snoozes``) fails, saying so (``SnoozedTooOften``)."""

    SCOPES = ("job", "type")

    def __init__(
        self, seconds: float | None = None, *, until: datetime | None = None, scope: str = "job", reason: str = ""
    ) -> None:
        self._hold(seconds, until, scope)
        when = f"for {seconds:g}s" if until is None else f"until {until.isoformat()}"
        super().__init__(f"snoozed {when}" + (f": {reason}" if reason else ""))

    def _hold(self, seconds: float | None, until: datetime | None, scope: str) -> None:
        """Check and keep when the snooze ends and who waits; a ValueError names what is wrong."""
        if (seconds is None) == (until is None):
            raise ValueError("Snooze: give seconds or until, not both and not neither")
        if seconds is not None and not 0 <= seconds < 1e9:
            raise ValueError(f"Snooze: seconds must be >= 0, got {seconds!r}")
        if until is not None and until.tzinfo is None:
            raise ValueError("Snooze: until must be timezone-aware (UTC)")
        if scope not in self.SCOPES:
            raise ValueError(f"Snooze: scope must be one of {', '.join(self.SCOPES)}, got {scope!r}")
        self.seconds, self.until, self.scope = seconds, until, scope

    def wakes_at(self, now: datetime) -> datetime:
        """When the job may run again, for a snooze raised at ``now``."""
        return self.until if self.until is not None else now + timedelta(seconds=self.seconds or 0)


class Deferred(Snooze):
    """The rate-limit hold: the attempt could not start its work before ``until`` (an assistant's
    rate limit with a reset time), so the job and every pending job of its type wait until then
    (a Snooze of scope "type" whose message is the limit's own)."""

    def __init__(self, message: str, until: datetime) -> None:
        self._hold(None, until, "type")
        JobError.__init__(self, message)  # the limit's own words, not a snooze's


class SnoozedTooOften(PermanentError):
    """A job snoozed as many times as its worker allows (``WorkerConfig.max_snoozes``) and asked
    once more: it fails rather than wait forever. Look at why its handler keeps snoozing; retry
    it (``tether retry ID``) once that is mended."""

    def __init__(self, snoozes: int, cap: int, last: str) -> None:
        super().__init__(
            f"the job snoozed {snoozes} times, the most a job may (max_snoozes={cap}), and asked again "
            f"({last}): it failed rather than wait forever; find out why its handler keeps snoozing, then retry it"
        )


class Cancelled(JobError):
    """The worker is shutting down; the attempt is given back and the job returns to pending."""
