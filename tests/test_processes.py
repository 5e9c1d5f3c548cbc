"""Real worker processes on one SQLite ledger: concurrency, SIGKILL at the worst instants,
graceful and hard shutdown by signal.

Workers are real ``tether worker`` subprocesses. The test job types and the fault hooks (a
write that hangs before its rename, a process that kills itself after the rename) live in
tests/proc_jobtypes.py, which only the workers that need a hook switch on (by environment).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from tether import Coordinator, JobRecord, config
from tether.jobtypes import CreateFile, Registry, default_registry, render
from tether.jobtypes.datafiles.paths import TEMP_SUFFIX
from tether.ledger.status import JobStatus
from workerkit import REPO, TETHER, WorkerProc, pj, wait_for

pytestmark = pytest.mark.slow


WORKERS = 4
JOBS_PER_WORKER = 2_000
DEADLINE = 30.0  # for one worker to reach a point it must reach; generous on a busy machine
DRAIN_DEADLINE = 150.0


def registry() -> Registry:
    reg = default_registry()
    pj.register(reg)
    return reg


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger' / 'tether.db'}"


@pytest.fixture
def start_worker(tmp_path: Path, ledger: str, root: Path) -> Iterator[Callable[..., WorkerProc]]:
    """Start ``tether worker ARGS`` on the test's ledger and root; killed at teardown if alive."""
    procs: list[WorkerProc] = []

    def start(*args: str, env: dict[str, str] | None = None, import_types: bool = True) -> WorkerProc:
        full_env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("TETHER_DB", "TETHER_ROOT", "TETHER_IMPORT", pj.HANG_ENV, pj.KILL_ENV)
        }
        full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        full_env.update(env or {})
        stderr = tmp_path / f"worker-{len(procs)}.stderr"
        argv = [*TETHER, "--db", ledger, "--root", str(root)]
        if import_types:
            argv += ["--import", "tests.proc_jobtypes"]
        with open(stderr, "wb") as err:
            popen = subprocess.Popen(
                [*argv, "worker", *args], cwd=REPO, env=full_env, stdout=err, stderr=subprocess.STDOUT
            )
        procs.append(WorkerProc(popen, stderr))
        return procs[-1]

    yield start
    for p in procs:
        if p.popen.poll() is None:
            p.popen.kill()
            p.popen.wait()


def assert_clean_exit(proc: WorkerProc, code: int) -> None:
    """Exit code 0, no traceback, no database error (logged or escaping) in the worker's output."""
    text = proc.text()
    assert code == 0, f"worker {proc.pid} exited {code}:\n{text[-2000:]}"
    assert "Traceback" not in text, text[-4000:]
    assert "database is locked" not in text, text[-4000:]
    assert proc.events("db_error") == []


def open_coordinator(ledger: str, root: Path) -> Coordinator:
    return Coordinator.open(ledger, root=root, registry=registry())


# -- concurrency ------------------------------------------------------------------------------


