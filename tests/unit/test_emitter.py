"""emitter: model output into real SDK objects (in-memory exporters stand where OTLP would),
then through the OTLP protobuf encoder, which drops whatever it cannot encode."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import LoggerProvider, LogRecordLimits, ReadableLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from elastic_otel.emit.emitter import (
    DEFAULT_VALUE_LIMIT,
    Emitter,
    clean,
    clean_attributes,
    value_limit,
)
from elastic_otel.model.spans import STATUS_ERROR, STATUS_OK, Output, SpanLink, SpanRecord
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import ElasticEvent, parse_event

RESOURCE = Resource.create({"service.name": "emitter-test"})
FAILED_WORKER = (
    '{"name": "torchelastic.worker.status.FAILED", "source": "WORKER", "timestamp": 0, '
    '"metadata": {"run_id": "job", "global_rank": 1, "group_rank": 0, "state": "FAILED", '
    '"raw_error": "Traceback (most recent call last):\\nRuntimeError: boom"}}'
)
JOINED = (
    '{"name": "dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous", "run_id": "job", '
    "\"message\": \"The node 'a_1_0' has joined round 2 of the rendezvous 'job' as rank 0 in a "
    'world of size 2.", "hostname": "a", "pid": 1, "node_state": "RUNNING", '
    '"master_endpoint": "", "rank": 0, "local_id": 0, "error_trace": ""}'
)


@dataclass
class Sdk:
    emitter: Emitter
    logs: InMemoryLogRecordExporter
    spans: InMemorySpanExporter

    def log_records(self) -> list[ReadableLogRecord]:
        return list(self.logs.get_finished_logs())

    def one_log(self) -> ReadableLogRecord:
        (record,) = self.log_records()
        return record

    def one_span(self) -> ReadableSpan:
        (span,) = self.spans.get_finished_spans()
        return span


def make_sdk(monkeypatch: pytest.MonkeyPatch, limit: str | None = None) -> Sdk:
    """A real LoggerProvider and span processor; ``limit`` is set only after the provider is
    made, so that the SDK's own log limits clip nothing and what is clipped is the emitter's."""
    logs, spans = InMemoryLogRecordExporter(), InMemorySpanExporter()
    provider = LoggerProvider(resource=RESOURCE, shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    if limit is not None:
        monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", limit)
    emitter = Emitter(
        provider.get_logger("elastic_otel"), SimpleSpanProcessor(spans), RESOURCE, "9.9"
    )
    return Sdk(emitter, logs, spans)


@pytest.fixture
def sdk(monkeypatch: pytest.MonkeyPatch) -> Sdk:
    return make_sdk(monkeypatch)


def encoded_log(record: ReadableLogRecord) -> object:
    """The OTLP protobuf log record, with every attribute there (the encoder drops bad ones)."""
    request = encode_logs([record])
    request.SerializeToString()
    (pb,) = request.resource_logs[0].scope_logs[0].log_records
    assert len(pb.attributes) == len(record.log_record.attributes or {})
    return pb


def encoded_span(span: ReadableSpan) -> object:
    request = encode_spans([span])
    request.SerializeToString()
    (pb,) = request.resource_spans[0].scope_spans[0].spans
    assert len(pb.attributes) == len(span.attributes or {})
    assert [len(e.attributes) for e in pb.events] == [len(e.attributes or {}) for e in span.events]
    assert [len(lk.attributes) for lk in pb.links] == [
        len(lk.attributes or {}) for lk in span.links
    ]
    return pb


# --- log records --------------------------------------------------------------------------------


def test_a_log_record_carries_its_span_and_the_event(sdk: Sdk) -> None:
    event = parse_event(FAILED_WORKER, 1_700_000_000_000_000_000)
    sdk.emitter.emit_log(event, trace_id=0xABC, span_id=0xDEF)
    readable = sdk.one_log()
    record = readable.log_record
    assert (record.trace_id, record.span_id) == (0xABC, 0xDEF)
    assert record.trace_flags is not None and record.trace_flags.sampled
    assert record.severity_text == "ERROR" and record.severity_number is not None
    assert record.severity_number.value == 17
    # a worker's failure reads as its whole traceback; the event's name says what it is
    assert record.body == "Traceback (most recent call last):\nRuntimeError: boom"
    assert record.event_name == "torchelastic.worker.status.FAILED"
    assert record.timestamp == record.observed_timestamp == 1_700_000_000_000_000_000
    assert record.attributes is not None
    assert record.attributes[A.GLOBAL_RANK] == 1 and record.attributes[A.RUN_ID] == "job"
    assert record.attributes[A.EXCEPTION_TYPE] == "RuntimeError"
    assert record.attributes[A.EXCEPTION_MESSAGE] == "boom"
    assert readable.resource is RESOURCE
    assert readable.instrumentation_scope is not None
    assert readable.instrumentation_scope.name == "elastic_otel"
    pb = encoded_log(readable)
    assert pb.trace_id == (0xABC).to_bytes(16, "big")  # type: ignore[attr-defined]


def test_a_rendezvous_log_is_info_named_by_its_action(sdk: Sdk) -> None:
    sdk.emitter.emit_log(parse_event(JOINED, 5), 1, 2)
    record = sdk.one_log().log_record
    assert record.severity_text == "INFO" and record.event_name == "torchelastic.rendezvous.joined"
    assert record.attributes is not None and record.attributes[A.ROUND] == 2
    assert str(record.body).startswith("The node 'a_1_0' has joined round 2")


@pytest.mark.parametrize(("trace_id", "span_id"), [(0, 0), (0xABC, 0), (0, 0xDEF)])
def test_a_log_of_no_span_has_no_context(sdk: Sdk, trace_id: int, span_id: int) -> None:
    sdk.emitter.emit_log(parse_event(FAILED_WORKER, 1), trace_id, span_id)
    record = sdk.one_log().log_record
    assert not record.trace_id and not record.span_id


def test_emit_output_hands_over_its_spans_and_logs(sdk: Sdk) -> None:
    event = parse_event(JOINED, 5)
    span = SpanRecord(A.SPAN_RDZV_MEMBER, 1, {}, trace_id=9, span_id=8).end(4)
    sdk.emitter.emit_output(Output(spans=[span], logs=[(event, 9, 8), (event, 0, 0)]))
    assert sdk.one_span().name == A.SPAN_RDZV_MEMBER
    assert [(r.log_record.trace_id or 0) for r in sdk.log_records()] == [9, 0]


@pytest.mark.filterwarnings("ignore:Log record attributes were dropped")  # the SDK's, as wanted
@pytest.mark.parametrize(
    "limits",
    [
        LogRecordLimits(),  # the defaults: nothing to cut
        LogRecordLimits(max_attributes=3),  # cut, and counted as dropped
        LogRecordLimits(max_attribute_length=4),  # every string value clipped
    ],
    ids=["defaults", "3 attributes", "values of 4 characters"],
)
def test_records_put_on_the_queues_encode_as_the_sdk_loggers_do(limits: LogRecordLimits) -> None:
    """Where the pipeline is its own, the emitter puts records on the export queues itself:
    on the wire they must be exactly what the SDK's Logger.emit and processor make."""
    logs = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=RESOURCE, shutdown_on_exit=False, log_record_limits=limits)
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    through_logger = Emitter(provider.get_logger("elastic_otel", "9.9"), None, RESOURCE, "9.9")
    queued: list[ReadableLogRecord] = []
    direct = Emitter(
        provider.get_logger("elastic_otel", "9.9"), None, RESOURCE, "9.9",
        log_sinks=[queued.append], log_limits=limits,
    )  # fmt: skip
    for emitter in (through_logger, direct):
        emitter.emit_log(parse_event(FAILED_WORKER, 1_700_000_000_000_000_000), 0xABC, 0xDEF)
        emitter.emit_log(parse_event(JOINED, 5), 0, 0)
    assert len(queued) == 2
    expected = encode_logs(list(logs.get_finished_logs()))
    assert encode_logs(queued) == expected
    records = expected.resource_logs[0].scope_logs[0].log_records
    if limits.max_log_record_attributes == 3:
        assert [len(r.attributes) for r in records] == [3, 3]
        assert all(r.dropped_attributes_count > 0 for r in records)
    if limits.max_log_record_attribute_length == 4:
        assert max(len(kv.value.string_value) for r in records for kv in r.attributes) == 4


