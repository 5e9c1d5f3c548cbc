"""Ledger vs world: does the disk hold what the completed jobs say they did?

For every target (a data path) the expectation is the effect of the *latest* completed job on it:
jobs on one target take effect in enqueue (id) order, so that is the one with the highest id. The
reconciler streams every job that has a target by ``(ordering_key, id)`` through ``ix_tether_jobs_targeted`` in short
read-only batches: each target's jobs arrive together, its latest last, so it holds one target at
a time and memory does not grow with the number of jobs. It reports, logs and never repairs.

A target with a pending or claimed job is in flight (``not_checked``). A target whose check
disagrees is checked once more against the ledger after the disk was read: if a job touched it
meanwhile, it is in flight, not drift. So a worker running alongside never causes false drift.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from .. import beneath, events, fs
from ..jobtypes.base import SYNCED, Check, Probe
from ..jobtypes.claude_extraction import answer_of
from ..jobtypes.files import listings
from ..jobtypes.target import display, file_key
from ..ledger import sql
from ..ledger.backend import Backend
from ..ledger.engine import READ_ONLY
from . import runs as reconcile_runs
from .drift import DRIFT, IN_SYNC, LEFTOVER_TEMP, NOT_CHECKED, STATUSES, UNKNOWN, UNTRACKED, Finding, Report

if TYPE_CHECKING:
    from ..coordinator import Coordinator
    from ..jobtypes import Registry

__all__ = ["DRIFT", "STATUSES", "Finding", "Report", "count_targeted_jobs", "reconcile"]

BATCH = 2000


# One target's jobs, once all have been read: (key, its latest completed job's id and type, an
# active job's id, the latest's payload when the probe wants it). A plain tuple: one is built per
# target, and a NamedTuple's constructor cost a tenth of an existence check.
_TargetState = tuple[str, str | None, str | None, str | None, str | None]


PAGE = sa.text(sql.RECONCILE_PAGE.format(payload=""))
PAGE_PAYLOADS = sa.text(sql.RECONCILE_PAGE.format(payload=", payload"))
PAYLOADS = sa.text(sql.PAYLOADS_BY_ID).bindparams(sa.bindparam("ids", expanding=True))
RECHECK = sa.text(sql.RECONCILE_RECHECK).bindparams(sa.bindparam("keys", expanding=True))
ACTIVE_ON = sa.text(sql.ACTIVE_ON_TARGET)
KNOWN_TARGETS = sa.text(sql.KNOWN_TARGETS).bindparams(sa.bindparam("keys", expanding=True))
COUNT_TARGETED = sa.text(sql.COUNT_TARGETED)

# ``.<name>.<8 hex>.tether-tmp``: fs.atomic_write's temp file for ``<name>`` in the same directory.
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{8}" + re.escape(fs.TEMP_SUFFIX) + "$")


def reconcile(
    coordinator: Coordinator,
    *,
    content: bool = True,
    untracked: bool = False,
    batch_size: int = BATCH,
    progress: Callable[[int], None] | None = None,
    aws: bool = True,
) -> Report:
    """Compare the ledger with the data root; change nothing (the one write is the check's
    verdict, kept in ``tether_reconcile_runs`` for metrics and pages).

    ``content`` false checks existence only (no file is read). ``untracked`` also reports files
    under the root that no job ever named (and, with ``aws``, AWS resources carrying this
    ledger's ownership tag that no job names). ``aws`` false leaves AWS alone: its targets are
    ``not_checked``. ``progress`` is called with the number of jobs read after each batch."""
    reconciler = _Reconciler(
        coordinator.engine, coordinator.root, coordinator.registry, content, untracked, batch_size, progress
    )
    reconciler.remote_allowed = {"aws"} if aws else set()
    reconciler.ledger_id = coordinator.queue.ledger_id
    report = reconciler.run(coordinator.clock.now())
    report.finished_at = coordinator.clock.now()
    events.emit("reconcile.finished", **report.summary())
    reconcile_runs.record(coordinator.engine, report)
    return report


def count_targeted_jobs(coordinator: Coordinator) -> int:
    """How many jobs a check will stream (for a progress bar's total)."""
    with coordinator.engine.connect().execution_options(**READ_ONLY) as conn:
        return int(conn.execute(COUNT_TARGETED).scalar_one())


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
    ) -> None:
        self.engine = engine
        self.root = root
        self.content = content
        self.untracked = untracked
        self.batch_size = batch_size
        self.progress = progress
        self.probes = {name: registry.get(name).probe for name in registry.names()}
        self.backend = Backend.for_engine(engine)
        self.suspects: list[tuple[str, Finding]] = []
        self.report: Report
        # Probes that read a remote world (``Probe.remote``: "aws") run only when allowed; the
        # targets they were asked about feed the search for untracked remote resources.
        self.remote_allowed: set[str] = set()
        self.remote_seen: dict[str, set[str]] = {}
        self.ledger_id = ""

    def run(self, now: datetime) -> Report:
        self.report = Report(checked_at=now, content=self.content, untracked=self.untracked)
        listed: dict[str, tuple[list[str], list[str]]] = {}
        token = listings.set(None if self.untracked else listed)
        try:
            for ready, read in self._pages():
                self._check_all(ready)
                if len(self.suspects) >= 500:
                    self._recheck()
                if self.progress is not None:
                    self.progress(read)
        finally:
            listings.reset(token)
        self._recheck()
        # After the ledger pass. (Overlapping this walk with it in a thread measured no faster
        # here: the GIL-bound parts of both compete.) Directories the probes listed in full are
        # not read again: a temp file left by an earlier crash was there when they were read;
        # one that appeared since was left by a write that was running during this check, and
        # the next check reports it if that write died.
        self._walk(_entries(self.root, only_temps=not self.untracked, listed=listed))
        if self.untracked:
            self._remote_untracked()
        self.report.findings.sort(key=lambda f: f.path)
        return self.report

    # -- the ledger ------------------------------------------------------------------------

    def _read(self, statement: sa.TextClause, params: dict[str, Any]) -> Sequence[Any]:
        """One short read-only transaction: a long check never holds a snapshot open (which on
        SQLite would stop WAL checkpoints for its whole duration)."""
        with self.engine.connect().execution_options(**READ_ONLY) as conn:
            return conn.execute(statement, params).fetchall()

    def _pages(self) -> Iterator[tuple[list[_TargetState], int]]:
        """Per batch of jobs, the targets whose jobs have all been read, as (key, latest
        completed id, its type, an active job's id, the latest's payload or None), and the jobs
        read so far. One target is carried between batches: its jobs arrive together, oldest
        first. Without payloads the stream reads only the target index, never the table."""
        probed = {name for name, probe in self.probes.items() if probe is not None}
        wide = any(self.probes[name].wants_payload(content=self.content) for name in probed)  # type: ignore[union-attr]  # probed: not None
        page = PAGE_PAYLOADS if wide else PAGE
        after_key, after_id, read, newest = "", "", 0, ""
        key: str | None = None
        latest_id = latest_type = active_id = latest_payload = None
        while True:
            # The stream is most of a check's reading: on the driver cursor, like the hot path.
            with self.backend.read() as cur:
                rows = cur.rows(page.text, {"after_key": after_key, "after_id": after_id, "limit": self.batch_size})
            ready: list[_TargetState] = []
            append = ready.append
            cols = list(zip(*rows, strict=True))  # columns, transposed in C
            if (
                rows
                and cols[2].count("completed") == len(rows)
                and len(set(cols[3])) == len(rows)
                and cols[3][0] != key
            ):
                # Every job completed and alone on its target (the common page): the targets are
                # zipped from the columns in C, the last carried over as the loop would carry it.
                if key is not None:
                    append((key, latest_id, latest_type, active_id, latest_payload))
                ready.extend(zip(cols[3], cols[0], cols[1], repeat(None), cols[4] if wide else repeat(None)))
                key, latest_id, latest_type, active_id, latest_payload = ready.pop()
                loop: Sequence[Any] = ()
            else:
                loop = rows
            for row in loop:
                row_key = row[3]
                if row_key != key:
                    if key is not None:
                        append((key, latest_id, latest_type, active_id, latest_payload))
                    key, latest_id, latest_type, active_id, latest_payload = row_key, None, None, None, None
                if row[2] == "completed":
                    latest_id, latest_type = row[0], row[1]
                    if wide:
                        latest_payload = row[4]
                elif active_id is None:
                    active_id = row[0]
            if rows:
                newest = max(newest, max(cols[0]))
            read += len(rows)
            self.report.newest_job_id = newest or None
            if len(rows) < self.batch_size:
                if key is not None:
                    append((key, latest_id, latest_type, active_id, latest_payload))
                yield ready, read
                return
            yield ready, read
            after_key, after_id = rows[-1][3], rows[-1][0]

    def _payloads(self, ids: list[str]) -> dict[str, str]:
        return dict(self._read(PAYLOADS, {"ids": ids})) if ids else {}

    def _check_all(self, ready: list[_TargetState]) -> None:
        """Ask each type's probe about its targets, a batch at a time."""
        by_type: dict[str, tuple[list[str], list[str], list[str | None]]] = {}
        # The groups of types checked here that read no remote world: most targets go straight
        # into one (the branches below, and a getattr per target, were a fifth of a check).
        local: dict[str | None, tuple[list[str], list[str], list[str | None]]] = {}
        probes = self.probes
        for key, latest_id, latest_type, active_id, payload in ready:
            if active_id is None and latest_id is not None and (group := local.get(latest_type)) is not None:
                group[0].append(key)
                group[1].append(latest_id)
                group[2].append(payload)
            elif active_id is not None:
                self._found(
                    Finding(display(key), NOT_CHECKED, active_id, detail="a job on this path is pending or claimed")
                )
            elif latest_id is None or latest_type is None:
                continue  # only failed jobs ever named this target: nothing is expected of it
            elif latest_type not in probes or probes[latest_type] is None:
                # Said, not skipped: a check run without the application's job types, or of a
                # type nothing can check, must not read as "all in sync".
                why = (
                    f"job type {latest_type!r} is not registered here (pass --import MODULE)"
                    if latest_type not in probes
                    else f"type {latest_type!r} has no probe: its effect cannot be checked"
                )
                self._found(Finding(display(key), NOT_CHECKED, latest_id, latest_type, detail=why))
            elif (remote := getattr(probes[latest_type], "remote", None)) and remote not in self.remote_allowed:
                self._found(
                    Finding(
                        display(key),
                        NOT_CHECKED,
                        latest_id,
                        latest_type,
                        detail=f"{remote} not checked (--no-{remote})",
                    )
                )
            else:
                if remote:
                    self.remote_seen.setdefault(latest_type, set()).add(key)
                group = by_type.get(latest_type)
                if group is None:
                    group = by_type[latest_type] = ([], [], [])
                    if not remote:
                        local[latest_type] = group
                group[0].append(key)
                group[1].append(latest_id)
                group[2].append(payload)
        for job_type, (keys, ids, payloads) in by_type.items():
            probe = self.probes[job_type]
            assert probe is not None
            with_payload = probe.wants_payload(content=self.content)
            checks = self._ask(probe, list(zip(keys, payloads, strict=True)))
            if not with_payload:
                # The report says what was expected: ask again, with payloads, about the few
                # targets that disagree.
                again = [n for n, c in enumerate(checks) if c is not SYNCED and c.status != IN_SYNC]
                if again:
                    found = self._payloads([ids[n] for n in again])
                    asked = self._ask(probe, [(keys[n], found.get(ids[n])) for n in again])
                    for n, check in zip(again, asked, strict=True):
                        checks[n] = check
            in_sync = 0
            if checks.count(SYNCED) == len(checks):  # the common case, counted in C
                self.report.counts[IN_SYNC] += len(checks)
                continue
            for key, job_id, check in zip(keys, ids, checks, strict=True):
                if check is SYNCED or check.status == IN_SYNC:
                    in_sync += 1
                    continue
                finding = Finding.of(display(key), check, job_id, job_type)
                if check.status in DRIFT:
                    self.suspects.append((key, finding))
                else:
                    self._found(finding)
            self.report.counts[IN_SYNC] += in_sync

    def _ask(self, probe: Probe, items: list[tuple[str, str | None]]) -> list[Check]:
        try:
            return probe.check_many(items, self.root, content=self.content)  # type: ignore[arg-type]  # None: not wanted
        except Exception:  # one bad payload: ask one at a time so only it is unknown
            return [self._check_one(probe, target, payload) for target, payload in items]

    def _check_one(self, probe: Probe, target: str, payload: str | None) -> Check:
        if payload is None and probe.wants_payload(content=self.content):
            return Check(UNKNOWN, detail="the job's row was removed during the check")
        try:
            return probe.check(target, payload, self.root, content=self.content)  # type: ignore[arg-type]  # None: not wanted
        except Exception as e:  # a probe bug or a payload it cannot read: this target is unknown
            return Check(UNKNOWN, detail=f"probe failed: {type(e).__name__}")

    def _recheck(self) -> None:
        """The disk was read after the ledger: if a job has touched a target since, what we saw may
        be its effect. Only a target on which the ledger still agrees is drift."""
        if not self.suspects:
            return
        now = {
            key: (latest, active)
            for key, latest, active in self._read(RECHECK, {"keys": [key for key, _ in self.suspects]})
        }
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
        if finding.status in DRIFT:
            events.emit("drift.detected", **finding.to_dict())
        elif finding.status == UNKNOWN:
            events.emit("reconcile.unreadable", path=finding.path, job_id=finding.job_id, detail=finding.detail)

    def _remote_untracked(self) -> None:
        """Remote resources that carry this ledger's ownership tag but that no job names."""
        for job_type, probe in self.probes.items():
            find = getattr(probe, "untracked", None)
            remote = getattr(probe, "remote", None)
            if find is None or remote not in self.remote_allowed:
                continue
            try:
                found: dict[str, str] = find(self.ledger_id, self.remote_seen.get(job_type, set()))
            except Exception as e:  # could not list: say so, never "none untracked"
                self._found(Finding(f"{remote}:*", UNKNOWN, job_type=job_type, detail=f"could not list: {e}"))
                continue
            keys = list(found)
            known: set[str] = set()
            for start in range(0, len(keys), 500):
                known.update(row[0] for row in self._read(KNOWN_TARGETS, {"keys": keys[start : start + 500]}))
            for key in keys:
                if key not in known:
                    self._found(Finding(display(key), UNTRACKED, job_type=job_type, detail=found[key]))

    # -- the data root ---------------------------------------------------------------------

    def _walk(self, entries: Iterable[tuple[str, os.DirEntry[str] | bool | None]]) -> None:
        """Leftover temp files, and (on request) files no job ever named. Never enters ``.tether/``
        or follows a symlinked directory."""
        pending: list[tuple[str, int | None]] = []
        for rel, entry in entries:
            if entry is None:
                self._found(Finding(rel, UNKNOWN, detail="directory could not be listed"))
            elif rel.endswith(fs.TEMP_SUFFIX):
                self._temp(rel)
            elif self.untracked:
                assert not isinstance(entry, bool)  # True only with only_temps, never when untracked
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
            if self._read(ACTIVE_ON, {"key": file_key(target)}):
                return  # a running job's write in progress
        try:  # asked after the ledger: gone means a write finished meanwhile
            with fs.data_file(self.root, rel) as f:
                st = f.lstat()
            if st is None:
                return
            size = st.st_size
        except FileNotFoundError:
            return
        except OSError as e:
            self._found(Finding(rel, UNKNOWN, detail=e.strerror))
            return
        self._found(Finding(rel, LEFTOVER_TEMP, actual_size=size, detail="temp file of an interrupted write"))

    def _untracked(self, files: list[tuple[str, int | None]]) -> None:
        keys: list[tuple[str, str, int | None]] = []
        for rel, size in files:
            try:
                rel.encode()
            except UnicodeEncodeError:  # not UTF-8 on disk: no payload can name it
                self._found(
                    Finding(rel.encode(errors="surrogateescape").decode(errors="replace"), UNTRACKED, actual_size=size)
                )
                continue
            keys.append((file_key(answer_of(rel) or rel), rel, size))  # an answer's sidecar goes with it
        if not keys:
            return
        known = {row[0] for row in self._read(KNOWN_TARGETS, {"keys": sorted({k for k, _, _ in keys})})}
        for key, rel, size in keys:
            if key not in known:
                self._found(Finding(rel, UNTRACKED, actual_size=size, detail="no job ever named this file"))


def _entries(
    root: Path,
    *,
    only_temps: bool,
    listed: dict[str, tuple[list[str], list[str]]] | None = None,
) -> Iterator[tuple[str, os.DirEntry[str] | bool | None]]:
    """(relative path, entry) of every non-directory entry under ``root`` (only temp files with
    ``only_temps``), skipping ``.tether/``; (directory, None) for one that could not be listed.
    With ``listed`` (only temp files), the directories in it are taken from it (entry: True).
    Each directory is opened from the root without following a symlink, as the probes read."""
    suffix = fs.TEMP_SUFFIX
    stack = [""]
    with fs.opened_root(root) as root_fd:
        while stack:
            prefix = stack.pop()
            path = os.path.join(root, prefix) if prefix else root
            known = listed.get(os.path.normpath(path)) if listed else None
            if known is not None and only_temps:
                temps, subdirs = known
                for name in temps:
                    yield f"{prefix}{name}", True
                stack.extend(f"{prefix}{name}/" for name in subdirs if prefix or name != fs.INTERNAL_DIR)
                continue
            try:
                dir_fd = beneath.open_dir(root_fd, prefix.rstrip("/"))
            except FileNotFoundError:
                continue
            except OSError:
                yield prefix.rstrip("/") or ".", None
                continue
            if only_temps and _leaf(dir_fd):
                try:
                    names = os.listdir(dir_fd)
                except OSError:
                    names = None
                finally:
                    os.close(dir_fd)
                if names is None:
                    yield prefix.rstrip("/") or ".", None
                else:
                    yield from ((f"{prefix}{name}", True) for name in names if name.endswith(suffix))
                continue
            try:
                entries = os.scandir(dir_fd)
            except OSError:
                os.close(dir_fd)
                yield prefix.rstrip("/") or ".", None
                continue
            try:  # the entries' stat() uses dir_fd: it stays open while they are handed out
                with entries:
                    for entry in entries:
                        try:
                            is_dir = entry.is_dir(follow_symlinks=False)
                        except OSError:
                            is_dir = False
                        if is_dir:  # a data directory named ``x.tether-tmp`` is no temp file
                            if prefix or entry.name != fs.INTERNAL_DIR:
                                stack.append(f"{prefix}{entry.name}/")
                        elif not only_temps or entry.name.endswith(suffix):
                            yield f"{prefix}{entry.name}", entry
            finally:
                os.close(dir_fd)


def _leaf(dir_fd: int) -> bool:
    """Whether the open directory has no subdirectory: a link count of 2 (its name and its own
    ``.``) says so where the file system counts subdirectories' ``..`` (ext4, XFS, tmpfs; btrfs
    says 1, and so does ext4 past 65,000 subdirectories: those are listed in full). A leaf's
    temp files are found from its names alone, without a type check per entry: as GNU find's
    leaf optimisation, and most of the walk's cost."""
    try:
        return os.fstat(dir_fd).st_nlink == 2
    except OSError:
        return False


def _size(entry: os.DirEntry[str]) -> int | None:
    try:
        return entry.stat(follow_symlinks=False).st_size
    except OSError:
        return None
