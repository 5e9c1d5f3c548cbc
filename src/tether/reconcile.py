"""Ledger vs world: does the disk hold what the completed jobs say they did?

For every target (a data path) the expectation is the effect of the *latest* completed job on it:
jobs on one target take effect in enqueue (id) order, so that is the one with the highest id. The
reconciler streams every job by ``(ordering_key, id)`` through ``ix_tether_jobs_target`` in short
read-only batches: each target's jobs arrive together, its latest last, so it holds one target at
a time and memory does not grow with the number of jobs. It reports, logs and never repairs.

A target with a pending or claimed job is in flight (``not_checked``). A target whose check
disagrees is checked once more against the ledger after the disk was read: if a job touched it
meanwhile, it is in flight, not drift. So a worker running alongside never causes false drift.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import sqlalchemy as sa

from . import events, fs
from .engine import READ_ONLY
from .jobtypes.base import IN_SYNC, MISSING, MODIFIED, UNEXPECTED, UNKNOWN, Check, file_target

if TYPE_CHECKING:
    from .coordinator import Coordinator
    from .jobtypes import Registry

NOT_CHECKED = "not_checked"
LEFTOVER_TEMP = "leftover_temp"
UNTRACKED = "untracked"

STATUSES = (IN_SYNC, MISSING, MODIFIED, UNEXPECTED, LEFTOVER_TEMP, UNTRACKED, NOT_CHECKED, UNKNOWN)
DRIFT = frozenset({MISSING, MODIFIED, UNEXPECTED, LEFTOVER_TEMP, UNTRACKED})
"""Statuses that are drift (exit 2). ``not_checked`` is in flight; ``unknown`` could not be read."""

BATCH = 2000

# Every job with a target, in target order and, within one target, in enqueue order.
PAGE = sa.text("""
SELECT id, type, status, ordering_key, payload FROM tether_jobs
WHERE (ordering_key, id) > (:after_key, :after_id) AND status IN ('pending', 'claimed', 'completed')
ORDER BY ordering_key, id
LIMIT :limit
""")
# Asked again after the disk was read, for targets that disagreed: the latest completed job and
# whether one is active now, per target.
RECHECK = sa.text("""
SELECT ordering_key,
       max(CASE WHEN status = 'completed' THEN id END),
       max(CASE WHEN status IN ('pending', 'claimed') THEN 1 ELSE 0 END)
FROM tether_jobs WHERE ordering_key IN :keys
GROUP BY ordering_key
""").bindparams(sa.bindparam("keys", expanding=True))
ACTIVE_ON = sa.text("""
SELECT 1 FROM tether_jobs WHERE ordering_key = :key AND status IN ('pending', 'claimed') LIMIT 1
""")
KNOWN_TARGETS = sa.text(
    "SELECT DISTINCT ordering_key FROM tether_jobs WHERE ordering_key IN :keys"
).bindparams(sa.bindparam("keys", expanding=True))
COUNT_TARGETED = sa.text("SELECT count(*) FROM tether_jobs WHERE ordering_key IS NOT NULL")

# ``.<name>.<8 hex>.tether-tmp``: fs.atomic_write's temp file for ``<name>`` in the same directory.
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{8}" + re.escape(fs.TEMP_SUFFIX) + "$")


@dataclass(frozen=True, slots=True)
class Finding:
    """One path that is not in sync: what the ledger expected (set by ``job_id``) and what is there."""

    path: str
    status: str
    job_id: str | None = None
    job_type: str | None = None
    expected_size: int | None = None
    expected_sha256: str | None = None
    actual_size: int | None = None
    actual_sha256: str | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    """The answer of one check. ``exit_code`` is Terraform's ``-detailed-exitcode``: 0 in sync,
    2 drift found, 1 could not check (here: some path could not be read, and no drift found)."""

    checked_at: datetime
    content: bool
    untracked: bool
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    findings: list[Finding] = field(default_factory=list)
    newest_job_id: str | None = None
    finished_at: datetime | None = None

    @property
    def drift(self) -> int:
        return sum(self.counts[s] for s in DRIFT)

    @property
    def exit_code(self) -> int:
        if self.drift:
            return 2
        return 1 if self.counts[UNKNOWN] else 0

    @property
    def checked(self) -> int:
        """Targets and files looked at (every status)."""
        return sum(self.counts.values())

    def summary(self) -> dict[str, Any]:
        return {
            "checked_at": self.checked_at.isoformat(),
            "newest_job_id": self.newest_job_id,
            "mode": "content" if self.content else "exists",
            "drift": self.drift,
            "exit_code": self.exit_code,
            "counts": dict(self.counts),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "untracked_checked": self.untracked,
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass(slots=True)
class _Target:
    """One target's jobs as they stream by: only the latest completed one is kept."""

    key: str
    latest_id: str | None = None
    latest_type: str | None = None
    latest_payload: str | None = None
    active_id: str | None = None
    probed: bool = False


