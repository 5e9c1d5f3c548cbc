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

import gc
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from itertools import compress, islice, repeat
from operator import eq, lt
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from .. import events
from ..jobtypes.base import SYNCED, Check, Probe
from ..jobtypes.claude_extraction import answer_of
from ..jobtypes.datafiles import durable, nofollow, paths
from ..jobtypes.datafiles.existence import listings
from ..jobtypes.target import display, file_key
from ..ledger import drivers
from ..ledger.catalogue import READS
from ..ledger.engine import READ_ONLY
from . import runs as reconcile_runs
from .drift import DRIFT, IN_SYNC, LEFTOVER_TEMP, NOT_CHECKED, STATUSES, UNKNOWN, UNTRACKED, Finding, Report

if TYPE_CHECKING:
    from ..coordinator import Coordinator
    from ..jobtypes import Registry

__all__ = ["DRIFT", "STATUSES", "Finding", "Report", "count_targeted_jobs", "reconcile"]

BATCH = 2000


# The targets of a batch whose jobs have all been read, as columns: keys, the latest completed
# job's id and type, an active job's id, the latest's payload (when the probe wants it). Columns,
# not a tuple per target: most of a batch is selected and handed on in C.
_Target = tuple[str, str | None, str | None, str | None, str | None]  # one target, as a row of those
_Targets = tuple[list[str], list[str | None], list[str | None], list[str | None], list[str | None]]

PAYLOADS = sa.text(READS.PAYLOADS_BY_ID).bindparams(sa.bindparam("ids", expanding=True))
RECHECK = sa.text(READS.RECONCILE_RECHECK).bindparams(sa.bindparam("keys", expanding=True))
ACTIVE_ON = sa.text(READS.ACTIVE_ON_TARGET)
KNOWN_TARGETS = sa.text(READS.KNOWN_TARGETS).bindparams(sa.bindparam("keys", expanding=True))
COUNT_TARGETED = sa.text(READS.COUNT_TARGETED)
TYPE_TARGETED = sa.text(READS.TYPE_TARGETED)

# ``.<name>.<8 hex>.tether-tmp``: fs.atomic_write's temp file for ``<name>`` in the same directory.
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{8}" + re.escape(paths.TEMP_SUFFIX) + "$")


