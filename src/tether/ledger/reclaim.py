"""Who is to blame when a worker dies: the stale-lock sweep's verdict on each job it held.

A worker claims up to a batch of jobs in one statement and records their outcomes in group
commits, so when it dies (a segfault, the OOM killer, ``os._exit`` in a handler) the ledger
knows which of its jobs have no committed outcome, but not which one was running. Writing a
"now running" mark before every job would cost a commit per job, the very thing batching saves.

So the sweep judges by claim (jobs that share ``locked_by`` and ``claimed_at`` came from one
claim statement):

- **alone**: the claim's only job without an outcome was the one running (or it finished and
  the worker died before recording it): it keeps the attempt its claim counted, fails if that
  was its last, and is quarantined (``crashed``).
- **batch**: several jobs of the claim have no outcome; any one of them may have killed the
  worker. Each gets its attempt back and is quarantined as a suspect of that claim
  (``suspect:<claim>``). A quarantined job is claimed alone (CLAIM in statements/sqlite.sql), so from then on a
  crash is pinned on exactly one job.
- A suspect that then kills its worker alone is charged that earlier batch crash too (it was the
  first of the batch to crash alone; suspects run in the batch's own order), and the batch's
  other suspects are acquitted of it (``suspect``): a poison job fails after exactly
  ``max_attempts`` crashes while it was running, and no batch-mate loses an attempt for it.

A job on its last attempt is claimed alone too (CLAIM in statements/sqlite.sql), so the crash that uses up its last
attempt is always pinned at once: with ``max_attempts`` 1 every job runs alone, at a commit each.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from .record import JobRecord

CRASHED = "crashed"  # a worker died while running it alone
SUSPECT = "suspect"  # it was in a crashed batch whose crash another job has been charged for
_SUSPECT_OF = "suspect:"  # + the claim: it was in that crashed batch, which nobody has been charged for yet


class Verdict(NamedTuple):
    """What the sweep does to one stale job: ``edge`` (reclaim or reclaim_exhausted) with the
    attempt count, quarantine and error it sets; ``acquit`` names the crashed batch whose other
    suspects no longer owe its crash."""

    job: JobRecord
    edge: str
    attempts: int
    quarantine: str
    error: str
    acquit: str | None = None


def claim_of(job: JobRecord) -> str:
    """The claim statement that took ``job``: its worker and claim time."""
    claimed_at = job.claimed_at.isoformat() if job.claimed_at else "?"
    return f"{job.locked_by} {claimed_at}"


def verdicts(stale: Iterable[JobRecord]) -> list[Verdict]:
    """The verdict on each of ``stale`` (claimed jobs whose lock expired), in claim order."""
    claims: dict[str, list[JobRecord]] = {}
    for job in sorted(stale, key=lambda j: (-j.priority, j.created_at, j.id)):
        claims.setdefault(claim_of(job), []).append(job)
    charged: set[str] = set()  # crashed batches charged in this sweep
    out = []
    for claim, jobs in claims.items():
        lock = f"lock of worker {jobs[0].locked_by} expired"
        if len(jobs) > 1:
            for job in jobs:
                error = (
                    f"worker died while running a batch of {len(jobs)} jobs holding this one (reclaimed, attempt "
                    f"given back; it runs alone until it completes or fails): {lock}"
                )
                out.append(Verdict(job, "reclaim", job.attempts - 1, _SUSPECT_OF + claim, error))
            continue
        [job] = jobs
        owed = job.quarantine or ""
        acquit = None
        attempts = job.attempts
        if owed.startswith(_SUSPECT_OF) and owed not in charged:
            # The batch crash it was suspected of: it has now killed a worker alone.
            charged.add(owed)
            acquit = owed
            attempts = min(attempts + 1, job.max_attempts)
        edge = "reclaim_exhausted" if attempts >= job.max_attempts else "reclaim"
        left = "; no attempts left" if edge == "reclaim_exhausted" else ""
        error = f"worker died while running (reclaimed, attempt {attempts} of {job.max_attempts}{left}): {lock}"
        out.append(Verdict(job, edge, attempts, CRASHED, error, acquit))
    return out
