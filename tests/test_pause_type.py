"""Pausing a job type, on both ledgers: no claim takes its jobs (limited or not) while it is
paused, a pause made by another process reaches a worker within ``pausing.REFRESH``, the claim's
statement is the same one whatever is paused, and resuming lets its jobs run."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from jobkit import Note, NoteType, registry_with
from tether import Coordinator
from tether.errors import ConfigError
from tether.jobtypes import CreateFile
from tether.ledger import pausing


def test_a_paused_types_jobs_are_not_claimed_and_run_once_it_is_resumed(coordinator: Coordinator):
    note_free = coordinator.enqueue(CreateFile(path="a.json", content=1)).id
    coordinator.pause("create_file", "maintenance")
    assert coordinator.queue.claim("w", limit=10) == []
    coordinator.resume("create_file")
    assert [j.id for j in coordinator.queue.claim("w", limit=10)] == [note_free]


def test_a_pause_leaves_the_other_types_to_be_claimed(make_coordinator: Callable[..., Coordinator]):
    c = make_coordinator(registry_with(NoteType()))
    c.enqueue(CreateFile(path="a.json", content=1))
    note = c.enqueue(Note(name="n")).id
    c.pause("create_file")
    assert [j.id for j in c.queue.claim("w", limit=10)] == [note]


def test_a_limited_type_is_not_claimed_while_paused(make_coordinator: Callable[..., Coordinator]):
    limited = NoteType()
    limited.max_running = 5
    c = make_coordinator(registry_with(limited))
    c.enqueue(Note(name="n"))
    c.pause("note")
    assert c.queue.claim("w", limit=10) == []
    c.resume("note")
    assert len(c.queue.claim("w", limit=10)) == 1


def test_a_pause_by_another_process_reaches_a_worker_once_its_view_is_refresh_seconds_old(
    make_coordinator: Callable[..., Coordinator], monkeypatch: pytest.MonkeyPatch
):
    counter = [1000.0]
    monkeypatch.setattr(pausing, "elapsed", lambda: counter[0])
    worker_side, operator = make_coordinator(), make_coordinator()
    assert worker_side.queue.claim("w") == []  # it has read the paused types: none
    for n in range(3):
        worker_side.enqueue(CreateFile(path=f"{n}.json", content=n))
    operator.pause("create_file")
    assert len(worker_side.queue.claim("w")) == 1  # its view is fresh: read again only once stale
    counter[0] += pausing.REFRESH
    assert worker_side.queue.claim("w") == []


def test_the_claim_binds_the_unpaused_types_into_the_same_statement(coordinator: Coordinator):
    claimer = coordinator.queue.claimer
    every = claimer._claimed_types(frozenset())
    fewer = claimer._claimed_types(frozenset({"create_file"}))
    assert "create_file" in str(every) and "create_file" not in str(fewer) and "delete_file" in str(fewer)


def test_a_type_name_that_no_type_could_have_is_refused(coordinator: Coordinator):
    with pytest.raises(ConfigError, match="is not a type name"):
        coordinator.pause("x" * 65)