def reconcile(
    coordinator: Coordinator,
    *,
    content: bool = True,
    untracked: bool = False,
    batch_size: int = BATCH,
    progress: Callable[[int], None] | None = None,
) -> Report:
    """Compare the ledger with the data root; write nothing anywhere.

    ``content`` false checks existence only (no file is read). ``untracked`` also reports files
    under the root that no job ever named. ``progress`` is called with the number of jobs read
    after each batch."""
    reconciler = _Reconciler(coordinator.engine, coordinator.root, coordinator.registry, content, untracked,
                             batch_size, progress)
    report = reconciler.run(coordinator.clock.now())
    report.finished_at = coordinator.clock.now()
    events.emit("reconcile.finished", **report.summary())
    return report


def count_targeted_jobs(coordinator: Coordinator) -> int:
    """How many jobs a check will stream (for a progress bar's total)."""
    with coordinator.engine.connect().execution_options(**READ_ONLY) as conn:
        return int(conn.execute(COUNT_TARGETED).scalar_one())


class _Reconciler:
    def __init__(self, engine: sa.Engine, root: Path, registry: Registry, content: bool, untracked: bool,
                 batch_size: int, progress: Callable[[int], None] | None) -> None:
        self.engine = engine
        self.root = root
        self.content = content
        self.untracked = untracked
        self.batch_size = batch_size
        self.progress = progress
        self.probes = {name: registry.get(name).probe for name in registry.names()}
        self.suspects: list[tuple[str, Finding]] = []
        self.report: Report

    def run(self, now: datetime) -> Report:
        self.report = Report(checked_at=now, content=self.content, untracked=self.untracked)
        for target in self._targets():
            self._check(target)
            if len(self.suspects) >= 500:
                self._recheck()
        self._recheck()
        self._walk()
        self.report.findings.sort(key=lambda f: f.path)
        return self.report

    # -- the ledger ------------------------------------------------------------------------

    def _read(self, statement: sa.TextClause, params: dict[str, Any]) -> list[Any]:
        """One short read-only transaction: a long check never holds a snapshot open (which on
        SQLite would stop WAL checkpoints for its whole duration)."""
        with self.engine.connect().execution_options(**READ_ONLY) as conn:
            return list(conn.execute(statement, params))

    def _targets(self) -> Iterator[_Target]:
        """Each target with its latest completed job and whether a job on it is active."""
        after_key, after_id, read = "", "", 0
        current: _Target | None = None
        while True:
            rows = self._read(PAGE, {"after_key": after_key, "after_id": after_id, "limit": self.batch_size})
            for job_id, job_type, status, key, payload in rows:
                if current is None or key != current.key:
                    if current is not None and current.probed:
                        yield current
                    current = _Target(key)
                if job_type in self.probes and self.probes[job_type] is not None:
                    current.probed = True
                if status == "completed":
                    current.latest_id, current.latest_type, current.latest_payload = job_id, job_type, payload
                elif current.active_id is None:
                    current.active_id = job_id
                if self.report.newest_job_id is None or job_id > self.report.newest_job_id:
                    self.report.newest_job_id = job_id
            read += len(rows)
            if self.progress is not None:
                self.progress(read)
            if len(rows) < self.batch_size:
                break
            after_key, after_id = rows[-1][3], rows[-1][0]
        if current is not None and current.probed:
            yield current

    def _check(self, target: _Target) -> None:
        path = _display(target.key)
        if target.active_id is not None:
            self._found(Finding(path, NOT_CHECKED, target.active_id, detail="a job on this path is pending or claimed"))
            return
        probe = self.probes.get(target.latest_type or "")
        if target.latest_id is None or probe is None:
            self._found(Finding(path, NOT_CHECKED, target.latest_id, target.latest_type,
                                detail=f"the latest job's type {target.latest_type!r} has no probe"))
            return
        assert target.latest_payload is not None
        try:
            check = probe.check(target.latest_payload, self.root, content=self.content)
        except Exception as e:  # a probe bug or a payload it cannot read: this target is unknown
            check = Check(UNKNOWN, detail=f"probe failed: {type(e).__name__}")
        if check.status == IN_SYNC:
            self.report.counts[IN_SYNC] += 1
            return
        finding = Finding(path, check.status, target.latest_id, target.latest_type, check.expected_size,
                          check.expected_sha256, check.actual_size, check.actual_sha256, check.detail)
        if check.status in DRIFT:
            self.suspects.append((target.key, finding))
        else:
            self._found(finding)

    def _recheck(self) -> None:
        """The disk was read after the ledger: if a job has touched a target since, what we saw may
        be its effect. Only a target on which the ledger still agrees is drift."""
        if not self.suspects:
            return
        now = {key: (latest, active) for key, latest, active in
               self._read(RECHECK, {"keys": [key for key, _ in self.suspects]})}
        for key, finding in self.suspects:
            latest, active = now.get(key, (None, 0))
            if active or latest != finding.job_id:
                finding = Finding(finding.path, NOT_CHECKED, finding.job_id, finding.job_type,
                                  detail="a job touched this path during the check")
            self._found(finding)
        self.suspects = []

    def _found(self, finding: Finding) -> None:
        self.report.counts[finding.status] += 1
        self.report.findings.append(finding)
        if finding.status in DRIFT:
            events.emit("drift.detected", **finding.to_dict())
        elif finding.status == UNKNOWN:
            events.emit("reconcile.unreadable", path=finding.path, job_id=finding.job_id, detail=finding.detail)

    # -- the data root ---------------------------------------------------------------------

    def _walk(self) -> None:
        """Leftover temp files, and (on request) files no job ever named. Never enters ``.tether/``
        or follows a symlinked directory."""
        pending: list[tuple[str, int | None]] = []
        for rel, entry in _entries(self.root):
            if entry is None:
                self._found(Finding(rel, UNKNOWN, detail="directory could not be listed"))
            elif rel.endswith(fs.TEMP_SUFFIX):
                self._temp(rel)
            elif self.untracked:
                pending.append((rel, _size(entry)))
                if len(pending) >= 500:
                    self._untracked(pending)
                    pending = []
        if pending:
            self._untracked(pending)

    def _temp(self, rel: str) -> None:
        directory, _, name = rel.rpartition("/")
        match = _TEMP_NAME.match(name)
        if match:
            target = f"{directory}/{match['target']}" if directory else match["target"]
            if self._read(ACTIVE_ON, {"key": file_target(target)}):
                return  # a running job's write in progress
        try:  # asked after the ledger: gone means a write finished meanwhile
            size = os.lstat(os.path.join(self.root, rel)).st_size
        except FileNotFoundError:
            return
        except OSError as e:
            self._found(Finding(rel, UNKNOWN, detail=e.strerror))
            return
        self._found(Finding(rel, LEFTOVER_TEMP, actual_size=size, detail="temp file of an interrupted write"))

    def _untracked(self, files: list[tuple[str, int | None]]) -> None:
        keys = {}
        for rel, size in files:
            try:
                rel.encode()
            except UnicodeEncodeError:  # not UTF-8 on disk: no payload can name it
                self._found(Finding(rel.encode(errors="surrogateescape").decode(errors="replace"), UNTRACKED, actual_size=size))
                continue
            keys[file_target(rel)] = (rel, size)
        if not keys:
            return
        known = {row[0] for row in self._read(KNOWN_TARGETS, {"keys": list(keys)})}
        for key, (rel, size) in keys.items():
            if key not in known:
                self._found(Finding(rel, UNTRACKED, actual_size=size, detail="no job ever named this file"))


def _entries(root: Path) -> Iterator[tuple[str, os.DirEntry[str] | None]]:
    """(relative path, entry) of every non-directory entry under ``root``, skipping ``.tether/``;
    (directory, None) for a directory that could not be listed."""
    stack = [""]
    while stack:
        prefix = stack.pop()
        try:
            entries = os.scandir(os.path.join(root, prefix) if prefix else root)
        except FileNotFoundError:
            continue
        except OSError:
            yield prefix.rstrip("/") or ".", None
            continue
        with entries:
            for entry in entries:
                rel = f"{prefix}{entry.name}"
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:
                    if rel != fs.INTERNAL_DIR:
                        stack.append(rel + "/")
                    continue
                yield rel, entry


def _size(entry: os.DirEntry[str]) -> int | None:
    try:
        return entry.stat(follow_symlinks=False).st_size
    except OSError:
        return None


def _display(key: str) -> str:
    """``file:notes/a.json`` -> ``notes/a.json``: the target as the operator names it."""
    return key.partition(":")[2] or key
