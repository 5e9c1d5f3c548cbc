"""``claude_extraction``: a prompt frozen at enqueue, answered once by an AI assistant (Claude
Code run non-interactively), the answer landed atomically at ``target_path``.

Paid for once: the idempotency key is ``requirement_id:prompt_hash``, so the same prompt for the
same requirement is never queued twice while one is active; and an answer already on disk for
this ``prompt_hash`` (its sidecar says so and the file's bytes still match it) completes the job
without calling the assistant, so a retry after a late failure never pays again.

The sidecar ``.<name>.answer`` beside the target records the ``prompt_hash`` the answer was
written for and the answer's sha256: the answer file holds the answer alone.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from pydantic import Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError, InvalidPayload
from .assistant import (
    DEFAULT_STDOUT_CAP,
    KILL_GRACE,
    AssistantFailed,
    base_command,
    child_env,
    command_line,
    judge,
    message,
    parse_answer,
)
from .assistant import (
    run as run_assistant,
)
from .base import (
    IN_SYNC,
    MISSING,
    MODIFIED,
    UNKNOWN,
    UNREADABLE_PAYLOAD,
    Check,
    Difference,
    JobType,
    Payload,
    Probe,
)
from .datafiles import durable, locks
from .datafiles.effects import write_locked
from .datafiles.existence import file_paths, files_exist
from .datafiles.paths import checked_path
from .registry import describe
from .target import Target

if TYPE_CHECKING:
    from .context import JobContext

NAME = "claude_extraction"
DEFAULT_TIMEOUT = 600.0
SIDECAR_SUFFIX = ".answer"


ENV_MAX_RUNNING = "TETHER_ASSISTANT_MAX_RUNNING"
"""At most this many extractions running at once across all workers (every worker should agree)."""


def max_running_from_env() -> int | None:
    raw = os.environ.get(ENV_MAX_RUNNING) or None
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{ENV_MAX_RUNNING}={raw!r}: expected a whole number of at least 1")
    return int(raw)


def prompt_hash(prompt: str) -> str:
    """sha256 of the prompt's UTF-8 bytes, hex: what tether records and deduplicates on."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


