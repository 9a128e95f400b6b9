"""The ``elastic_otel_file`` exporters (on OpenTelemetry's OTLP/JSON encoder) and the reader,
which also reads OpenTelemetry's own ``otlp_json_file`` output and the Collector's ``file``."""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    InMemoryLogRecordExporter,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from elastic_otel.cli.otlp_json_reader import OtlpJsonError, read_otlp_json
from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.emit.emitter import Emitter
from elastic_otel.emit.otlp_json import (
    OtlpJsonFileLogExporter,
    OtlpJsonFileMetricExporter,
    OtlpJsonFileSpanExporter,
)
from elastic_otel.emit.pipeline import build_pipeline, exporter_class
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.parsing.torch_events import parse_event
from tests.support.fixtures import captured_events
from tests.support.otlp_receiver import decode_logs, decode_spans

HEX32 = set("0123456789abcdef")


def feed_recorded_run(emitter: Emitter) -> None:
    """One agent of the recorded restart job through the trace model into ``emitter``."""
    model = TraceModel(salt="otlp-json-test")
    last = 0
    for created, payload in captured_events("restart_node0.tsv"):
        event = parse_event(payload, int(created * 1e9))
        last = event.time_ns
        out = model.process(event)
        for span in out.spans:
            emitter.emit_span(span)
        for ev, trace_id, span_id in out.logs:
            emitter.emit_log(ev, trace_id, span_id)
    out = model.close_all(last, "end")
    for span in out.spans:
        emitter.emit_span(span)


def export_recorded_run(path: Path) -> tuple[list, list]:
    """Export the run to ``path`` and to in-memory exporters; return the SDK objects."""
    spans_mem, logs_mem = InMemorySpanExporter(), InMemoryLogRecordExporter()
    resource = Resource.create({"service.name": "otlp-json-test"})
    provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(OtlpJsonFileLogExporter(path)))
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs_mem))
    processors = SynchronousMultiSpanProcessor()
    processors.add_span_processor(SimpleSpanProcessor(OtlpJsonFileSpanExporter(path)))
    processors.add_span_processor(SimpleSpanProcessor(spans_mem))
    feed_recorded_run(Emitter(provider.get_logger("elastic_otel"), processors, resource))
    return list(spans_mem.get_finished_spans()), list(logs_mem.get_finished_logs())


def hex_to_base64(data: dict) -> dict:
    """Undo the OTLP/JSON id encoding, so protobuf's JSON parser can read the line."""
    for resource in data.get("resourceSpans", ()):
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for item in [span, *span.get("links", ())]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if item.get(key):
                            item[key] = base64.b64encode(bytes.fromhex(item[key])).decode()
    for resource in data.get("resourceLogs", ()):
        for scope in resource["scopeLogs"]:
            for record in scope["logRecords"]:
                for key in ("traceId", "spanId"):
                    if record.get(key):
                        record[key] = base64.b64encode(bytes.fromhex(record[key])).decode()
    return data


