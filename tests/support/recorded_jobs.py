"""Two-node jobs as their bridges record them, for the timeline's tests: span and log records
built by hand, written through the project's emitter and OTLP/JSON file exporters with one
resource per node (one agent process each), read back as ``elastic-otel timeline`` reads them.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from elastic_otel.emit.emitter import Emitter
from elastic_otel.emit.otlp_json import OtlpJsonFileLogExporter, OtlpJsonFileSpanExporter
from elastic_otel.model.spans import SpanRecord
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import ElasticEvent, EventKind

MS = 1_000_000
BASE = 1_763_884_800_000 * MS  # an epoch time: the renderers print the start as a date
NODES = {"a": ("node-a", 100), "b": ("node-b", 200)}


@dataclass
class RecordedJob:
    """Each node's span records and log records (event, span), as its bridge emits them."""

    run: str
    trace: int  # the trace of a span unless ``add`` is given another
    spans: dict[str, list[SpanRecord]] = field(default_factory=lambda: {"a": [], "b": []})
    logs: dict[str, list[tuple[ElasticEvent, SpanRecord]]] = field(
        default_factory=lambda: {"a": [], "b": []}
    )
    members: dict[str, SpanRecord] = field(default_factory=dict)
    workers: dict[int, SpanRecord] = field(default_factory=dict)  # by global rank

    def add(
        self, node: str, name: str, start_ms: int, end_ms: int, trace: int = 0, **kw: Any
    ) -> SpanRecord:
        attrs = kw.pop("attrs", {})
        host, pid = NODES[node]
        span = SpanRecord(
            name,
            BASE + start_ms * MS,
            {A.RUN_ID: self.run, A.HOST_NAME: host, A.PROCESS_PID: pid, **attrs},
            trace_id=trace or self.trace,
            end_ns=BASE + end_ms * MS,
            **kw,
        )
        self.spans[node].append(span)
        return span

    def log(self, node: str, name: str, at_ms: int, span: SpanRecord, **kw: Any) -> None:
        attrs = {A.RUN_ID: self.run, A.HOST_NAME: NODES[node][0], A.EVENT_NAME: name, **kw}
        event = ElasticEvent(
            kind=EventKind.GENERIC,
            name=name,
            body=str(attrs.pop("body", name)),
            time_ns=BASE + at_ms * MS,
            attributes=attrs,
            run_id=self.run,
            state=str(attrs.pop("state", "")),
        )
        self.logs[node].append((event, span))

    def write(self, path: Path) -> Path:
        for node, spans in self.spans.items():
            host, _ = NODES[node]
            resource = Resource.create({"service.instance.id": f"agent-{node}", A.HOST_NAME: host})
            logs = LoggerProvider(resource=resource, shutdown_on_exit=False)
            logs.add_log_record_processor(SimpleLogRecordProcessor(OtlpJsonFileLogExporter(path)))
            processor = SimpleSpanProcessor(OtlpJsonFileSpanExporter(path))
            emitter = Emitter(logs.get_logger("elastic_otel"), processor, resource)
            for span in spans:
                emitter.emit_span(span)
            for event, span in self.logs[node]:
                emitter.emit_log(event, span.trace_id, span.span_id)
            processor.shutdown()
            logs.shutdown()
        return path


def timeline_cli(path: Path, page: Path) -> subprocess.CompletedProcess[str]:
    """``elastic-otel timeline PATH --html PAGE``, as a user runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "elastic_otel.cli", "timeline", str(path), "--html", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done
