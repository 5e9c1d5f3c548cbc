"""OpenTelemetry traces (the ``tether[otel]`` extra): an enqueue's context travels with its job, each
attempt is a span in that trace linked to the enqueue and to the attempt before, reconcile runs and
AWS calls are spans, and no payload content reaches a span. Spans go to the SDK's in-memory
exporter, once through the OTLP/HTTP exporter into a receiver in this file, which decodes them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is part of the test extra")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from jobkit import Note, NoteType  # noqa: E402
from tether import Coordinator, tracing  # noqa: E402
from tether.jobtypes import CreateFile, default_registry  # noqa: E402
from tether.worker.producer import Producer  # noqa: E402
from tether.worker.retry import RetryPolicy  # noqa: E402

SECRET = "s3cr3t-payload-text"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """tether's tracer on a provider of the test's own (the global one can be set once per
    process), exporting into memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer_made", provider.get_tracer("tether"))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Coordinator]:
    registry = default_registry()
    registry.register(NoteType())
    coordinator = Coordinator.open(f"sqlite:///{tmp_path / 'tether.db'}", root=tmp_path / "data", registry=registry)
    yield coordinator
    coordinator.close()


def named(exported: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in exported if s.name == name]


def everything_said(exported: Any) -> str:
    """Every name, attribute, event and status text of the spans, as one string."""
    parts = []
    for s in exported:
        parts += [s.name, str(dict(s.attributes or {})), str(s.status.description)]
        parts += [f"{e.name} {dict(e.attributes or {})}" for e in s.events]
        parts += [str(dict(link.attributes or {})) for link in s.links]
    return "\n".join(parts)


def test_an_enqueue_stores_its_spans_context_with_the_job_under_the_callers_span(spans, c):
    provider, exporter = spans
    with provider.get_tracer("app").start_as_current_span("request") as request:
        job = c.enqueue(CreateFile(path="a.json", content={"k": SECRET})).job
    [send] = named(exporter.get_finished_spans(), "send create_file")
    assert send.kind == trace.SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert job.traceparent == tracing.format_context(send.context)
    assert c.get(job.id).traceparent == job.traceparent  # stored, not only returned
    assert send.attributes is not None and send.attributes["messaging.message.id"] == job.id
    assert send.attributes["messaging.destination.name"] == "create_file"


def test_an_async_enqueue_records_the_trace_of_the_task_that_awaited_it(spans, c):
    import asyncio

    from tether import AsyncCoordinator

    provider, exporter = spans

    async def request() -> Any:
        async_c = AsyncCoordinator(c)
        with provider.get_tracer("app").start_as_current_span("request") as span:
            return span, (await async_c.enqueue(CreateFile(path="b.json", content=1))).job

    span, job = asyncio.run(request())
    [send] = named(exporter.get_finished_spans(), "send create_file")
    assert send.parent is not None and send.parent.span_id == span.get_span_context().span_id
    assert job.traceparent == tracing.format_context(send.context)


def test_a_refused_enqueue_is_a_failed_span_naming_only_the_errors_class(spans, c):
    """The message of InvalidPayload quotes what it refuses, here a path made of the payload."""
    from tether import InvalidPayload

    with pytest.raises(InvalidPayload) as refused:
        c.enqueue(CreateFile(path=f"../{SECRET}.json", content=1))
    name = type(refused.value).__name__  # a subclass: UnsafePath
    [send] = named(exporter_spans(spans), "send")
    assert send.status.status_code == trace.StatusCode.ERROR and send.status.description == name
    assert send.attributes is not None and send.attributes["error.type"] == name
    assert SECRET not in everything_said([send])


def test_a_retried_attempt_runs_when_its_previous_attempts_span_cannot_be_read(spans, c, monkeypatch):
    import sqlalchemy as sa

    def unreadable(job_id: str) -> str:
        raise sa.exc.OperationalError("SELECT", {}, Exception("database is locked"))

    monkeypatch.setattr(c.queue, "previous_attempt_trace", unreadable)
    job = c.enqueue(Note(name="n", fail_times=1)).job
    c.run_until_idle(retry=RetryPolicy(base=0.0))
    assert c.get(job.id).status.value == "completed"  # the link is left out, the attempt runs


