"""The README's code runs as written: every ```python block is run by a test (here, or in
test_demo.py: the first example, the job type's module and script, and the demo's transcript),
the worker-events transcript is replayed, and no shell line calls a bare ``tether`` that ``make``
did not put on the PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlmodel import Field, SQLModel

from tether import Coordinator, JobStatus, Payload
from tether.demo.app import Project
from tether.observe import schedules
from tether.store import JsonStore

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)
BIN = Path(sys.executable).parent

# A line of each python block, and the test that runs the block.
RUN_BY = {
    'store = JsonStore(Coordinator.open("sqlite:///tether.db", root="data"))': "test_demo.py: first example",
    "# stamps.py: the module": "test_demo.py: job type example",
    "# enqueue_stamp.py: the script": "test_demo.py: job type example",
    'store.save("orders/o-1001.json", order_document, session=session)': "test_the_outbox_fragment_runs",
    'store.sync_aws("sqs_queue", "old-jobs", {"state": "absent"})': "test_the_sync_aws_fragment_runs",
    'c.schedule("nightly-sync"': "test_the_periodic_job_examples_run",
    "def schedules(coordinator):": "test_the_periodic_job_examples_run",
    'Mount("/ops/tether"': "test_the_ui_mount_fragment_runs",
    "raise Snooze(60": "test_the_snooze_fragment_runs",
    "AsyncJsonStore(c)": "test_the_asyncio_fragment_runs",
    "async def run(self, p, ctx):": "test_the_async_handler_fragment_runs",
    "# test_people.py": "test_the_testing_example_passes_under_the_plugin",
}


def block(marker: str, lang: str = "python") -> str:
    [found] = [text for kind, text in BLOCKS if kind == lang and marker in text]
    return found


def normalized(text: str) -> list[str]:
    """Output as a test compares it with the README's copy: ids, times, ports, worker names and
    measured figures masked; table rules and column padding dropped."""
    text = re.sub(r"\b[0-9A-HJKMNP-TV-Z]{26}\b", "<ulid>", text)
    text = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?(\+00:00)?", "<time>", text)
    # Worker names before the demo's short ids: a worker's random suffix may be six digits.
    text = re.sub(r'"worker":"[^"]+"|worker [^ \n"]+:\d+:[0-9a-f]+', "<worker>", text)
    text = re.sub(r"\b[0-9A-Z]{6}\b", "<id>", text)  # the demo's short job ids
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", text)
    text = re.sub(r"\b\d+\.\d+(e-\d+)?\b", "<n>", text)  # durations, costs, percentiles
    text = re.sub(r"\S*bin/tether\b", "tether", text)
    text = re.sub(r"[─━│┃┏┓┗┛┡┩┳┻╇┴┬└┘┌┐├┤┼╋]", " ", text)
    lines = (" ".join(line.split()) for line in text.splitlines())
    return [line for line in lines if line]


def assert_same_output(shown: str, printed: str, what: str) -> None:
    expected, actual = normalized(shown), normalized(printed)
    for n, (want, got) in enumerate(zip(expected, actual, strict=False)):
        assert want == got, f"{what}: line {n + 1} differs from the README's\n README: {want}\n now:    {got}"
    assert len(expected) == len(actual), f"{what}: {len(actual)} lines now, {len(expected)} in the README"


def test_every_python_block_of_the_readme_is_run_by_a_test() -> None:
    python = [text for kind, text in BLOCKS if kind == "python"]
    assert len(python) >= 8
    for text in python:
        runners = [test for marker, test in RUN_BY.items() if marker in text]
        assert runners, f"no test runs this README block; add it to RUN_BY:\n{text}"


def test_no_shell_line_calls_a_bare_tether() -> None:
    """``make`` installs tether into .venv and puts nothing on the PATH: a line that starts with
    ``tether`` fails as written (a transcript's ``$ tether`` shows a session with it on the PATH)."""
    for kind, text in BLOCKS:
        if kind == "sh":
            bare = [line for line in text.splitlines() if re.match(r"\s*tether\b", line)]
            assert not bare, f"README shell lines call a bare tether: {bare}"


@pytest.fixture
def coordinator(tmp_path: Path) -> Any:
    with Coordinator.open(f"sqlite:///{tmp_path / 'tether.db'}", root=tmp_path / "data") as c:
        yield c


class Order(SQLModel, table=True):
    __tablename__ = "readme_orders"

    id: str = Field(primary_key=True)
    customer: str
    total_cents: int


def test_the_outbox_fragment_runs(coordinator: Coordinator) -> None:
    Order.metadata.create_all(coordinator.engine, tables=[Order.__table__])  # type: ignore[attr-defined]
    store = JsonStore(coordinator)
    scope = {"coordinator": coordinator, "store": store, "Order": Order, "order_document": {"id": "o-1001"}}
    exec(compile(block("order_document"), "README.md", "exec"), scope)
    [job] = store.flush()
    assert job.status is JobStatus.COMPLETED and (coordinator.root / "orders" / "o-1001.json").exists()


def test_the_sync_aws_fragment_runs(coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    from awskit import dummy_environment

    dummy_environment(monkeypatch)
    store = JsonStore(coordinator)
    project = Project(slug="apollo", name="Apollo", owner="ada")
    with mock_aws():
        exec(
            compile(block('"old-jobs"'), "README.md", "exec"),
            {"coordinator": coordinator, "store": store, "project": project},
        )
        jobs = store.flush()
    assert [j.type for j in jobs] == ["create_file", "sync_aws", "sync_aws", "sync_aws"]
    assert {j.status for j in jobs} == {JobStatus.COMPLETED}


def test_the_periodic_job_examples_run(coordinator: Coordinator, tmp_path: Path) -> None:
    exec(compile(block('c.schedule("nightly-sync"'), "README.md", "exec"), {"c": coordinator})
    [nightly] = schedules.listing(coordinator.engine)
    assert (nightly["name"], nightly["timezone"], nightly["type"]) == ("nightly-sync", "Europe/Berlin", "sync_aws")

    # The hook, beside register(registry) in the README's stamps.py, declared by a worker of it.
    work = tmp_path / "app"
    work.mkdir()
    (work / "stamps.py").write_text(block("# stamps.py: the module") + "\n\n" + block("def schedules(coordinator):"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    tether = [str(BIN / "tether"), "--db", f"sqlite:///{work / 'tether.db'}", "--root", str(work / "data")]
    for args in (["init"], ["--import", "stamps", "worker", "--until-idle", "-q"]):
        done = subprocess.run([*tether, *args], cwd=work, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    listed = subprocess.run([*tether, "schedules"], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert "hourly-stamp" in listed.stdout and "0 * * * *" in listed.stdout, listed.stdout + listed.stderr


def test_the_ui_mount_fragment_runs(coordinator: Coordinator) -> None:
    scope: dict[str, Any] = {"coordinator": coordinator}
    exec(compile(block('Mount("/ops/tether"'), "README.md", "exec"), scope)
    [mount] = scope["routes"]
    assert mount.path == "/ops/tether"


def test_the_worker_events_transcript_replays(tmp_path: Path) -> None:
    """Each ``$`` line of the README's transcript, run in an empty directory with the venv's
    tether on the PATH, prints what the README shows (ids, worker names, figures aside)."""
    shown = block("$ id=$(tether enqueue create_file", "sh")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    printed = []
    for line in shown.splitlines():
        if line.startswith("$ "):
            command = line[2:]
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,  # one stream, in the order a terminal shows them
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stdout
            printed += [line, done.stdout.rstrip("\n")]
    assert_same_output(shown, "\n".join(printed).replace(str(tmp_path), "/srv/app"), "the events transcript")


def test_the_snooze_fragment_runs() -> None:
    from types import SimpleNamespace

    from tether import Snooze

    ready = {"now": False}
    namespace: dict[str, Any] = {"report_ready": lambda report_id: ready["now"]}
    exec(block("raise Snooze(60"), namespace)
    with pytest.raises(Snooze) as snoozed:
        namespace["run"](None, SimpleNamespace(report_id=7), None)
    assert (snoozed.value.seconds, snoozed.value.scope, str(snoozed.value)) == (
        60,
        "job",
        "snoozed for 60s: the report is not ready",
    )
    ready["now"] = True
    namespace["run"](None, SimpleNamespace(report_id=7), None)


def test_the_asyncio_fragment_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import asyncio

    from pydantic import BaseModel

    class Person(BaseModel):
        handle: str
        email: str

    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {"Person": Person}
    exec(compile(block("AsyncJsonStore(c)"), "README.md", "exec"), scope)
    asyncio.run(scope["main"]())
    assert capsys.readouterr().out == "handle='ada' email='ada@example.org'\n"
    assert (tmp_path / "data" / "people" / "ada.json").is_file()


class Fetch(Payload):
    job_type: ClassVar[str] = "fetch"
    url: str
    path: str


def test_the_async_handler_fragment_runs(coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    from tether import JobType, write_locked

    real_client = httpx.AsyncClient
    served = httpx.MockTransport(lambda request: httpx.Response(200, content=b"fetched " + request.url.path.encode()))
    monkeypatch.setattr(httpx, "AsyncClient", lambda: real_client(transport=served))
    scope: dict[str, Any] = {"JobType": JobType, "Fetch": Fetch, "write_locked": write_locked}
    exec(compile(block("async def run(self, p, ctx):"), "README.md", "exec"), scope)
    coordinator.register(scope["FetchType"]())
    job = coordinator.enqueue(Fetch(url="https://example.org/a", path="a.txt"))
    assert coordinator.run_until_idle() == 1
    assert coordinator.get(job.id).status is JobStatus.COMPLETED
    assert (coordinator.root / "a.txt").read_bytes() == b"fetched /a"


def test_the_testing_example_passes_under_the_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_people=block("# test_people.py"))
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
