"""Group commit (tether/ledger/groupcommit.py): single enqueues that arrive from several threads
while a commit is in flight are written together by the next transaction; each caller returns
once its own job is durable, a refused job fails only its own caller, and a transaction an
application holds (``session=``) or gathers (``transaction()``) commits its own rows only."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from tether import Coordinator, CreateFile, InvalidPayload

GROUP_ENQUEUER = Path(__file__).with_name("proc_group_enqueuer.py")

# A job whose payload holds "reject" is refused by the database, as a constraint refuses a row.
REJECT = {
    "sqlite": [
        "CREATE TRIGGER reject_marked BEFORE INSERT ON tether_jobs WHEN NEW.payload LIKE '%\"reject\"%' "
        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
    ],
    "postgresql": [
        "CREATE OR REPLACE FUNCTION reject_marked() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF strpos(NEW.payload::text, '\"reject\"') > 0 THEN "
        "RAISE EXCEPTION 'refused by the test' USING ERRCODE = 'check_violation'; END IF; RETURN NEW; END $$",
        "CREATE TRIGGER reject_marked BEFORE INSERT ON tether_jobs FOR EACH ROW EXECUTE FUNCTION reject_marked()",
    ],
}


def run_sql(db_url: str, statements: list[str]) -> None:
    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def stored(c: Coordinator, column: str = "id") -> set[str]:
    with c.engine.connect() as conn:
        return set(conn.exec_driver_sql(f"SELECT {column} FROM tether_jobs").scalars())


@contextmanager
def ledger_locked(c: Coordinator) -> Iterator[None]:
    """Hold back every writer of ``c``'s ledger until the block ends: SQLite's write lock, or on
    PostgreSQL a lock on the jobs table that INSERT waits for."""
    if c.engine.dialect.name == "sqlite":
        lite = sqlite3.connect(c.engine.url.database or "", isolation_level=None)
        lite.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            lite.rollback()
            lite.close()
        return
    with c.engine.connect() as conn:
        conn.exec_driver_sql("LOCK TABLE tether_jobs IN SHARE ROW EXCLUSIVE MODE")
        try:
            yield
        finally:
            conn.rollback()


class Commits:
    """The transactions of tether's own that ``c`` runs: how many began, and the ids of the jobs
    each committed one inserted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, c: Coordinator) -> None:
        self.begun = 0
        self.committed: list[set[str]] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        transact, insert_all = c.queue.backend.transact, c.queue.enqueuer.insert_all

        def counted_transact(body: Callable[[Any], Any], **options: Any) -> Any:
            with self._lock:
                self.begun += 1
            ids: set[str] = set()
            self._local.ids = ids
            try:
                result = transact(body, **options)
            finally:
                self._local.ids = None
            with self._lock:
                self.committed.append(ids)
            return result

        def recorded_insert_all(cur: Any, jobs: Any, notes: Any = None) -> Any:
            results = insert_all(cur, jobs, notes)
            if getattr(self._local, "ids", None) is not None:
                self._local.ids.update(job.id for job in jobs)
            return results

        together = c.queue.enqueuer._insert_together

        def recorded_together(batch: list[Any], cur: Any) -> Any:  # several callers' jobs in one statement
            outcomes = together(batch, cur)
            if outcomes is not None and getattr(self._local, "ids", None) is not None:
                self._local.ids.update(job.id for request in batch for job in request.jobs)
            return outcomes

        monkeypatch.setattr(c.queue.backend, "transact", counted_transact)
        monkeypatch.setattr(c.queue.enqueuer, "insert_all", recorded_insert_all)
        monkeypatch.setattr(c.queue.enqueuer, "_insert_together", recorded_together)

    def holding(self, job_id: str) -> set[str]:
        """The ids committed in the transaction that committed ``job_id``."""
        [ids] = [ids for ids in self.committed if job_id in ids]
        return ids


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.001)


class Callers:
    """Threads that each run one call, keeping what it returned or raised."""

    def __init__(self) -> None:
        self.outcomes: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []

    def start(self, name: str, call: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                self.outcomes[name] = call()
            except Exception as e:  # the outcome under test
                self.outcomes[name] = e

        thread = threading.Thread(target=run, name=name)
        self._threads.append(thread)
        thread.start()

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=30)
            assert not thread.is_alive(), f"{thread.name} did not return"


def job(path: str, **content: Any) -> CreateFile:
    return CreateFile(path=path, content=content)


def enqueue_file(c: Coordinator, path: str, **content: Any) -> Any:
    """One caller's single enqueue of a file job (run in its own thread)."""
    return c.enqueue(job(path, **content))


