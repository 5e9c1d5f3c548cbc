"""Issue 19, rows 1-2: tether's cost over the bare work it coordinates, each figure in a fresh process.

    .venv/bin/python benchmarks/limits.py [--before SRC] [--rounds 5] [--jobs 5000] [--only enqueue,first,drain]

Every measurement runs in a new interpreter (``--child``) on a fresh ledger under ``.bench/``, SQLite
WAL + synchronous=FULL on both sides, with blocks of ``--jobs`` jobs whose payload is what an
application sends: five fields, one of them a nested object (``Order`` below). Sides alternate
in short rounds (the side going first alternates too); each figure is the median over rounds, and
each ratio the median of the per-round ratios (same round, same load). With ``--before`` (another
checkout's ``src/``, put first on ``PYTHONPATH``) tether is measured on both trees in every round.

  enqueue, blocks       ``coordinator.enqueue(order)``, ``--jobs`` in a row, p50 / p95; bare: BEGIN
                        IMMEDIATE + INSERT of the same row (built by tether beforehand) + COMMIT,
                        ``--jobs`` in a row, in a process of its own.
  enqueue, interleaved  one tether enqueue and one bare INSERT + commit alternating, in one
                        process, on two ledgers (the side going first alternates per job).
  first enqueue         a fresh process against an existing ledger: ``Coordinator.open`` + one
                        ``enqueue`` (``import tether`` and the payload's model apart, but not what
                        the open imports: ``Coordinator`` loads lazily, with SQLAlchemy); then a
                        second open + enqueue in the same process, all loaded. Bare:
                        ``sqlite3.connect`` + pragmas + one INSERT + commit (both rows).
  drain                 ``worker(threads=1).run_until_idle()`` over ``--jobs`` no-op jobs
                        (enqueued untimed); bare: one loop, each commit completing the last 100
                        jobs (fenced by owner and attempt, as core.py's bare complete) and
                        claiming the next 100 (core.py's bare claim, LIMIT 100) -- the same
                        commits tether's worker makes.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import _common
from _common import BARE_CLAIM_N, BARE_INSERT, REPO, SCRATCH, machine, percentile, scratch

BATCH = 100
FIGURES = ("enqueue", "interleaved", "first", "drain")


# -- the child: one measurement in this interpreter (tether from PYTHONPATH) --------------------------


@cache
def _order_types() -> tuple[Any, Any]:
    """The payload model and its no-op job type: five fields, one a nested object."""
    from typing import ClassVar

    from pydantic import BaseModel

    from tether import JobContext, JobType, Payload

    class Address(BaseModel):
        street: str
        city: str
        postcode: str
        country: str

    class Order(Payload):
        job_type: ClassVar[str] = "bench_order"
        order_id: int
        customer: str
        amount: float
        items: list[str]
        ship_to: Address

    class OrderType(JobType[Order]):
        name = "bench_order"
        payload_model = Order

        def run(self, payload: Order, ctx: JobContext) -> None:
            return None

    return Order, OrderType


def _orders(n: int) -> list[Any]:
    order, _ = _order_types()
    return [
        order(
            order_id=i,
            customer=f"customer-{i % 97:03d}@example.com",
            amount=19.5 + i % 50,
            items=["sku-1042", "sku-77", f"sku-{i % 13}"],
            ship_to={"street": f"{i} Long Road", "city": "Leeds", "postcode": "LS1 4AP", "country": "GB"},
        )
        for i in range(n)
    ]


def _open(directory: Path) -> Any:
    from tether import Coordinator
    from tether.jobtypes import default_registry

    _, order_type = _order_types()
    registry = default_registry()
    registry.register(order_type())
    return Coordinator.open(
        f"sqlite:///{directory}/ledger.db", root=directory / "data", registry=registry, durability="full"
    )


def _bare_rows(c: Any, payloads: list[Any]) -> list[tuple[Any, ...]]:
    """The rows tether would insert for ``payloads``, as bare sqlite3 parameters."""
    from _common import bare_row

    return [bare_row(c.queue.build(p)) for p in payloads]


def _bare_insert(conn: Any, row: tuple[Any, ...]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(BARE_INSERT, row)
    conn.execute("COMMIT")


def _latencies(samples: list[float]) -> dict[str, float]:
    return {"p50": percentile(samples, 0.5) * 1e6, "p95": percentile(samples, 0.95) * 1e6}


def child_enqueue(directory: Path, side: str, n: int) -> dict[str, Any]:
    """``n`` single enqueues in a row by one side: p50/p95 in µs."""
    from _common import bare_connect

    payloads = _orders(n)
    out: list[float] = []
    perf = time.perf_counter
    if side == "bare":
        with _open(directory) as c:  # tether's DDL, and the rows it would insert
            rows = _bare_rows(c, payloads)
        conn = bare_connect(directory / "ledger.db")
        try:
            for row in rows:
                t0 = perf()
                _bare_insert(conn, row)
                out.append(perf() - t0)
        finally:
            conn.close()
    else:
        with _open(directory) as c:
            for p in payloads:
                t0 = perf()
                c.enqueue(p)
                out.append(perf() - t0)
    return _latencies(out)


def child_interleaved(directory: Path, n: int) -> dict[str, Any]:
    """One tether enqueue and one bare INSERT + commit alternating, on two ledgers."""
    from _common import bare_connect

    payloads = _orders(n)
    (directory / "bare").mkdir()
    with _open(directory / "bare") as c:
        rows = _bare_rows(c, payloads)
    conn = bare_connect(directory / "bare" / "ledger.db")
    tether: list[float] = []
    bare: list[float] = []
    cpu = {"tether": 0.0, "bare": 0.0}
    perf, process = time.perf_counter, time.process_time
    try:
        with _open(directory) as c:
            for i in range(n):
                for side in ("tether", "bare") if i % 2 == 0 else ("bare", "tether"):
                    c0, t0 = process(), perf()
                    if side == "tether":
                        c.enqueue(payloads[i])
                        tether.append(perf() - t0)
                    else:
                        _bare_insert(conn, rows[i])
                        bare.append(perf() - t0)
                    cpu[side] += process() - c0
    finally:
        conn.close()
    return {
        "tether": {**_latencies(tether), "cpu": cpu["tether"] / n * 1e6},
        "bare": {**_latencies(bare), "cpu": cpu["bare"] / n * 1e6},
    }


def child_setup(directory: Path) -> dict[str, Any]:
    """A ledger for the first-enqueue figure, and the row the bare side will insert."""
    with _open(directory) as c:
        c.enqueue(_orders(1)[0])
        [row] = _bare_rows(c, _orders(1))
    return {"row": row}


def child_first(directory: Path, side: str, row: list[Any]) -> dict[str, Any]:
    """Open + one enqueue in this fresh process (imports timed apart)."""
    t0 = time.perf_counter()
    if side == "bare":
        import sqlite3  # noqa: F401  (the import, timed apart as tether's is)

        from _common import bare_connect

        t1 = time.perf_counter()
        conn = bare_connect(directory / "ledger.db")
        _bare_insert(conn, tuple(row))
        t2 = time.perf_counter()
        conn.close()
    else:
        import tether  # noqa: F401

        payload = _orders(1)[0]
        t1 = time.perf_counter()
        c = _open(directory)
        c.enqueue(payload)
        t2 = time.perf_counter()
        c.close()
        # The same again with every module already loaded: what the open and enqueue themselves
        # cost, apart from the imports the first one triggers (``Coordinator`` is imported lazily).
        t3 = time.perf_counter()
        c = _open(directory)
        c.enqueue(payload)
        t4 = time.perf_counter()
        c.close()
        return {"import_ms": (t1 - t0) * 1e3, "first_us": (t2 - t1) * 1e6, "again_us": (t4 - t3) * 1e6}
    return {"import_ms": (t1 - t0) * 1e3, "first_us": (t2 - t1) * 1e6, "again_us": (t2 - t1) * 1e6}


def child_drain(directory: Path, side: str, n: int) -> dict[str, Any]:
    """Jobs/s (and CPU µs per job) of one side draining ``n`` no-op jobs enqueued beforehand."""
    with _open(directory) as c:
        c.enqueue_many(_orders(n))
        if side == "bare":
            c.close()
        else:
            worker = c.worker(threads=1)
        with _gc_timer() as gc_seconds:
            t0, cpu0 = time.perf_counter(), time.process_time()
            if side == "bare":
                ran = _bare_drain(directory / "ledger.db")
            else:
                ran = worker.run_until_idle(install_signals=False)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if ran != n:
        raise RuntimeError(f"{side} ran {ran} of {n} jobs")
    return {"rate": n / elapsed, "cpu_us": cpu / n * 1e6, "gc_us": gc_seconds[0] / n * 1e6}


@contextmanager
def _gc_timer() -> Iterator[list[float]]:
    """CPU seconds the cyclic garbage collector took inside the block (any thread)."""
    spent, started = [0.0], [0.0]

    def note(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            spent[0] += time.process_time() - started[0]

    gc.callbacks.append(note)
    try:
        yield spent
    finally:
        gc.callbacks.remove(note)


def _bare_drain(db: Path) -> int:
    """Each commit completes the last batch (fenced per job) and claims the next ``BATCH``."""
    from _common import bare_connect, sqlite_now
    from core import BARE_COMPLETE

    conn = bare_connect(db)
    done: list[tuple[Any, ...]] = []
    ran = 0
    try:
        while True:
            now = sqlite_now()
            conn.execute("BEGIN IMMEDIATE")
            if done:
                moved = conn.executemany(BARE_COMPLETE, done).rowcount
                if moved != len(done):
                    raise RuntimeError(f"bare complete moved {moved} of {len(done)}")
            jobs = conn.execute(BARE_CLAIM_N, ("bare", now, now, now, BATCH)).fetchall()
            conn.execute("COMMIT")
            if not jobs:
                return ran
            # a no-op handler: the job's result is None; each job finishes at its own time
            done = [(sqlite_now(), None, job_id, "bare", attempts) for job_id, attempts, _payload in jobs]
            ran += len(jobs)
    finally:
        conn.close()


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import tether

    directory = Path(spec["dir"])
    figure = spec["figure"]
    if figure == "enqueue":
        out = child_enqueue(directory, spec["side"], spec["jobs"])
    elif figure == "interleaved":
        out = child_interleaved(directory, spec["jobs"])
    elif figure == "setup":
        out = child_setup(directory)
    elif figure == "first":
        out = child_first(directory, spec["side"], spec["row"])
    else:
        out = child_drain(directory, spec["side"], spec["jobs"])
    return {**out, "src": str(Path(tether.__file__).parent)}


# -- the parent: rounds of fresh processes ------------------------------------------------------


def run_child(src: Path, spec: dict[str, Any]) -> dict[str, Any]:
    return _common.run_child(__file__, src, spec)


def one_round(r: int, trees: dict[str, Path], figures: list[str], jobs: int) -> dict[tuple[str, str], Any]:
    """Every figure once for every side; the order of the sides alternates with ``r``."""
    after = trees["after"]
    sides = ["bare", *trees]
    order = sides if r % 2 == 0 else list(reversed(sides))
    got: dict[tuple[str, str], Any] = {}
    for figure in figures:
        for side in order:
            src = after if side == "bare" else trees[side]
            with scratch(SCRATCH, f"limits-{figure}") as d:
                if figure == "interleaved":
                    if side != "bare":  # bare runs inside each tree's process
                        got[(figure, side)] = run_child(src, {"figure": figure, "dir": str(d), "jobs": jobs})
                elif figure == "first":
                    # The ledger made by the side's own tree: an older tree refuses one a newer schema made.
                    setup = run_child(src, {"figure": "setup", "dir": str(d)})
                    spec = {"figure": figure, "dir": str(d), "side": "bare" if side == "bare" else "tether"}
                    got[(figure, side)] = run_child(src, {**spec, "row": setup["row"]})
                else:
                    spec = {"figure": figure, "dir": str(d), "jobs": jobs}
                    got[(figure, side)] = run_child(src, {**spec, "side": "bare" if side == "bare" else "tether"})
        print(f"round {r + 1} {figure}: {_brief(figure, got)}", file=sys.stderr, flush=True)
    return got


def _brief(figure: str, got: dict[tuple[str, str], Any]) -> str:
    parts = []
    for (fig, side), v in got.items():
        if fig != figure:
            continue
        if figure == "interleaved":
            t, b = v["tether"], v["bare"]
            parts.append(f"{side} {t['p50']:.0f}/{t['p95']:.0f} vs bare {b['p50']:.0f}/{b['p95']:.0f} us")
            parts.append(f"CPU {t['cpu']:.0f} vs {b['cpu']:.0f} us")
        elif figure == "enqueue":
            parts.append(f"{side} {v['p50']:.0f}/{v['p95']:.0f} us")
        elif figure == "first":
            parts.append(f"{side} {v['first_us']:.0f} us")
        else:
            parts.append(f"{side} {v['rate']:,.0f}/s {v['cpu_us']:.1f} us CPU ({v['gc_us']:.1f} in gc)")
    return ", ".join(parts)


def table(rounds: list[dict[tuple[str, str], Any]], trees: list[str], figures: list[str]) -> str:
    """The issue's table: bare | each tree | its ratio to bare (median of per-round ratios) | target."""
    med = statistics.median

    def values(figure: str, side: str, pick: Any) -> list[float]:
        return [pick(rd[(figure, side)]) for rd in rounds]

    head = ["figure (WAL + synchronous=FULL)", "bare"]
    for t in trees:
        head += [t, f"{t}/bare"]
    head.append("target")
    lines = ["| " + " | ".join(head) + " |", "| --- | " + " | ".join("---:" for _ in head[1:-1]) + " | --- |"]

    def row(name: str, figure: str, bare_pick: Any, pick: Any, unit: str, target: str, fmt: str = ",.0f") -> None:
        bare = values(figure, "bare" if figure != "interleaved" else trees[-1], bare_pick)
        cells = [name, f"{med(bare):{fmt}} {unit}"]
        for t in trees:
            mine = values(figure, t, pick)
            if figure == "interleaved":  # each process's own bare side
                bare = values(figure, t, bare_pick)
            ratios = [a / b for a, b in zip(mine, bare, strict=True)]
            cells += [f"{med(mine):{fmt}} {unit}", f"{med(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"]
        cells.append(target)
        lines.append("| " + " | ".join(cells) + " |")

    for q in ("p50", "p95"):
        if "enqueue" in figures:
            row(
                f"single durable enqueue {q}, blocks",
                "enqueue",
                lambda v, q=q: v[q],
                lambda v, q=q: v[q],
                "µs",
                "<= 1.15x",
            )
        if "interleaved" in figures:
            row(
                f"single durable enqueue {q}, interleaved",
                "interleaved",
                lambda v, q=q: v["bare"][q],
                lambda v, q=q: v["tether"][q],
                "µs",
                "<= 1.15x",
            )
    if "interleaved" in figures:
        row(
            "single durable enqueue, interleaved: process CPU per enqueue",
            "interleaved",
            lambda v: v["bare"]["cpu"],
            lambda v: v["tether"]["cpu"],
            "µs",
            "",
        )
    if "first" in figures:
        pick = lambda v: v["first_us"]  # noqa: E731
        row("first enqueue of a fresh process (open + enqueue)", "first", pick, pick, "µs", "reported")
        again = lambda v: v["again_us"]  # noqa: E731
        row("(first: a second open + enqueue in that process, modules loaded)", "first", again, again, "µs", "")
    if "drain" in figures:
        pick = lambda v: v["rate"]  # noqa: E731
        row(
            f"drain, one worker, no-op jobs (bare: claim {BATCH} + complete {BATCH} per commit)",
            "drain",
            pick,
            pick,
            "/s",
            ">= 0.7x",
        )
        cpu = lambda v: v["cpu_us"]  # noqa: E731
        row("drain: process CPU per job", "drain", cpu, cpu, "µs", "", ".1f")
        gcs = lambda v: v["gc_us"]  # noqa: E731
        row("drain: of which the garbage collector", "drain", gcs, gcs, "µs", "", ".1f")
    if "first" in figures:
        imp = lambda v: v["import_ms"]  # noqa: E731
        row("(first: the imports before it, ms)", "first", imp, imp, "ms", "", ".0f")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.tree_options(parser)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per block (default 5000)")
    parser.add_argument("--only", default=",".join(FIGURES), help=f"comma-separated, of {', '.join(FIGURES)}")
    args = parser.parse_args()
    trees = _common.trees_or_child(args, child)
    if trees is None:
        return
    figures = [f for f in FIGURES if f in args.only.split(",")]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()
    rounds = [one_round(r, trees, figures, args.jobs) for r in range(args.rounds)]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(
        f"{started}, {args.rounds} rounds of fresh processes, {args.jobs:,} jobs a block; {machine()}; "
        f"load average {load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; this checkout at "
        f"{commit.stdout.strip()}; " + ", ".join(f"{k} = {v}" for k, v in trees.items())
    )
    print("medians over rounds; ratios: median of the per-round ratios (range)\n")
    print(table(rounds, list(trees), figures))


if __name__ == "__main__":
    main()