def test_each_line_is_one_export_request_in_otlp_json(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sdk_spans, sdk_logs = export_recorded_run(path)
    lines = path.read_text().splitlines()
    assert len(lines) == len(sdk_spans) + len(sdk_logs)  # simple processors: one per line

    span_requests = [json.loads(line) for line in lines if '"resourceSpans"' in line]
    log_requests = [json.loads(line) for line in lines if '"resourceLogs"' in line]
    assert len(span_requests) == len(sdk_spans) and len(log_requests) == len(sdk_logs)

    span = span_requests[0]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(span["traceId"]) == 32 and set(span["traceId"]) <= HEX32
    assert len(span["spanId"]) == 16 and set(span["spanId"]) <= HEX32
    assert isinstance(span["startTimeUnixNano"], str)  # int64 as a string
    assert isinstance(span["kind"], int)  # enums as integers
    int_attr = next(a for a in span["attributes"] if "intValue" in a["value"])
    assert isinstance(int_attr["value"]["intValue"], str)
    record = log_requests[0]["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    assert isinstance(record["severityNumber"], int) and record["severityText"] == "INFO"
    assert set(record["traceId"]) <= HEX32 and len(record["traceId"]) == 32

    # Same data as the protobuf the OTLP exporters send, field for field.
    for request, sdk_span in zip(span_requests, sdk_spans, strict=True):
        parsed = json_format.ParseDict(hex_to_base64(request), ExportTraceServiceRequest())
        assert parsed == encode_spans([sdk_span])
    for request, sdk_log in zip(log_requests, sdk_logs, strict=True):
        parsed = json_format.ParseDict(hex_to_base64(request), ExportLogsServiceRequest())
        assert parsed == encode_logs([sdk_log])


def test_reader_agrees_with_the_protobuf_decoder(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sdk_spans, sdk_logs = export_recorded_run(path)
    spans, logs = read_otlp_json(path)

    expected_spans = decode_spans(encode_spans(sdk_spans))
    assert len(spans) == len(expected_spans) == 13
    keys = ("trace_id", "span_id", "parent_span_id", "name", "start_ns", "end_ns")
    keys += ("attributes", "events", "links", "status_code", "status_message", "resource")
    for got, want in zip(spans, expected_spans, strict=True):
        assert {k: got[k] for k in keys} == {k: want[k] for k in keys}

    expected_logs = decode_logs(encode_logs(sdk_logs))
    keys = ("time_ns", "severity_number", "severity_text", "body", "attributes", "trace_id")
    keys += ("span_id", "event_name")
    for got, want in zip(logs, expected_logs, strict=True):
        assert {k: got[k] for k in keys} == {k: want[k] for k in keys}


def test_reader_reads_gzip_and_names_the_bad_line(tmp_path: Path) -> None:
    plain = tmp_path / "out.jsonl"
    export_recorded_run(plain)
    packed = tmp_path / "out.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_otlp_json(packed) == read_otlp_json(plain)

    broken = tmp_path / "broken.jsonl"
    lines = plain.read_text().splitlines()
    broken.write_text("\n".join([lines[0], '{"resourceSpans": [', *lines[1:]]) + "\n")
    with pytest.raises(OtlpJsonError, match=r"broken\.jsonl:2: not JSON"):
        read_otlp_json(broken)
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}\n')
    with pytest.raises(OtlpJsonError, match=r"other\.json:1: not an OTLP/JSON export request"):
        read_otlp_json(other)


def test_environment_selects_the_exporters_by_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "env.jsonl"
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "elastic_otel_file")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "elastic_otel_file")
    monkeypatch.setenv("ELASTIC_OTEL_OTLP_JSON_FILE", str(path))
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    pipeline = build_pipeline("test")
    assert pipeline is not None and pipeline.owned
    feed_recorded_run(Emitter(pipeline.logger, pipeline.span_processor, pipeline.resource))
    assert pipeline.shutdown(10)
    spans, logs = read_otlp_json(path)
    assert {s["name"] for s in spans} >= {"rendezvous.join", "rendezvous.member", "worker"}
    assert len(logs) == len(captured_events("restart_node0.tsv"))
    assert spans[0]["resource"]["service.name"] == "torchelastic"


def test_exporter_without_a_path_says_which_variable_to_set() -> None:
    with pytest.raises(ValueError, match="ELASTIC_OTEL_OTLP_JSON_FILE"):
        OtlpJsonFileSpanExporter()


WRITER = textwrap.dedent(
    """
    import sys
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext
    from elastic_otel.emit.otlp_json import OtlpJsonFileSpanExporter

    writer, batches, per_batch = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    exporter = OtlpJsonFileSpanExporter(sys.argv[1])
    resource = Resource({"writer": writer})
    for b in range(batches):
        spans = [
            ReadableSpan(
                name=f"w{writer}-b{b}-s{i}",
                context=SpanContext(writer + 1, b * per_batch + i + 1, False),
                attributes={"padding": "x" * 512},
                resource=resource,
                start_time=1,
                end_time=2,
            )
            for i in range(per_batch)
        ]
        assert exporter.export(spans).name == "SUCCESS"
    exporter.shutdown()
    """
)