def test_four_worker_processes_drain_8000_jobs_applying_each_effect_exactly_once(
    tmp_path: Path, ledger: str, root: Path, start_worker: Callable[..., WorkerProc]
) -> None:
    log = tmp_path / "effects.log"  # outside the data root
    gate = tmp_path / "go"  # jobs wait for it, so a worker that starts late still finds work
    total = WORKERS * JOBS_PER_WORKER
    with open_coordinator(ledger, root) as c:
        ids = {r.job.id for r in c.enqueue_many([pj.AppendId(log=str(log), gate=str(gate))] * total)}
    assert len(ids) == total

    started = time.monotonic()
    procs = [start_worker("--until-idle") for _ in range(WORKERS)]
    deadline = time.monotonic() + DEADLINE
    while not all(p.events("claimed") for p in procs):  # every worker holds a batch
        assert time.monotonic() < deadline, "not every worker claimed a job"
        assert all(p.popen.poll() is None for p in procs), "a worker exited before claiming"
        time.sleep(0.05)
    gate.touch()
    codes = [p.wait(timeout=DRAIN_DEADLINE) for p in procs]
    elapsed = time.monotonic() - started
    print(f"\n{WORKERS} worker processes drained {total} jobs in {elapsed:.1f}s ({total / elapsed:.0f} jobs/s)")
    for p, code in zip(procs, codes, strict=True):
        assert_clean_exit(p, code)

    lines = log.read_text().splitlines()
    applied = Counter(line.split()[0] for line in lines)
    twice = {job_id: n for job_id, n in applied.items() if n != 1}
    assert twice == {}, f"effects applied more than once: {list(twice.items())[:5]}"
    assert set(applied) == ids, f"{len(ids - set(applied))} jobs never applied"
    # Every process took part, and each one's own count matches the effects it applied.
    by_pid = Counter(int(line.split()[1]) for line in lines)
    for p in procs:
        assert by_pid[p.pid] > 0, f"worker {p.pid} ran no job"
        assert len(p.events("completed")) == by_pid[p.pid]
        assert p.events("worker_stopped")[-1]["processed"] == by_pid[p.pid]

    with open_coordinator(ledger, root) as c, c.engine.connect() as conn:
        counts: dict[str, int] = dict(
            conn.execute(sa.text("SELECT status, count(*) FROM tether_jobs GROUP BY status")).all()
        )
        attempts = conn.execute(sa.text("SELECT max(attempts) FROM tether_jobs")).scalar_one()
    assert counts == {"completed": total}
    assert attempts == 1  # no job was retried or run twice


# -- crashes ----------------------------------------------------------------------------------


def reclaim_after_timeout(c: Coordinator, job_id: str) -> None:
    """The killed worker's job stays claimed until its lock is older than the timeout; then the
    sweep returns it to pending without counting an attempt."""
    claimed = c.get(job_id)
    assert claimed.status is JobStatus.CLAIMED and claimed.attempts == 1
    assert claimed.locked_at is not None
    assert c.reclaim_stale(now=claimed.locked_at + timedelta(seconds=c.lock_timeout - 1)) == []
    back = c.reclaim_stale(now=claimed.locked_at + timedelta(seconds=c.lock_timeout + 1))
    assert [j.id for j in back] == [job_id]
    pending = c.get(job_id)
    assert pending.status is JobStatus.PENDING
    assert pending.attempts == 1 and pending.locked_by is None


def rerun_after_reclaim(
    ledger: str, root: Path, job_id: str, start_worker: Callable[..., WorkerProc]
) -> tuple[JobRecord, WorkerProc]:
    """The dead worker's job goes back to pending after the lock timeout; a new worker runs it."""
    with open_coordinator(ledger, root) as c:
        reclaim_after_timeout(c, job_id)
        survivor = start_worker("--until-idle", import_types=False)
        assert_clean_exit(survivor, survivor.wait())
        return c.get(job_id), survivor


def test_worker_killed_mid_atomic_write_leaves_job_for_another_worker_and_no_temp_file(
    tmp_path: Path, ledger: str, root: Path, start_worker: Callable[..., WorkerProc]
) -> None:
    payload = CreateFile(path="notes/a.json", content={"title": "crash mid-write", "n": [1, 2, 3]})
    with open_coordinator(ledger, root) as c:
        job_id = c.enqueue(payload).job.id

    marker = tmp_path / "hung-before-rename"
    doomed = start_worker("--until-idle", env={pj.HANG_ENV: str(marker)})
    wait_for(marker.exists, "the worker to write its temp file and hang before the rename")
    doomed.popen.send_signal(signal.SIGKILL)
    assert doomed.wait() == -signal.SIGKILL

    target = root / "notes" / "a.json"
    temp = Path(marker.read_text())
    assert temp.parent == target.parent and temp.name.endswith(TEMP_SUFFIX)
    assert temp.exists() and not target.exists()  # killed between the temp write and the rename

    done, survivor = rerun_after_reclaim(ledger, root, job_id, start_worker)
    assert done.status is JobStatus.COMPLETED and done.attempts == 2
    assert done.result_data["written"] is True
    assert target.read_bytes() == render(payload)
    assert sorted(os.listdir(target.parent)) == ["a.json"]  # the dead writer's temp is gone