@contextmanager
def grouped(c: Coordinator, commits: Commits, leaders: Callers) -> Iterator[None]:
    """Start as many lone callers as commits may run at once and hold them inside their commits
    (the ledger locked), so that every caller started in the block waits for a commit in flight;
    the block ends once those are filed, and the lock is let go."""
    at_once = c.queue.enqueuer.group.at_once
    with ledger_locked(c):
        for k in range(at_once):
            leaders.start(f"leader{k}", partial(enqueue_file, c, f"leader{k}.json"))
        until(lambda: commits.begun == at_once, "the leading callers are inside their commits")
        yield


def test_callers_arriving_during_a_commit_share_the_next_one_and_each_returns_its_own_job(db_url, root, monkeypatch):
    with Coordinator.open(db_url, root=root) as c:
        commits = Commits(monkeypatch, c)
        callers = Callers()
        with grouped(c, commits, callers):
            for k in range(8):
                callers.start(f"caller{k}", partial(enqueue_file, c, f"c{k}.json", k=k))
            until(lambda: c.queue.enqueuer.group.waiting == 8, "every caller waits for the commit in flight")
        callers.join()
        results = {name: r for name, r in callers.outcomes.items() if name.startswith("caller")}
        ids = {r.job.id for r in results.values()}
        assert {r.job.ordering_key for r in results.values()} == {f"file:c{k}.json" for k in range(8)}
        assert ids <= stored(c)
        assert commits.holding(next(iter(ids))) == ids  # the eight in one transaction
        assert sorted(map(len, commits.committed)) == [1] * c.queue.enqueuer.group.at_once + [8]


def test_a_refused_or_invalid_job_fails_only_its_own_caller_and_the_others_still_share_a_commit(
    db_url, root, monkeypatch
):
    with Coordinator.open(db_url, root=root) as c:
        run_sql(db_url, REJECT[c.engine.dialect.name])
        commits = Commits(monkeypatch, c)
        callers = Callers()
        with grouped(c, commits, callers):
            for k in range(6):
                callers.start(f"caller{k}", partial(enqueue_file, c, f"c{k}.json", k=k))
            callers.start("refused", partial(enqueue_file, c, "refused.json", reject=True))
            callers.start("invalid", partial(enqueue_file, c, "../outside.json"))
            until(lambda: c.queue.enqueuer.group.waiting == 7, "the callers wait for the commit in flight")
        callers.join()
        assert isinstance(callers.outcomes["refused"], sa.exc.IntegrityError)
        assert isinstance(callers.outcomes["invalid"], InvalidPayload)
        ids = {callers.outcomes[f"caller{k}"].job.id for k in range(6)}
        assert ids <= stored(c)
        assert commits.holding(next(iter(ids))) == ids  # committed together, without the refused one
        assert "file:refused.json" not in stored(c, "ordering_key")


def test_a_refusal_is_its_own_callers_even_when_a_later_keyed_job_meets_it_first(db_url, root, monkeypatch):
    """On PostgreSQL a pipelined keyed insert fetches its answer, and a fetch raises the first error
    of everything sent before it: the refusal of the request filed first."""
    with Coordinator.open(db_url, root=root) as c:
        run_sql(db_url, REJECT[c.engine.dialect.name])
        commits = Commits(monkeypatch, c)
        callers = Callers()
        with grouped(c, commits, callers):
            callers.start("refused", partial(enqueue_file, c, "refused.json", reject=True))
            until(lambda: c.queue.enqueuer.group.waiting == 1, "the refused caller waits")
            callers.start("keyed", lambda: c.enqueue(job("keyed.json", k=1), key="only-one"))
            until(lambda: c.queue.enqueuer.group.waiting == 2, "the keyed caller waits behind it")
        callers.join()
        assert isinstance(callers.outcomes["refused"], sa.exc.IntegrityError)
        keyed = callers.outcomes["keyed"]
        assert not isinstance(keyed, Exception), keyed
        assert keyed.job.id in stored(c) and "file:refused.json" not in stored(c, "ordering_key")


def test_a_transaction_block_commits_its_own_jobs_never_with_other_callers(db_url, root, monkeypatch):
    with Coordinator.open(db_url, root=root) as c:
        commits = Commits(monkeypatch, c)
        callers = Callers()

        def gathered() -> list[str]:
            with c.transaction() as tx:
                tx.enqueue(job("tx1.json"))
                tx.enqueue(job("tx2.json"))
            return [r.job.id for r in tx.results]

        at_once = c.queue.enqueuer.group.at_once
        with grouped(c, commits, callers):
            for k in range(4):
                callers.start(f"caller{k}", partial(enqueue_file, c, f"c{k}.json"))
            callers.start("tx", gathered)
            # Every caller has arrived: the block inside a transaction of its own, or filed
            # with the others.
            until(
                lambda: commits.begun - at_once + c.queue.enqueuer.group.waiting == 5,
                "every caller waits for the ledger",
            )
        callers.join()
        tx_ids = set(callers.outcomes["tx"])
        assert tx_ids <= stored(c)
        assert commits.holding(next(iter(tx_ids))) == tx_ids
        strangers = {callers.outcomes[f"caller{k}"].job.id for k in range(4)}
        assert commits.holding(next(iter(strangers))) == strangers


