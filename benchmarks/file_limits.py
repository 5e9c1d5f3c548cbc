"""create_file against the bare durable atomic-write loop, with no ledger at all (issue 19, target 3).

    .venv/bin/python benchmarks/file_limits.py [--jobs 1000] [--dirs 4] [--rounds 8] [--before SRC]
    .venv/bin/python benchmarks/file_limits.py --profile [--cpu] [--jobs 2000]

Bare: per file, render the payload's bytes, temp file in the same directory (O_EXCL), write,
fsync, ``os.replace``, fsync the directory. No ledger, no lock, no path checks.
tether: the same files as ``create_file`` jobs (enqueued untimed with ``enqueue_many``), drained by
one worker thread (``run_until_idle``), SQLite WAL + ``synchronous=FULL``.

Each block writes ``--jobs`` files over ``--dirs`` directories (made beforehand on every side) in a
fresh process and a fresh scratch directory. A round runs one block per side, the order rotating
from round to round; the figures are medians of the per-round ratios, and of each side's CPU a
file split into user and system time (``getrusage`` around the timed part: what tether controls
is mostly its user time; the system time of both sides moves with ext4's inode allocation). With ``--before SRC``
(another checkout's ``src``, e.g. ``git worktree add /tmp/base main``), that tree's tether is a
third side in the same rounds, so before and after come from one run on one machine state.

``--profile`` drains one block in this process with cProfile around ``Worker._loop`` (the worker
thread) and prints the top functions by cumulative and by own time: wall time, or with ``--cpu``
the worker thread's CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRATCH = REPO / ".bench"

# Both sides' prelude: fsyncs counted, the payload (five fields, one a nested object: the shape an
# application sends) and its path, and the block's directories, made before anything is timed.
_CONTENT = """
import os
_fsync, fsyncs = os.fsync, [0]
def _counted(fd):
    fsyncs[0] += 1
    _fsync(fd)
os.fsync = _counted  # file and directory fsyncs from Python, counted (SQLite's own are not)
def content(i):
    return {"id": i, "title": f"note {i}", "tags": ["bench", "tether"],
            "meta": {"owner": "bench", "rev": i, "labels": {"a": 1, "b": [1, 2]}}, "done": False}
def rel(i, dirs):
    return f"d{i % dirs:02d}/note-{i:06d}.json"
import sys
# Both sides: the block's scratch directory, its size, and the directories made beforehand.
directory, jobs, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
root = os.path.join(directory, "data")
for d in range(dirs):
    os.makedirs(os.path.join(root, f"d{d:02d}"))
"""

_BARE = (
    _CONTENT
    + """
import json, os, resource, sys, time
import orjson
from _common import write_replace
items = [(rel(i, dirs), content(i)) for i in range(jobs)]
wall, cpu, ru = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
for n, (path, body) in enumerate(items):
    data = orjson.dumps(body, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    target = os.path.join(root, path)
    parent = os.path.dirname(target)
    write_replace(f"{parent}/.{os.path.basename(target)}.{n:08x}.tmp", target, data, os.O_CLOEXEC)
wall, cpu, end = time.perf_counter() - wall, time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF)
user, sys_ = end.ru_utime - ru.ru_utime, end.ru_stime - ru.ru_stime
print(json.dumps({"wall": wall, "cpu": cpu, "user": user, "sys": sys_, "fsyncs": fsyncs[0] / jobs, "tether": None}))
"""
)

_TETHER = (
    _CONTENT
    + """
import json, os, resource, sys, time
import tether
from tether import Coordinator, CreateFile
from tether.jobtypes import render
c = Coordinator.open(f"sqlite:///{directory}/ledger.db", root=root, durability="full")
payloads = [CreateFile(path=rel(i, dirs), content=content(i), overwrite=True) for i in range(jobs)]
c.enqueue_many(payloads)
w = c.worker(threads=1)
wall, cpu, ru, fsyncs[0] = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF), 0
ran = w.run_until_idle(install_signals=False)
wall, cpu, end = time.perf_counter() - wall, time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF)
user, sys_ = end.ru_utime - ru.ru_utime, end.ru_stime - ru.ru_stime
assert ran == jobs, ran
for p in (payloads[0], payloads[-1]):
    with open(os.path.join(root, p.path), "rb") as f:
        assert f.read() == render(p), p.path
c.close()
print(json.dumps({"wall": wall, "cpu": cpu, "user": user, "sys": sys_, "fsyncs": fsyncs[0] / jobs,
                  "tether": tether.__file__}))
