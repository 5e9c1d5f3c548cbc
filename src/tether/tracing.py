"""OpenTelemetry traces of jobs, through the ``tether[otel]`` extra: an enqueue is a producer span
whose W3C context (``traceparent``) is stored with its jobs; each attempt is a consumer span in
that trace, linked to the enqueue and to the job's previous attempt; a reconcile run is a span.

tether only speaks the OpenTelemetry API: the application (or ``opentelemetry-instrument``)
configures the SDK and its exporter, and without one every span is the API's no-op. Without
the API installed nothing is imported and each hook costs one check of a module global.

Attributes follow OpenTelemetry's messaging conventions (a job type is the destination, a job
id the message id) plus ``tether.job.*`` for what those do not name. Payload contents never go
into a span; neither does a handler's error text, which may quote them: only its class.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.util
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .ledger.lifecycle import Decision
    from .ledger.queue import Queue
    from .ledger.record import InsertResult, JobRecord

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C")  # what an attempt runs with (the worker's JobContext)

# The SDK would record an escaping exception's message (an event, the status text); _failed
# records its class instead.
_QUIET = {"record_exception": False, "set_status_on_exception": False}

SYSTEM = "tether"  # messaging.system: tether is the messaging system here
_api: Any = None  # opentelemetry.trace once looked for; False when it is not installed


def _trace() -> Any:
    """The OpenTelemetry trace API, or None when the extra is not installed (looked for once)."""
    global _api
    if _api is None:
        _api = False
        if importlib.util.find_spec("opentelemetry") is not None:
            try:
                from opentelemetry import trace
            except ImportError:  # a namespace package without its API
                pass
            else:
                _api = trace
                _find_context_variable()
    return _api or None


_context_variable: contextvars.ContextVar[Any] | None = None
"""The variable the API keeps the current context in, where this API version has one."""


def _find_context_variable() -> None:
    """Find the API's context variable: with it, an enqueue made outside any span (most) is
    told in one C call, where the API's own ``get_current_span`` is six calls of Python."""
    global _context_variable
    from opentelemetry import context

    found = getattr(getattr(context, "_RUNTIME_CONTEXT", None), "_current_context", None)
    _context_variable = found if isinstance(found, contextvars.ContextVar) else None


def _tracer(trace: Any) -> Any:
    """tether's tracer, made once: the API's proxy follows whichever provider is set later."""
    global _tracer_made
    if _tracer_made is None:
        from .version import installed

        _tracer_made = trace.get_tracer("tether", installed())
    return _tracer_made


_tracer_made: Any = None


def _recording_tracer(trace: Any) -> Any:
    """tether's tracer when its spans may record: None while no tracer provider is set (the API
    installed without an SDK), where every span would be a no-op that still costs an enqueue
    more than its own work. Asked on every enqueue, so it calls nothing once the tracer is made."""
    tracer = _tracer_made if _tracer_made is not None else _tracer(trace)
    if not isinstance(tracer, trace.ProxyTracer):
        return tracer
    # Whether a provider is set: ``_tracer`` has asked for one, which loads one the environment
    # names. ``get_tracer_provider()`` would say so too, but it looks up an environment variable
    # on every call while none is set: the API's own global, where this API version has it, is
    # an attribute read.
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:
        provider = None if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider) else tracer
    return None if provider is None else tracer


_UNKNOWN = object()


def format_context(context: Any) -> str | None:
    """A span context as a W3C ``traceparent`` header value, or None for an invalid one."""
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parse_context(trace: Any, traceparent: str | None) -> Any:
    """The remote span context a ``traceparent`` names, or None if it names none."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    context = trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags))
    return context if context.is_valid else None


def traceparent() -> str | None:
    """The current trace context as a ``traceparent``: what an enqueue stores with its jobs."""
    trace = _api if _api is not None else _trace()
    if not trace:
        return None
    if _context_variable is not None and not _context_variable.get():  # nothing attached: no span
        return None
    return format_context(trace.get_current_span().get_span_context())


def traced_enqueue(method: F) -> F:
    """Wraps ``Coordinator.enqueue``/``enqueue_many`` in a producer span (``send <type>``): the jobs
    built inside it store its context, so their attempts join the caller's trace."""

    @functools.wraps(method)
    def enqueue(self: Any, *args: Any, **kwargs: Any) -> Any:
        trace = _api if _api is not None else _trace()
        tracer = _recording_tracer(trace) if trace else None
        if tracer is None:  # the jobs still keep a context the caller's span holds (traceparent)
            return method(self, *args, **kwargs)
        kind = trace.SpanKind.PRODUCER
        with tracer.start_as_current_span("send", kind=kind, **_QUIET) as span:
            try:
                results = method(self, *args, **kwargs)
            except Exception as e:
                _failed(trace, span, e)
                raise
            if span.is_recording():
                _sent(span, results if isinstance(results, list) else [results])
            return results

    return enqueue  # type: ignore[return-value]


def _sent(span: Any, results: Sequence[InsertResult]) -> None:
    if not results:
        return
    job_type = results[0].job.type
    span.update_name(f"send {job_type}")
    span.set_attributes(_messaging("send", job_type))
    if len(results) == 1:
        span.set_attribute("messaging.message.id", results[0].job.id)
        span.set_attribute("tether.job.duplicate", results[0].duplicate)
    else:
        span.set_attribute("messaging.batch.message_count", len(results))


def _messaging(operation: str, job_type: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": operation,
        "messaging.destination.name": job_type,
        "tether.job.type": job_type,
    }


