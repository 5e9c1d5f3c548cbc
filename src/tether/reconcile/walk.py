"""The data root's side of a check: temp files of interrupted writes and (on request) files no job
ever named, found by walking the root after the ledger pass. Never enters ``.tether/`` or
follows a symlinked directory."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..jobtypes.claude_extraction import answer_of
from ..jobtypes.datafiles import durable, nofollow, paths
from ..jobtypes.target import file_key
from .clean_dirs import CleanDirs
from .drift import LEFTOVER_TEMP, UNKNOWN, UNTRACKED, Finding
from .reads import LedgerReads

# ``.<name>.<8 hex>.tether-tmp``: the temp file ``durable.DataFile.write`` writes ``<name>`` through.
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{8}" + re.escape(paths.TEMP_SUFFIX) + "$")

Listed = dict[str, tuple[list[str], list[str]]]  # directory -> (its temp files, its subdirectories)
Entry = tuple[str, os.DirEntry[str] | bool | None]  # (relative path, entry); see entries


class RootWalk:
    """Report, through ``found``, what the walk of ``root`` finds that no running job explains."""

    def __init__(
        self, root: Path, reads: LedgerReads, found: Callable[[Finding], None], *, untracked: bool, trust: bool = True
    ) -> None:
        self.root, self.reads, self.found, self.untracked, self.trust = root, reads, found, untracked, trust

    def run(self, listed: Listed) -> None:
        """Directories the probes listed in full (``listed``) are not read again: a temp file left
        by an earlier crash was there when they were read; one that appeared since was left by a
        write running during this check, and the next check reports it if that write died. A
        leaf directory unchanged since a walk found it clean is not listed either, unless the
        check trusts no fingerprint (``trust`` false: ``clean_dirs.py``)."""
        clean = None if self.untracked else CleanDirs(self.reads, trust=self.trust)
        self._walk(entries(self.root, only_temps=not self.untracked, listed=listed, clean=clean))
        if clean is not None:
            clean.flush()

    def _walk(self, found_entries: Iterable[Entry]) -> None:
        pending: list[tuple[str, int | None]] = []
        for rel, entry in found_entries:
            if entry is None:
                self.found(Finding(rel, UNKNOWN, detail="directory could not be listed"))
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
            if self.reads.active_on(file_key(target)):
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
            self.found(Finding(rel, UNKNOWN, detail=e.strerror))
            return
        self.found(Finding(rel, LEFTOVER_TEMP, actual_size=size, detail="temp file of an interrupted write"))

    def _untracked(self, files: list[tuple[str, int | None]]) -> None:
        keys: list[tuple[str, str, int | None]] = []
        for rel, size in files:
            try:
                rel.encode()
            except UnicodeEncodeError:  # not UTF-8 on disk: no payload can name it
                shown = rel.encode(errors="surrogateescape").decode(errors="replace")
                self.found(Finding(shown, UNTRACKED, actual_size=size))
                continue
            keys.append((file_key(answer_of(rel) or rel), rel, size))  # an answer's sidecar goes with it
        if not keys:
            return
        known = self.reads.known(sorted({k for k, _, _ in keys}))
        for key, rel, size in keys:
            if key not in known:
                self.found(Finding(rel, UNTRACKED, actual_size=size, detail="no job ever named this file"))


def entries(
    root: Path, *, only_temps: bool, listed: Listed | None = None, clean: CleanDirs | None = None
) -> Iterator[Entry]:
    """(relative path, entry) of every non-directory entry under ``root`` (only temp files with
    ``only_temps``), skipping ``.tether/``; (directory, None) for one that could not be listed.
    With ``listed`` (only temp files), the directories in it are taken from it (entry: True);
    with ``clean`` (only temp files), a leaf directory unchanged since a listing found it clean
    is not listed (``clean_dirs.py``). Each directory is opened from the root without following
    a symlink, as the probes read."""
    stack: list[tuple[str, str | None]] = [("", clean.root() if clean is not None else None)]
    with durable.opened_root(root) as root_fd:
        while stack:
            prefix, row = stack.pop()
            path = os.path.join(root, prefix) if prefix else root
            known = listed.get(os.path.normpath(path)) if listed else None
            if known is not None and only_temps:
                temps, probed = known
                yield from ((f"{prefix}{name}", True) for name in temps)
                _push(stack, prefix, probed, clean)
                continue
            try:
                dir_fd = nofollow.open_dir(root_fd, prefix.rstrip("/"))
            except FileNotFoundError:
                continue
            except OSError:
                yield prefix.rstrip("/") or ".", None
                continue
            if only_temps:
                moment = time.time_ns()  # before the fstat: see clean_dirs.py
                st = _leaf(dir_fd)
                if st is not None:
                    yield from _leaf_temps(dir_fd, prefix, moment, st, row, clean)
                    continue
            if row is not None and clean is not None:
                clean.not_leaf(prefix)
            subdirs: list[str] = []
            yield from _scan(dir_fd, prefix, only_temps, subdirs)
            _push(stack, prefix, subdirs, clean)


def _push(stack: list[tuple[str, str | None]], prefix: str, subdirs: list[str], clean: CleanDirs | None) -> None:
    """The subdirectories of the directory at ``prefix`` onto ``stack`` (but ``.tether/`` at the
    root), each with its clean row (none looked for under a directory without subdirectories:
    most directories, a read each otherwise; rows left under it by subdirectories since removed
    are never trusted, their directories being gone)."""
    rows = clean.under(prefix, subdirs) if clean is not None and subdirs else {}
    stack.extend((f"{prefix}{name}/", rows.get(name)) for name in subdirs if prefix or name != paths.INTERNAL_DIR)


def _leaf_temps(
    dir_fd: int, prefix: str, moment: int, st: os.stat_result, row: str | None, clean: CleanDirs | None
) -> Iterator[Entry]:
    """The temp files of a directory without subdirectories, from its names alone (none read
    when ``clean`` says it is unchanged since a clean listing); closes it."""
    try:
        names = None if clean is not None and clean.unchanged(st, row) else os.listdir(dir_fd)
    except OSError:
        yield prefix.rstrip("/") or ".", None
        return
    finally:
        os.close(dir_fd)
    if names is None:
        return
    # Most directories hold no temp file: that is decided in C, on the names joined.
    temps = [name for name in names if name.endswith(paths.TEMP_SUFFIX)] if paths.TEMP_SUFFIX in "/".join(names) else []
    if clean is not None:
        clean.listed(prefix, moment, st, row, temps=bool(temps))
    yield from ((f"{prefix}{name}", True) for name in temps)


def _scan(dir_fd: int, prefix: str, only_temps: bool, subdirs: list[str]) -> Iterator[Entry]:
    """The entries of a directory (only temp files with ``only_temps``); the names of its
    subdirectories go to ``subdirs``. Closes the directory."""
    try:
        found = os.scandir(dir_fd)
    except OSError:
        os.close(dir_fd)
        yield prefix.rstrip("/") or ".", None
        return
    try:  # the entries' stat() uses dir_fd: it stays open while they are handed out
        with found:
            for entry in found:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:  # a data directory named ``x.tether-tmp`` is no temp file
                    subdirs.append(entry.name)
                elif not only_temps or entry.name.endswith(paths.TEMP_SUFFIX):
                    yield f"{prefix}{entry.name}", entry
    finally:
        os.close(dir_fd)


def _leaf(dir_fd: int) -> os.stat_result | None:
    """The open directory's fstat if it has no subdirectory, else None: a link count of 2 (its
    name and its own ``.``) says so where the file system counts subdirectories' ``..`` (ext4,
    XFS, tmpfs; btrfs says 1, and so does ext4 past 65,000 subdirectories: those are listed in
    full). A leaf's temp files are found from its names alone, without a type check per entry:
    as GNU find's leaf optimisation, and most of the walk's cost."""
    try:
        st = os.fstat(dir_fd)
    except OSError:
        return None
    return st if st.st_nlink == 2 else None


def _size(entry: os.DirEntry[str]) -> int | None:
    try:
        return entry.stat(follow_symlinks=False).st_size
    except OSError:
        return None
