"""The pages each commit of a hot-target drain writes (WAL frames), by b-tree.

    .venv/bin/python benchmarks/wal_frames.py [--before SRC] [--after SRC] [--jobs 2000] [--batch 100]

One worker thread drains ``--jobs`` no-op jobs all on one target (hot_target.py's K = 1), SQLite
with full durability, with the WAL never checkpointed (``wal_autocheckpoint=0`` on every
connection), so the WAL file holds every frame the drain wrote. Each frame header names its page
and marks the commit it ends; the pages are put to their b-tree by ``dbstat`` on a copy of the
ledger as it stood after that commit (the WAL cut after the commit's last frame), for a sample
of the drain's commits. Printed per side: commits and frames per job, the distribution of frames
per commit, and the b-trees of the sampled commits' pages per job.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sqlite3
import struct
import tempfile
from pathlib import Path
from typing import Any

import _common
from _common import SCRATCH, scratch

WAL_HEADER = 32
FRAME_HEADER = 24


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Drain in this process (tether from PYTHONPATH); copy the ledger and its WAL to spec["out"]."""
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real_connect(*args, **kwargs)
        conn.execute("PRAGMA wal_autocheckpoint=0")
        return conn

    # SQLAlchemy's driver module is sqlite3.dbapi2, whose connect is its own name.
    sqlite3.connect = sqlite3.dbapi2.connect = connect  # type: ignore[assignment]
    import tether
    from hot_jobtypes import hot_noop
    from tether import Coordinator
    from tether.jobtypes import default_registry

    HotNoop, HotNoopType = hot_noop()
    registry = default_registry()
    registry.register(HotNoopType())
    n, batch, out = spec["jobs"], spec["batch"], Path(spec["out"])
    with scratch(SCRATCH, "wal-frames") as tmp:
        db = tmp / "ledger.db"
        with Coordinator.open(f"sqlite:///{db}", root=tmp / "data", registry=registry, durability="full") as c:
            c.enqueue_many([HotNoop(n=i, key=spec["key"]) for i in range(n)])
            start = os.path.getsize(f"{db}-wal")
            ran = c.worker(threads=1, batch=batch).run_until_idle(install_signals=False)
            shutil.copy(db, out / "ledger.db")
            shutil.copy(f"{db}-wal", out / "ledger.db-wal")
    return {"ran": ran, "start": start, "src": str(Path(tether.__file__).parent)}


def frames(wal: bytes, start: int) -> tuple[int, list[list[int]]]:
    """The page size and, per commit from byte ``start`` on, its frames' page numbers."""
    page_size = struct.unpack(">I", wal[8:12])[0]
    salts = wal[16:24]
    size = FRAME_HEADER + page_size
    offset = max(start, WAL_HEADER)
    commits: list[list[int]] = []
    pages: list[int] = []
    while offset + size <= len(wal):
        pgno, commit = struct.unpack(">II", wal[offset : offset + 8])
        if wal[offset + 8 : offset + 16] != salts:
            raise RuntimeError(f"a frame of another WAL generation at byte {offset}: the WAL was reset")
        pages.append(pgno)
        offset += size
        if commit:
            commits.append(pages)
            pages = []
    return page_size, commits


def btrees(out: Path, wal: bytes, end: int) -> dict[int, str]:
    """Page number to b-tree name on the ledger as it stood at WAL byte ``end`` (a commit's end)."""
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        shutil.copy(out / "ledger.db", f"{tmp}/cut.db")
        Path(f"{tmp}/cut.db-wal").write_bytes(wal[:end])
        conn = sqlite3.connect(f"{tmp}/cut.db")
        try:
            names = {pgno: name for name, pgno in conn.execute("SELECT name, pageno FROM dbstat")}
        finally:
            conn.close()
    return names


def analyse(out: Path, start: int, ran: int, samples: int) -> dict[str, Any]:
    wal = (out / "ledger.db-wal").read_bytes()
    page_size, commits = frames(wal, start)
    size = FRAME_HEADER + page_size
    total = sum(len(c) for c in commits)
    by_count = collections.Counter(len(c) for c in commits)
    # Sample commits evenly over the middle of the drain, in pairs (a claim's and a completion's).
    ends, offset = [], max(start, WAL_HEADER)
    for c in commits:
        offset += len(c) * size
        ends.append(offset)
    step = max(1, len(commits) // samples)
    picked = list(range(len(commits) // 10, len(commits) - len(commits) // 10, step))[:samples]
    per_tree: collections.Counter[str] = collections.Counter()
    shapes: collections.Counter[tuple[str, ...]] = collections.Counter()
    for i in picked:
        for j in (i, i + 1):
            names = btrees(out, wal, ends[j])
            trees = tuple(sorted(names.get(p, "free/other") for p in commits[j]))
            shapes[trees] += 1
            per_tree.update(trees)
    sampled = 2 * len(picked)
    return {
        "jobs": ran,
        "commits": len(commits),
        "frames": total,
        "commits_per_job": len(commits) / ran,
        "frames_per_job": total / ran,
        "frames_per_commit": dict(sorted(by_count.items())),
        "sampled_commits": sampled,
        "pages_per_job_by_btree": {k: v / sampled * len(commits) / ran for k, v in per_tree.most_common()},
        "commit_shapes": [[n, list(s)] for s, n in shapes.most_common(6)],
    }


def measure(src: Path, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=SCRATCH) as out:
        spec = {"jobs": args.jobs, "batch": args.batch, "key": "k0", "out": out}
        got = _common.run_child(__file__, src, spec)
        return analyse(Path(out), got["start"], got["ran"], args.samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.tree_options(parser)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--samples", type=int, default=40, help="commit pairs whose pages are put to b-trees")
    args = parser.parse_args()
    trees = _common.trees_or_child(args, child)
    if trees is None:
        return
    SCRATCH.mkdir(parents=True, exist_ok=True)
    for side, src in trees.items():
        print(f"== {side}: {src}")
        print(json.dumps(measure(src, args), indent=1))


if __name__ == "__main__":
    main()
