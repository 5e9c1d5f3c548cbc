"""The data-model layer: JsonStore over the coordinator, the outbox with the application's own
rows, and one logical operation as one job (or a parent whose children commit with it).
Runs on SQLite and PostgreSQL (the `db_url` fixture is parametrised)."""

from __future__ import annotations

import errno
import os
from typing import Any, ClassVar, Literal

import pytest
from pydantic import BaseModel
from pydantic import Field as PydanticField
from sqlmodel import Field, Session, SQLModel, col, select

from tether import (
    CreateFile,
    InvalidPayload,
    JobContext,
    JobStatus,
    JobType,
    Payload,
    PermanentError,
    RetryPolicy,
    TetherError,
    UnsafePath,
)
from tether.demo.app import (
    ArchiveProject,
    Project,
    Requirement,
    SaveRequirement,
    json_bytes,
    project_path,
    register,
    requirement_files,
)
from tether.jobtypes import default_registry
from tether.ledger.orm import Job
from tether.store import InvalidModel, JsonStore, ModelNotFound, NotApplied

FAST = RetryPolicy(base=0.01, cap=0.02)


class Person(BaseModel):
    handle: str = PydanticField(pattern=r"^[a-z]+$")
    email: str = PydanticField(pattern=r"^[^@]+@[^@]+$")
    age: int = PydanticField(ge=0)
    tags: list[str] = []


class Invoice(SQLModel, table=True):
    """An application's own SQLModel table (also the outbox test's row)."""

    __tablename__ = "test_store_invoices"
    id: str = Field(primary_key=True)
    customer: str
    total_cents: int


def jobs(c) -> list[Job]:
    with Session(c.engine) as s:
        return list(s.exec(select(Job).order_by(col(Job.created_at), col(Job.id))))


@pytest.fixture
def store(coordinator):
    return JsonStore(coordinator, retry=FAST)


@pytest.fixture
def invoices(coordinator):
    """The application's table in the same database as the ledger, empty."""
    table = Invoice.__table__  # type: ignore[attr-defined]  # sqlmodel sets it; its types do not declare it
    table.drop(coordinator.engine, checkfirst=True)
    table.create(coordinator.engine)
    return coordinator


# -- save / load ---------------------------------------------------------------------------------


def test_saved_model_loads_back_equal(store, root):
    ada = Person(handle="ada", email="ada@example.org", age=36, tags=["math"])
    result = store.save("people/ada.json", ada)
    assert not (root / "people/ada.json").exists()  # recorded, not yet run
    assert store.flush()[0].id == result.id
    assert store.load("people/ada.json", Person) == ada
    assert (root / "people/ada.json").read_bytes() == json_bytes(ada)


def test_save_accepts_a_plain_dict_and_a_sqlmodel_row(store):
    store.save("raw/a.json", {"a": [1, 2], "b": None})
    store.save("rows/i1.json", Invoice(id="i1", customer="acme", total_cents=1200))
    store.flush()
    assert store.load_json("raw/a.json") == {"a": [1, 2], "b": None}
    assert store.load("rows/i1.json", Invoice).total_cents == 1200


def test_overwrite_replaces_the_file(store):
    store.save("people/ada.json", Person(handle="ada", email="a@x", age=1), wait=True)
    store.save("people/ada.json", Person(handle="ada", email="a@y", age=2), wait=True)
    assert store.load("people/ada.json", Person).email == "a@y"


def test_invalid_model_is_refused_before_any_job_exists(store, coordinator, root):
    bad = Person.model_construct(handle="Ada!", email="nope", age=-1)
    with pytest.raises(InvalidModel) as e:
        store.save("people/ada.json", bad)
    message = str(e.value)
    assert "Person" in message and "people/ada.json" in message and "nothing was enqueued" in message
    assert "handle" in message and "email" in message and "age" in message
    assert "nope" not in message  # field values (which may be private) stay out of errors
    mutated = Person(handle="ada", email="a@x", age=1)
    mutated.age = -5  # pydantic does not validate assignment by default
    with pytest.raises(InvalidModel, match="age"):
        store.save("people/ada.json", mutated)
    with pytest.raises(InvalidPayload, match="content"):
        store.save("raw/x.json", {"when": object()})  # not a JSON value
    with pytest.raises(UnsafePath, match="'..'"):
        store.save("../escape.json", {"a": 1})
    assert jobs(coordinator) == []
    assert sorted(p.name for p in root.iterdir()) == []


def test_delete_removes_the_file_when_its_job_runs(store, root):
    store.save("people/ada.json", {"handle": "ada"}, wait=True)
    result = store.delete("people/ada.json")
    assert (root / "people/ada.json").exists()
    store.flush()
    assert not (root / "people/ada.json").exists()
    assert store.coordinator.get(result.id).result_data == {"deleted": True}
    with pytest.raises(ModelNotFound, match="people/ada.json"):
        store.load("people/ada.json", Person)


