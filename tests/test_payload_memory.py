"""A worker's memory is bounded by payload bytes, not by how many large jobs are queued (issue 24).

The drain runs in a process of its own (tests/proc_big_payloads.py), which reports its peak RSS
(``resource.getrusage``) before and after; another process enqueued the jobs, so the peak is the
drain's. Before the byte cap, 40 jobs of 5 MiB grew a worker by about 650 MiB: its first claim
took all 40 payloads at once, each held several times over. Now a batch holds at most
``batch_bytes`` (8 MiB) or one job, so here one 5 MiB job at a time, and the worker
holds, at its peak: the batch it ran and the one it claims in the same commit (2 payloads), and
SQLite's own copies while it rewrites a claimed row (about 3: the row, the new record and the
statement journal; the claim leaves a large payload out of its RETURNING rows and reads it after,
or there would be 3 more). The handler's copies (parsed model, rendered bytes) come later, once
that is freed. Hence the bound: 8 payloads and 16 MiB for the allocator, a third of the 40
payloads alone.

``TETHER_SOAK=1`` also drains 200 jobs of 5 MiB on PostgreSQL (about two minutes), to the same
bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import JsonValue

from conftest import scratch_pg_database
from tether.jobtypes.create_file import render_fields
from tether.jobtypes.datafiles import durable

MIB = 1 << 20
SCRIPT = Path(__file__).with_name("proc_big_payloads.py")
SOAK = bool(os.environ.get("TETHER_SOAK"))
PAYLOAD_MIB = 5


def bound(payload: int) -> int:
    return 8 * payload + 16 * MIB


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """Where the ledger and the files go: memory (tmpfs) where there is one, since what is
    measured is the worker's memory, not the disk's speed."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(dir=shm, prefix="tether-test-") as d:
            yield Path(d)
    else:
        yield tmp_path


def drain_growth(db_url: str, root: Path, jobs: int) -> int:
    _run("enqueue", db_url, str(root), str(jobs), str(PAYLOAD_MIB))
    report = json.loads(_run("drain", db_url, str(root)))
    assert report["ran"] == jobs
    growth: int = report["after"] - report["before"]
    return growth


def test_draining_40_jobs_of_5_mib_grows_a_worker_by_a_few_payloads_not_by_the_queue(scratch: Path) -> None:
    growth = drain_growth(f"sqlite:///{scratch / 'ledger.db'}", scratch / "data", 40)
    assert growth < bound(PAYLOAD_MIB * MIB), f"peak RSS grew by {growth / MIB:.0f} MiB"


def test_claiming_one_large_job_holds_a_few_copies_of_its_payload_not_eight(scratch: Path) -> None:
    # SQLite keeps every RETURNING row until its statement ends, beside the row it rewrites and
    # its statement journal: returned by the claim, one 8 MiB payload grew the process by 66 MiB;
    # read after it, by 33 MiB (the rewrite's copies, then the one kept).
    db_url, root = f"sqlite:///{scratch / 'ledger.db'}", str(scratch / "data")
    _run("enqueue", db_url, root, "1", "8")
    report = json.loads(_run("claim", db_url, root))
    assert report["ran"] > 8 * MIB  # the payload came back whole
    growth = report["after"] - report["before"]
    assert growth < 5 * 8 * MIB, f"peak RSS grew by {growth / MIB:.0f} MiB"


@pytest.mark.skipif(not SOAK, reason="a long run: TETHER_SOAK=1 (200 jobs of 5 MiB on PostgreSQL)")
def test_draining_200_jobs_of_5_mib_on_postgresql_grows_a_worker_by_a_few_payloads(scratch: Path) -> None:
    with scratch_pg_database("tether_bytes") as url:
        growth = drain_growth(url, scratch / "data", 200)
    print(f"PostgreSQL, 200 jobs of {PAYLOAD_MIB} MiB: peak RSS grew by {growth / MIB:.1f} MiB")
    assert growth < bound(PAYLOAD_MIB * MIB), f"peak RSS grew by {growth / MIB:.0f} MiB"


def test_an_existing_large_file_is_compared_a_chunk_at_a_time(tmp_path: Path) -> None:
    data = os.urandom(8 * MIB)
    (tmp_path / "big.bin").write_bytes(data)
    with durable.data_file(tmp_path, "big.bin") as f:
        tracemalloc.start()
        try:
            assert f.holds(data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 3 * MIB  # a chunk (1 MiB) at a time, the next read while the last is freed: not the file again


def test_json_content_is_rendered_without_a_second_copy() -> None:
    content: JsonValue = {"rows": [{"name": "x" * 90, "n": i} for i in range(40_000)]}
    tracemalloc.start()
    try:
        rendered = render_fields(content, None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rendered.endswith(b"}\n") and len(rendered) > 4 * MIB
    assert peak < 2 * len(rendered)  # orjson's buffer grows as it writes; appending the newline would copy it all
