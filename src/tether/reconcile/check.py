"""Ledger vs world: does the disk hold what the completed jobs say they did?

For every target (a data path, a resource) the expectation is the effect of the *latest*
completed job on it: jobs on one target take effect in enqueue (id) order, so that is the one with
the highest id. The targets stream from the ledger (``targets.py``), each type's go to its probe,
then the data root is walked for what no job explains (``walk.py``). It reports, logs and never
repairs.

A target with a pending or claimed job is in flight (``not_checked``). A target whose check
disagrees is checked once more against the ledger after the disk was read: if a job touched it
meanwhile, it is in flight, not drift. So a worker running alongside never causes false drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from itertools import repeat
from operator import eq, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from .. import events, tracing
from ..jobtypes.base import SYNCED, Check, Probe
from ..jobtypes.datafiles import fingerprint
from ..jobtypes.datafiles.existence import listings
from ..jobtypes.target import display, file_key
from . import collector, ignore
from . import runs as reconcile_runs
from .drift import DRIFT, IN_SYNC, NOT_CHECKED, STATUSES, UNKNOWN, UNTRACKED, Finding, Report
from .reads import LedgerReads, count_targets
from .targets import Targets, TargetStream
from .walk import Listed, RootWalk

if TYPE_CHECKING:
    from ..coordinator import Coordinator
    from ..jobtypes import Registry

__all__ = ["DRIFT", "STATUSES", "Finding", "Report", "count_targeted", "reconcile"]

FILE_PREFIX = file_key("")
_AFTER_PREFIX = itemgetter(slice(len(FILE_PREFIX), None))
BATCH = 2000
RECHECK_AT = 500  # suspects held before they are checked again against the ledger
_REMOVED = Check(UNKNOWN, detail="the job's row was removed during the check")


@tracing.traced("tether.reconcile", lambda report: report.span_attributes())
def reconcile(
    coordinator: Coordinator,
    *,
    content: bool = True,
    full: bool = False,
    untracked: bool = False,
    batch_size: int = BATCH,
    progress: Callable[[int], None] | None = None,
    aws: bool | None = None,
) -> Report:
    """Compare the ledger with the data root; change nothing (the one write is the check's
    verdict and findings, kept in ``tether_reconcile_runs`` and ``tether_drift_findings`` for
    metrics, pages and ``tether drift``). Findings an ignore rule of the data root matches
    (``ignore.py``) are listed under ``report.ignored``, never counted as drift.

    ``content`` false checks existence only (no file is read). A content check reads only the
    files whose stat no longer reads as the fingerprint recorded when their bytes were last known
    (``Probe.fingerprints``, ``datafiles/fingerprint.py``), with the verdicts of reading them all,
    and records a new fingerprint for each file it read in sync; ``full`` reads every file and
    records nothing. ``untracked`` also reports files
    under the root that no job ever named, and AWS resources carrying this ledger's ownership tag
    that no job names: looked for when the ledger holds a ``sync_aws`` job, or on any ledger with
    ``aws`` true. ``aws`` false leaves AWS alone: its targets are ``not_checked``, nothing is
    listed. ``progress`` is called with the number of targets read after each batch."""
    reconciler = _Reconciler(
        coordinator.engine, coordinator.root, coordinator.registry, content, untracked, batch_size, progress, full=full
    )
    reconciler.remote_allowed = set() if aws is False else {"aws"}
    reconciler.remote_asked = {"aws"} if aws else set()
    reconciler.ledger_id = coordinator.queue.ledger_id
    report = reconciler.run(coordinator.clock.now())
    _ignore(report, ignore.load(coordinator.root))
    for finding in report.findings:  # after the ignore rules: an ignored finding is listed, not an alert
        if finding.status in DRIFT:
            events.emit("drift_detected", **finding.to_dict())
    report.finished_at = coordinator.clock.now()
    events.emit("reconcile_finished", **report.summary())
    reconcile_runs.record(coordinator.engine, report)
    return report


def _ignore(report: Report, rules: list[ignore.Rule]) -> None:
    """Move the findings an ignore rule matches to ``report.ignored``, out of the counts."""
    report.findings, report.ignored = ignore.split(report.findings, rules)
    for finding, _ in report.ignored:
        report.counts[finding.status] -= 1


def count_targeted(coordinator: Coordinator) -> int:
    """How many targets a check will stream (for a progress bar's total)."""
    return count_targets(coordinator.engine)


class _Reconciler:
    def __init__(
        self,
        engine: sa.Engine,
        root: Path,
        registry: Registry,
        content: bool,
        untracked: bool,
        batch_size: int,
        progress: Callable[[int], None] | None,
        *,
        full: bool = False,
    ) -> None:
        self.root = root
        self.content = content
        self.full = full
        self.untracked = untracked
        self.batch_size = batch_size
        self.progress = progress
        self.probes = {name: registry.get(name).probe for name in registry.names()}
        # Payloads only of the types whose probes read them in this mode: an existence check of
        # file jobs reads the target index alone, whatever other types are registered. A content
        # check by fingerprints reads the fingerprints of the types that record them instead, and
        # their payloads only for the files it reads.
        fingerprinted = (
            sorted(name for name, probe in self.probes.items() if probe is not None and probe.fingerprints)
            if content and not full
            else []
        )
        wanting = sorted(
            name
            for name, probe in self.probes.items()
            if probe is not None and probe.wants_payload(content=content) and name not in fingerprinted
        )
        self.by_fingerprint = set(fingerprinted)
        self.reads = LedgerReads(engine, wanting, fingerprinted)
        self.suspects: list[tuple[str, Finding]] = []
        self.report: Report
        # Probes that read a remote world (``Probe.remote``: "aws") run only when allowed; the
        # targets they were asked about feed the search for untracked remote resources.
        self.remote_allowed: set[str] = set()
        self.remote_seen: dict[str, set[str]] = {}
        # Searched for untracked resources on any ledger (asked by name); the others only on a
        # ledger holding their types' jobs: one of files needs no AWS library or credentials.
        self.remote_asked: set[str] = set()
        self.ledger_id = ""
        self.collecting = True  # whether the collector ran before this check (see _collector_paused)

    def run(self, now: datetime) -> Report:
        self.report = Report(checked_at=now, content=self.content, untracked=self.untracked, full=self.full)
        listed: Listed = {}
        token = listings.set(None if self.untracked else listed)
        try:
            with collector.paused() as self.collecting:
                self._ledger_pass()
        finally:
            listings.reset(token)
        self._recheck()
        # After the ledger pass. (Overlapping this walk with it in a thread measured no faster
        # here: the GIL-bound parts of both compete.)
        RootWalk(self.root, self.reads, self._found, untracked=self.untracked, trust=not self.full).run(listed)
        if self.untracked:
            self._remote_untracked()
        self.report.findings.sort(key=lambda f: f.path)
        return self.report

    def _ledger_pass(self) -> None:
        """Every target the ledger names, a page at a time, to its type's probe."""
        stream = TargetStream(self.reads, self.batch_size)
        for ready in stream:
            self.report.newest_job_id = stream.newest
            self._check_all(ready)
            if len(self.suspects) >= RECHECK_AT:
                self._recheck()
            if self.progress is not None:
                self.progress(stream.read)

    # -- asking the probes -------------------------------------------------------------------

    def _check_all(self, ready: Targets) -> None:
        """Ask each type's probe about its targets, a batch at a time. Per target only where one
        is in flight; the rest go to the probes by type, selected in C."""
        types = ready.job_types
        if None in types:
            detail = "a job on this path is pending or claimed"
            for key, job_id, job_type in zip(ready.keys, ready.job_ids, types, strict=True):
                if job_type is None:
                    self._found(Finding(display(key), NOT_CHECKED, job_id, detail=detail))
            ready = ready.select(types)  # the rest: types are never empty strings
            types = ready.job_types
        kinds = dict.fromkeys(types)  # in page order: probes asked, and drift reported, in a stable order
        for job_type in kinds:
            assert job_type is not None  # the in-flight targets were taken out above
            of_type = ready if len(kinds) == 1 else ready.select(map(eq, types, repeat(job_type)))
            self._check_type(job_type, of_type)

    def _check_type(self, job_type: str, targets: Targets) -> None:
        probe = self.probes.get(job_type)
        if probe is None:
            # Said, not skipped: a check run without the application's job types, or of a type
            # nothing can check, must not read as "all in sync".
            why = (
                f"job type {job_type!r} is not registered here (pass --import MODULE)"
                if job_type not in self.probes
                else f"type {job_type!r} has no probe: its effect cannot be checked"
            )
            for key, job_id in zip(targets.keys, targets.job_ids, strict=True):
                self._found(Finding(display(key), NOT_CHECKED, job_id, job_type, detail=why))
            return
        remote = probe.remote
        if remote and remote not in self.remote_allowed:
            detail = f"{remote} not checked (--no-{remote})"
            for key, job_id in zip(targets.keys, targets.job_ids, strict=True):
                self._found(Finding(display(key), NOT_CHECKED, job_id, job_type, detail=detail))
            return
        if not remote:
            self._check_with(probe, job_type, targets)
            return
        self.remote_seen.setdefault(job_type, set()).update(targets.keys)
        with collector.running(self.collecting):
            self._check_with(probe, job_type, targets)

    def _check_with(self, probe: Probe, job_type: str, targets: Targets) -> None:
        """Ask ``probe`` about the targets of ``job_type`` and count or report its answers."""
        keys, job_ids = targets.keys, targets.job_ids
        if job_type in self.by_fingerprint:
            with_payload = True
            checks = self._by_fingerprint(probe, targets)
        else:
            with_payload = probe.wants_payload(content=self.content)
            if with_payload and None in targets.payloads:  # some too large for a page: read apart
                checks = self._apart(probe, targets)
            else:
                checks = self._ask(probe, list(zip(keys, targets.payloads, strict=True)))
        if checks.count(SYNCED) == len(checks):  # the common case, counted in C
            self.report.counts[IN_SYNC] += len(checks)
            return
        if not with_payload:
            # The report says what was expected: ask again, with payloads, about the few
            # targets that disagree.
            again = [n for n, c in enumerate(checks) if c is not SYNCED and c.status != IN_SYNC]
            for part in self._by_id(probe, targets, again):  # a job removed meanwhile: as first asked
                for n, check in part:
                    checks[n] = check
        in_sync = 0
        for key, job_id, check in zip(keys, job_ids, checks, strict=True):
            if check is SYNCED or check.status == IN_SYNC:
                in_sync += 1
                continue
            finding = Finding.of(display(key), check, job_id, job_type)
            if check.status in DRIFT:
                self.suspects.append((key, finding))
            else:
                self._found(finding)
        self.report.counts[IN_SYNC] += in_sync

    def _by_fingerprint(self, probe: Probe, targets: Targets) -> list[Check]:
        """The content check of a type that records fingerprints: in sync where the file's stat
        reads as its fingerprint; the rest asked of ``probe`` with their payloads (read by id)
        as a full read asks, and a new fingerprint recorded for each found in sync."""
        keys, job_ids = targets.keys, targets.job_ids
        rels: list[str | None] = list(map(_AFTER_PREFIX, keys))  # in C; mostly every target a file's
        if not all(map(str.startswith, keys, repeat(FILE_PREFIX))):
            rels = [rel if key.startswith(FILE_PREFIX) else None for key, rel in zip(keys, rels, strict=True)]
        same, fresh = fingerprint.compare(self.root, rels, targets.fingerprints)
        if all(same):  # the common case, decided in C
            return [SYNCED] * len(same)
        checks: list[Check] = [SYNCED] * len(same)
        unread = [n for n, known in enumerate(same) if not known]
        for n in unread:  # until its payload is read: a job removed meanwhile has none
            checks[n] = _REMOVED
        for part in self._by_id(probe, targets, unread):
            renewed: dict[str, str] = {}
            for n, check in part:
                checks[n] = check
                new = fresh[n]
                if new is not None and (check is SYNCED or check.status == IN_SYNC):
                    renewed[job_ids[n]] = new
            # A part at a time: recording a fingerprint rewrites its job's row, payload and all,
            # and one transaction holds the pages it rewrites.
            self.reads.refresh(renewed)
        return checks

    def _apart(self, probe: Probe, targets: Targets) -> list[Check]:
        """The checks of a page's targets of a type that wants payloads, some of which the page
        left out as too large for it (reads.PAGE_BYTES): those read by id."""
        payloads = targets.payloads
        carried = [n for n, payload in enumerate(payloads) if payload is not None]
        apart = [n for n, payload in enumerate(payloads) if payload is None]
        checks: list[Check] = [_REMOVED] * len(payloads)  # until its payload is read
        asked = self._ask(probe, [(targets.keys[n], payloads[n]) for n in carried])
        for n, check in zip(carried, asked, strict=True):
            checks[n] = check
        for part in self._by_id(probe, targets, apart):
            for n, check in part:
                checks[n] = check
        return checks

    def _by_id(self, probe: Probe, targets: Targets, positions: list[int]) -> Iterator[list[tuple[int, Check]]]:
        """``probe``'s answers about the targets at ``positions``, their payloads read by id a part
        at a time (reads.PAGE_BYTES): per part, (position, check) of each target whose job is
        still there."""
        keys, job_ids = targets.keys, targets.job_ids
        for found in self.reads.payloads([job_ids[n] for n in positions]):
            read = [n for n in positions if job_ids[n] in found]
            yield list(zip(read, self._ask(probe, [(keys[n], found[job_ids[n]]) for n in read]), strict=True))

    def _ask(self, probe: Probe, items: list[tuple[str, str | None]]) -> list[Check]:
        try:
            return probe.check_many(items, self.root, content=self.content)  # type: ignore[arg-type]  # None: not wanted
        except Exception:  # one bad payload: ask one at a time so only it is unknown
            return [self._check_one(probe, target, payload) for target, payload in items]

    def _check_one(self, probe: Probe, target: str, payload: str | None) -> Check:
        if payload is None and probe.wants_payload(content=self.content):
            return _REMOVED
        try:
            return probe.check(target, payload, self.root, content=self.content)  # type: ignore[arg-type]  # None: not wanted
        except Exception as e:  # a probe bug or a payload it cannot read: this target is unknown
            return Check(UNKNOWN, detail=f"probe failed: {type(e).__name__}")

    # -- the verdicts --------------------------------------------------------------------------

    def _recheck(self) -> None:
        """The disk was read after the ledger: if a job has touched a target since, what we saw may
        be its effect. Only a target on which the ledger still agrees is drift."""
        if not self.suspects:
            return
        now = self.reads.recheck([key for key, _ in self.suspects])
        for key, finding in self.suspects:
            latest, active = now.get(key, (None, 0))
            if active or latest != finding.job_id:
                finding = Finding(
                    finding.path,
                    NOT_CHECKED,
                    finding.job_id,
                    finding.job_type,
                    detail="a job touched this path during the check",
                )
            self._found(finding)
        self.suspects = []

    def _found(self, finding: Finding) -> None:
        self.report.counts[finding.status] += 1
        self.report.findings.append(finding)
        if finding.status == UNKNOWN:
            events.emit("reconcile_unreadable", path=finding.path, job_id=finding.job_id, detail=finding.detail)

    def _remote_untracked(self) -> None:
        """Remote resources that carry this ledger's ownership tag but that no job names."""
        for job_type, probe in self.probes.items():
            remote = None if probe is None else probe.remote
            if probe is None or remote is None or remote not in self.remote_allowed:
                continue
            seen = self.remote_seen.get(job_type, set())
            if remote not in self.remote_asked and not (seen or self.reads.type_targeted(job_type)):
                continue
            try:
                found = probe.untracked(self.ledger_id, seen)
            except Exception as e:  # could not list: say so, never "none untracked"
                self._found(Finding(f"{remote}:*", UNKNOWN, job_type=job_type, detail=f"could not list: {e}"))
                continue
            known = self.reads.known(list(found))
            for key, detail in found.items():
                if key not in known:
                    self._found(Finding(display(key), UNTRACKED, job_type=job_type, detail=detail))