def test_nothing_is_emitted_without_a_logger_or_processor() -> None:
    emitter = Emitter(None, None, RESOURCE)
    emitter.emit_log(parse_event(JOINED, 1), 1, 2)  # no logger: nothing, and no error
    emitter.emit_span(SpanRecord("worker", 1, {}, trace_id=3).end(2))


# --- spans --------------------------------------------------------------------------------------


def test_spans_keep_the_models_ids_times_links_events_and_status(sdk: Sdk) -> None:
    failure = parse_event(FAILED_WORKER, 150)
    record = SpanRecord(
        A.SPAN_WORKER, start_ns=100, attributes={A.GLOBAL_RANK: 1}, trace_id=0x1234, span_id=7
    )
    record.parent_span_id = 5
    record.links.append(SpanLink(0x9999, 3, {A.ROUND: 0}))
    record.record_error(failure)
    sdk.emitter.emit_output(Output(spans=[record.end(200)], logs=[]))
    span = sdk.one_span()
    assert span.name == "worker"
    assert span.context is not None
    assert (span.context.trace_id, span.context.span_id) == (0x1234, 7)
    assert span.parent is not None
    assert (span.parent.trace_id, span.parent.span_id) == (0x1234, 5)
    assert (span.start_time, span.end_time) == (100, 200)  # back-dated, as the model said
    assert [(lk.context.trace_id, lk.context.span_id) for lk in span.links] == [(0x9999, 3)]
    assert dict(span.links[0].attributes or {}) == {A.ROUND: 0}
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "RuntimeError"
    (exception,) = span.events
    assert (exception.name, exception.timestamp) == ("exception", 150)
    assert exception.attributes is not None
    assert exception.attributes[A.EXCEPTION_MESSAGE] == "boom"
    assert exception.attributes[A.EXCEPTION_TYPE] == "RuntimeError"
    assert dict(span.attributes or {}) == {A.GLOBAL_RANK: 1}
    assert span.resource is RESOURCE
    assert span.instrumentation_scope is not None
    assert (span.instrumentation_scope.name, span.instrumentation_scope.version) == (
        "elastic_otel",
        "9.9",
    )
    assert record.status == STATUS_ERROR
    encoded_span(span)


