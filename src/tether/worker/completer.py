"""The worker's completer: decides what each attempt comes to (``decide``, the one place an
outcome becomes a transition) and records the decisions in group commits, through lost
connections, lost commit answers and values the database refuses."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

import sqlalchemy as sa

from .. import events
from ..errors import Cancelled, InvalidPayload, JobTimedOut, PermanentError, Snooze, SnoozedTooOften, StorageFull
from ..jobtypes.datafiles.effects import file_error
from ..ledger import attempts, faults
from ..ledger.backend import LostCommit
from ..ledger.lifecycle import Decision, error_text
from ..ledger.recheck import unsettled
from ..ledger.record import JobRecord
from .cancels import effect_of
from .executor import Returned

if TYPE_CHECKING:
    from ..ledger.queue import Queue
    from .loop import WorkerConfig
    from .producer import Producer
    from .supervisor import Supervisor


# The longest a job waits for space on a full data root before it tries again.
STORAGE_WAIT = timedelta(seconds=60)


class NotRun:
    """The job was claimed but its handler never started (shutdown, a batch that turned slow, a
    loop that ended with jobs in hand): it goes back untouched."""


NOT_RUN = NotRun()


class Unrecordable(NamedTuple):
    """The database refused to store the outcome first decided (``edge``) with ``error``."""

    edge: str
    error: BaseException


class Stopped(NamedTuple):
    """An operator cancelled the job while it ran (``note``: their reason); however the handler
    ended, the attempt ends ``cancelled``."""

    note: str


Outcome = Returned | Exception | NotRun | Unrecordable | Stopped


class Completer:
    """Decides and records the outcomes of one worker's jobs."""

    def __init__(self, queue: Queue, config: WorkerConfig, producer: Producer, supervisor: Supervisor) -> None:
        self.queue = queue
        self.config = config
        self.producer = producer
        self.supervisor = supervisor
        self._full_streak = 0  # jobs in a row that met a full data root (see _storage_wait)

    def decide(self, job: JobRecord, outcome: Outcome, duration: float | None = None) -> Decision:
        """The one place an attempt's outcome becomes a transition: an operator's cancel seen
        while it ran ends it cancelled, with its effect's verdict; a handler that returned
        completes; one not run, or cancelled, gives its attempt back; a handler's snooze (a
        rate limit's hold among them) snoozes the job or its type, up to the worker's cap; a full
        data root snoozes the job, uncounted; a permanent error, an invalid payload or the last
        attempt fails it; any other error retries it after the backoff. An outcome the database
        refused to store, or an error in deciding, fails the job visibly."""
        clock = self.queue.clock
        try:
            if isinstance(outcome, Returned):  # first: nearly every outcome is one
                self._full_streak = 0
                return Decision.complete(job, outcome.result, outcome.children, duration, clock.now())
            if isinstance(outcome, Stopped):
                effect = effect_of(self.queue, job)
                error = f"Cancelled: {outcome.note} (effect: {effect})"
                return Decision.cancel_running(job, error, effect, duration, clock.now())
            if isinstance(outcome, (NotRun, Cancelled)):
                return Decision.release(job, duration, ran=not isinstance(outcome, NotRun))
            if isinstance(outcome, Unrecordable):
                error = f"tether could not record this job's outcome ({outcome.edge}): {faults.describe(outcome.error)}"
                return Decision.fail(job, error, duration)
            now = clock.now()
            if isinstance(outcome, Snooze):
                return self._snoozed(job, outcome, now, duration)
            if isinstance(outcome, StorageFull):
                return Decision.snooze(job, error_text(outcome), now + self._storage_wait(), duration, counted=False)
            ended = attempts.Outcome.TIMEOUT if isinstance(outcome, JobTimedOut) else None  # else the edge's: an error
            if isinstance(outcome, (PermanentError, InvalidPayload)) or job.attempts >= job.max_attempts:
                return Decision.fail(job, error_text(outcome), duration, now, ended)
            run_at = now + self.config.retry.delay(job.attempts)
            return Decision.retry(job, error_text(outcome), run_at, duration, now, ended)
        except Exception as e:  # e.g. a retry policy that raises: the job fails, visibly
            return Decision.fail(job, error_text(e), duration, clock.now())

    def _snoozed(self, job: JobRecord, snooze: Snooze, now: datetime, duration: float | None) -> Decision:
        """A handler's snooze: the job (scope "job") or its whole type (scope "type") waits, the
        attempt given back and the snooze counted; past the worker's cap the job fails instead."""
        cap = self.config.max_snoozes
        if job.snoozes >= cap:
            return Decision.fail(job, error_text(SnoozedTooOften(job.snoozes, cap, str(snooze))), duration, now)
        edge = Decision.defer if snooze.scope == "type" else Decision.snooze
        return edge(job, error_text(snooze), snooze.wakes_at(now), duration)

    def _storage_wait(self) -> timedelta:
        """How long a job that met a full data root waits: the retry policy's backoff over this
        worker's run of such jobs since one last completed, at most ``STORAGE_WAIT``, so that
        space which returns is used soon. Threads share the count; a lost increment only
        shortens one wait."""
        self._full_streak += 1
        return min(self.config.retry.delay(self._full_streak), STORAGE_WAIT)

    def synced(self, pending: list[Decision], failed: dict[str, tuple[str, OSError]]) -> list[Decision]:
        """``pending`` once its jobs' directories are fsynced (``failed`` are the jobs whose
        directory fsync failed): a job whose entry is not durable is never recorded completed;
        its outcome becomes the failed fsync's, as if its handler had raised it."""
        if not failed:
            return pending
        out = []
        for d in pending:
            if d.edge == "complete" and d.job.id in failed:
                rel, e = failed[d.job.id]
                d = self.decide(d.job, file_error(e, rel), d.duration)
            out.append(d)
        return out

    def record(self, decisions: list[Decision], *, claim: int = 0) -> list[JobRecord]:
        """Record outcomes in one group commit and, with ``claim``, take the next jobs in it;
        returns the jobs taken.

        The handlers' effects have happened: keep trying to record them while the database
        is unreachable (the heartbeat keeps the locks meanwhile). If we give up at a hard
        shutdown, the locks go stale and the jobs re-run; handlers are idempotent. A commit
        whose answer was lost is read back before anything is recorded again (ledger/recheck.py)."""
        supervisor = self.supervisor
        backoff = 0.0
        refused_once = False
        unsure = False  # the last attempt's COMMIT may have landed
        while True:
            try:
                if unsure:
                    decisions, unsure = unsettled(self.queue, supervisor.worker_id, decisions), False
                    if not decisions:
                        return []
                return self._commit(decisions, claim)
            except LostCommit:
                # Read back at once (the pool opens a new connection); if the database is down,
                # the read fails and waits below. Jobs the lost commit may have claimed for the
                # next batch run nowhere until the sweep finds their locks stale.
                unsure, claim = True, 0
            except (sa.exc.OperationalError, sa.exc.InterfaceError) as e:
                if supervisor.fatal(e):
                    return []  # unrecorded: the locks go stale and the jobs run again elsewhere
                # Recording must not wait on claiming (which may be what fails), and a commit
                # that went through unseen must not leave a second batch claimed: retry without.
                claim = 0
                backoff = supervisor.next_backoff(backoff)
                supervisor.db_error(e, retry_in=backoff, jobs=len(decisions))
                if supervisor.stopping.wait(backoff) and supervisor.cancel.is_set():
                    return []
            except sa.exc.SQLAlchemyError as e:
                if supervisor.fatal(e):
                    return []
                refused = self._refused(decisions, e, refused_once)
                if not refused:
                    return []
                decisions, refused_once = refused, True

    def _commit(self, decisions: list[Decision], claim: int) -> list[JobRecord]:
        """One attempt at a group commit (and the next claim in it)."""
        waits = self.queue.backend.lock_waits
        claimed = self.queue.finish_and_claim(
            self.supervisor.worker_id, decisions, records=False, claim=claim, claim_bytes=self.config.batch_bytes
        )[1]
        if claim:
            self.producer.adapt(self.queue.backend.lock_waits != waits)
        return claimed

    def _refused(self, decisions: list[Decision], e: sa.exc.SQLAlchemyError, again: bool) -> list[Decision]:
        """The database refuses these outcomes (a value it cannot store): retrying would never
        end, so each is recorded alone, and one it refuses becomes a plain failure to record;
        returns what to record next (nothing once even the plain failure was refused, ``again``:
        the lock will go stale)."""
        events.emit("db_refused", worker=self.supervisor.worker_id, error=faults.describe(e), jobs=len(decisions))
        if len(decisions) > 1:
            for d in decisions:
                self.record([d])
            return []
        if again:
            return []
        [d] = decisions
        return [self.decide(d.job, Unrecordable(d.edge, e), d.duration)]
