"""emitter: model output into real SDK objects (an in-memory exporter stands where OTLP would)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from elastic_otel import attributes as A
from elastic_otel.emitter import DEFAULT_VALUE_LIMIT, Emitter, clean, clean_attributes
from elastic_otel.parsing import parse_event
from elastic_otel.spans import STATUS_ERROR, Output, SpanLink, SpanRecord

RESOURCE = Resource.create({"service.name": "emitter-test"})
FAILED_WORKER = (
    '{"name": "torchelastic.worker.status.FAILED", "source": "WORKER", "timestamp": 0, '
    '"metadata": {"run_id": "job", "global_rank": 1, "group_rank": 0, "state": "FAILED", '
    '"raw_error": "Traceback (most recent call last):\\nRuntimeError: boom"}}'
)


@pytest.fixture
def sdk() -> tuple[Emitter, InMemoryLogRecordExporter, InMemorySpanExporter]:
    logs, spans = InMemoryLogRecordExporter(), InMemorySpanExporter()
    provider = LoggerProvider(resource=RESOURCE, shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    emitter = Emitter(provider.get_logger("elastic_otel"), SimpleSpanProcessor(spans), RESOURCE)
    return emitter, logs, spans


def test_a_log_record_carries_its_span_and_the_event(sdk: tuple) -> None:
    emitter, logs, _ = sdk
    event = parse_event(FAILED_WORKER, 1_700_000_000_000_000_000)
    emitter.emit_log(event, trace_id=0xABC, span_id=0xDEF)
    (record,) = [r.log_record for r in logs.get_finished_logs()]
    assert (record.trace_id, record.span_id) == (0xABC, 0xDEF)
    assert record.severity_text == "ERROR" and record.severity_number.value == 17
    assert record.body == "torchelastic.worker.status.FAILED"
    assert record.event_name == "torchelastic.worker.status.FAILED"
    assert record.timestamp == 1_700_000_000_000_000_000
    assert record.attributes[A.GLOBAL_RANK] == 1
    assert record.attributes[A.EXCEPTION_TYPE] == "RuntimeError"


def test_a_log_of_no_span_has_no_context(sdk: tuple) -> None:
    emitter, logs, _ = sdk
    emitter.emit_log(parse_event(FAILED_WORKER, 1), 0, 0)
    (record,) = [r.log_record for r in logs.get_finished_logs()]
    assert not record.trace_id and not record.span_id


def test_spans_keep_the_models_ids_times_links_events_and_status(sdk: tuple) -> None:
    emitter, _, spans = sdk
    record = SpanRecord(
        A.SPAN_WORKER, start_ns=100, attributes={A.GLOBAL_RANK: 1}, trace_id=0x1234, span_id=7
    )
    record.parent_span_id = 5
    record.links.append(SpanLink(0x9999, 3, {A.ROUND: 0}))
    record.record_error(parse_event(FAILED_WORKER, 150))
    emitter.emit_output(Output(spans=[record.end(200)], logs=[]))
    (span,) = spans.get_finished_spans()
    assert span.context.trace_id == 0x1234 and span.context.span_id == 7
    assert span.parent is not None and span.parent.span_id == 5
    assert (span.start_time, span.end_time) == (100, 200)  # back-dated, as the model said
    assert [(lk.context.trace_id, lk.context.span_id) for lk in span.links] == [(0x9999, 3)]
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "RuntimeError"
    (exception,) = span.events
    assert exception.name == "exception" and exception.attributes[A.EXCEPTION_MESSAGE] == "boom"
    assert span.resource is RESOURCE and span.instrumentation_scope.name == "elastic_otel"
    assert record.status == STATUS_ERROR


def test_a_span_without_trace_id_is_not_emitted(sdk: tuple) -> None:
    emitter, _, spans = sdk
    emitter.emit_span(SpanRecord("rendezvous.join", 1, {}).end(2))
    assert spans.get_finished_spans() == ()


def test_values_are_clipped_and_made_encodable(sdk: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "10")
    logs = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=RESOURCE, shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    emitter = Emitter(provider.get_logger("x"), None, RESOURCE)
    event = parse_event(FAILED_WORKER, 1)
    event.attributes["torchelastic.blob"] = "y" * 100
    event.attributes["torchelastic.bad"] = "a\ud800b"  # a lone surrogate: protobuf refuses it
    emitter.emit_log(event, 0, 0)
    (record,) = [r.log_record for r in logs.get_finished_logs()]
    assert record.attributes["torchelastic.blob"] == "y" * 10
    assert record.attributes["torchelastic.bad"] == "a?b"
    record.attributes["torchelastic.bad"].encode("utf-8")  # encodable now


def test_clean_attributes_copies_only_when_needed() -> None:
    plain = {"a": "short", "n": 1}
    assert clean_attributes(plain, DEFAULT_VALUE_LIMIT) is plain
    assert clean_attributes({"a": "é" * 5}, 3) == {"a": "ééé"}
    assert clean("\udcff", 5) == "?"