class ClaudeExtraction(Payload):
    """Ask the assistant ``prompt`` (frozen at enqueue) about ``requirement_id``; keep its
    answer at ``target_path`` (a JSON value when the path ends in ``.json``, satisfying
    ``schema`` when one is given). ``prompt_hash`` is computed by tether; one given that does not
    match the prompt is refused."""

    job_type: ClassVar[str] = NAME

    prompt: str = Field(min_length=1)
    target_path: str
    requirement_id: str = Field(min_length=1, max_length=200)
    prompt_hash: str | None = None
    answer_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    model: str | None = Field(default=None, min_length=1, max_length=200)

    model_config = {**Payload.model_config, "populate_by_name": True, "serialize_by_alias": True}

    @model_validator(mode="before")
    @classmethod
    def _hash_prompt(cls, data: Any) -> Any:
        # Filled in before the fields are checked, so it is a set field and is stored.
        if isinstance(data, dict) and isinstance(data.get("prompt"), str) and data.get("prompt_hash") is None:
            data = {**data, "prompt_hash": prompt_hash(data["prompt"])}
        return data

    @field_validator("prompt_hash")
    @classmethod
    def _hash_matches(cls, value: str | None, info: Any) -> str | None:
        prompt = info.data.get("prompt")
        if value is not None and isinstance(prompt, str) and value != prompt_hash(prompt):
            raise ValueError("does not match the sha256 of prompt; leave it out and tether computes it")
        return value

    @field_validator("answer_schema")
    @classmethod
    def _schema_is_valid(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            import jsonschema  # type: ignore[import-untyped]  # no stubs; imported here, where a schema is checked, so that importing tether.jobtypes does not load it

            try:
                jsonschema.validators.validator_for(value).check_schema(value)
            except jsonschema.SchemaError as e:
                raise ValueError(f"not a valid JSON Schema ({e.message})") from None
        return value

    @classmethod
    def of(cls, **fields: Any) -> ClaudeExtraction:
        """Build one, with InvalidPayload naming the field for bad input."""
        try:
            return cls.model_validate(fields)
        except ValidationError as e:
            raise InvalidPayload(NAME, describe(e)) from e


REQUIREMENT_TEMPLATE = """Extract structured data from this requirement. Answer with one JSON object only.

id: {id}
title: {title}
project: {project}
priority: {priority}
status: {status}
owner: {owner}
tags: {tags}

{text}
"""
"""The default prompt of ``JsonStore.extract``: a requirement's fields in a fixed layout."""


def render_prompt(template: str | Callable[[dict[str, Any]], str], fields: dict[str, Any]) -> str:
    """The frozen prompt: ``template`` called with the requirement's fields, or formatted with
    them (``{title}``; a list is joined with ", "). A field the template names but the
    requirement lacks is an InvalidPayload naming it."""
    if callable(template):
        return template(fields)
    values = {k: ", ".join(map(str, v)) if isinstance(v, list) else v for k, v in fields.items()}
    try:
        return template.format_map(values)
    except KeyError as e:
        raise InvalidPayload(NAME, [f"prompt: the template names {{{e.args[0]}}}, which the requirement lacks"]) from e
    except (ValueError, IndexError) as e:
        raise InvalidPayload(NAME, [f"prompt: the template is not a valid format string ({e})"]) from e


def sidecar(rel: str) -> str:
    """Where the record of a landed answer lives: ``dir/.<name>.answer`` beside it."""
    directory, _, name = rel.rpartition("/")
    return f"{directory}/.{name}{SIDECAR_SUFFIX}" if directory else f".{name}{SIDECAR_SUFFIX}"


def answer_of(rel: str) -> str | None:
    """The answer a sidecar path records (``dir/.a.json.answer`` -> ``dir/a.json``), else None:
    the reconciler counts a sidecar as part of its answer, never as an untracked file."""
    directory, _, name = rel.rpartition("/")
    if not (name.startswith(".") and name.endswith(SIDECAR_SUFFIX) and len(name) > len(SIDECAR_SUFFIX) + 1):
        return None
    answer = name[1 : -len(SIDECAR_SUFFIX)]
    return f"{directory}/{answer}" if directory else answer


def answer_bytes(value: Any, *, as_json: bool) -> bytes:
    """The answer file's bytes: indented JSON for a ``.json`` target, else the text."""
    if as_json:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n"
    return (value if isinstance(value, str) else orjson.dumps(value).decode()).encode("utf-8")


class ExtractionProbe(Probe):
    """A completed extraction's answer exists, is a regular file, parses as JSON (``.json``) and
    is still the answer written for the job's ``prompt_hash`` (its sidecar records that hash and
    the answer's sha256): a hand edit is ``modified``, a deleted answer ``missing``."""

    def wants_payload(self, *, content: bool) -> bool:
        return content

    def check_many(self, items: Sequence[tuple[str, str]], root: Path, *, content: bool) -> list[Check]:
        if not content:
            return files_exist(root, file_paths(items), present=True)
        return [self.check(target, payload, root, content=True) for target, payload in items]

    def check(self, target: str, payload: str, root: Path, *, content: bool) -> Check:
        if not content:
            return files_exist(root, file_paths([(target, payload)]), present=True)[0]
        try:
            fields = orjson.loads(payload)
            rel, wanted = fields["target_path"], fields["prompt_hash"]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            return UNREADABLE_PAYLOAD
        expected = {"prompt_hash": wanted}
        try:
            data = read_data(root, rel)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return Check(MISSING, expected=expected)
            if e.errno == errno.ELOOP:
                return Check(MODIFIED, expected=expected, detail="is a symbolic link")
            if e.errno in (errno.EINVAL, errno.EISDIR):
                return Check(MODIFIED, expected=expected, detail="is not a regular file")
            return Check(UNKNOWN, detail=e.strerror or type(e).__name__)
        record = _read_record(root, rel) or {}
        actual = {"prompt_hash": record.get("prompt_hash")}
        if rel.endswith(".json"):
            try:
                orjson.loads(data)
            except orjson.JSONDecodeError:
                return Check(MODIFIED, expected=expected, actual=actual, detail="no longer parses as JSON")
        if record.get("prompt_hash") != wanted:
            diff = Difference("prompt_hash", wanted, record.get("prompt_hash"))
            return Check(MODIFIED, expected, actual, (diff,), "not the answer written for this prompt")
        digest = durable.sha256(data)
        if digest != record.get("sha256"):
            diff = Difference("sha256", record.get("sha256"), digest)
            return Check(MODIFIED, {**expected, "sha256": record.get("sha256")}, {**actual, "sha256": digest}, (diff,))
        return Check(IN_SYNC)


class ClaudeExtractionType(JobType[ClaudeExtraction]):
    """The job type. ``command`` (argv, or a string split like a shell would) overrides
    ``$TETHER_ASSISTANT_COMMAND`` for a coordinator: ``coordinator.register(ClaudeExtractionType(
    command=["claude"]))``; ``env`` names extra environment variables passed on to it."""

    name = NAME
    payload_model = ClaudeExtraction
    timeout: ClassVar[float | None] = DEFAULT_TIMEOUT
    probe = ExtractionProbe()

    def __init__(
        self,
        command: Sequence[str] | str | None = None,
        *,
        env: Sequence[str] = (),
        stdout_cap: int = DEFAULT_STDOUT_CAP,
        max_running: int | None = None,
        grace: float = KILL_GRACE,
    ) -> None:
        self.command = None if command is None else base_command(command)
        self.env = tuple(env)
        self.stdout_cap = stdout_cap
        self.max_running = max_running if max_running is not None else max_running_from_env()
        self.grace = grace

    def prepare(self, payload: ClaudeExtraction, root: Path) -> ClaudeExtraction:
        path = checked_path(self.name, "target_path", root, payload.target_path)
        if payload.prompt_hash != prompt_hash(payload.prompt):  # a payload built without validation
            raise InvalidPayload(self.name, ["prompt_hash: does not match the sha256 of prompt"])
        return payload if path == payload.target_path else payload.model_copy(update={"target_path": path})

    def target(self, payload: ClaudeExtraction) -> Target:
        return Target.file(payload.target_path)

    def idempotency_key(self, payload: ClaudeExtraction) -> str:
        return f"{payload.requirement_id}:{payload.prompt_hash}"

    def argv(self, payload: ClaudeExtraction) -> list[str]:
        """The assistant's full command line for this payload."""
        base = self.command if self.command is not None else base_command()
        return command_line(base, schema=payload.answer_schema, model=payload.model)

    def run(self, payload: ClaudeExtraction, ctx: JobContext) -> dict[str, Any]:
        as_json = payload.target_path.endswith(".json")
        landed = _landed(ctx.root, payload)
        if landed is not None:
            return {**landed, "assistant_called": False, "written": False}
        ctx.checkpoint()
        done = run_assistant(
            self.argv(payload),
            payload.prompt,
            cancelled=ctx.cancelled,
            reason=lambda: ctx.cancel_reason,
            env=child_env(extra=self.env),
            stdout_cap=self.stdout_cap,
            grace=self.grace,
        )
        if done.stopped is not None:
            ctx.checkpoint()  # cancelled: Cancelled (given back at shutdown) or the timeout's error
            raise AssistantFailed(message(done.stopped, done))
        answer = judge(done, now=ctx.clock.now())
        try:
            value = parse_answer(answer.value, done, as_json=as_json)
            if payload.answer_schema is not None:
                import jsonschema

                errors = sorted(
                    jsonschema.validators.validator_for(payload.answer_schema)(payload.answer_schema).iter_errors(
                        value
                    ),
                    key=lambda e: list(e.absolute_path),
                )
                if errors:
                    where = "/".join(str(p) for p in errors[0].absolute_path) or "(root)"
                    raise AssistantFailed(
                        message("schema_unmet", done, f"{len(errors)} schema error(s), first at {where}")
                    )
        except AssistantFailed as e:
            # An answer that cannot be used was paid for all the same: say what it cost.
            cost = answer.spend.get("cost_usd")
            if cost is None:
                raise
            raise AssistantFailed(f"{e}; paid cost_usd={cost}") from e
        data = answer_bytes(value, as_json=as_json)
        digest = durable.sha256(data)
        record = {"prompt_hash": payload.prompt_hash, "sha256": digest, "job_id": ctx.job.id}
        write_answer(ctx, payload.target_path, data, orjson.dumps(record) + b"\n")
        return {"bytes": len(data), "sha256": digest, "prompt_hash": payload.prompt_hash, **answer.spend} | {
            "assistant_called": True,
            "written": True,
        }


def write_answer(ctx: JobContext, rel: str, data: bytes, record: bytes) -> None:
    """Land the answer, then its sidecar, each through the one locked write (lock, no symlinks,
    confirmed lease, atomic). A crash between the two leaves an answer without a record: the
    next attempt asks again, never trusts it."""
    write_locked(ctx, rel, data)
    write_locked(ctx, sidecar(rel), record)


def _landed(root: Path, payload: ClaudeExtraction) -> dict[str, Any] | None:
    """The answer already on disk for this prompt_hash, if its sidecar says so and the file
    still holds the bytes it recorded; else None."""
    with locks.path_lock(root, payload.target_path):
        record = _read_record(root, payload.target_path)
        if record is None or record.get("prompt_hash") != payload.prompt_hash:
            return None
        try:
            data = read_data(root, payload.target_path)
        except OSError:
            return None
        if durable.sha256(data) != record.get("sha256"):
            return None
        return {"bytes": len(data), "sha256": record["sha256"], "prompt_hash": payload.prompt_hash}


def read_data(root: Path, rel: str) -> bytes:
    """The bytes of the regular data file ``rel``, opened without following any symlink (OSError
    otherwise: ENOENT missing, ELOOP a symlink, EISDIR/EINVAL not a regular file)."""
    with durable.data_file(root, rel) as f:
        fd = os.open(f.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=f.dir_fd)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise OSError(errno.EINVAL, "is not a regular file")
            return handle.read()


def _read_record(root: Path, rel: str) -> dict[str, Any] | None:
    try:
        value = orjson.loads(read_data(root, sidecar(rel)))
    except (OSError, orjson.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None
