"""One job's trace, from the application's request through a real ``tether worker``: enqueue, a
first attempt that fails, a second that completes.

    pip install 'tether[otel]'
    python examples/otel_trace.py --out docs/otel-trace.json

The application (this script) configures the OpenTelemetry SDK itself and enqueues a ``flaky``
job inside its own request span. The worker is the ``tether worker`` command, run under
``opentelemetry-instrument``, which configures the SDK from ``OTEL_*`` variables: no tracing code
in the worker. Both export over OTLP/HTTP to a small receiver in this script (standing in for a
collector), which decodes the protobuf; the spans of the job's trace are written as OTLP JSON.
The worker imports this file (``--import otel_trace``) for its ``flaky`` job type.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from tether import Coordinator, JobContext, JobType, Payload
from tether.jobtypes import default_registry


class Flaky(Payload):
    job_type: ClassVar[str] = "flaky"
    note: str


class FlakyType(JobType[Flaky]):
    """Fails its first attempt (a retryable error), completes the next."""

    name = "flaky"
    payload_model = Flaky

    def target(self, payload: Flaky) -> Any:
        return None

    def run(self, payload: Flaky, ctx: JobContext) -> dict[str, Any]:
        if ctx.job.attempts == 1:
            raise ConnectionError("the first attempt meets a dropped connection")
        return {"ok": True}


def register(registry: Any) -> None:
    """What ``tether worker --import otel_trace`` calls."""
    registry.register(FlakyType())


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP traces endpoint: each request decoded and kept as OTLP JSON."""

    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        request = ExportTraceServiceRequest()
        request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
        Receiver.received.append(hex_ids(MessageToDict(request)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def hex_ids(value: Any) -> Any:
    """OTLP JSON writes trace and span ids in hex, where protobuf's JSON writes bytes in base64."""
    if isinstance(value, list):
        return [hex_ids(v) for v in value]
    if not isinstance(value, dict):
        return value
    ids = ("traceId", "spanId", "parentSpanId")
    return {k: base64.b64decode(v).hex() if k in ids and v else hex_ids(v) for k, v in value.items()}


def enqueue(db: str, root: Path, endpoint: str) -> str:
    """The application's side: its own request span, the enqueue inside it; returns the job id."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "notes-app"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)
    registry = default_registry()
    register(registry)
    with Coordinator.open(db, root=root, registry=registry) as c:
        with trace.get_tracer("notes-app").start_as_current_span("POST /notes"):
            job_id = c.enqueue(Flaky(note="a private note")).id
    provider.shutdown()  # exported before the worker starts
    return job_id


def work(db: str, root: Path, endpoint: str, job_id: str, *, timeout: float = 60) -> None:
    """The worker's side: ``opentelemetry-instrument tether worker`` until the job completes."""
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "OTEL_SERVICE_NAME": "tether-worker",
        "OTEL_TRACES_EXPORTER": "otlp_proto_http",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    command = [str(bin_dir / "opentelemetry-instrument"), str(bin_dir / "tether"), "--db", db, "--root", str(root)]
    command += ["--import", "otel_trace", "worker", "--quiet"]
    worker = subprocess.Popen(command, cwd=Path(__file__).parent, env=env)
    try:
        with Coordinator.open(db, root=root, create=False) as c:
            deadline = time.monotonic() + timeout
            while c.get(job_id).status.value != "completed":
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise SystemExit(f"the job did not complete: {c.get(job_id).status.value}")
                time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)  # a graceful stop: the SDK flushes its spans at exit
        worker.wait(timeout=30)


def trace_of(received: list[dict[str, Any]], job_id: str) -> dict[str, Any]:
    """The OTLP JSON of the spans in the trace of ``job_id``'s enqueue, grouped by resource."""
    trace_id = None
    for request in received:
        for resource in request.get("resourceSpans", []):
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    attributes = {a["key"]: a["value"] for a in span.get("attributes", [])}
                    if span["name"].startswith("send ") and attributes.get("messaging.message.id") == {
                        "stringValue": job_id
                    }:
                        trace_id = span["traceId"]
    kept = []
    for request in received:
        for resource in request.get("resourceSpans", []):
            scopes = []
            for scope in resource.get("scopeSpans", []):
                spans = [s for s in scope.get("spans", []) if s["traceId"] == trace_id]
                if spans:
                    scopes.append({**scope, "spans": spans})
            if scopes:
                kept.append({**resource, "scopeSpans": scopes})
    return {"resourceSpans": kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the trace (OTLP JSON)")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    work_dir = Path(tempfile.mkdtemp(prefix="tether-otel-"))
    try:
        db, root = f"sqlite:///{work_dir / 'tether.db'}", work_dir / "data"
        job_id = enqueue(db, root, endpoint)
        work(db, root, endpoint, job_id)
    finally:
        server.shutdown()
        shutil.rmtree(work_dir, ignore_errors=True)
    found = trace_of(Receiver.received, job_id)
    args.out.write_text(json.dumps(found, indent=2) + "\n")
    names = [s["name"] for r in found["resourceSpans"] for sc in r["scopeSpans"] for s in sc["spans"]]
    print(f"job {job_id}: {len(names)} spans written to {args.out}: {', '.join(names)}")


if __name__ == "__main__":
    main()