def test_worker_killed_between_rename_and_completion_commit_rerun_finds_bytes_in_place(
    tmp_path: Path, ledger: str, root: Path, start_worker: Callable[..., WorkerProc]
) -> None:
    payload = CreateFile(path="notes/b.json", content={"title": "crash after rename"})
    with open_coordinator(ledger, root) as c:
        job_id = c.enqueue(payload).job.id

    marker = tmp_path / "kill-once"
    marker.touch()
    doomed = start_worker("--until-idle", env={pj.KILL_ENV: str(marker)})
    assert doomed.wait() == -signal.SIGKILL
    assert not marker.exists()  # it died where the hook kills, after the real handler returned
    target = root / "notes" / "b.json"
    assert target.read_bytes() == render(payload)  # the rename landed; the completion did not

    done, survivor = rerun_after_reclaim(ledger, root, job_id, start_worker)
    assert done.status is JobStatus.COMPLETED and done.attempts == 2
    assert done.result_data["written"] is False  # the re-run saw the bytes already there
    assert target.read_bytes() == render(payload)
    assert sorted(os.listdir(target.parent)) == ["b.json"]
    assert [e["job_id"] for e in survivor.events("completed")] == [job_id]


def test_a_batching_worker_killed_mid_drain_loses_nothing_and_reruns_only_uncommitted_completions(
    tmp_path: Path, ledger: str, root: Path, start_worker: Callable[..., WorkerProc]
) -> None:
    log = tmp_path / "effects.log"
    total, kill_at, batch = 600, 250, 100  # the default batch: claims 100, records in group commits
    with open_coordinator(ledger, root) as c:
        ids = {r.job.id for r in c.enqueue_many([pj.AppendId(log=str(log))] * total)}

    doomed = start_worker("--until-idle", env={pj.KILL_AT_ENV: str(kill_at)})
    assert doomed.wait() == -signal.SIGKILL
    with open_coordinator(ledger, root) as c:
        held = {j.id for j in c.reclaim_stale(now=datetime.now(UTC) + timedelta(seconds=c.lock_timeout + 1))}
        committed = {job_id for job_id in ids if c.get(job_id).status is JobStatus.COMPLETED}
    assert 0 < len(held) <= 2 * batch  # its batch (and at most the next one, taken in a commit)
    survivor = start_worker("--until-idle")
    assert_clean_exit(survivor, survivor.wait())

    runs: dict[str, list[int]] = {}
    for line in log.read_text().splitlines():
        job_id, pid = line.split()
        runs.setdefault(job_id, []).append(int(pid))
    assert set(runs) == ids  # nothing lost
    with open_coordinator(ledger, root) as c:
        assert {c.get(i).status for i in ids} == {JobStatus.COMPLETED}
    twice = {job_id for job_id, pids in runs.items() if len(pids) > 1}
    print(
        f"\nkilled after {kill_at} effects: {len(committed)} completions had committed, "
        f"{len(held)} jobs reclaimed, {len(twice)} effects re-run"
    )
    assert all(len(pids) <= 2 for pids in runs.values())
    assert twice, "the kill came after effects whose completion had not committed"
    # Only completions that had not committed ran again: every re-run job was held by the dead
    # worker, which applied it first; every completion it committed ran exactly once.
    assert twice <= held
    assert all(runs[j][0] == doomed.pid and runs[j][1] == survivor.pid for j in twice)
    assert all(len(runs[j]) == 1 for j in committed)
    # Each of the dead worker's effects either had its completion committed or ran once more.
    assert sum(1 for pids in runs.values() if pids[0] == doomed.pid) == kill_at == len(committed) + len(twice)


def _sync_order(log: Path) -> tuple[dict[str, int], dict[int, list[int]], dict[str, int]]:
    """From a worker's sync log: the line of each data file's last rename (by ``<dir inode>/<name>``),
    the lines of each directory's fsyncs, and the line of the commit that recorded each job."""
    renamed: dict[str, int] = {}
    fsynced: dict[int, list[int]] = {}
    recorded: dict[str, int] = {}
    for n, line in enumerate(log.read_text().splitlines()):
        kind, _, rest = line.partition(" ")
        if kind == "rename":
            inode, name = rest.split(" ", 1)
            renamed[f"{inode}/{name}"] = n
        elif kind == "fsync":
            fsynced.setdefault(int(rest), []).append(n)
        else:
            recorded.update((job_id, n) for job_id in rest.split())
    return renamed, fsynced, recorded


