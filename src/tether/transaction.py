"""The jobs an application gathers in ``Coordinator.transaction()``, inserted together when its
block ends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .jobtypes import Payload
from .ledger.notes import Note, notes_for
from .ledger.record import InsertResult, JobRecord

if TYPE_CHECKING:
    from .coordinator import Coordinator


class Transaction:
    """Jobs gathered in ``Coordinator.transaction()``; committed together when the block ends."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self.jobs: list[JobRecord] = []
        self.notes: dict[str, Note] = {}
        self.results: list[InsertResult] = []

    def enqueue(
        self,
        payload: Payload,
        *,
        tags: Sequence[str] | None = None,
        meta: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        job = self._coordinator.queue.build(payload, **options)
        self.notes.update(notes_for([job], tags, meta) or {})
        self.jobs.append(job)
