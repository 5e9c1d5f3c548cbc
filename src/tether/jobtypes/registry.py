"""Job types by name, and payload validation with errors that name the field."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..errors import InvalidPayload, UnknownJobType
from .base import JobType, Payload


class Registry:
    def __init__(self, types: list[JobType[Any]] | None = None) -> None:
        self._types: dict[str, JobType[Any]] = {}
        self.generation = 0  # bumped by every register(): what callers cached from it is stale
        for t in types or []:
            self.register(t)

    def register(self, job_type: JobType[Any]) -> JobType[Any]:
        if job_type.payload_model.job_type != job_type.name:
            raise ValueError(f"{type(job_type).__name__}: payload model is for {job_type.payload_model.job_type!r}")
        self._types[job_type.name] = job_type
        self.generation += 1
        return job_type

    def names(self) -> list[str]:
        return sorted(self._types)

    def get(self, name: str) -> JobType[Any]:
        try:
            return self._types[name]
        except KeyError:
            raise UnknownJobType(name, list(self._types)) from None

    def for_payload(self, payload: Payload) -> JobType[Any]:
        job_type = self.get(payload.job_type)
        if not isinstance(payload, job_type.payload_model):
            raise InvalidPayload(payload.job_type, [f"expected a {job_type.payload_model.__name__}"])
        return job_type

    def parse(self, name: str, data: dict[str, Any] | str | bytes) -> Payload:
        """Validate raw payload data (a dict or JSON text) for job type ``name``."""
        model = self.get(name).payload_model
        try:
            if isinstance(data, (str, bytes)):
                return model.model_validate_json(data)
            return model.model_validate(data)
        except ValidationError as e:
            raise InvalidPayload(name, describe(e)) from e


def describe(error: ValidationError) -> list[str]:
    """One line per problem: the field, what is wrong, and the type that was given (never the
    value, which may be file contents or a prompt)."""
    problems = []
    for err in error.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(payload)"
        msg = err["msg"]
        if err["type"] not in ("missing", "extra_forbidden", "value_error") and "input" in err:
            msg += f" (got {type(err['input']).__name__})"
        if err["type"] == "extra_forbidden":
            msg = "unknown field (payload fields are snake_case)"
        problems.append(f"{field}: {msg}")
    return problems