def test_delete_of_a_missing_file_with_require_exists_fails_on_wait(store):
    with pytest.raises(NotApplied, match="failed"):
        store.delete("people/ghost.json", require_exists=True, wait=True)


def test_wait_true_returns_after_the_job_completed(store, root):
    result = store.save("people/ada.json", {"handle": "ada"}, wait=True)
    assert result.job.status is JobStatus.COMPLETED
    assert store.load_json("people/ada.json") == {"handle": "ada"}
    assert store.flush() == []  # nothing left that this store recorded


def test_wait_raises_not_applied_when_the_job_fails(store, root):
    (root / "people/ada.json").mkdir(parents=True)  # a directory where the file should go
    with pytest.raises(NotApplied) as e:
        store.save("people/ada.json", {"handle": "ada"}, wait=True, max_attempts=1)
    assert e.value.job.status is JobStatus.FAILED and e.value.job.attempts == 1
    assert "tether retry" in str(e.value) and "people/ada.json is a directory" in str(e.value)


def test_wait_gives_up_after_its_timeout_and_the_job_stays_queued(coordinator, clock, root, monkeypatch):
    def io_error(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", io_error)  # a retryable failure
    store = JsonStore(coordinator, wait_timeout=0.1)  # the retry's backoff outlasts the wait
    with pytest.raises(NotApplied, match="did not finish in time") as e:
        store.save("people/ada.json", {"handle": "ada"}, wait=True)
    assert e.value.job.status is JobStatus.PENDING and e.value.job.attempts == 1
    monkeypatch.undo()
    clock.advance(seconds=3600)
    assert store.wait([e.value.job.id])[0].status is JobStatus.COMPLETED


def test_duplicate_key_returns_the_active_job(store):
    first = store.save("a.json", {"v": 1}, key="a")
    second = store.save("a.json", {"v": 1}, key="a")
    assert second.duplicate and second.id == first.id
    assert len(store.flush()) == 2 and len(jobs(store.coordinator)) == 1


def test_load_names_a_missing_file_and_an_invalid_one(store, root):
    with pytest.raises(ModelNotFound, match="no model file at 'people/x.json'"):
        store.load("people/x.json", Person)
    (root / "people").mkdir()
    (root / "people/bad.json").write_text('{"handle": "ada"}')
    with pytest.raises(InvalidModel, match="does not hold a valid Person: email: Field required"):
        store.load("people/bad.json", Person)
    (root / "people/torn.json").write_text('{"handle": ')
    with pytest.raises(InvalidModel, match="not valid JSON"):
        store.load("people/torn.json", Person)
    with pytest.raises(UnsafePath):
        store.load("/etc/passwd", Person)


# -- the outbox: the application's rows and the job commit together ------------------------------


def test_outbox_row_and_job_commit_together(invoices):
    store = JsonStore(invoices)
    with Session(invoices.engine) as s:
        s.add(Invoice(id="i1", customer="acme", total_cents=1200))
        store.save("invoices/i1.json", {"id": "i1", "total_cents": 1200}, session=s)
        s.commit()
    with Session(invoices.engine) as s:
        assert s.get(Invoice, "i1") is not None
    assert [j.type for j in jobs(invoices)] == ["create_file"]
    store.flush()
    assert store.load_json("invoices/i1.json")["total_cents"] == 1200


def test_outbox_failure_between_row_and_commit_keeps_neither(invoices):
    store = JsonStore(invoices)
    with pytest.raises(RuntimeError, match="crash"):
        with Session(invoices.engine) as s:
            s.add(Invoice(id="i2", customer="acme", total_cents=99))
            store.save("invoices/i2.json", {"id": "i2"}, session=s)
            raise RuntimeError("crash before commit")  # the session rolls back on close
    # An invalid job after the row: the application aborts, the row goes too.
    with Session(invoices.engine) as s:
        s.add(Invoice(id="i3", customer="acme", total_cents=99))
        s.flush()
        with pytest.raises(UnsafePath):
            store.save("../i3.json", {"id": "i3"}, session=s)
        s.rollback()
    with Session(invoices.engine) as s:
        assert s.exec(select(Invoice)).all() == []
    assert jobs(invoices) == []
    assert store.flush() == []  # the rolled-back jobs are not awaited
    assert invoices.run_until_idle() == 0


def test_wait_cannot_be_combined_with_a_session(invoices):
    with Session(invoices.engine) as s, pytest.raises(TetherError, match="session"):
        JsonStore(invoices).save("a.json", {"a": 1}, session=s, wait=True)


# -- one logical operation, one job --------------------------------------------------------------


def requirement(
    req_id: str, project: str = "ingest", status: Literal["open", "done", "archived"] = "open"
) -> Requirement:
    return Requirement(
        id=req_id,
        project=project,
        title="A title",
        text="Body.",
        priority="must",
        status=status,
        owner="ada",
        tags=["x"],
    )


@pytest.fixture
def app(make_coordinator):
    """A coordinator with the sample application's job types."""
    return make_coordinator(register(default_registry()))


def test_one_job_writes_a_model_and_its_companion_file(app, root):
    req = requirement("REQ-001")
    app.enqueue(SaveRequirement(requirement=req))
    assert app.run_until_idle() == 1
    for rel, data in requirement_files(req).items():
        assert (root / rel).read_bytes() == data
    assert [(j.type, j.status) for j in jobs(app)] == [("save_requirement", "completed")]


def test_rerun_of_the_one_job_is_idempotent(app, root):
    req = requirement("REQ-002")
    app.enqueue(SaveRequirement(requirement=req))
    app.run_until_idle()
    stamp = {rel: (root / rel).stat().st_mtime_ns for rel in requirement_files(req)}
    app.enqueue(SaveRequirement(requirement=req))
    app.run_until_idle()
    assert jobs(app)[-1].result == '{"files":2,"written":0}'
    assert {rel: (root / rel).stat().st_mtime_ns for rel in requirement_files(req)} == stamp


def test_reconciler_checks_the_model_and_its_companion_file(app, root):
    from tether.reconcile.check import reconcile

    req = requirement("REQ-004")
    app.enqueue(SaveRequirement(requirement=req))
    app.run_until_idle()
    assert reconcile(app).exit_code == 0
    (root / "requirements/REQ-004/README.md").write_text("edited by hand")
    report = reconcile(app)
    assert report.exit_code == 2
    [finding] = [f for f in report.findings if f.status == "modified"]
    assert finding.job_type == "save_requirement" and "README.md" in (finding.detail or "")


def seed_project(app, slug: str, reqs: list[Requirement]) -> None:
    store = JsonStore(app)
    store.save(project_path(slug), Project(slug=slug, name=slug.title(), owner="ada"))
    for r in reqs:
        app.enqueue(SaveRequirement(requirement=r))
    store.flush()
    app.run_until_idle()


def test_children_of_a_completed_parent_exist_and_run(app, root):
    seed_project(
        app,
        "portal",
        [requirement("REQ-001", "portal"), requirement("REQ-002", "portal"), requirement("REQ-003", "other")],
    )
    parent = app.enqueue(ArchiveProject(slug="portal"))
    app.run_until_idle()
    children = [j for j in jobs(app) if j.parent_id == parent.id]
    assert app.get(parent.id).status is JobStatus.COMPLETED
    assert len(children) == 2 and all(j.status == "completed" for j in children)
    store = JsonStore(app)
    assert store.load(project_path("portal"), Project).status == "archived"
    assert [
        store.load(f"requirements/{i}/requirement.json", Requirement).status for i in ("REQ-001", "REQ-002", "REQ-003")
    ] == ["archived", "archived", "open"]


class Spawner(Payload):
    job_type: ClassVar[str] = "spawner"
    children: int
    fail_after_enqueue: bool


class SpawnerType(JobType[Spawner]):
    """Enqueues ``children`` create_file jobs, then raises if ``fail_after_enqueue``."""

    name = "spawner"
    payload_model = Spawner

    def run(self, payload: Spawner, ctx: JobContext) -> dict[str, Any]:
        for i in range(payload.children):
            ctx.enqueue(CreateFile(path=f"children/{ctx.job.id}-{i}.json", content={"i": i}))
        if payload.fail_after_enqueue:
            raise PermanentError("parent fails after enqueueing its children")
        return {"children": payload.children}


def test_children_exist_if_and_only_if_the_parent_completed(make_coordinator, root):
    registry = default_registry()
    registry.register(SpawnerType())
    c = make_coordinator(registry)
    failed = c.enqueue(Spawner(children=3, fail_after_enqueue=True))
    done = c.enqueue(Spawner(children=3, fail_after_enqueue=False))
    c.run_until_idle()
    assert c.get(failed.id).status is JobStatus.FAILED
    assert c.get(done.id).status is JobStatus.COMPLETED
    by_parent: dict[str | None, list[Job]] = {}
    for j in jobs(c):
        by_parent.setdefault(j.parent_id, []).append(j)
    assert failed.id not in by_parent  # the failed parent left no children behind
    assert [j.status for j in by_parent[done.id]] == ["completed"] * 3
    assert sorted(p.name.split("-")[0] for p in (root / "children").iterdir()) == [done.id] * 3
