"""The reconciler benchmark (issues 3, 37): paths checked per second next to bare file-system
loops, and peak memory for 100,000 vs 1,000,000 jobs.

    .venv/bin/python benchmarks/reconcile.py [--jobs 100000] [--big 1000000] [--runs 5] [--dir DIR]
    .venv/bin/python benchmarks/reconcile.py --large-files 2500 [--file-kib 64,512]

(a) Throughput: a ledger of ``--jobs`` completed create_file jobs, one file each, in sync, each
    with the fingerprint a worker records (its file's stat just after the write: mostly racily
    clean, so the first check reads those and records new ones; its time is printed).
    ``reconcile(content=False)`` (existence only) and ``reconcile()`` (content, by fingerprints)
    run next to a bare loop of ``os.stat`` over the same paths, and ``reconcile(full=True)``
    (every file read: size, then bytes) next to a bare loop of open + read + sha256. Runs are
    interleaved, the page cache is warm for both sides, every figure is the median over
    ``--runs``. The reconciler's figure includes everything it does: reading the ledger in
    batches, rendering expected bytes from payloads, and listing the tree for leftover temp
    files; the bare loops are given the paths. Then 1 % of the files are edited in place (same
    size, other bytes, mtime set back as ``touch -r`` does): the check by fingerprints and the
    full read must each report exactly those as modified.
(b) Memory: peak RSS of a fresh process that reconciles (full content) a ledger of ``--jobs``
    and one of ``--big`` jobs. Both ledgers are in sync and have the same mix (1 create_file in
    10, the rest delete_file of absent paths), so findings stay empty and what is measured is
    what the check holds per job read, not the size of a drift report. Reported: peak RSS and
    peak minus the RSS after imports and opening the ledger (the reconciler's own share).
(c) ``--large-files N`` (instead of a and b): peak RSS of a full check and of a check by
    fingerprints with none recorded (every file read, as after an upgrade) over N files of each
    ``--file-kib`` size: what a check holds of its payloads, pages of them read ahead included.

Ledgers are built with bulk inserts of completed rows (a worker would take hours for 1,000,000);
files go to ``--dir`` (default: a tmpfs under /dev/shm when there is one, since creating 100,000
files on a shared disk dominates the run otherwise; reads are from the page cache either way).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tether import Coordinator, CreateFile, DeleteFile
from tether.jobtypes import render
from tether.jobtypes.datafiles import fingerprint
from tether.jobtypes.datafiles.durable import Known
from tether.jobtypes.target import file_key
from tether.ledger.ids import new_id
from tether.reconcile.check import reconcile

BATCH = 20_000


def build_ledger(
    db: Path, root: Path, jobs: int, *, create_every: int = 1, files: bool = True, text_kib: int = 0
) -> list[str]:
    """``jobs`` completed jobs: every ``create_every``-th a create_file (its file written), the
    others delete_file of a path that is absent. Returns the created files' absolute paths.
    ``text_kib``: each file holds that many KiB of text, and has no fingerprint (as after an
    upgrade: a check by fingerprints reads them all)."""
    c = Coordinator.open(f"sqlite:///{db}", root=root, durability="normal")
    now = c.clock.now()
    stamp = now.replace(tzinfo=None).isoformat(" ")
    created: list[str] = []
    raw = c.engine.raw_connection()
    try:
        cur = raw.cursor()
        rows = []
        for i in range(jobs):
            path = f"d{i % 1000:03d}/{i:07d}.json"
            recorded = None
            if i % create_every == 0:
                if text_kib:
                    payload = CreateFile(path=path, text=f"{i:07d}" + "x" * (text_kib * 1024 - 7))
                else:
                    payload = CreateFile(path=path, content={"id": i, "name": f"item {i}", "tags": ["a", "b"]})
                if files:
                    target = root / path
                    target.parent.mkdir(exist_ok=True)
                    target.write_bytes(render(payload))
                    created.append(str(target))
                    # As a worker records it: the moment, then the stat, just after the write.
                    recorded = None if text_kib else fingerprint.of(Known(time.time_ns(), os.stat(target)))
            else:
                payload = DeleteFile(path=path)
            encoded = payload.to_json()
            rows.append(
                (
                    new_id(now),
                    payload.job_type,
                    encoded.decode(),
                    len(encoded),
                    stamp,
                    stamp,
                    stamp,
                    stamp,
                    file_key(path),
                    recorded,
                )
            )
            if len(rows) == BATCH or i == jobs - 1:
                cur.execute("BEGIN")
                cur.executemany(
                    "INSERT INTO tether_jobs (id, type, payload, payload_bytes, status, priority, attempts,"
                    " max_attempts, created_at, run_at, claimed_at, completed_at, ordering_key, fingerprint)"
                    " VALUES (?, ?, ?, ?, 'completed', 0, 1, 3, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                cur.execute("COMMIT")
                rows = []
        cur.execute("ANALYZE")
    finally:
        raw.close()
        c.close()
    return created


def bare_stat(paths: list[str]) -> None:
    for p in paths:
        os.stat(p)


def bare_read_hash(paths: list[str]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            hashlib.sha256(f.read()).hexdigest()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def throughput(work: Path, jobs: int, runs: int) -> dict:
    db, root = work / "throughput.db", work / "data"
    started = time.perf_counter()
    paths = build_ledger(db, root, jobs)
    print(f"built {jobs:,} completed create_file jobs and files in {time.perf_counter() - started:.1f}s", flush=True)
    c = Coordinator.open(f"sqlite:///{db}", root=root)
    try:
        bare_stat(paths), bare_read_hash(paths)  # warm the page cache for both sides
        first = timed(lambda: _in_sync(c, jobs))
        print(
            f"first check by fingerprints after the writes (reads the racily clean): {jobs / first:,.0f}/s", flush=True
        )
        for options in ({"content": False}, {"full": True}):
            _in_sync(c, jobs, **options)
        samples: dict[str, list[float]] = {k: [] for k in ("stat", "exists", "fingerprint", "read_hash", "full")}
        for run in range(runs):
            pairs = [
                ("stat", lambda: bare_stat(paths)),
                ("exists", lambda: reconcile(c, content=False)),
                ("fingerprint", lambda: reconcile(c)),
                ("read_hash", lambda: bare_read_hash(paths)),
                ("full", lambda: reconcile(c, full=True)),
            ]
            if run % 2:  # alternate which side goes first
                pairs = [pairs[1], pairs[2], pairs[0], pairs[4], pairs[3]]
            for name, fn in pairs:
                samples[name].append(jobs / timed(fn))
        edits = edited(c, root, paths)
    finally:
        c.close()
    rates = {k: statistics.median(v) for k, v in samples.items()}
    # Ratios per run (each pair measured back to back), then their median: on a shared machine
    # the load moves between runs more than between the two sides of one pair.
    return {
        "jobs": jobs,
        "runs": runs,
        "paths_per_s": rates,
        "samples": samples,
        "exists_vs_stat": _ratio(samples["exists"], samples["stat"]),
        "fingerprint_vs_stat": _ratio(samples["fingerprint"], samples["stat"]),
        "full_vs_read_hash": _ratio(samples["full"], samples["read_hash"]),
        "edits": edits,
    }


def _ratio(mine: list[float], bare: list[float]) -> float:
    return statistics.median(m / b for m, b in zip(mine, bare, strict=True))


def _in_sync(c: Coordinator, jobs: int, **options: bool) -> None:
    report = reconcile(c, **options)
    assert report.counts["in_sync"] == jobs and not report.findings, report.summary()


def edited(c: Coordinator, root: Path, paths: list[str]) -> dict:
    """Edit 1 % of the files in place (same size, other bytes, mtime set back as ``touch -r``
    does); what the check by fingerprints and the full read each report."""
    chosen = paths[::100]
    for path in chosen:
        st = os.stat(path)
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            data[-2] ^= 0x01  # a digit of the id: other bytes, same size, still JSON
            f.seek(0)
            f.write(data)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    want = {os.path.relpath(p, root) for p in chosen}
    found = {}
    for name, options in (("fingerprint", {}), ("full", {"full": True})):
        started = time.perf_counter()
        report = reconcile(c, **options)
        found[name] = {
            "seconds": time.perf_counter() - started,
            "modified": len([f for f in report.findings if f.status == "modified"]),
            "exactly_the_edited": {(f.path, f.status) for f in report.findings} == {(p, "modified") for p in want},
        }
    return {"edited": len(chosen), **found}


def rss_child(db: str, root: str, mode: str = "full") -> None:
    """Run in a fresh process: print baseline and peak RSS (KiB) around one check (``mode``:
    "full", every file read; "fingerprints", the default content check)."""
    c = Coordinator.open(f"sqlite:///{db}", root=root)
    reconcile(c, content=False, batch_size=10)  # imports and first connections, on a tiny read
    base = _current_rss_kib()
    started = time.perf_counter()
    report = reconcile(c, full=mode == "full")
    elapsed = time.perf_counter() - started
    peak = _status_kib("VmHWM")
    print(
        json.dumps(
            {
                "baseline_kib": base,
                "peak_kib": peak,
                "seconds": elapsed,
                "in_sync": report.counts["in_sync"],
                "findings": len(report.findings),
            }
        )
    )


def _current_rss_kib() -> int:
    return _status_kib("VmRSS")


def _status_kib(field: str) -> int:
    """A figure of /proc/self/status in KiB: VmRSS now, or VmHWM, the peak of this process's own
    memory (``ru_maxrss`` keeps the parent's peak across the exec that starts a child)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    return 0


def _checked_in_child(db: Path, root: Path, mode: str, targets: int) -> dict:
    """``rss_child``'s figures of one check of a ledger of ``targets`` in sync, in a fresh process."""
    done = subprocess.run(
        [sys.executable, __file__, "--rss-child", str(db), str(root), "--rss-mode", mode],
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["findings"] == 0 and found["in_sync"] == targets, found
    return found


@contextmanager
def _work_dir(given: Path | None) -> Iterator[Path]:
    """A scratch directory under ``given``, else on a tmpfs when there is one, removed after."""
    base = given or (Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir()))
    work = Path(tempfile.mkdtemp(prefix="tether-bench-reconcile-", dir=base))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def memory(work: Path, small: int, big: int) -> dict:
    out = {}
    for jobs in (small, big):
        db, root = work / f"rss-{jobs}.db", work / f"rss-{jobs}"
        started = time.perf_counter()
        build_ledger(db, root, jobs, create_every=10)
        print(f"built {jobs:,} jobs (1 create in 10) in {time.perf_counter() - started:.1f}s", flush=True)
        out[jobs] = _checked_in_child(db, root, "full", jobs)
        shutil.rmtree(root, ignore_errors=True)
        db.unlink()
    s, b = out[small], out[big]
    return {
        "small": small,
        "big": big,
        "results": out,
        "peak_ratio": b["peak_kib"] / s["peak_kib"],
        "own_ratio": (b["peak_kib"] - b["baseline_kib"]) / max(1, s["peak_kib"] - s["baseline_kib"]),
    }


def large_files(work: Path, count: int, sizes: list[int]) -> dict[int, dict[str, dict]]:
    """Peak RSS of a full check and of a check by fingerprints (none recorded: every file read)
    over ``count`` files of each size in KiB, a fresh process each."""
    out: dict[int, dict[str, dict]] = {}
    for kib in sizes:
        db, root = work / f"large-{kib}.db", work / f"large-{kib}"
        started = time.perf_counter()
        build_ledger(db, root, count, text_kib=kib)
        print(f"built {count:,} files of {kib:,} KiB in {time.perf_counter() - started:.1f}s", flush=True)
        out[kib] = {mode: _checked_in_child(db, root, mode, count) for mode in ("full", "fingerprints")}
        shutil.rmtree(root, ignore_errors=True)
        db.unlink()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--rss-child", nargs=2, metavar=("DB", "ROOT"))
    parser.add_argument("--rss-mode", default="full", choices=("full", "fingerprints"))
    parser.add_argument("--large-files", type=int, default=0, help="(c) only: this many files of each --file-kib")
    parser.add_argument("--file-kib", default="64,512", help="(c): the files' sizes in KiB")
    args = parser.parse_args()
    if args.rss_child:
        rss_child(*args.rss_child, args.rss_mode)
        return
    if args.large_files:
        with _work_dir(args.dir) as work:
            found = large_files(work, args.large_files, [int(n) for n in args.file_kib.split(",")])
        print(f"\n(c) peak RSS of a check of {args.large_files:,} files (fresh process each)")
        for kib, modes in found.items():
            for mode, res in modes.items():
                own = (res["peak_kib"] - res["baseline_kib"]) / 1024
                print(
                    f"    {kib:>6,} KiB files ({args.large_files * kib / 1024:,.0f} MiB in all), {mode:<12}:"
                    f" peak {res['peak_kib'] / 1024:7.1f} MiB, reconcile's own {own:7.1f} MiB, {res['seconds']:.2f}s"
                )
        return
    with _work_dir(args.dir) as work:
        t = throughput(work, args.jobs, args.runs)
        shutil.rmtree(work / "data", ignore_errors=True)
        r = t["paths_per_s"]
        print(f"\n(a) paths checked per second, {t['jobs']:,} completed jobs, median of {t['runs']} runs")
        print(
            f"    fingerprints compared in {'C (_stamps.c)' if fingerprint.matches_in_c else 'Python (no _stamps.c)'}"
        )
        print(
            f"    existence only : reconcile {r['exists']:>10,.0f}/s   bare os.stat      {r['stat']:>10,.0f}/s"
            f"   ratio {t['exists_vs_stat']:.0%}*"
        )
        print(
            f"    content (fprint): reconcile {r['fingerprint']:>9,.0f}/s   bare os.stat      {r['stat']:>10,.0f}/s"
            f"   ratio {t['fingerprint_vs_stat']:.0%}*"
        )
        print(
            f"    full content   : reconcile {r['full']:>10,.0f}/s   bare read+sha256  {r['read_hash']:>10,.0f}/s"
            f"   ratio {t['full_vs_read_hash']:.0%}*"
        )
        print("    * median of the per-run ratios (each run measures both sides back to back)")
        print("    samples: " + json.dumps({k: [round(x) for x in v] for k, v in t["samples"].items()}))
        e = t["edits"]
        print(f"    {e['edited']:,} files edited in place (same size, mtime restored):")
        for name in ("fingerprint", "full"):
            print(
                f"      {name:<11}: {e[name]['modified']:,} modified, exactly the edited ones: "
                f"{e[name]['exactly_the_edited']} ({e[name]['seconds']:.2f}s)"
            )
        if not args.skip_memory:
            m = memory(work, args.jobs, args.big)
            print("\n(b) peak RSS of a full-content check (fresh process each)")
            for jobs, res in m["results"].items():
                print(
                    f"    {jobs:>9,} jobs: peak {res['peak_kib'] / 1024:7.1f} MiB,"
                    f" baseline {res['baseline_kib'] / 1024:6.1f} MiB,"
                    f" reconcile's own {(res['peak_kib'] - res['baseline_kib']) / 1024:6.1f} MiB, {res['seconds']:.1f}s"
                    f" ({jobs / res['seconds']:,.0f} jobs/s)"
                )
            print(
                f"    ratio {m['big']:,} / {m['small']:,}: peak {m['peak_ratio']:.2f}x, own share {m['own_ratio']:.2f}x"
            )


if __name__ == "__main__":
    main()