def reconcile(
    coordinator: Coordinator,
    *,
    content: bool = True,
    untracked: bool = False,
    batch_size: int = BATCH,
    progress: Callable[[int], None] | None = None,
    aws: bool | None = None,
) -> Report:
    """Compare the ledger with the data root; change nothing (the one write is the check's
    verdict, kept in ``tether_reconcile_runs`` for metrics and pages).

    ``content`` false checks existence only (no file is read). ``untracked`` also reports files
    under the root that no job ever named, and AWS resources carrying this ledger's ownership tag
    that no job names: looked for when the ledger holds a ``sync_aws`` job, or on any ledger with
    ``aws`` true. ``aws`` false leaves AWS alone: its targets are ``not_checked``, nothing is
    listed. ``progress`` is called with the number of jobs read after each batch."""
    reconciler = _Reconciler(
        coordinator.engine, coordinator.root, coordinator.registry, content, untracked, batch_size, progress
    )
    reconciler.remote_allowed = set() if aws is False else {"aws"}
    reconciler.remote_asked = {"aws"} if aws else set()
    reconciler.ledger_id = coordinator.queue.ledger_id
    report = reconciler.run(coordinator.clock.now())
    report.finished_at = coordinator.clock.now()
    events.emit("reconcile_finished", **report.summary())
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
        self.backend = drivers.for_engine(engine)
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
        self.collecting = True  # whether the collector ran before this check (see run)

    def run(self, now: datetime) -> Report:
        """The check, with Python's cyclic garbage collector paused (and restored as it was: an
        application that turned it off keeps it off). A check of local files makes a few objects
        per job read (rows, paths, answers), none in a cycle, and the collector's passes over
        them found nothing and were a good part of its time (benchmarks/README.md, reconcile.py). It
        runs again while a remote probe works: an AWS client leaves cycles behind each call."""
        self.collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run(now)
        finally:
            if self.collecting:
                gc.enable()

    @contextmanager
    def _collector_running(self) -> Iterator[None]:
        """The collector on, as it was before the check, for a remote probe's calls."""
        if self.collecting:
            gc.enable()
        try:
            yield
        finally:
            if self.collecting:
                gc.disable()

    def _run(self, now: datetime) -> Report:
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
            with self._collector_running():
                self._remote_untracked()
        self.report.findings.sort(key=lambda f: f.path)
        return self.report

    # -- the ledger ------------------------------------------------------------------------

    def _read(self, statement: sa.TextClause, params: dict[str, Any]) -> Sequence[Any]:
        """One short read-only transaction: a long check never holds a snapshot open (which on
        SQLite would stop WAL checkpoints for its whole duration)."""
        with self.engine.connect().execution_options(**READ_ONLY) as conn:
            return conn.execute(statement, params).fetchall()

    def _pages(self) -> Iterator[tuple[_Targets, int]]:
        """Per batch of jobs, the targets whose jobs have all been read, as columns (keys, latest
        completed ids, their types, an active job's id, the latest's payload or None), and the
        jobs read so far. One target is carried between batches: its jobs arrive together, oldest
        first. Without payloads the stream reads only the target index, never the table."""
        # Payloads only of the types whose probes read them in this mode: an existence check of
        # file jobs reads the target index alone, whatever other types are registered.
        wanting = sorted(
            name
            for name, probe in self.probes.items()
            if probe is not None and probe.wants_payload(content=self.content)
        )
        wide = bool(wanting)
        page = self.backend.sql.RECONCILE_PAGE_PAYLOADS if wide else self.backend.sql.RECONCILE_PAGE
        binds = {"want": self.backend.sql.types(wanting)} if wide else {}
        after_key, after_id, read, newest = "", "", 0, ""
        carried: _Target | None = None
        while True:
            # The stream is most of a check's reading: on the driver cursor, like the hot path.
            with self.backend.read() as cur:
                params = {"after_key": after_key, "after_id": after_id, "limit": self.batch_size, **binds}
                cols = list(zip(*cur.rows(page, params), strict=True))  # columns, transposed in C
            n = len(cols[0]) if cols else 0
            ready: _Targets
            if n and None not in cols[1] and _distinct(cols[2]) and (carried is None or cols[2][0] != carried[0]):
                # Every job completed and alone on its target (the common page): its columns are
                # the targets', with the carried target first and the last one carried on.
                payloads: Sequence[str | None] = cols[3] if wide else (None,) * n
                if carried is None:
                    ready = ([*cols[2]], [*cols[0]], [*cols[1]], [None] * n, [*payloads])
                else:
                    key, latest_id, latest_type, active_id, latest_payload = carried
                    ready = (
                        [key, *cols[2]],
                        [latest_id, *cols[0]],
                        [latest_type, *cols[1]],
                        [active_id, *(None,) * n],
                        [latest_payload, *payloads],
                    )
                carried = (cols[2][-1], cols[0][-1], cols[1][-1], None, payloads[-1])
                for column in ready:
                    column.pop()
            else:
                ready, carried = _targets_of(zip(*cols, strict=True), carried, wide)
            if n:
                newest = max(newest, max(cols[0]))
            read += n
            self.report.newest_job_id = newest or None
            if n < self.batch_size:
                if carried is not None:
                    _add(ready, carried)
                yield ready, read
                return
            yield ready, read
            after_key, after_id = cols[2][-1], cols[0][-1]

    def _payloads(self, ids: list[str]) -> dict[str, str]:
        return dict(self._read(PAYLOADS, {"ids": ids})) if ids else {}

    def _check_all(self, ready: _Targets) -> None:
        """Ask each type's probe about its targets, a batch at a time. Per target only where one
        is in flight or of a type that cannot be checked here; the rest go to the probes by
        type, selected in C."""
        keys, ids, types, actives, payloads = ready
        if actives.count(None) < len(actives):
            idle = [n for n, active in enumerate(actives) if active is None]
            for n, active in enumerate(actives):
                if active is not None:
                    detail = "a job on this path is pending or claimed"
                    self._found(Finding(display(keys[n]), NOT_CHECKED, active, detail=detail))
            keys = list(map(keys.__getitem__, idle))
            ids, types, payloads = (list(map(column.__getitem__, idle)) for column in (ids, types, payloads))
        kinds = dict.fromkeys(types)  # in page order: probes asked, and drift reported, in a stable order
        for job_type in kinds:
            if len(kinds) == 1:
                of_type = (keys, ids, payloads)
            else:
                mask = list(map(eq, types, repeat(job_type)))
                of_type = (list(compress(keys, mask)), list(compress(ids, mask)), list(compress(payloads, mask)))
            # An idle target's latest job completed (failed jobs are not read): neither is None.
            self._check_type(job_type, *of_type)  # type: ignore[arg-type]

    def _check_type(self, job_type: str, keys: list[str], ids: list[str], payloads: list[str | None]) -> None:
        probe = self.probes.get(job_type)
        if probe is None:
            # Said, not skipped: a check run without the application's job types, or of a type
            # nothing can check, must not read as "all in sync".
            why = (
                f"job type {job_type!r} is not registered here (pass --import MODULE)"
                if job_type not in self.probes
                else f"type {job_type!r} has no probe: its effect cannot be checked"
            )
            for key, job_id in zip(keys, ids, strict=True):
                self._found(Finding(display(key), NOT_CHECKED, job_id, job_type, detail=why))
            return
        remote = getattr(probe, "remote", None)
        if remote:
            if remote not in self.remote_allowed:
                for key, job_id in zip(keys, ids, strict=True):
                    detail = f"{remote} not checked (--no-{remote})"
                    self._found(Finding(display(key), NOT_CHECKED, job_id, job_type, detail=detail))
                return
            self.remote_seen.setdefault(job_type, set()).update(keys)
            with self._collector_running():
                self._check_with(probe, job_type, keys, ids, payloads)
            return
        self._check_with(probe, job_type, keys, ids, payloads)

    def _check_with(
        self, probe: Probe, job_type: str, keys: list[str], ids: list[str], payloads: list[str | None]
    ) -> None:
        """Ask ``probe`` about the targets of ``job_type`` and count or report its answers."""
        with_payload = probe.wants_payload(content=self.content)
        checks = self._ask(probe, list(zip(keys, payloads, strict=True)))
        if checks.count(SYNCED) == len(checks):  # the common case, counted in C
            self.report.counts[IN_SYNC] += len(checks)
            return
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
            events.emit("drift_detected", **finding.to_dict())
        elif finding.status == UNKNOWN:
            events.emit("reconcile_unreadable", path=finding.path, job_id=finding.job_id, detail=finding.detail)

    def _remote_untracked(self) -> None:
        """Remote resources that carry this ledger's ownership tag but that no job names."""
        for job_type, probe in self.probes.items():
            find = getattr(probe, "untracked", None)
            remote = getattr(probe, "remote", None)
            if find is None or remote not in self.remote_allowed:
                continue
            if remote not in self.remote_asked and not (
                self.remote_seen.get(job_type) or self._read(TYPE_TARGETED, {"type": job_type})
            ):
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
            elif rel.endswith(paths.TEMP_SUFFIX):
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
            with durable.data_file(self.root, rel) as f:
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


