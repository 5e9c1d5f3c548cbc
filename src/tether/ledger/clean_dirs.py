"""The ``tether_clean_dirs`` table: the leaf directories a reconcile check's walk found without
temp files, as an fstat saw them (its reads and writes: ``reconcile/clean_dirs.py``).

A row is a hint kept by the walk alone: losing one costs a directory's listing, never a verdict.
"""

from __future__ import annotations

import sqlalchemy as sa

from .schema import metadata

clean_dirs = sa.Table(
    "tether_clean_dirs",
    metadata,
    # A leaf directory of the data root (one without subdirectories) as an fstat saw it just
    # before a listing that found no temp file in it (reconcile/clean_dirs.py): while its fstat
    # still reads so, no entry was made, removed or renamed in it, and a check's walk for leftover
    # temp files need not list it. Kept by the walk alone; losing a row costs one listing.
    sa.Column("parent", sa.String(1024), primary_key=True),  # the walk's prefix: "" or "a/b/"
    sa.Column("name", sa.String(1024), primary_key=True),  # "" for the data root itself
    sa.Column("fingerprint", sa.Text, nullable=False),  # datafiles/fingerprint.py's text
    sqlite_with_rowid=False,  # a directory's rows are one range of the key's b-tree
)
