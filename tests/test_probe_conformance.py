"""What every reconcile probe must do, whatever its target: one suite, one case per job type.

A probe answers ``in_sync`` when the effect of a target's latest completed job holds, ``missing``
when it is gone, ``modified`` with the fields that differ, ``unexpected`` when something is there
that the job removed, and ``unknown`` (never ``missing``, never an exception) when the world could
not be read. A new job type with a probe adds a ``ProbeCase`` below (AWS resources, extractions).
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from awskit import client_hook, dummy_environment
from tether import Check, Coordinator, CreateFile, DeleteFile, Payload, Probe
from tether.jobtypes import ClaudeExtraction, ClaudeExtractionType, Registry, default_registry
from tether.jobtypes.aws import SyncAws, reset_clients
from tether.reconcile.drift import IN_SYNC, MISSING, MODIFIED, UNEXPECTED, UNKNOWN


@dataclass
class Completed:
    """A completed job's target and stored payload, as the reconciler hands them to a probe."""

    target: str
    payload: str


@dataclass
class ProbeCase:
    """How to bring one job type's target into each state. A state the type cannot reach (a
    created file is never ``unexpected``) is None."""

    name: str
    complete: Callable[[Coordinator], Payload]
    make_missing: Callable[[Coordinator, Payload], object] | None
    make_modified: Callable[[Coordinator, Payload], object] | None
    make_unexpected: Callable[[Coordinator, Payload], object] | None
    broken_world: Callable[[], Any]  # a context manager under which reading the world fails
    registry: Callable[[], Registry] | None = None  # job types configured for the test (default: built-ins)
    world: Callable[[], AbstractContextManager[Any]] = nullcontext  # the world the whole test runs in
    job_type: str | None = None  # when several cases share one job type (default: ``name``)


