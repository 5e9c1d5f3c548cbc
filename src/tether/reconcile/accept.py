"""Accepting drift: what is on disk (or in AWS) now becomes a target's expected state.

Each accept is one ``adopt`` job, written completed (its handler has no effect, so nothing waits
for a worker): it is the target's latest completed job, so the next check compares the target
with the facts it holds. It records who accepted and why, and is an ordinary row of the jobs
table: a target's history lists it among the others.

A file: its size and sha256 now (or its absence), and the fingerprint of the file read for them, so
the next content check reads it only if its stat has changed. An AWS resource: the fields its latest
``sync_aws`` job declared, with the values AWS holds now, kept as the accepted config (a resource
gone: accepted absent). The application's model is not changed: the accept holds until the
next job on the target, so the model's desired state wins again the next time it is saved.
"""

from __future__ import annotations

import getpass
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
import sqlalchemy as sa

from ..errors import ConfigError, TetherError
from ..jobtypes.adopt import Adopt
from ..jobtypes.aws.resource import RESOURCES
from ..jobtypes.base import IN_SYNC, MISSING, MODIFIED
from ..jobtypes.datafiles import durable, fingerprint, paths
from ..jobtypes.target import AWS, Target, file_key
from ..ledger.record import JobRecord
from ..ledger.schema import ACTIVE_SQL, jobs
from ..ledger.status import JobStatus

if TYPE_CHECKING:
    from ..coordinator import Coordinator


class CannotAccept(TetherError):
    """A target's present state cannot be accepted now (a job on it is in flight, it cannot be read)."""


def target_key(name: str) -> str:
    """The target an operator names: a file's path, ``<aws type>:<region>:<id>`` as a check
    shows an AWS resource, or a target key (``file:...``, ``aws:...``)."""
    kind, sep, _ = name.partition(":")
    if sep and kind in ("file", AWS):
        return name
    if sep and kind in RESOURCES:
        return f"{AWS}:{name}"
    try:
        return file_key(paths.normalize(name))
    except paths.PathRejected as e:
        raise ConfigError(f"target {name!r} {e}") from e


def accept(
    coordinator: Coordinator, names: Sequence[str], *, reason: str | None = None, by: str | None = None
) -> list[JobRecord]:
    """Record each named target's present state as its expected state (one ``adopt`` job each,
    completed, in one transaction). CannotAccept if a job on one of them is pending or claimed."""
    who = by or getpass.getuser()
    keys = list(dict.fromkeys(target_key(n) for n in names))
    present = [_present(coordinator, key) for key in keys]
    adopts = [Adopt(target=key, by=who, reason=reason, **facts) for key, (facts, _) in zip(keys, present, strict=True)]
    built = coordinator.queue.enqueuer.build(adopts)
    now = coordinator.clock.now()
    done = [job._replace(status=JobStatus.COMPLETED, completed_at=now, max_attempts=1) for job in built]
    rows = [
        {**job._asdict(), "status": job.status.value, "blocked": False, "fingerprint": fingerprint_of}
        for job, (_, fingerprint_of) in zip(done, present, strict=True)
    ]
    with coordinator.engine.begin() as conn:
        busy = conn.execute(
            sa.select(jobs.c.ordering_key).where(jobs.c.ordering_key.in_(keys), sa.text(ACTIVE_SQL)).distinct()
        ).scalars()
        in_flight = sorted(busy)
        if in_flight:
            raise CannotAccept(
                f"a job on {', '.join(in_flight)} is pending or claimed: accept once it has ended "
                "(its effect may be what you see)"
            )
        conn.execute(sa.insert(jobs), rows)
    return done


def _present(coordinator: Coordinator, key: str) -> tuple[dict[str, Any], str | None]:
    """The facts an adopt of ``key`` holds (what is there now), and the fingerprint of the file
    read for them (None: not a file there)."""
    target = Target.parse(key)
    if target.kind == AWS:
        return {"aws": _aws_present(coordinator, key)}, None
    try:
        data, known = durable.read_known(coordinator.root, target.identity)
    except FileNotFoundError:
        return {"exists": False}, None
    except OSError as e:
        raise CannotAccept(f"{target.identity}: cannot read it ({e.strerror or e}): nothing accepted") from e
    return {"size": len(data), "sha256": durable.sha256(data)}, fingerprint.of(known)


def _aws_present(coordinator: Coordinator, key: str) -> dict[str, Any]:
    """The latest ``sync_aws`` payload on ``key`` with its declared fields as AWS holds them."""
    from ..jobtypes.aws.sync import SyncAwsProbe

    query = (
        sa.select(jobs.c.payload)
        .where(jobs.c.ordering_key == key, jobs.c.status == "completed", jobs.c.type == "sync_aws")
        .order_by(jobs.c.id.desc())
        .limit(1)
    )
    with coordinator.engine.connect() as conn:
        payload = conn.execute(query).scalar()
    if payload is None:
        raise CannotAccept(f"{key}: no completed sync_aws job declares it: nothing to accept against")
    declared = orjson.loads(payload)
    check = SyncAwsProbe().check(key, payload, coordinator.root, content=True)
    config = dict(declared.get("config") or {})
    if check.status == MISSING:
        config = {"state": "absent"}
    elif check.status == MODIFIED and isinstance(check.actual, dict):
        config.update({k: v for k, v in check.actual.items() if v is not None})
    elif check.status != IN_SYNC:
        raise CannotAccept(f"{key}: {check.status} ({check.detail or 'no detail'}): nothing accepted")
    return {**declared, "config": config}
