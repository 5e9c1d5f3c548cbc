"""A check of the data root in instructions a target (callgrind), for source trees side by side.

    .venv/bin/python benchmarks/reconcile_cg.py [SRC ...] [--jobs 30000] [--modes exists content full]
                                                [--profile MODE]

Each SRC is a checkout's ``src`` (default: this one's). Per tree, its own
``benchmarks/reconcile.py`` builds a ledger of ``--jobs`` completed create_file jobs, one file
each, in sync (a tree reads only its own schema), on tmpfs (``/dev/shm``), and one untimed process
checks it once in every mode (the first content check records fingerprints; later ones find
them). Then, under ``valgrind --tool=callgrind`` (``PYTHONHASHSEED=0``), one process checks the
ledger once in every mode (the warm-up: imports, caches, the clean directories' rows) and stops;
and one per mode does the same, then checks it once more in that mode. The difference over the
number of targets is that check's instructions a target, with its split by object file (self
cost: libsqlite3, the interpreter, libc, the rest), as ``drain_cg.py`` splits them.

Modes as ``reconcile_before.py``'s: existence (``content=False``), the default content check, and
every file read (``full=True``; a tree without that option reads every file in its default
content check). ``--profile MODE`` prints instead the functions (cProfile, by own time) of one
such check after the warm-up, per tree, without valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from drain_cg import group, objects
from reconcile_before import _BUILD, MODES, REPO  # the same ledger, built the same way

# argv: ledger, root, measured mode ("" for none, "warm" for the untimed first pass), "profile"?
_CHECK = """
import inspect, sys
from tether import Coordinator
from tether.reconcile.check import reconcile
c = Coordinator.open(f"sqlite:///{sys.argv[1]}", root=sys.argv[2])
full = {"full": True} if "full" in inspect.signature(reconcile).parameters else {}
modes = {"exists": {"content": False}, "content": {}, "full": full}
for options in modes.values():
    reconcile(c, **options)
if sys.argv[3] in modes:
    if sys.argv[4:] == ["profile"]:
        import cProfile, pstats
        profile = cProfile.Profile()
        profile.runcall(reconcile, c, **modes[sys.argv[3]])
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    else:
        reconcile(c, **modes[sys.argv[3]])
"""


def counted(check: list[str], env: dict[str, str], out: Path) -> tuple[int, dict[str, int]]:
    """The instructions of one child process (whole, and split by object file)."""
    valgrind = ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={out}"]
    subprocess.run([*valgrind, *check], env=env, check=True, capture_output=True)
    with out.open(errors="replace") as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("summary:"))
    return total, group(objects(out))


def tree(src: Path, work: Path, args: argparse.Namespace) -> None:
    side = work / re.sub(r"\W", "_", str(src))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(PYTHONPATH=str(src), PYTHONHASHSEED="0")
    build = [sys.executable, "-c", _BUILD, str(src.parent / "benchmarks"), f"{side}.db", str(side), str(args.jobs)]
    subprocess.run(build, env=env, check=True)
    check = [sys.executable, "-c", _CHECK, f"{side}.db", str(side)]
    subprocess.run([*check, "warm"], env=env, check=True)
    if args.profile:
        print(f"{src} ({args.profile}):", flush=True)
        subprocess.run([*check, args.profile, "profile"], env=env, check=True)
        return
    base, base_split = counted([*check, ""], env, work / "callgrind.base")
    for mode in args.modes:
        total, split = counted([*check, mode], env, work / f"callgrind.{mode}")
        parts = " ".join(f"{(split[k] - base_split[k]) / args.jobs:,.0f}" for k in split)
        print(f"{src} {mode:8s} {(total - base) / args.jobs:8,.0f} | {parts}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="*", type=Path, help="checkouts' src directories (default: this one's)")
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--profile", choices=MODES, help="cProfile one check in this mode instead")
    parser.add_argument("--base", default="/dev/shm", help="where the ledgers and files go")
    args = parser.parse_args()
    trees = [src.resolve() for src in args.trees] or [(REPO / "src").resolve()]
    print(f"instructions a target ({args.jobs:,} targets): whole | sqlite python libc other")
    for src in trees:
        with tempfile.TemporaryDirectory(dir=args.base, prefix="tether-reconcile-cg-") as work:
            tree(src, Path(work), args)


if __name__ == "__main__":
    main()
