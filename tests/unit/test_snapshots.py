"""Open-span snapshots (partial-span-processor's convention) and lost nodes in the timeline."""

from __future__ import annotations

import json

from opentelemetry.exporter.otlp.json.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from elastic_otel.bridge.conversion import Conversion
from elastic_otel.cli.otlp_json_reader import decode_line
from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.render.chart import timeline_data
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.emit.counters import EventCounters
from elastic_otel.emit.emitter import Emitter
from elastic_otel.emit.otlp_json import to_line
from elastic_otel.model.snapshots import SnapshotSchedule
from elastic_otel.model.spans import SpanRecord
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.names import attributes as A
from tests.support.fixtures import captured_events

S = 1_000_000_000
EVENTS = captured_events("restart_node0.tsv")
T0 = int(EVENTS[0][0] * 1e9)


def test_schedule_heartbeats_each_long_open_span_once_per_interval() -> None:
    schedule = SnapshotSchedule(30)
    short = SpanRecord("worker", T0 + 20 * S, {}, trace_id=1)
    long = SpanRecord("rendezvous.member", T0, {}, trace_id=1)
    assert schedule.due([long, short], T0 + 29 * S) == ([], [])
    assert schedule.due([long, short], T0 + 31 * S) == ([long], [])
    assert schedule.due([long, short], T0 + 45 * S) == ([], [])  # not again within the interval
    assert schedule.due([long, short], T0 + 61 * S) == ([long, short], [])
    long.end(T0 + 70 * S)
    assert schedule.due([short], T0 + 71 * S) == ([], [long])  # it ended: one stop record
    assert schedule.due([short], T0 + 120 * S) == ([short], [])
    assert SnapshotSchedule(0).due([long], T0 + 3600 * S) == ([], [])  # 0: off


def _pipeline() -> tuple[Emitter, InMemoryLogRecordExporter, InMemorySpanExporter]:
    resource = Resource.create({"service.name": "torchelastic"})
    logs, spans = InMemoryLogRecordExporter(), InMemorySpanExporter()
    provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    return (
        Emitter(provider.get_logger("elastic_otel"), SimpleSpanProcessor(spans), resource),
        logs,
        spans,
    )


def _joined_node(conversion: Conversion) -> None:
    for created, payload in EVENTS[:5]:  # attempts to join ... joined round 0: a member span
        conversion.process(payload, created)


def test_snapshot_records_follow_partial_span_processor() -> None:
    emitter, logs, _ = _pipeline()
    conversion = Conversion(TraceModel(salt="s"), emitter, EventCounters(), open_span_interval_s=2)
    _joined_node(conversion)
    (member,) = [s for s in conversion.model.open_spans() if s.name == A.SPAN_RDZV_MEMBER]
    before = len(logs.get_finished_logs())
    conversion.tick(member.start_ns + 3 * S)
    (snapshot,) = [r.log_record for r in logs.get_finished_logs()[before:]]
    assert snapshot.attributes == {
        "partial.event": "heartbeat",
        "partial.frequency": "2000ms",
        "partial.body.type": "json/v1",
    }
    assert (snapshot.trace_id, snapshot.span_id) == (member.trace_id, member.span_id)
    assert snapshot.severity_text == "INFO"
    body = json.loads(snapshot.body)
    (span,) = body["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert (
        span["traceId"] == f"{member.trace_id:032x}" and span["spanId"] == f"{member.span_id:016x}"
    )
    assert span["name"] == "rendezvous.member" and "endTimeUnixNano" not in span


def test_timeline_shows_a_node_known_only_from_snapshots_as_lost() -> None:
    emitter, logs, spans = _pipeline()
    conversion = Conversion(TraceModel(salt="s"), emitter, EventCounters(), open_span_interval_s=1)
    _joined_node(conversion)
    start = T0 + 2 * S
    conversion.tick(start)
    conversion.tick(start + 2 * S)  # the latest snapshot wins
    # ... then the process is SIGKILLed: no final span ever comes. The file holds what came.
    lines = [to_line(encode_logs(logs.get_finished_logs()))]
    if spans.get_finished_spans():
        lines.append(to_line(encode_spans(spans.get_finished_spans())))
    read_spans, read_logs = [], []
    for line in lines:
        s, lg = decode_line(line)
        read_spans += s
        read_logs += lg
    timeline = build_timeline(read_spans, read_logs)
    (rnd,) = timeline.rounds
    (node,) = rnd.nodes
    assert node.lost_ns == max(r["time_ns"] for r in read_logs)  # last heard of its process
    text = render_text(timeline)
    assert "LOST" in text and "last heard at +" in text and "1 node lost" in text
    assert timeline_data(timeline)["rounds"][0]["nodes"][0]["lost"] is not None


def test_a_node_that_ended_its_spans_is_not_lost() -> None:
    emitter, logs, spans = _pipeline()
    conversion = Conversion(TraceModel(salt="s"), emitter, EventCounters(), open_span_interval_s=1)
    for created, payload in EVENTS:
        conversion.process(payload, created)
        conversion.tick(int(created * 1e9))
    conversion.close("end", False)
    read_spans, _ = decode_line(to_line(encode_spans(spans.get_finished_spans())))
    _, read_logs = decode_line(to_line(encode_logs(logs.get_finished_logs())))
    assert any(r["attributes"].get("partial.event") == "heartbeat" for r in read_logs)
    timeline = build_timeline(read_spans, read_logs)
    assert all(n.lost_ns is None for r in timeline.rounds for n in r.nodes)
    assert "LOST" not in render_text(timeline)