def test_processes_appending_to_one_file_never_interleave_lines(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    writers, batches, per_batch = 4, 30, 150  # lines of ~150 KB, far above PIPE_BUF
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(w), str(batches), str(per_batch)]
        )
        for w in range(writers)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * writers
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    assert len(lines) - 1 == writers * batches
    names = []
    for line in lines[:-1]:
        request = json.loads(line)  # a torn or interleaved line would not parse
        spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
        assert len(spans) == per_batch
        names += [s["name"] for s in spans]
    assert len(set(names)) == writers * batches * per_batch


DATA = Path(__file__).parent.parent / "data"


def test_metrics_go_to_the_same_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "all.jsonl"
    monkeypatch.setenv("ELASTIC_OTEL_OTLP_JSON_FILE", str(path))
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    exporter_cls = exporter_class("metrics", "elastic_otel_file")
    assert exporter_cls is OtlpJsonFileMetricExporter
    reader = PeriodicExportingMetricReader(exporter_cls(), export_interval_millis=60_000)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    provider.get_meter("t").create_counter("torchelastic.workers.default.failed").add(2)
    export_recorded_run(path)  # spans and logs into the same file
    provider.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    (metrics,) = [line for line in lines if "resourceMetrics" in line]
    (metric,) = metrics["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
    assert metric["name"] == "torchelastic.workers.default.failed"
    assert metric["sum"]["dataPoints"][0]["asInt"] == "2"
    spans, logs = read_otlp_json(path)  # a metrics line among the others is fine
    assert len(spans) == 13 and logs


def test_entry_points_are_ours_and_never_the_official_name() -> None:
    from importlib.metadata import entry_points

    for group, cls in (
        ("opentelemetry_traces_exporter", OtlpJsonFileSpanExporter),
        ("opentelemetry_logs_exporter", OtlpJsonFileLogExporter),
        ("opentelemetry_metrics_exporter", OtlpJsonFileMetricExporter),
    ):
        (ours,) = entry_points(group=group, name="elastic_otel_file")
        assert ours.load() is cls
        claimed = [ep for ep in entry_points(group=group) if ep.value.startswith("elastic_otel")]
        assert [ep.name for ep in claimed] == ["elastic_otel_file"]


def test_reader_reads_what_the_official_exporter_wrote() -> None:
    spans, logs = read_otlp_json(DATA / "official_otlp_json_file.jsonl")
    assert len(spans) == 13 and len(logs) == len(captured_events("restart_node0.tsv"))
    assert {s["name"] for s in spans} >= {"rendezvous.join", "rendezvous.member", "worker"}
    assert all(len(s["trace_id"]) == 32 and set(s["trace_id"]) <= HEX32 for s in spans)
    text = render_text(build_timeline(spans, logs))
    assert "ROUND 0" in text and "ROUND 1" in text and "REPLACED" in text


def test_reader_reads_the_collector_file_exporter() -> None:
    spans, logs = read_otlp_json(DATA / "collector_file_exporter.jsonl")
    (span,) = spans
    assert span["name"] == "worker" and span["status_code"] == "ERROR"
    assert span["trace_id"] == "8e0ecd2f0a4b4c4e9d3e6f7a8b9c0d1e"
    assert span["attributes"]["torchelastic.exit_code"] == 1
    assert span["events"][0]["attributes"]["exception.type"] == "RuntimeError"
    assert span["resource"]["host.name"] == "node-b"
    (log,) = logs
    assert log["severity_number"] == 17 and log["span_id"] == span["span_id"]