def test_with_no_tracer_provider_set_an_enqueue_starts_no_span(c, monkeypatch):
    """The API installed without an SDK: a no-op span would cost each enqueue more than its work."""
    started = _no_provider_yet(monkeypatch)
    job = c.enqueue(CreateFile(path="quiet.json", content=1)).job
    assert started == [] and c.get(job.id).status.value == "pending"


def test_with_no_tracer_provider_set_an_attempt_starts_no_span(c, monkeypatch):
    """The same for the worker: no span a job while nothing would record it."""
    job = c.enqueue(CreateFile(path="quiet.json", content=1)).job
    started = _no_provider_yet(monkeypatch)
    assert c.run_until_idle() == 1
    assert started == [] and c.get(job.id).status.value == "completed"


def test_a_worker_looks_up_the_tracing_api_before_its_first_claim(c, monkeypatch):
    """Its import (tens of milliseconds) would otherwise hold up the jobs of the first batch."""
    c.enqueue(CreateFile(path="first.json", content=1))
    monkeypatch.setattr(tracing, "_api", None)  # not looked up yet, as in a new worker process
    at_claims: list[Any] = []
    claim = Producer.claim

    def claiming(self: Producer, *args: Any, **kwargs: Any) -> Any:
        at_claims.append(tracing._api)
        return claim(self, *args, **kwargs)

    monkeypatch.setattr(Producer, "claim", claiming)
    assert c.run_until_idle() == 1
    assert at_claims and at_claims[0] is trace


def test_with_no_tracer_provider_set_a_child_a_handler_enqueues_keeps_its_jobs_trace(c, monkeypatch):
    """No span is started, but the trace an enqueue recorded still reaches what its handler
    enqueues: a worker with an SDK later continues that trace."""
    from jobkit import Spawn, SpawnType

    c.register(SpawnType())
    started = _no_provider_yet(monkeypatch)
    caller = trace.SpanContext(0x5EED, 0xC0FFEE, is_remote=True, trace_flags=trace.TraceFlags(1))
    with trace.use_span(trace.NonRecordingSpan(caller)):  # a context propagated from elsewhere
        parent = c.enqueue(Spawn(children=["x"])).job
    assert c.run_until_idle() == 2 and started == []
    child = c.history("children/x.json").jobs[0]
    assert parent.traceparent is not None and child.traceparent == parent.traceparent