"""
)


def block(side: str, src: Path | None, jobs: int, dirs: int) -> dict[str, float]:
    """One block in a fresh process and scratch directory: seconds of wall and CPU time."""
    SCRATCH.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=SCRATCH, prefix=f"file-limits-{side}-") as d:
        env = dict(os.environ)
        # tether's side: that tree's tether; the bare side: _common's write_replace, nothing else.
        env["PYTHONPATH"] = str(src if src is not None else Path(__file__).resolve().parent)
        code = _BARE if src is None else _TETHER
        done = subprocess.run(
            [sys.executable, "-c", code, d, str(jobs), str(dirs)], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"{side} block failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout)
    if src is not None and not str(result["tether"]).startswith(str(src)):
        raise RuntimeError(f"{side} ran tether from {result['tether']}, not {src}")
    return result


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def measure(args: argparse.Namespace) -> int:
    sides: dict[str, Path | None] = {"bare": None, "tether": REPO / "src"}
    if args.before is not None:
        sides["before"] = args.before.resolve()
    rate: dict[str, list[float]] = {s: [] for s in sides}
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    split: dict[str, list[tuple[float, float]]] = {s: [] for s in sides}  # user, sys
    fsyncs: dict[str, list[float]] = {s: [] for s in sides}
    print(
        f"file_limits: {args.jobs} files per block over {args.dirs} directories, {args.rounds} rounds, "
        "sides " + ", ".join(f"{s}={p or '-'}" for s, p in sides.items())
    )
    print(f"start {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load {load()}", flush=True)
    names = list(sides)
    for _ in range(1):  # warm the page cache and the interpreters' bytecode caches
        for side in names:
            block(side, sides[side], 100, args.dirs)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for side in order:
            got = block(side, sides[side], args.jobs, args.dirs)
            rate[side].append(args.jobs / got["wall"])
            cpu[side].append(got["cpu"] / args.jobs * 1e6)
            split[side].append((got["user"] / args.jobs * 1e6, got["sys"] / args.jobs * 1e6))
            fsyncs[side].append(got["fsyncs"])
        line = ", ".join(f"{s} {rate[s][-1]:,.0f}/s" for s in names)
        print(f"round {r + 1}: {line}; tether/bare {rate['tether'][-1] / rate['bare'][-1]:.3f}x", flush=True)
    print()
    for side in names:
        print(
            f"{side:>7}: median {statistics.median(rate[side]):,.0f} files/s, "
            f"{statistics.median(cpu[side]):,.0f} us CPU per file "
            f"(user {statistics.median(u for u, _ in split[side]):,.0f}, "
            f"sys {statistics.median(k for _, k in split[side]):,.0f}), "
            f"{statistics.median(fsyncs[side]):.2f} fsyncs per file (files and directories; SQLite's not counted)"
        )
    pairs = [("tether", "bare")] + ([("before", "bare"), ("tether", "before")] if "before" in sides else [])
    for a, b in pairs:
        ratios = [x / y for x, y in zip(rate[a], rate[b], strict=True)]
        # CPU too, round by round: the kernel's share of a file (its inode allocation above all)
        # moves with what the blocks before left behind, alike for the sides of one round.
        cpus = [x / y for x, y in zip(cpu[a], cpu[b], strict=True)]
        print(
            f"{a}/{b}: median of per-round ratios {statistics.median(ratios):.3f}x "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}); CPU per file {statistics.median(cpus):.3f}x "
            f"(range {min(cpus):.3f}-{max(cpus):.3f})"
        )
    print(f"end {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load {load()}")
    return 0


def profile(args: argparse.Namespace) -> int:
    """One tether block in this process, cProfile around the worker thread's loop."""
    import cProfile
    import pstats

    from tether import Coordinator, CreateFile
    from tether.worker.loop import Worker

    # CPU time of the worker thread (the process's would count other threads' to whatever call it
    # spans), not wall time, which the
    # fsyncs' waits would fill.
    prof = cProfile.Profile(time.thread_time) if args.cpu else cProfile.Profile()
    loop = Worker._loop

    def profiled(self: Worker, until_idle: bool) -> None:
        prof.runcall(loop, self, until_idle)

    SCRATCH.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=SCRATCH, prefix="file-limits-profile-") as d:
        # The benchmark's own payload builders, and the block's directories, as a block makes them.
        namespace: dict[str, object] = {}
        argv, sys.argv = sys.argv, [sys.argv[0], d, str(args.jobs), str(args.dirs)]
        try:
            exec(_CONTENT, namespace)  # noqa: S102
        finally:
            sys.argv = argv
        content, rel = namespace["content"], namespace["rel"]
        root = Path(d) / "data"
        with Coordinator.open(f"sqlite:///{d}/ledger.db", root=root, durability="full") as c:
            c.enqueue_many(
                [CreateFile(path=rel(i, args.dirs), content=content(i), overwrite=True) for i in range(args.jobs)]  # type: ignore[operator]
            )
            Worker._loop = profiled  # type: ignore[method-assign]
            try:
                t0 = time.perf_counter()
                ran = c.worker(threads=1).run_until_idle(install_signals=False)
                wall = time.perf_counter() - t0
            finally:
                Worker._loop = loop  # type: ignore[method-assign]
    print(f"{ran} jobs in {wall:.2f} s ({ran / wall:,.0f}/s), load {load()}")
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000, help="files per block (default 1000)")
    ap.add_argument("--dirs", type=int, default=4, help="directories the files are spread over (default 4)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds, one block per side each (default 8)")
    ap.add_argument("--before", type=Path, default=None, help="another checkout's src: a third side")
    ap.add_argument("--profile", action="store_true", help="profile one tether block instead")
    ap.add_argument("--cpu", action="store_true", help="with --profile: CPU time, not wall time")
    ap.add_argument("--top", type=int, default=30, help="functions listed per profile table (default 30)")
    args = ap.parse_args(argv)
    return profile(args) if args.profile else measure(args)


if __name__ == "__main__":
    sys.exit(main())