def test_a_root_span_and_the_ok_and_unset_statuses(sdk: Sdk) -> None:
    sdk.emitter.emit_span(SpanRecord("agent.run", 1, {}, trace_id=2, span_id=3).end(5, STATUS_OK))
    sdk.emitter.emit_span(SpanRecord("agent.run", 1, {}, trace_id=2, span_id=4).end(5))
    ok, unset = sdk.spans.get_finished_spans()
    assert ok.parent is None
    assert (ok.status.status_code, ok.status.description) == (StatusCode.OK, None)
    assert unset.status.status_code is StatusCode.UNSET


def test_a_span_without_trace_id_is_not_emitted(sdk: Sdk) -> None:
    sdk.emitter.emit_span(SpanRecord("rendezvous.join", 1, {}).end(2))
    assert sdk.spans.get_finished_spans() == ()


# --- clipping and cleaning ----------------------------------------------------------------------


def long_and_bad(event: ElasticEvent) -> ElasticEvent:
    event.attributes["torchelastic.blob"] = "y" * 100
    event.attributes["torchelastic.bad"] = "a\ud800b"  # a lone surrogate: protobuf refuses it
    event.attributes["torchelastic.k\udcff"] = 1  # in a key, too
    event.body = "b" * 100
    return event


def test_log_strings_are_clipped_and_made_encodable(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = make_sdk(monkeypatch, limit="10")
    sdk.emitter.emit_log(long_and_bad(parse_event(FAILED_WORKER, 1)), 0, 0)
    readable = sdk.one_log()
    record = readable.log_record
    assert record.attributes is not None
    assert record.attributes["torchelastic.blob"] == "y" * 10
    assert record.attributes["torchelastic.bad"] == "a?b"
    assert record.attributes["torchelastic.k?"] == 1
    assert record.attributes[A.GLOBAL_RANK] == 1  # numbers untouched
    assert record.body == "Traceback "  # a failure's body is its traceback, clipped likewise
    encoded_log(readable)  # nothing dropped on the way to the wire


def test_span_strings_are_clipped_and_made_encodable(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = make_sdk(monkeypatch, limit="10")
    record = SpanRecord(
        "worker", 1, {"torchelastic.blob": "x" * 50, "torchelastic.bad": "\udcff"}, trace_id=1
    )
    record.add_event("exception", 2, {A.EXCEPTION_MESSAGE: "m" * 50 + "\ud800"})
    record.set_error("s" * 5000 + "\ud800")
    sdk.emitter.emit_span(record.end(3))
    span = sdk.one_span()
    assert dict(span.attributes or {}) == {"torchelastic.blob": "x" * 10, "torchelastic.bad": "?"}
    assert dict(span.events[0].attributes or {}) == {A.EXCEPTION_MESSAGE: "m" * 10}
    assert span.status.description == "s" * 1024  # a status message has its own bound
    encoded_span(span)


def test_the_default_limit_keeps_long_strings_whole_up_to_it(sdk: Sdk) -> None:
    event = parse_event(FAILED_WORKER, 1)
    event.attributes["torchelastic.trace"] = "t" * (DEFAULT_VALUE_LIMIT + 5)
    event.attributes["torchelastic.fits"] = "f" * DEFAULT_VALUE_LIMIT
    sdk.emitter.emit_log(event, 0, 0)
    attributes = sdk.one_log().log_record.attributes
    assert attributes is not None
    assert attributes["torchelastic.trace"] == "t" * DEFAULT_VALUE_LIMIT
    assert attributes["torchelastic.fits"] == "f" * DEFAULT_VALUE_LIMIT


def test_link_attributes_are_clipped_and_made_encodable(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = make_sdk(monkeypatch, limit="10")
    record = SpanRecord("worker", 1, {}, trace_id=1)
    record.links.append(SpanLink(2, 3, {"torchelastic.x": "a\ud800b", "torchelastic.y": "y" * 50}))
    sdk.emitter.emit_span(record.end(2))
    span = sdk.one_span()
    assert dict(span.links[0].attributes or {}) == {
        "torchelastic.x": "a?b",
        "torchelastic.y": "y" * 10,
    }
    encoded_span(span)


@pytest.mark.parametrize(
    ("setting", "limit"),
    [(None, DEFAULT_VALUE_LIMIT), ("20", 20), (" 20 ", 20), ("abc", DEFAULT_VALUE_LIMIT), ("0", 1)],
)
def test_value_limit_setting(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, limit: int
) -> None:
    if setting is not None:
        monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", setting)
    assert value_limit() == limit


def test_clean_attributes_copies_only_when_needed() -> None:
    plain = {"a": "short", "n": 1, "f": 1.5, "b": True}
    assert clean_attributes(plain, DEFAULT_VALUE_LIMIT) is plain
    assert clean_attributes({}, 1) == {}
    needs = {"a": "é" * 5, "n": 7, "ключ": "v"}
    cleaned = clean_attributes(needs, 3)
    assert cleaned == {"a": "ééé", "n": 7, "ключ": "v"}  # non-ASCII is kept when encodable
    assert cleaned is not needs and needs["a"] == "é" * 5  # the model's dict is not changed
    assert clean("\udcff", 5) == "?"
    assert clean("abcdef", 3) == "abc"
    text = "plain"
    assert clean(text, 10) is text