def test_a_worker_killed_before_a_shared_directory_fsync_left_no_completed_job_without_a_durable_entry(
    tmp_path: Path, ledger: str, root: Path, start_worker: Callable[..., WorkerProc]
) -> None:
    """Directory fsyncs are shared by the jobs of a group commit (jobtypes/datafiles/dirsync.py). Killed
    just before one of them, the worker has renamed files whose entries are not durable: none of
    their jobs may be completed, and every completed job's directory was fsynced after its
    rename and before the commit that recorded it."""
    payloads = [CreateFile(path=f"d{i % 3}/n{i:04d}.json", content={"n": i}) for i in range(300)]
    with open_coordinator(ledger, root) as c:
        ids = [r.job.id for r in c.enqueue_many(payloads)]
    log = tmp_path / "sync.log"
    # 3 fsyncs of the root (each directory's first write), then 3 per group commit: the 8th is
    # inside the second commit's flush (or later ones, when a slow disk makes claims go singly).
    doomed = start_worker("--until-idle", env={pj.SYNC_LOG_ENV: str(log), pj.KILL_AT_DIR_SYNC_ENV: "8"})
    assert doomed.wait() == -signal.SIGKILL

    renamed, fsynced, recorded = _sync_order(log)
    inodes = {d: (root / d).stat().st_ino for d in ("d0", "d1", "d2")}
    with open_coordinator(ledger, root) as c:
        completed = [
            (job_id, p) for job_id, p in zip(ids, payloads, strict=True) if c.get(job_id).status is JobStatus.COMPLETED
        ]
    assert completed, "the kill came after at least one group commit"
    for job_id, p in completed:
        directory, name = p.path.split("/")
        rename = renamed[f"{inodes[directory]}/{name}"]
        assert any(rename < f < recorded[job_id] for f in fsynced.get(inodes[directory], [])), (
            f"{p.path} was recorded completed before its directory entry was fsynced"
        )
        assert (root / p.path).read_bytes() == render(p)
    completed_ids = {job_id for job_id, _ in completed}
    assert len(renamed) > len(completed_ids), "the kill came after renames whose entries were not yet fsynced"

    with open_coordinator(ledger, root) as c:
        c.reclaim_stale(now=datetime.now(UTC) + timedelta(seconds=c.lock_timeout + 1))
    survivor = start_worker("--until-idle")
    assert_clean_exit(survivor, survivor.wait())
    with open_coordinator(ledger, root) as c:
        assert {c.get(i).status for i in ids} == {JobStatus.COMPLETED}
    assert all((root / p.path).read_bytes() == render(p) for p in payloads)


# -- shutdown by signal -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "signum"),
    [
        pytest.param("--poll-interval=0.05", signal.SIGTERM, id="run-SIGTERM"),
        pytest.param("--until-idle", signal.SIGTERM, id="until-idle-SIGTERM"),
        pytest.param("--until-idle", signal.SIGINT, id="until-idle-SIGINT"),
    ],
)
def test_first_signal_lets_the_running_job_finish_claims_nothing_more_and_exits_zero(
    tmp_path: Path, ledger: str, root: Path, start_worker: Callable[..., WorkerProc], mode: str, signum: signal.Signals
) -> None:
    started, release = tmp_path / "started", tmp_path / "release"
    log = tmp_path / "effects.log"
    with open_coordinator(ledger, root) as c:
        slow_id = c.enqueue(pj.Slow(started=str(started), release=str(release))).job.id
        next_id = c.enqueue(pj.AppendId(log=str(log))).job.id

    worker = start_worker(mode)
    wait_for(started.exists, "the slow job to start")
    worker.popen.send_signal(signum)
    wait_for(lambda: worker.events("shutdown") or worker.popen.poll() is not None, "the worker to log the shutdown")
    assert worker.popen.poll() is None, (
        f"the worker exited mid-job (exit {worker.popen.returncode}) instead of finishing it"
    )
    assert [(e["signal"], e["mode"], e["grace_seconds"]) for e in worker.events("shutdown")] == [
        (signum.name, "finish running jobs", config.DEFAULT_SHUTDOWN_GRACE)
    ]
    release.touch()
    assert_clean_exit(worker, worker.wait())

    with open_coordinator(ledger, root) as c:
        slow, nxt = c.get(slow_id), c.get(next_id)
    assert slow.status is JobStatus.COMPLETED and slow.attempts == 1
    assert nxt.status is JobStatus.PENDING and nxt.attempts == 0
    assert not log.exists()
    assert [e["job_id"] for e in worker.events("completed")] == [slow_id]