@contextmanager
def _disk_fails() -> Iterator[None]:
    """Every read of the data root fails with EIO (a dying disk), whatever call a probe uses."""

    def fail(*_: Any, **__: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    from tether.jobtypes.datafiles import existence, fingerprint

    with pytest.MonkeyPatch.context() as mp:
        for name in ("open", "lstat", "stat", "scandir", "listdir"):
            mp.setattr(os, name, fail)
        mp.setattr(existence, "lstat_data_file", fail)  # the probes' own handle on lstat
        mp.setattr(fingerprint, "matches_in_c", None)  # and the check's stats in C
        yield


def _file(c: Coordinator, rel: str) -> Path:
    return Path(c.root, rel)


def _with_stand_in_assistant() -> Registry:
    registry = default_registry()
    stand_in = Path(__file__).resolve().parent.parent / "sample_data" / "stand_in_claude.py"
    registry.register(ClaudeExtractionType(command=[sys.executable, str(stand_in)]))
    return registry


@contextmanager
def _moto() -> Iterator[None]:
    """AWS, in-process (moto), with dummy credentials; fresh clients."""
    with pytest.MonkeyPatch.context() as mp:
        dummy_environment(mp)
        with mock_aws(), client_hook(lambda client: None):
            yield


@contextmanager
def _no_credentials() -> Iterator[None]:
    """AWS cannot be read: boto3's default chain finds no credentials."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            mp.delenv(name, raising=False)
        reset_clients()
        try:
            yield
        finally:
            reset_clients()


def _queue_url(name: str) -> str:
    return str(boto3.client("sqs").get_queue_url(QueueName=name)["QueueUrl"])


CASES = [
    ProbeCase(
        "create_file",
        complete=lambda c: CreateFile(path="docs/a.json", content={"n": 1}),
        make_missing=lambda c, p: _file(c, "docs/a.json").unlink(),
        make_modified=lambda c, p: _file(c, "docs/a.json").write_text('{"n": 2, "extra": true}\n'),
        make_unexpected=None,
        broken_world=_disk_fails,
    ),
    ProbeCase(
        "delete_file",
        complete=lambda c: DeleteFile(path="docs/gone.json"),
        make_missing=None,
        make_modified=None,
        make_unexpected=lambda c, p: _file(c, "docs/gone.json").write_text("back\n"),
        broken_world=_disk_fails,
    ),
    ProbeCase(
        "claude_extraction",
        complete=lambda c: ClaudeExtraction.of(prompt="id: REQ-001\n", target_path="x/a.json", requirement_id="R"),
        make_missing=lambda c, p: _file(c, "x/a.json").unlink(),
        make_modified=lambda c, p: _file(c, "x/a.json").write_text('{"edited": true}\n'),
        make_unexpected=None,
        broken_world=_disk_fails,
        registry=_with_stand_in_assistant,
    ),
    ProbeCase(
        "sync_aws",
        complete=lambda c: SyncAws(
            resource_type="sqs_queue",
            resource_id="probe-q",
            config={"attributes": {"VisibilityTimeout": 40}, "tags": {"env": "prod"}},
        ),
        make_missing=lambda c, p: boto3.client("sqs").delete_queue(QueueUrl=_queue_url("probe-q")),
        make_modified=lambda c, p: boto3.client("sqs").tag_queue(QueueUrl=_queue_url("probe-q"), Tags={"env": "dev"}),
        make_unexpected=None,
        broken_world=_no_credentials,
        world=_moto,
    ),
    ProbeCase(
        "sync_aws_absent",
        complete=lambda c: SyncAws(resource_type="sqs_queue", resource_id="probe-gone", config={"state": "absent"}),
        make_missing=None,
        make_modified=None,
        make_unexpected=lambda c, p: boto3.client("sqs").create_queue(QueueName="probe-gone"),
        broken_world=_no_credentials,
        world=_moto,
        job_type="sync_aws",
    ),
]


def cases(state: str | None = None) -> Any:
    """Parametrize ``case`` over the job types that can reach ``state``."""
    chosen = [c for c in CASES if state is None or getattr(c, state) is not None]
    return pytest.mark.parametrize("case", chosen, ids=[c.name for c in chosen])


@pytest.fixture
def completed(
    case: ProbeCase, make_coordinator: Callable[..., Coordinator]
) -> Iterator[tuple[Coordinator, Payload, Completed]]:
    with case.world():
        c = make_coordinator() if case.registry is None else make_coordinator(registry=case.registry())
        if case.name == "delete_file":  # something to delete, so the job has an effect
            c.enqueue(CreateFile(path="docs/gone.json", text="x"))
        payload = case.complete(c)
        job_id = c.enqueue(payload).id
        c.run_until_idle()
        job = c.get(job_id)
        assert job.status.value == "completed" and job.ordering_key is not None, job.last_error
        yield c, payload, Completed(job.ordering_key, job.payload)


def probe_of(c: Coordinator, case: ProbeCase) -> Probe:
    probe = c.registry.get(case.job_type or case.name).probe
    assert probe is not None, f"{case.name} has no probe"
    return probe


def ask(c: Coordinator, case: ProbeCase, done: Completed, *, content: bool) -> Check:
    """The probe's answer, asked both ways the reconciler asks (one target, and a batch): the two
    must agree."""
    probe = probe_of(c, case)
    payload = done.payload if probe.wants_payload(content=content) else None
    one = probe.check(done.target, payload, c.root, content=content)  # type: ignore[arg-type]
    [batched] = probe.check_many([(done.target, payload)], c.root, content=content)  # type: ignore[list-item]
    assert (one.status, one.differences) == (batched.status, batched.differences)
    return one


@cases()
@pytest.mark.parametrize("content", [True, False], ids=["content", "exists"])
def test_a_target_whose_effect_holds_is_in_sync(case, completed, content):
    c, _, done = completed
    assert ask(c, case, done, content=content).status == IN_SYNC


@cases("make_missing")
@pytest.mark.parametrize("content", [True, False], ids=["content", "exists"])
def test_a_target_whose_effect_is_gone_is_missing(case, completed, content):
    c, payload, done = completed
    case.make_missing(c, payload)
    assert ask(c, case, done, content=content).status == MISSING


@cases("make_modified")
def test_a_modified_target_names_the_fields_that_differ(case, completed):
    c, payload, done = completed
    case.make_modified(c, payload)
    check = ask(c, case, done, content=True)
    assert check.status == MODIFIED
    assert check.differences, "a modified target says which fields differ"
    for d in check.differences:
        assert d.kind in ("ADD", "REMOVE", "NOT_EQUAL") and d.path
        assert d.expected != d.actual


@cases("make_unexpected")
def test_something_present_where_the_job_removed_it_is_unexpected(case, completed):
    c, payload, done = completed
    case.make_unexpected(c, payload)
    assert ask(c, case, done, content=True).status == UNEXPECTED


@cases()
@pytest.mark.parametrize("content", [True, False], ids=["content", "exists"])
def test_a_world_that_cannot_be_read_is_unknown_never_missing(case, completed, content):
    c, _, done = completed
    with case.broken_world():
        check = ask(c, case, done, content=content)
    assert check.status == UNKNOWN and check.detail


@cases()
def test_a_probe_never_raises_on_a_payload_it_cannot_read(case, completed):
    c, _, done = completed
    probe = probe_of(c, case)
    for garbage in ("{", "[]", '{"unexpected": 1}'):
        try:
            checks = probe.check_many([(done.target, garbage)], c.root, content=True)
        except Exception as e:  # the reconciler would survive it; the probe contract says unknown
            pytest.fail(f"{case.name} probe raised {type(e).__name__} on a bad payload instead of answering")
        assert [ch.status for ch in checks] in ([UNKNOWN], [IN_SYNC])