def _no_provider_yet(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The API as it is before any tracer provider is set (whatever another test set globally),
    with tether's tracer counting the spans started through it; returns that count's list."""
    started: list[str] = []

    class Counting(trace.ProxyTracer):
        def start_as_current_span(self, name: str, *args: Any, **kwargs: Any) -> Any:
            started.append(name)
            return super().start_as_current_span(name, *args, **kwargs)

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    monkeypatch.setattr(tracing, "_tracer_made", Counting("tether"))
    return started


def test_an_enqueue_outside_any_trace_records_no_context():
    """Without a span current (and without the SDK), the job carries no trace context."""
    assert tracing.traceparent() is None


def test_attempts_are_spans_of_the_enqueues_trace_linked_to_it_and_to_the_attempt_before(spans, c):
    provider, exporter = spans
    with provider.get_tracer("app").start_as_current_span("request"):
        job = c.enqueue(Note(name=SECRET, target="t1", fail_times=1)).job
    c.run_until_idle(retry=RetryPolicy(base=0.0))
    assert c.get(job.id).status.value == "completed"
    exported = exporter.get_finished_spans()
    [send] = named(exported, "send note")
    first, second = named(exported, "process note")
    for attempt in (first, second):
        assert attempt.kind == trace.SpanKind.CONSUMER
        assert attempt.context.trace_id == send.context.trace_id
        assert attempt.parent is not None and attempt.parent.span_id == send.context.span_id
        assert send.context.span_id in [link.context.span_id for link in attempt.links]
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["tether.job.attempt"], first.attributes["tether.job.outcome"]) == (1, "retry")
    assert first.attributes["error.type"] == "RuntimeError"
    assert first.status.status_code == trace.StatusCode.ERROR
    assert (second.attributes["tether.job.attempt"], second.attributes["tether.job.outcome"]) == (2, "complete")
    assert second.attributes["messaging.message.id"] == job.id
    assert second.attributes["tether.job.target"] == "t1"
    assert first.context.span_id in [link.context.span_id for link in second.links]
    assert SECRET not in everything_said(exported)  # neither the payload nor the error that quotes it


def test_a_child_enqueued_by_a_handler_joins_the_attempts_trace(spans, c):
    from jobkit import Spawn, SpawnType

    c.register(SpawnType())
    c.enqueue(Spawn(children=["x"]))
    c.run_until_idle()
    exported = exporter_spans(spans)
    [parent_attempt] = named(exported, "process spawn")
    [child_attempt] = named(exported, "process create_file")
    assert child_attempt.context.trace_id == parent_attempt.context.trace_id
    assert child_attempt.parent is not None and child_attempt.parent.span_id == parent_attempt.context.span_id


def exporter_spans(spans: tuple[TracerProvider, InMemorySpanExporter]) -> tuple[ReadableSpan, ...]:
    return spans[1].get_finished_spans()


class CurrentSpan(NoteType):
    """Records the span current while its handler runs."""

    def __init__(self) -> None:
        super().__init__()
        self.current: list[Any] = []

    def run(self, payload: Note, ctx: Any) -> dict[str, Any]:
        self.current.append(trace.get_current_span().get_span_context())
        return super().run(payload, ctx)


def test_a_handler_with_a_timeout_runs_inside_its_attempts_span(spans, c):
    """Such a handler runs in a thread of its own, which gets the attempt's context."""
    handler = CurrentSpan()
    c.register(handler)
    job = c.enqueue(Note(name="n"), timeout=5).job
    c.run_until_idle()
    [attempt] = named(exporter_spans(spans), "process note")
    assert c.get(job.id).status.value == "completed"
    assert handler.current[0].span_id == attempt.context.span_id


def test_a_reconcile_run_is_a_span_with_its_verdict(spans, c):
    c.enqueue(CreateFile(path="a.json", content=1))
    c.run_until_idle()
    (c.root / "a.json").write_text("changed")
    c.startup_check()
    [run] = named(exporter_spans(spans), "tether.reconcile")
    assert run.attributes is not None
    assert (run.attributes["tether.reconcile.drift"], run.attributes["tether.reconcile.exit_code"]) == (1, 2)


def test_aws_calls_of_a_sync_aws_attempt_are_its_child_spans(spans, c, monkeypatch):
    pytest.importorskip("opentelemetry.instrumentation.botocore")
    from moto import mock_aws
    from opentelemetry.instrumentation.botocore import BotocoreInstrumentor

    from awskit import dummy_environment
    from tether.jobtypes.aws import SyncAws, reset_clients

    dummy_environment(monkeypatch)
    provider, exporter = spans
    instrumentor = BotocoreInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:  # by tether's clients in an earlier test
        instrumentor.uninstrument()
    instrumentor.instrument(tracer_provider=provider)
    try:
        with mock_aws():
            reset_clients()
            c.enqueue(SyncAws(resource_type="sqs_queue", resource_id="traced-queue", config={}))
            c.run_until_idle()
    finally:
        instrumentor.uninstrument()
        reset_clients()
    exported = exporter.get_finished_spans()
    [attempt] = named(exported, "process sync_aws")
    calls = [s for s in exported if s.attributes and s.attributes.get("rpc.system") == "aws-api"]
    assert calls, [s.name for s in exported]
    assert all(s.parent is not None and s.parent.span_id == attempt.context.span_id for s in calls)


def test_making_aws_clients_turns_on_the_botocore_instrumentation(monkeypatch):
    pytest.importorskip("opentelemetry.instrumentation.botocore")
    from opentelemetry.instrumentation.botocore import BotocoreInstrumentor

    from awskit import dummy_environment
    from tether.jobtypes.aws.clients import Clients

    dummy_environment(monkeypatch)
    instrumentor = BotocoreInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    Clients()
    try:
        assert instrumentor.is_instrumented_by_opentelemetry
    finally:
        instrumentor.uninstrument()


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint: decodes each ExportTraceServiceRequest it is sent."""

    received: list[Any] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        type(self).received.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_spans_reach_an_otlp_receiver_over_http_with_their_links(c, monkeypatch):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    provider = TracerProvider()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=5)))
    monkeypatch.setattr(tracing, "_tracer_made", provider.get_tracer("tether"))
    try:
        job = c.enqueue(Note(name=SECRET, fail_times=1)).job
        c.run_until_idle(retry=RetryPolicy(base=0.0))
        provider.force_flush()
    finally:
        provider.shutdown()
        server.shutdown()
    decoded = [
        span
        for request in _Receiver.received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    by_name: dict[str, list[Any]] = {}
    for span in decoded:
        by_name.setdefault(span.name, []).append(span)
    [send] = by_name["send note"]
    first, second = by_name["process note"]
    assert {a.key: a.value.string_value for a in send.attributes}["messaging.message.id"] == job.id
    assert first.parent_span_id == send.span_id and second.trace_id == send.trace_id
    assert first.span_id in [link.span_id for link in second.links]
    assert SECRET.encode() not in b"".join(r.SerializeToString() for r in _Receiver.received)


def test_without_the_extra_nothing_of_opentelemetry_is_imported_and_jobs_run(tmp_path):
    """The API hidden from a fresh interpreter: enqueue, run and reconcile as usual."""
    script = f"""
import sys
sys.modules["opentelemetry"] = None  # as if not installed: any import of it fails
from tether import Coordinator, tracing
from tether.jobtypes import CreateFile
with Coordinator.open("sqlite:///{tmp_path}/t.db", root="{tmp_path}/data") as c:
    job = c.enqueue(CreateFile(path="a.json", content=1)).job
    assert job.traceparent is None
    assert c.run_until_idle() == 1 and c.get(job.id).status.value == "completed"
    assert c.startup_check().exit_code == 0
loaded = [m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v is not None]
assert not loaded, loaded
assert tracing._api is False
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_an_enqueue_records_its_span_once_a_provider_is_set_after_tether_made_its_tracer(tmp_path):
    """An application that sets up OpenTelemetry after its first enqueue: the enqueues before
    record no context (no provider, nothing recording), the ones after do."""
    script = f"""
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from tether import Coordinator
from tether.jobtypes import CreateFile
with Coordinator.open("sqlite:///{tmp_path}/t.db", root="{tmp_path}/data") as c:
    before = c.enqueue(CreateFile(path="a.json", content=1)).job
    trace.set_tracer_provider(TracerProvider())
    after = c.enqueue(CreateFile(path="b.json", content=1)).job
    print(before.traceparent is None, after.traceparent is not None)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_a_real_worker_under_opentelemetry_instrument_exports_the_jobs_trace(tmp_path):
    """examples/otel_trace.py: the application's enqueue, then `opentelemetry-instrument tether worker`
    runs attempt 1 (an error) and attempt 2 (completed), each exported over OTLP/HTTP into the
    example's receiver; the written trace holds all three, linked, and not the payload."""
    pytest.importorskip("opentelemetry.distro")
    out = tmp_path / "trace.json"
    example = Path(__file__).resolve().parents[1] / "examples" / "otel_trace.py"
    done = subprocess.run(
        [sys.executable, str(example), "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    import json

    spans = [s for r in json.loads(out.read_text())["resourceSpans"] for sc in r["scopeSpans"] for s in sc["spans"]]
    [send] = [s for s in spans if s["name"] == "send flaky"]
    attempts = sorted((s for s in spans if s["name"] == "process flaky"), key=lambda s: s["startTimeUnixNano"])
    assert [s["status"].get("code") for s in attempts] == ["STATUS_CODE_ERROR", None]
    assert all(s["parentSpanId"] == send["spanId"] and s["traceId"] == send["traceId"] for s in attempts)
    assert attempts[0]["spanId"] in [link["spanId"] for link in attempts[1]["links"]]
    assert "a private note" not in out.read_text()