def test_second_signal_cancels_the_job_at_its_checkpoint_and_gives_the_attempt_back(
    tmp_path: Path, ledger: str, root: Path, start_worker: Callable[..., WorkerProc]
) -> None:
    started, release = tmp_path / "started", tmp_path / "never-released"
    with open_coordinator(ledger, root) as c:
        job_id = c.enqueue(pj.Slow(started=str(started), release=str(release))).job.id

    worker = start_worker("--poll-interval", "0.05")
    wait_for(started.exists, "the slow job to start")
    worker.popen.send_signal(signal.SIGTERM)
    # Python runs one handler for signals that arrive before it runs: wait for the first.
    wait_for(lambda: worker.events("shutdown"), "the worker to log the first signal")
    worker.popen.send_signal(signal.SIGINT)
    assert_clean_exit(worker, worker.wait())

    assert [(e["mode"], e.get("reason")) for e in worker.events("shutdown")] == [
        ("finish running jobs", None),
        ("cancel running jobs", "second signal"),
    ]
    assert [e["job_id"] for e in worker.events("released")] == [job_id]
    assert worker.events("completed") == [] and worker.events("failed") == []
    with open_coordinator(ledger, root) as c:
        job = c.get(job_id)
    assert job.status is JobStatus.PENDING
    assert job.attempts == 0 and job.locked_by is None and job.locked_at is None


def test_a_job_still_running_when_the_shutdown_grace_ends_is_cancelled_and_given_back(
    tmp_path: Path, ledger: str, root: Path, start_worker: Callable[..., WorkerProc]
) -> None:
    started, release = tmp_path / "started", tmp_path / "never-released"
    with open_coordinator(ledger, root) as c:
        job_id = c.enqueue(pj.Slow(started=str(started), release=str(release))).job.id

    worker = start_worker("--poll-interval", "0.05", "--shutdown-grace", "0.5")
    wait_for(started.exists, "the slow job to start")
    signalled = time.monotonic()
    worker.popen.send_signal(signal.SIGTERM)  # one signal only
    assert_clean_exit(worker, worker.wait())
    assert time.monotonic() - signalled >= 0.5  # it was given the grace first

    assert [(e["mode"], e.get("reason")) for e in worker.events("shutdown")] == [
        ("finish running jobs", None),
        ("cancel running jobs", "grace period over"),
    ]
    assert [e["job_id"] for e in worker.events("released")] == [job_id]
    with open_coordinator(ledger, root) as c:
        job = c.get(job_id)
    assert job.status is JobStatus.PENDING and job.attempts == 0 and job.locked_by is None


def _default_signals() -> None:
    # A shell's background job inherits SIGINT ignored, and Python then keeps it ignored: the
    # child starts from the defaults whoever launched the test run.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


# Worker.run()/run_until_idle() put the application's SIGINT and SIGTERM handlers back when they return.
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_after_run_until_idle_returns_a_signal_stops_the_application_again(
    tmp_path: Path, ledger: str, root: Path, signum: signal.Signals
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "proc_runner.py"), ledger, str(root), signum.name],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        preexec_fn=_default_signals,
    )
    assert done.stdout == "ran 1\n", done.stderr[-2000:]
    assert done.returncode == -signum, f"exit {done.returncode}: {done.stderr[-2000:]}"