def test_a_session_enqueue_commits_or_rolls_back_with_the_session_never_with_other_callers(db_url, root, monkeypatch):
    with Coordinator.open(db_url, root=root) as c:
        callers = Callers()
        with Session(c.engine) as session:
            mine = c.enqueue(job("mine.json"), session=session).job.id
            for k in range(4):
                callers.start(f"caller{k}", partial(enqueue_file, c, f"c{k}.json"))
            if c.engine.dialect.name == "postgresql":  # not held back by the session: they commit
                callers.join()
                assert mine not in stored(c)
            session.rollback()
        callers.join()
        strangers = {callers.outcomes[f"caller{k}"].job.id for k in range(4)}
        assert strangers <= stored(c)
        assert mine not in stored(c)  # rolled back with the session, alone


def test_a_process_killed_while_16_threads_enqueue_loses_no_returned_job_and_keeps_no_raised_one(db_url, root):
    Coordinator.open(db_url, root=root).close()
    dialect = sa.make_url(db_url).get_backend_name()
    run_sql(db_url, REJECT[dialect])
    child = subprocess.Popen(
        [sys.executable, str(GROUP_ENQUEUER), db_url, str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout is not None
    lines: list[bytes] = []
    try:
        while sum(line.startswith(b"ok ") for line in lines) < 400:
            line = child.stdout.readline()
            assert line, child.stderr.read().decode() if child.stderr else "the enqueuer ended"
            lines.append(line)
        child.send_signal(signal.SIGKILL)  # mid-run: sixteen threads inside their enqueues
        lines += child.stdout.read().splitlines(keepends=True)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    done = [line.decode().split() for line in lines if line.endswith(b"\n")]
    returned = {value for kind, value in done if kind == "ok"}
    raised = {f"file:{value}" for kind, value in done if kind == "raised"}
    assert raised, "no enqueue raised: the test proved nothing about them"
    with Coordinator.open(db_url, root=root) as c:
        assert returned <= stored(c)  # none lost whose enqueue returned
        assert not raised & stored(c, "ordering_key")  # none kept whose enqueue raised


def test_a_child_forked_while_a_commit_is_in_flight_enqueues_without_waiting_for_it(tmp_path, root, monkeypatch):
    with Coordinator.open(f"sqlite:///{tmp_path / 'ledger.db'}", root=root) as c:
        transact, inside, go_on = c.queue.backend.transact, threading.Event(), threading.Event()

        def held_transact(body: Callable[[Any], Any], **options: Any) -> Any:
            if threading.current_thread().name == "leader":  # in flight, before any lock is taken
                inside.set()
                go_on.wait(20)
            return transact(body, **options)

        monkeypatch.setattr(c.queue.backend, "transact", held_transact)
        leader = Callers()
        leader.start("leader", partial(enqueue_file, c, "leader.json"))
        assert inside.wait(20)
        pid = os.fork()
        if pid == 0:  # the child: the parent's leader is not here to hand it the lead
            code = 1
            try:
                code = 0 if c.enqueue(job("child.json")).job.id else 1
            finally:
                os._exit(code)
        deadline = time.monotonic() + 20
        while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if ended[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        go_on.set()
        leader.join()
        assert ended[0] == pid and os.waitstatus_to_exitcode(ended[1]) == 0, "the child's enqueue did not return"
        assert {"file:child.json", "file:leader.json"} <= stored(c, "ordering_key")


def test_a_waiting_caller_interrupted_leaves_the_queue_and_later_callers_still_commit():
    from tether.ledger.groupcommit import GroupCommit, Request

    first_inside, let_go = threading.Event(), threading.Event()
    committed: list[int] = []

    def commit(batch: list[Request]) -> None:
        if not committed:
            first_inside.set()
            let_go.wait(10)
        committed.append(len(batch))
        for request in batch:
            request.results = []

    group = GroupCommit(commit, at_once=1)
    leader = threading.Thread(target=group.submit, args=(Request([], None),))
    leader.start()
    assert first_inside.wait(10)

    class Interrupted:  # Ctrl-C arriving while the caller waits for the commit in flight
        def acquire(self) -> None:
            raise KeyboardInterrupt

    waiting = Request([], None)
    waiting._ready = Interrupted()
    with pytest.raises(KeyboardInterrupt):
        group.submit(waiting)
    let_go.set()
    leader.join(10)
    later = threading.Thread(target=group.submit, args=(Request([], None),))
    later.start()
    later.join(10)
    assert not later.is_alive() and committed == [1, 1]  # the interrupted one never committed


def _handed_the_lead(ready: Any) -> tuple[list[str], list[int], list[threading.Thread]]:
    """Callers first, then x1 and x2 (committed together), then y1 and y2, y1 waiting on
    ``ready``: x1 hands the lead to y1 with x2 to wake. What each caller did (its name, or
    "<name> interrupted"), the batches' sizes, and the callers' threads, ended or not."""
    from tether.ledger.groupcommit import GroupCommit, Request

    inside = {n: threading.Event() for n in (1, 2)}
    let_go = {n: threading.Event() for n in (1, 2)}
    committed: list[int] = []

    def commit(batch: list[Request]) -> None:
        committed.append(len(batch))
        n = len(committed)
        if n in inside:
            inside[n].set()
            let_go[n].wait(10)
        for request in batch:
            request.results = []

    group = GroupCommit(commit, at_once=1)
    returned: list[str] = []

    def submit(name: str, request: Request) -> None:
        try:
            group.submit(request)
            returned.append(name)
        except KeyboardInterrupt:
            returned.append(f"{name} interrupted")

    def start(name: str, request: Request) -> threading.Thread:
        thread = threading.Thread(target=submit, args=(name, request), daemon=True)  # a failure leaves one
        thread.start()
        return thread

    threads = [start("first", Request([], None))]
    assert inside[1].wait(10)
    threads += [start("x1", Request([], None))]
    until(lambda: group.waiting == 1, "x1 waits")
    threads += [start("x2", Request([], None))]
    until(lambda: group.waiting == 2, "x2 waits")
    let_go[1].set()  # x1 leads [x1, x2]
    assert inside[2].wait(10)
    y1 = Request([], None)
    y1._ready = ready
    threads += [start("y1", y1)]
    until(lambda: group.waiting == 1, "y1 waits")
    threads += [start("y2", Request([], None))]
    until(lambda: group.waiting == 2, "y2 waits")
    let_go[2].set()  # x1 hands the lead to y1, with x2 to wake
    for thread in threads:
        thread.join(10)
    return returned, committed, threads


class _Interrupted:
    """A waiting caller's lock whose waits numbered in ``at`` are interrupted (Ctrl-C): the
    first as the caller is woken (the wake stands for its next wait), any later one at once."""

    def __init__(self, *at: int) -> None:
        self.lock, self.calls, self.at = threading.Lock(), 0, at
        self.lock.acquire()

    def acquire(self) -> None:
        self.calls += 1
        if self.calls in self.at and self.calls > 1:
            raise KeyboardInterrupt
        self.lock.acquire()
        if self.calls in self.at:
            self.lock.release()
            raise KeyboardInterrupt

    def release(self) -> None:
        self.lock.release()


def test_a_caller_handed_the_lead_as_it_is_interrupted_still_wakes_the_callers_of_the_commit_before():
    """The next leader wakes the callers of the commit before (GroupCommit._handed): one whose
    wait is interrupted just as it is handed the lead must wake them too, then lead."""
    returned, committed, threads = _handed_the_lead(_Interrupted(1))
    assert not any(thread.is_alive() for thread in threads), f"still waiting; returned: {returned}"
    assert sorted(returned) == ["first", "x1", "x2", "y1 interrupted", "y2"]
    assert committed == [1, 2, 2]


def test_a_caller_interrupted_twice_as_it_is_handed_the_lead_still_leaves_its_batch_committed():
    """A second Ctrl-C while an interrupted caller waits for the commit that hands it the lead:
    the caller stops at once, and a thread in its place leads its batch and wakes the callers of
    the commit before, so no other caller waits forever."""
    ready = _Interrupted(1, 2)
    returned, committed, threads = _handed_the_lead(ready)
    assert not any(thread.is_alive() for thread in threads), f"still waiting; returned: {returned}"
    assert sorted(returned) == ["first", "x1", "x2", "y1 interrupted", "y2"]
    assert committed == [1, 2, 2] and ready.calls == 3


def test_callers_of_one_failed_batch_each_raise_an_exception_of_their_own():
    """One error set on every request of a batch (a commit that failed for all): each caller raises
    its own copy, so tracebacks written by threads raising at once do not mix."""
    from tether.ledger.groupcommit import Request, own_outcome

    orig = Exception("the disk is full")
    shared = sa.exc.OperationalError("COMMIT", {}, orig)
    raised = []
    for request in (Request([], None), Request([], None)):
        request.error = shared
        with pytest.raises(sa.exc.OperationalError) as caught:
            own_outcome(request)
        raised.append(caught.value)
    assert raised[0] is not raised[1]
    assert str(raised[0]) == str(raised[1]) == str(shared) and raised[1].orig is orig
