"""Where a content check by fingerprints spends its time, per target: each part timed alone on
the same ledger, the parts alternated run by run, medians (issue 37).

    .venv/bin/python benchmarks/reconcile_parts.py [--jobs 100000] [--runs 5] [--dir DIR]

Parts: the bare ``os.stat`` loop of ``reconcile.py`` (paths in creation order); the whole check;
the page statements with their fetch; the same rows fetched by plain ``sqlite3`` (what any read
of a row a target costs in Python); the stream that turns pages into columns (statements
included); ``compare`` (the stats, stamps and comparisons: in C where ``_stamps.c`` is built);
the stats alone in Python, as ``compare`` makes them where it is not (through each directory's
descriptor, in key order); the walk for leftover temp files, as a
check makes it (a leaf directory unchanged since found clean not listed) and listing every
directory (as ``--full``). The ledger is
``reconcile.py``'s (files on tmpfs by default), checked once first so every file has a
fingerprint.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from reconcile import bare_stat, build_ledger
from tether import Coordinator
from tether.jobtypes.datafiles import durable, fingerprint, nofollow
from tether.reconcile.check import FILE_PREFIX, _Reconciler, reconcile
from tether.reconcile.targets import TargetStream
from tether.reconcile.walk import RootWalk

PAGE = 2000
# A page's rows, a row per target, as the check read them before its pages became one row of
# JSON arrays (RECONCILE_TARGETS_FINGERPRINTS without its payload test).
BARE_PAGE = "SELECT job_id, type, key, NULL, fingerprint FROM tether_targets WHERE key > ? ORDER BY key LIMIT ?"


def parts(c: Coordinator, root: Path, paths: list[str]) -> dict[str, Callable[[], object]]:
    rec = _Reconciler(c.engine, c.root, c.registry, True, False, PAGE, None)
    pages = list(TargetStream(rec.reads, PAGE))
    rels = [[key[len(FILE_PREFIX) :] for key in page.keys] for page in pages]
    recorded = [page.fingerprints for page in pages]

    def statements() -> None:  # the page reads of tether_targets (and of the jobs in flight)
        after_key = ""
        while (page := rec.reads.targets(after_key, PAGE)[0]).size == PAGE:
            after_key = page.last

    def bare_fetch() -> None:  # the same pages' rows through plain sqlite3: the floor of a read
        conn = sqlite3.connect(c.engine.url.database)
        try:
            after_key = ""
            while len(rows := conn.execute(BARE_PAGE, (after_key, PAGE)).fetchall()) == PAGE:
                after_key = rows[-1][2]
        finally:
            conn.close()

    def stream() -> None:  # the check's reads, the next page read on the stream's thread
        for _ in TargetStream(rec.reads, PAGE):
            pass

    def compare() -> None:
        for page, known in zip(rels, recorded, strict=True):
            fingerprint.compare(root, page, known)

    def stats() -> None:
        with durable.opened_root(root) as root_fd:
            for page in rels:
                current, dir_fd = None, -1
                for rel in page:
                    directory, _, name = rel.rpartition("/")
                    if directory != current:
                        if dir_fd >= 0:
                            os.close(dir_fd)
                        dir_fd, current = nofollow.open_dir(root_fd, directory), directory
                    os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                os.close(dir_fd)

    return {
        "bare os.stat (reconcile.py's loop)": lambda: bare_stat(paths),
        "the check, whole": lambda: reconcile(c),
        "ledger: page statements and fetch": statements,
        "ledger: the same rows through bare sqlite3": bare_fetch,
        "ledger: the stream (pages to columns)": stream,
        "files: compare (stat, stamp, compare)": compare,
        "files: the stats alone, in Python": stats,
        "walk for leftover temp files": lambda: RootWalk(root, rec.reads, lambda f: None, untracked=False).run({}),
        "walk, every directory listed": lambda: RootWalk(
            root, rec.reads, lambda f: None, untracked=False, trust=False
        ).run({}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tether-parts-", dir=args.dir))
    try:
        root = work / "data"
        paths = build_ledger(work / "parts.db", root, args.jobs)
        c = Coordinator.open(f"sqlite:///{work / 'parts.db'}", root=root)
        assert reconcile(c).counts["in_sync"] == args.jobs  # records the racily clean's fingerprints
        timed = parts(c, root, paths)
        samples: dict[str, list[float]] = {name: [] for name in timed}
        load = os.getloadavg()
        for run in range(args.runs):
            for name, fn in list(timed.items())[:: -1 if run % 2 else 1]:
                started = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - started) / args.jobs * 1e6)
        c.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.jobs:,} targets, medians of {args.runs}; load average {load[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"fingerprints compared in {'C (_stamps.c)' if fingerprint.matches_in_c else 'Python (no _stamps.c)'}")
    for name, values in samples.items():
        print(f"  {name:48s} {statistics.median(values):6.2f} us a target")
    bare, whole = (statistics.median(samples[k]) for k in ("bare os.stat (reconcile.py's loop)", "the check, whole"))
    print(f"  the check at {bare / whole:.2f}x of bare os.stat")


if __name__ == "__main__":
    main()
