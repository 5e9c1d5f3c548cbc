"""Clean leaf directories: the ones a check's walk listed and found without a temp file, kept with
their fingerprints (``tether_clean_dirs``), so the next walk lists only the ones that changed.

Making, removing or renaming an entry in a directory changes its mtime and ctime, and no user can
set a ctime. So a leaf directory (no subdirectories) whose fstat still reads as the fingerprint
taken just before a listing that found no temp file holds no temp file now: the rule of a data
file's fingerprint (``datafiles/fingerprint.py``), racily clean case included (an fstat within a
tick of the directory's ctime is not recorded), applied to the directory's entries instead of a
file's bytes. A directory that is not a leaf is always listed (its subdirectories are walked from
that listing), and so is every directory of a check that trusts no fingerprint (``--full``).

The rows of a directory's subdirectories are read when the walk lists it, so memory holds the
rows of the directories the walk holds anyway; rows of subdirectories gone from that listing are
forgotten then. New rows and forgotten ones are written in batches.
"""

from __future__ import annotations

import os

from ..jobtypes.datafiles import fingerprint
from ..jobtypes.datafiles.durable import Known
from .reads import LedgerReads

WRITE_AT = 500  # rows held before they are written


def parent_and_name(prefix: str) -> tuple[str, str]:
    """A walk's prefix (``a/b/``; ``""`` for the root) as its parent's prefix and its name."""
    head, _, name = prefix[:-1].rpartition("/")
    return (f"{head}/" if head else ""), name


class CleanDirs:
    """One walk's reads and writes of ``tether_clean_dirs``. ``trust``: whether a leaf whose fstat
    reads as its row is left unlisted (False: each is listed, and its row renewed)."""

    def __init__(self, reads: LedgerReads, *, trust: bool) -> None:
        self.reads = reads
        self.trust = trust
        self.clean: list[tuple[str, str, str]] = []
        self.gone: list[tuple[str, str]] = []

    def root(self) -> str | None:
        """The data root's own row (it may be a leaf: a flat data root)."""
        return self.reads.clean_dirs("").get("")

    def under(self, prefix: str, subdirs: list[str]) -> dict[str, str]:
        """The rows of the subdirectories of the directory at ``prefix``, just listed with
        ``subdirs``; the rows of others under it are forgotten."""
        known = self.reads.clean_dirs(prefix)
        known.pop("", None)  # the root's own row, under the root's prefix
        gone = known.keys() - set(subdirs)
        if gone:
            self._forget([(prefix, name) for name in gone])
        return known

    def unchanged(self, st: os.stat_result, known: str | None) -> bool:
        """Whether a leaf's fstat reads as its row: no entry changed since its clean listing."""
        return self.trust and known is not None and fingerprint.stamp(st) == known

    def listed(self, prefix: str, moment: int, st: os.stat_result, known: str | None, *, temps: bool) -> None:
        """A leaf at ``prefix`` was listed after an fstat ``st`` taken at ``moment``: kept as
        clean if it held no temp file and that fstat is trusted, else its row forgotten."""
        parent, name = parent_and_name(prefix)
        stamp = None if temps else fingerprint.of(Known(moment, st))
        if stamp is not None:
            if stamp != known:
                self.clean.append((parent, name, stamp))
                if len(self.clean) >= WRITE_AT:
                    self.flush()
        elif known is not None:
            self._forget([(parent, name)])

    def not_leaf(self, prefix: str) -> None:
        """The directory at ``prefix``, which has a row, is no leaf now: its row is forgotten."""
        self._forget([parent_and_name(prefix)])

    def _forget(self, rows: list[tuple[str, str]]) -> None:
        self.gone.extend(rows)
        if len(self.gone) >= WRITE_AT:
            self.flush()

    def flush(self) -> None:
        """Write the rows held (a ledger that refuses is told by an event; the walk stands)."""
        if self.clean or self.gone:
            self.reads.keep_clean_dirs(self.clean, self.gone)
        self.clean, self.gone = [], []
