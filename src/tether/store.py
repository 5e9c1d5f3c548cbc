"""The data-model layer: save, delete and load JSON models; tether turns saves into jobs.

An application's data-model code should not assemble job payloads by hand. ``JsonStore`` takes a
pydantic / SQLModel model (or a plain dict), validates it, and enqueues one ``create_file`` job
holding its canonical JSON; ``delete`` enqueues a ``delete_file``; ``sync_aws`` a job that makes
an AWS resource paired with the model match its declared state. The call returns once the job
is durably recorded (the acknowledgement); ``wait=True`` or ``flush()`` also runs it. ``load``
reads straight from disk: the files are the data layer, the database only coordinates.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import orjson
import sqlalchemy as sa
from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session

from .coordinator import Coordinator
from .errors import InvalidPayload, TetherError, UnsafePath
from .jobtypes import ClaudeExtraction, CreateFile, DeleteFile, SyncAws
from .jobtypes.claude_extraction import REQUIREMENT_TEMPLATE, render_prompt
from .jobtypes.datafiles import durable, paths
from .jobtypes.registry import describe
from .ledger.record import InsertResult, JobRecord
from .ledger.status import JobStatus

M = TypeVar("M", bound=BaseModel)

DEFAULT_WAIT_TIMEOUT = 30.0


class InvalidModel(InvalidPayload):
    """A model (being saved, or read back from disk) does not validate. When saving, nothing
    was enqueued: fix the fields named in the message."""

    def __init__(self, model: str, path: str, problems: list[str], *, on_disk: bool = False) -> None:
        self.job_type = "create_file"
        self.problems = problems
        self.model = model
        self.path = path
        # InvalidPayload's own message is about payload fields; this one is about the model.
        where = (
            f"the file {path!r} does not hold a valid {model}"
            if on_disk
            else (f"refusing to save an invalid {model} to {path!r} (nothing was enqueued)")
        )
        TetherError.__init__(self, f"{where}: " + "; ".join(problems))


class ModelNotFound(TetherError):
    """``load`` found no file at the path (never saved, deleted, or its job has not run yet)."""

    def __init__(self, path: str, root: str) -> None:
        self.path = path
        super().__init__(
            f"no model file at {path!r} under the data root {root}; was its save job run? "
            "(use wait=True or store.flush() to run queued jobs)"
        )


class NotApplied(TetherError):
    """``wait=True`` / ``flush()`` returned before a job reached ``completed``. The job stays in the
    ledger: a failed job waits for ``tether retry``; a pending one will be retried by a worker."""

    def __init__(self, job: JobRecord, reason: str) -> None:
        self.job = job
        error = _error_line(job.last_error)
        super().__init__(
            f"job {job.id} ({job.type}) is {job.status.value} after {job.attempts} attempt(s): "
            f"{reason}" + (f"; last error: {error}" if error else "")
        )


class JsonStore:
    """``store = JsonStore(coordinator)``; ``store.save("people/ada.json", person)``.

    ``save`` / ``delete`` validate before anything is written, then record one job and return once
    it is durably committed (or, with ``session=``, inside the application's own transaction).
    ``wait=True`` also runs the queued jobs in this process and raises NotApplied unless the job
    completed. Default keys are none: two saves of one path both run, in enqueue order.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        max_attempts: int = 3,
        priority: int = 0,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        **worker_config: Any,
    ) -> None:
        self.coordinator = coordinator
        self.max_attempts = max_attempts
        self.priority = priority
        self.wait_timeout = wait_timeout
        self.worker_config = worker_config  # used when wait=True / flush() run jobs here
        self._unflushed: list[str] = []
        self._lock = threading.Lock()

    # -- writes ------------------------------------------------------------------------------

    def payload(self, path: str, model: BaseModel | Mapping[str, Any]) -> CreateFile:
        """The ``create_file`` payload that saves ``model`` at ``path`` (validated; for use in
        ``coordinator.transaction()`` or a handler's ``ctx.enqueue``)."""
        content = self.canonical(path, model)
        try:
            return CreateFile(path=path, content=content, overwrite=True)
        except ValidationError as e:
            raise InvalidPayload(CreateFile.job_type, describe(e)) from e

    def canonical(self, path: str, model: BaseModel | Mapping[str, Any]) -> Any:
        """The JSON value stored for ``model``: the model re-validated (a model built with
        ``model_construct``, a SQLModel table row or a mutated instance may hold bad values),
        then dumped in JSON mode by alias, so ``load`` reads it back as an equal model."""
        if isinstance(model, BaseModel):
            cls = type(model)
            try:
                checked = cls.model_validate(model.model_dump(by_alias=True, warnings=False))
            except ValidationError as e:
                raise InvalidModel(cls.__name__, path, describe(e)) from e
            return checked.model_dump(mode="json", by_alias=True)
        if isinstance(model, Mapping):
            return dict(model)  # CreateFile checks it is a JSON value
        raise InvalidModel(type(model).__name__, path, ["(model): expected a pydantic/SQLModel model or a dict"])

    def save(
        self,
        path: str,
        model: BaseModel | Mapping[str, Any],
        *,
        wait: bool = False,
        key: str | None = None,
        session: Session | None = None,
        **options: Any,
    ) -> InsertResult:
        """Record a job that writes ``model``'s canonical JSON to ``path`` (overwriting).
        Raises InvalidModel / InvalidPayload / UnsafePath before any job exists."""
        return self._record(self.payload(path, model), wait=wait, key=key, session=session, **options)

    def delete(
        self,
        path: str,
        *,
        wait: bool = False,
        require_exists: bool = False,
        key: str | None = None,
        session: Session | None = None,
        **options: Any,
    ) -> InsertResult:
        """Record a job that deletes ``path`` (a missing file is success unless ``require_exists``)."""
        try:
            payload = DeleteFile(path=path, require_exists=require_exists)
        except ValidationError as e:
            raise InvalidPayload(DeleteFile.job_type, describe(e)) from e
        return self._record(payload, wait=wait, key=key, session=session, **options)

    def extract(
        self,
        requirement_path: str,
        target_path: str,
        *,
        template: str | Callable[[dict[str, Any]], str] = REQUIREMENT_TEMPLATE,
        schema: dict[str, Any] | None = None,
        model: str | None = None,
        wait: bool = False,
        session: Session | None = None,
        **options: Any,
    ) -> InsertResult:
        """Read the requirement at ``requirement_path``, render ``template`` with its fields into
        the frozen prompt, and record one ``claude_extraction`` job that keeps the assistant's
        answer at ``target_path``. The same prompt for the same requirement while one is active
        returns that job (``duplicate=True``). The requirement's ``id`` field names it (else its
        path)."""
        fields = self.load_json(requirement_path)
        if not isinstance(fields, dict):
            raise InvalidModel("requirement", requirement_path, ["(model): expected a JSON object"], on_disk=True)
        prompt = render_prompt(template, fields)
        extra: dict[str, Any] = {"schema": schema} if schema is not None else {}
        if model is not None:
            extra["model"] = model
        requirement_id = fields.get("id") if isinstance(fields.get("id"), str) else requirement_path
        payload = ClaudeExtraction.of(prompt=prompt, target_path=target_path, requirement_id=requirement_id, **extra)
        return self._record(payload, wait=wait, key=None, session=session, **options)

    def sync_aws(
        self,
        resource_type: str,
        resource_id: str,
        config: Mapping[str, Any] | None = None,
        *,
        region: str | None = None,
        wait: bool = False,
        key: str | None = None,
        session: Session | None = None,
        **options: Any,
    ) -> InsertResult:
        """Record a job that makes the AWS resource match ``config`` (its full desired state;
        ``{"state": "absent"}`` deletes it), with ``session=`` in the application's own
        transaction. Raises InvalidPayload (nothing enqueued) for a config its type refuses."""
        try:
            payload = SyncAws(
                resource_type=resource_type, resource_id=resource_id, config=dict(config or {}), region=region
            )
        except ValidationError as e:
            raise InvalidPayload(SyncAws.job_type, describe(e)) from e
        return self._record(payload, wait=wait, key=key, session=session, **options)

    def _record(
        self, payload: Any, *, wait: bool, key: str | None, session: Session | None, **options: Any
    ) -> InsertResult:
        if wait and session is not None:
            raise TetherError(
                "wait=True cannot be used with session=: the job is not committed "
                "until your session commits; call store.flush() after the commit"
            )
        options.setdefault("max_attempts", self.max_attempts)
        options.setdefault("priority", self.priority)
        result = self.coordinator.enqueue(payload, key=key, session=session, **options)
        if session is not None:
            self._track_on_commit(session, result.id)
            return result
        if not wait:
            self._track(result.id)
            return result
        self.wait([result.id])
        return InsertResult(self.coordinator.get(result.id), result.duplicate)

    def _track(self, job_id: str) -> None:
        with self._lock:
            self._unflushed.append(job_id)

    def _track_on_commit(self, session: Session, job_id: str) -> None:
        # The job exists only if the application's transaction commits: flush() must not wait
        # for one that was rolled back. One pair of listeners per session and store.
        ids_key, hooked_key = ("tether.store.ids", id(self)), ("tether.store.hooked", id(self))
        session.info.setdefault(ids_key, []).append(job_id)
        if session.info.get(hooked_key):
            return
        session.info[hooked_key] = True

        def committed(s: Session) -> None:
            for i in s.info.pop(ids_key, []):
                self._track(i)

        sa.event.listen(session, "after_commit", committed)
        sa.event.listen(session, "after_rollback", lambda s: s.info.pop(ids_key, None))

    # -- running -----------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> list[JobRecord]:
        """Run queued jobs until every job this store recorded has completed; returns their
        records. Raises NotApplied for one that failed or is still waiting after ``timeout``."""
        with self._lock:
            ids, self._unflushed = self._unflushed, []
        return self.wait(ids, timeout)

    def wait(self, job_ids: list[str], timeout: float | None = None) -> list[JobRecord]:
        """Run ready jobs in this process until ``job_ids`` are all finished (another worker may
        hold some; their outcome is awaited too). Returns the records; NotApplied if one failed
        or did not finish within ``timeout`` seconds (a retry waiting out its backoff, say)."""
        deadline = time.monotonic() + (self.wait_timeout if timeout is None else timeout)
        pause = 0.005
        while True:
            self.coordinator.run_until_idle(**self.worker_config)
            records = [self.coordinator.get(i) for i in job_ids]
            for r in records:
                if r.status is JobStatus.FAILED:
                    raise NotApplied(r, "it failed; fix the cause, then `tether retry " + r.id + "`")
            waiting = [r for r in records if r.status is not JobStatus.COMPLETED]
            if not waiting:
                return records
            if time.monotonic() >= deadline:
                raise NotApplied(waiting[0], "it did not finish in time; it stays queued and a worker will run it")
            time.sleep(pause)  # a retry's backoff or another worker's job: poll, with a deadline
            pause = min(pause * 2, 0.2)

    # -- reads -------------------------------------------------------------------------------

    def path(self, path: str) -> Path:
        """The absolute file of ``path`` under the data root (UnsafePath if it escapes)."""
        try:
            return paths.resolve(self.coordinator.root, path)
        except paths.PathRejected as e:
            raise UnsafePath("load", "path", path, str(e)) from e

    def _canonical(self, path: str) -> str:
        try:
            return paths.canonical(self.coordinator.root, path)
        except paths.PathRejected as e:
            raise UnsafePath("load", "path", path, str(e)) from e

    def exists(self, path: str) -> bool:
        return self.path(path).is_file()

    def load(self, path: str, model: type[M]) -> M:
        """Read ``path`` from disk and validate it as ``model``. ModelNotFound if it is missing,
        InvalidModel if it is not valid JSON or not a valid ``model``."""
        try:
            # Opened from the root, following no symlink, never blocking (a FIFO there is no model).
            data = durable.read(self.coordinator.root, self._canonical(path))
        except (FileNotFoundError, NotADirectoryError, durable.NotRegularFile) as e:
            raise ModelNotFound(path, str(self.coordinator.root)) from e
        try:
            return model.model_validate(orjson.loads(data))
        except orjson.JSONDecodeError as e:
            raise InvalidModel(
                model.__name__, path, [f"not valid JSON ({e.msg} at position {e.pos})"], on_disk=True
            ) from e
        except ValidationError as e:
            raise InvalidModel(model.__name__, path, describe(e), on_disk=True) from e

    def load_json(self, path: str) -> Any:
        """Read ``path`` as a plain JSON value (ModelNotFound if missing)."""
        try:
            return orjson.loads(durable.read(self.coordinator.root, self._canonical(path)))
        except (FileNotFoundError, NotADirectoryError, durable.NotRegularFile) as e:
            raise ModelNotFound(path, str(self.coordinator.root)) from e
        except orjson.JSONDecodeError as e:
            raise InvalidModel(
                "JSON value", path, [f"not valid JSON ({e.msg} at position {e.pos})"], on_disk=True
            ) from e


def _error_line(last_error: str | None) -> str:
    """The line of ``last_error`` that says what went wrong (a traceback's last line)."""
    lines = [line for line in (last_error or "").splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1].strip() if lines[0].startswith("Traceback") else lines[0]
