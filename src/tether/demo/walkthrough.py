"""The end-to-end demo (``make demo``, ``python -m tether.demo``): the sample application's
operations (``app.py``) on a scratch copy of ``sample_data``, a worker draining them, the AWS part
(``aws.py``) in the same ledger, a drift the reconciler finds in both, and a periodic job, each
step shown as it runs."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from ..coordinator import Coordinator
from ..errors import TetherError
from ..jobtypes import ClaudeExtractionType, CreateFile, default_registry
from ..jobtypes.target import display
from ..ledger.url import mask_url
from ..observe.health import stats
from ..observe.jobs import jobs as find_jobs
from ..store import JsonStore
from ..worker.retry import RetryPolicy
from .app import (
    ArchiveProject,
    Person,
    Project,
    PublishReport,
    Requirement,
    SaveRequirement,
    person_path,
    project_path,
    register,
    requirement_path,
    requirements_on_disk,
)

MARKER = ".tether-demo"  # only a directory holding this file is ever wiped
DEFAULT_SAMPLE = Path(__file__).resolve().parents[3] / "sample_data"
EXTRACTION_PATH = "requirements/REQ-001/extraction.json"
DESCRIPTION = "The end-to-end demo (``make demo``), and the small sample application it drives."
FAST_RETRY = RetryPolicy(base=0.2, cap=1.0)  # so the demo's retry waits a fraction of a second


class Demo:
    def __init__(self, workdir: Path, sample: Path, out: Any = print) -> None:
        self.workdir, self.sample, self.say = workdir, sample, out
        self.root = workdir / "data"
        self.db_url = f"sqlite:///{workdir / 'tether.db'}"

    def prepare(self) -> None:
        """Wipe the scratch directory (only one the demo made) and copy the sample store in."""
        work, sample = self.workdir.resolve(), self.sample.resolve()
        if not (sample / "data").is_dir():
            raise TetherError(f"no sample data store at {sample / 'data'}; run the demo from a clone of tether")
        if work == sample or sample in work.parents or work in sample.parents:
            raise TetherError(f"the scratch directory {work} must be outside {sample}")
        if work.exists():
            if any(work.iterdir()) and not (work / MARKER).exists():
                raise TetherError(f"{work} exists and was not made by the demo; refusing to wipe it")
            shutil.rmtree(work)
        work.mkdir(parents=True)
        (work / MARKER).write_text("scratch directory of `make demo`; wiped on every run\n")
        shutil.copytree(sample / "data", self.root)

    def run(self) -> int:
        started = time.monotonic()
        self.prepare()
        files = sum(1 for p in self.root.rglob("*") if p.is_file())
        rel = os.path.relpath(self.workdir)
        self.say(f"tether demo: scratch directory {rel}/ (wiped first)")
        self.say(f"  data root  {rel}/data   ({files} files copied from sample_data/data)")
        ledger = mask_url(f"sqlite:///{rel}/tether.db")  # as every URL tether prints
        self.say(f"  ledger     {ledger}   (embedded SQLite, WAL, synchronous=FULL)\n")
        registry = register(default_registry(), flaky=True)
        # The extraction asks the stand-in assistant (no account, no network, no bill); point
        # TETHER_ASSISTANT_COMMAND at the real `claude` outside the demo.
        stand_in = self.sample / "stand_in_claude.py"
        registry.register(ClaudeExtractionType(command=[sys.executable, str(stand_in)]))
        with Coordinator.open(self.db_url, root=self.root, registry=registry) as c:
            store = JsonStore(c, retry=FAST_RETRY)
            self.operations(c, store)
            self.drain(c)
            self.show_jobs(c)
            self.check_files(store)
            self.say("\n4. The operator's view")
            self.cli(self.base(rel) + ["status"])
            with self.aws(c, store) as damage_aws:
                code = self.observe(rel, damage_aws)
        self.periodic(rel)
        exe = Path(sys.executable).parent / "tether"
        tether = os.path.relpath(exe) if exe.exists() else "tether"
        self.say(
            f"\ndone in {time.monotonic() - started:.1f} s. Explore the ledger, e.g.:\n"
            f"   {tether} {' '.join(self.base(rel))} --import tether.demo.app jobs"
            "   (or: show ID, recent, reconcile --no-aws)"
        )
        if damage_aws is not None:
            self.say("   (--no-aws: the demo's AWS was a moto server, stopped now)")
        return code

    def base(self, rel: str) -> list[str]:
        """The global options that name the demo's one ledger and its data root."""
        return ["--db", f"sqlite:///{rel}/tether.db", "--root", f"{rel}/data"]

    def operations(self, c: Coordinator, store: JsonStore) -> None:
        say = self.say
        say("1. The application's operations, through the data-model API (each call returns once")
        say("   its job is durably committed; wait=True also runs it before returning)")
        alan = Person(handle="alan", name="Alan Turing", email="alan@example.org", role="engineer")
        r = store.save(person_path("alan"), alan, wait=True)
        say(f"   save    {person_path('alan'):<34} create, wait=True   job {short(r.id)} {r.job.status.value}")
        ada = store.load(person_path("ada"), Person)
        r = store.save(person_path("ada"), ada.model_copy(update={"email": "ada@lovelace.example"}))
        say(f"   save    {person_path('ada'):<34} overwrite           job {short(r.id)} queued")
        r = store.delete(person_path("ken"))
        say(f"   delete  {person_path('ken'):<34} delete              job {short(r.id)} queued")
        bad = Person.model_construct(handle="bob", name="Bob", email="not-an-email", role="intern")
        try:
            store.save(person_path("bob"), bad)
        except TetherError as e:
            say(f"   save    {person_path('bob'):<34} REFUSED ({type(e).__name__}), no job recorded:")
            say(textwrap.fill(str(e), 100, initial_indent=" " * 11, subsequent_indent=" " * 11))
        req = Requirement(
            id="REQ-025",
            project="ingest",
            title="Extraction output is valid JSON",
            text="Every extraction result is validated against its schema before it is stored.",
            priority="must",
            owner="ada",
            tags=["extraction", "validation"],
        )
        r = c.enqueue(SaveRequirement(requirement=req))
        say(f"   save_requirement REQ-025 (requirement.json + README.md, one job)     job {short(r.id)} queued")
        done = store.load(requirement_path("REQ-003"), Requirement).model_copy(update={"status": "done"})
        r = c.enqueue(SaveRequirement(requirement=done))
        say(f"   save_requirement REQ-003 status -> done (overwrites both files)      job {short(r.id)} queued")
        r = c.enqueue(ArchiveProject(slug="portal"))
        say(f"   archive_project  portal (parent: enqueues a child per requirement)   job {short(r.id)} queued")
        r = store.extract(requirement_path("REQ-001"), EXTRACTION_PATH)
        say(f"   extract          REQ-001 -> {EXTRACTION_PATH} (stand-in assistant)  job {short(r.id)} queued")
        for _ in range(2):  # the user clicks "publish" twice
            r = c.enqueue(PublishReport(slug="billing"))
            verdict = "DEDUPLICATED (same key, still active)" if r.duplicate else "queued"
            say(f"   publish_report   billing (key report:billing)                       job {short(r.id)} {verdict}")

    def drain(self, c: Coordinator) -> None:
        """Run the worker until no job is active, waiting out retry backoffs (poll, bounded)."""
        started, ran, deadline = time.monotonic(), 0, time.monotonic() + 30
        while True:
            ran += c.run_until_idle(retry=FAST_RETRY)
            if active_jobs(c) == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.say(
            f"\n2. Worker until idle: {ran} attempt(s) in {time.monotonic() - started:.2f} s "
            "(a failed attempt is retried after a backoff)\n"
        )

    def show_jobs(self, c: Coordinator) -> None:
        rows = find_jobs(c, limit=None)[::-1]  # oldest first
        self.say(f"   {'job':<8}{'type':<18}{'target':<42}{'status':<11}attempts")
        for row in rows:
            target = display(row.ordering_key) if row.ordering_key else ""
            note = f"  child of {short(row.parent_id)}" if row.parent_id else ""
            if row.attempts > 1 and row.last_error:
                note += f"  (attempt 1: {row.last_error.splitlines()[0].split(': ', 1)[-1]})"
            self.say(f"   {short(row.id):<8}{row.type:<18}{target:<42}{row.status:<11}{row.attempts}{note}")
        by_status = ", ".join(f"{sum(r.status == s for r in rows)} {s}" for s in ("completed", "failed", "pending"))
        self.say(
            f"   {len(rows)} jobs ({by_status}), {sum(r.attempts for r in rows)} attempts; "
            f"{sum(1 for r in rows if r.parent_id)} enqueued by a parent job"
        )

    def check_files(self, store: JsonStore) -> None:
        ada = store.load(person_path("ada"), Person)
        archived = [r.id for r in requirements_on_disk(self.root) if r.project == "portal" and r.status == "archived"]
        self.say("\n3. The data store afterwards (read back from disk with store.load)")
        self.say(f"   people/ada.json email      {ada.email}")
        self.say(f"   people/ken.json exists     {store.exists(person_path('ken'))}")
        self.say(f"   people/bob.json exists     {store.exists(person_path('bob'))}  (refused, never queued)")
        self.say(
            f"   REQ-025 files              {sorted(p.name for p in (self.root / 'requirements/REQ-025').iterdir())}"
        )
        self.say(f"   REQ-003 status             {store.load(requirement_path('REQ-003'), Requirement).status}")
        self.say(
            f"   portal requirements        {len(archived)} archived; projects/portal.json status "
            f"{store.load(project_path('portal'), Project).status}"
        )
        self.say(f"   reports/billing.md         {store.exists('reports/billing.md')}")
        answer = store.load_json(EXTRACTION_PATH)
        [job] = [j for j in find_jobs(store.coordinator, limit=None) if j.type == "claude_extraction"]
        spent = orjson.loads(store.coordinator.get(job.id).result or "{}")
        self.say(
            f"   {EXTRACTION_PATH}  {answer}; cost ${spent.get('cost_usd')}, "
            f"{spent.get('input_tokens')} in / {spent.get('output_tokens')} out tokens"
        )

    def observe(self, rel: str, damage_aws: Callable[[], str] | None) -> int:
        """``tether reconcile`` before and after files (and, with ``damage_aws``, AWS resources)
        are damaged by hand, through the real CLI."""
        # --import: the reconciler checks the sample job types' effects with their own probes.
        reconcile = self.base(rel) + ["--import", "tether.demo.app", "reconcile", "--quiet"]
        also = " (and AWS)" if damage_aws else ""
        self.say(f"\n6. Does the disk{also} agree with the ledger?")
        first = self.cli(reconcile)
        damaged = self.root / person_path("alan")
        damaged.write_text(damaged.read_text().replace("Alan Turing", "A. M. Turing"))
        (self.root / person_path("ada")).unlink()
        what = "two files (an editor, a stray script)" + (" and two AWS resources" if damage_aws else "")
        self.say(f"\n7. Damage {what} by hand, then reconcile again")
        self.say(f"   edit {rel}/data/{person_path('alan')}; delete {rel}/data/{person_path('ada')}")
        if damage_aws is not None:
            self.say(f"   {damage_aws()}")
        second = self.cli(reconcile)
        ok = first == 0 and second == 2
        self.say(
            f"\n   reconcile exit codes: {first} (in sync), then {second} (drift found)"
            + ("" if ok else "   UNEXPECTED: expected 0 then 2")
        )
        return 0 if ok else 1

    @contextmanager
    def aws(self, c: Coordinator, store: JsonStore) -> Iterator[Callable[[], str] | None]:
        """Step 5, the AWS part (tether.demo.aws), in the same ledger: a moto server runs until the
        block ends; yields how to damage its resources by hand (None: the part cannot run here)."""
        from . import aws as demo_aws

        why = demo_aws.available()
        if why is not None:
            self.say(f"\n5. AWS part skipped: {why}")
            yield None
            return
        with demo_aws.moto_server():
            project = (project_path("apollo"), Project(slug="apollo", name="Apollo", owner="ada"))
            demo_aws.pair(c, store, project, self.say)
            yield demo_aws.damage

    def periodic(self, rel: str) -> None:
        """A schedule firing in a real worker, then the operator's view of it."""
        runs = 3
        self.say(
            f"\n8. A periodic job: `heartbeat` every second (cron `* * * * * *`), {runs} runs, each slot enqueued once"
        )
        with Coordinator.open(self.db_url, root=self.root, registry=register(default_registry())) as c:
            payload = CreateFile(path="reports/heartbeat.json", content={"from": "schedule"})
            c.schedule("heartbeat", "* * * * * *", payload, catch_up="none", limit=runs)  # then finished: quiet
            worker = c.worker(poll_interval=0.2)
            thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
            thread.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and worker.processed < runs:
                time.sleep(0.05)  # a demo watching a clock: its runs, then stop
            worker.stop()
            thread.join()
        self.cli(self.base(rel) + ["schedules"])
        self.cli(self.base(rel) + ["jobs", "--schedule", "heartbeat"])

    def cli(self, args: list[str]) -> int:
        self.say(f"   $ tether {' '.join(args)}")
        proc = subprocess.run(
            [sys.executable, "-m", "tether", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "112", "NO_COLOR": "1"},
        )
        for line in (proc.stdout + proc.stderr).rstrip().splitlines():
            self.say(f"     {line.rstrip()}")
        return proc.returncode


def short(job_id: str | None) -> str:
    return (job_id or "")[-6:]


def active_jobs(c: Coordinator) -> int:
    return stats(c).outstanding


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tether.demo", description=DESCRIPTION)
    parser.add_argument("--dir", default="demo-run", help="scratch directory, wiped first (default ./demo-run)")
    parser.add_argument("--sample-data", default=str(DEFAULT_SAMPLE), help="the sample store to copy")
    args = parser.parse_args(argv)
    try:
        return Demo(Path(args.dir), Path(args.sample_data)).run()
    except TetherError as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