def _distinct(keys: Sequence[str]) -> bool:
    """Whether each of a page's (ordered) keys is another target: increasing (compared in C),
    or, where the database's collation orders text unlike Python, by a set."""
    return all(map(lt, keys, islice(keys, 1, None))) or len(set(keys)) == len(keys)


def _add(targets: _Targets, target: _Target) -> None:
    keys, ids, types, actives, payloads = targets
    key, latest_id, latest_type, active_id, latest_payload = target
    keys.append(key)
    ids.append(latest_id)
    types.append(latest_type)
    actives.append(active_id)
    payloads.append(latest_payload)


def _targets_of(rows: Iterable[Sequence[Any]], carried: _Target | None, wide: bool) -> tuple[_Targets, _Target | None]:
    """The targets of a page in which some target has several jobs, or an active one: row by
    row, the ``carried`` target first; returns them and the page's last target, carried on."""
    targets: _Targets = ([], [], [], [], [])
    if carried is None:
        key, latest_id, latest_type, active_id, latest_payload = None, None, None, None, None
    else:
        key, latest_id, latest_type, active_id, latest_payload = carried
    for row in rows:
        row_key = row[2]
        if row_key != key:
            if key is not None:
                _add(targets, (key, latest_id, latest_type, active_id, latest_payload))
            key, latest_id, latest_type, active_id, latest_payload = row_key, None, None, None, None
        if row[1] is not None:  # completed: its type
            latest_id, latest_type = row[0], row[1]
            if wide:
                latest_payload = row[3]
        elif active_id is None:
            active_id = row[0]
    last = None if key is None else (key, latest_id, latest_type, active_id, latest_payload)
    return targets, last


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
    suffix = paths.TEMP_SUFFIX
    stack = [""]
    with durable.opened_root(root) as root_fd:
        while stack:
            prefix = stack.pop()
            path = os.path.join(root, prefix) if prefix else root
            known = listed.get(os.path.normpath(path)) if listed else None
            if known is not None and only_temps:
                temps, subdirs = known
                for name in temps:
                    yield f"{prefix}{name}", True
                stack.extend(f"{prefix}{name}/" for name in subdirs if prefix or name != paths.INTERNAL_DIR)
                continue
            try:
                dir_fd = nofollow.open_dir(root_fd, prefix.rstrip("/"))
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
                            if prefix or entry.name != paths.INTERNAL_DIR:
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