def _failed(trace: Any, span: Any, error: BaseException) -> None:
    """Marks ``span`` failed by the class of ``error`` (its message may quote a payload)."""
    name = type(error).__name__
    span.set_attribute("error.type", name)
    span.set_status(trace.Status(trace.StatusCode.ERROR, name))


class Attempt:
    """One attempt's span while its handler runs; ``ended`` records how it came out."""

    __slots__ = ("span", "trace")

    def __init__(self, trace: Any, span: Any) -> None:
        self.trace, self.span = trace, span

    def ended(self, decision: Decision, outcome: object) -> Decision:
        """Sets the outcome on the span; returns ``decision`` carrying the span's context, which
        its attempt row keeps for the next attempt's link."""
        span = self.span
        if self.trace is None or not span.is_recording():
            return decision
        span.set_attribute("tether.job.outcome", decision.edge)
        if isinstance(outcome, BaseException):
            _failed(self.trace, span, outcome)
        return decision._replace(traceparent=format_context(span.get_span_context()))


_UNTRACED = Attempt(None, None)


def attempt_tracer() -> Any:
    """The tracer the attempts of a batch record their spans in, or None when none would record:
    asked once a batch, so that an attempt with no trace to carry costs ``attempt`` one check."""
    trace = _api if _api is not None else _trace()
    return _recording_tracer(trace) if trace else None


def attempt(
    tracer: Any,
    queue: Queue,
    job: JobRecord,
    worker: str,
    run: Callable[[JobRecord, C], tuple[Decision, object]],
    ctx: C,
) -> Decision:
    """``run(job, ctx)``, one attempt of ``job`` to its decision and outcome, inside the attempt's
    span (``process <type>``) in ``tracer`` (``attempt_tracer``): a child of the enqueue's context,
    linked to it, and to the job's previous attempt when one was traced. The spans the handler
    makes (AWS calls, follow-up enqueues) are its children. Returns the decision, carrying the
    span's context. With no span to record and no trace to carry, ``run`` is simply called: a
    no-op span (or a ``with``) would cost a job more than its work."""
    if tracer is None and not job.traceparent:
        return run(job, ctx)[0]
    trace = _trace()
    enqueued = parse_context(trace, job.traceparent) if trace else None
    if tracer is None and enqueued is None:
        return run(job, ctx)[0]
    with _attempt(trace, tracer, enqueued, queue, job, worker) as span:
        decision, outcome = run(job, ctx)
        return span.ended(decision, outcome)


@contextmanager
def _attempt(trace: Any, tracer: Any, enqueued: Any, queue: Queue, job: JobRecord, worker: str) -> Iterator[Attempt]:
    """The span of ``attempt``, with a span to record or an enqueue's trace to carry."""
    if tracer is None:
        # Nothing records here, but what the handler enqueues keeps the trace its job was in.
        with trace.use_span(trace.NonRecordingSpan(enqueued)):
            yield _UNTRACED
        return
    parent = None if enqueued is None else trace.set_span_in_context(trace.NonRecordingSpan(enqueued))
    links = [] if enqueued is None else [trace.Link(enqueued, {"tether.link": "enqueue"})]
    attributes = {
        **_messaging("process", job.type),
        "messaging.message.id": job.id,
        "messaging.client.id": worker,
        "tether.job.attempt": job.attempts,
    }
    if job.ordering_key is not None:
        attributes["tether.job.target"] = job.ordering_key
    if job.payload_bytes is not None:
        attributes["messaging.message.body.size"] = job.payload_bytes
    kind = trace.SpanKind.CONSUMER
    with tracer.start_as_current_span(f"process {job.type}", parent, kind, attributes, links, **_QUIET) as span:
        if span.is_recording() and not job.first_run:
            previous = parse_context(trace, _previous_attempt_trace(queue, job.id))
            if previous is not None:
                span.add_link(previous, {"tether.link": "previous_attempt"})
        yield Attempt(trace, span)


def _previous_attempt_trace(queue: Any, job_id: str) -> str | None:
    """The previous attempt's span, for a link; None when the ledger cannot say now: an optional
    link is no reason for a database error to stop the worker before the handler runs."""
    import sqlalchemy as sa

    try:
        found: str | None = queue.previous_attempt_trace(job_id)
    except sa.exc.SQLAlchemyError:
        return None
    return found


def in_context(function: Callable[[], None]) -> Callable[[], None]:
    """``function`` to run in another thread with this thread's context (so the current span
    stays the parent of what it traces)."""
    return functools.partial(contextvars.copy_context().run, function)


def traced(name: str, describe: Callable[[Any], dict[str, Any]]) -> Callable[[F], F]:
    """Wraps a function in an internal span ``name`` whose attributes ``describe`` reads from
    what it returned (a reconcile run: its mode, drift and exit code)."""

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            trace = _api if _api is not None else _trace()
            if not trace:
                return function(*args, **kwargs)
            with _tracer(trace).start_as_current_span(name, **_QUIET) as span:
                try:
                    value = function(*args, **kwargs)
                except Exception as e:
                    _failed(trace, span, e)
                    raise
                if span.is_recording():
                    span.set_attributes(describe(value))
                return value

        return run  # type: ignore[return-value]

    return wrap


def instrument_botocore() -> bool:
    """Turn on OpenTelemetry's botocore instrumentation (a span per AWS call) when it is
    installed with the API, unless it is on already (``opentelemetry-instrument`` turns it on).
    True when AWS calls are traced."""
    if not _trace() or importlib.util.find_spec("opentelemetry.instrumentation.botocore") is None:
        return False
    module: Any = importlib.import_module("opentelemetry.instrumentation.botocore")
    instrumentor = module.BotocoreInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:  # the instrumentor is one per process
        instrumentor.instrument()
    return True
