"""OpenTelemetry emission: log models and finished span records into SDK processors.

Spans reach the span processor already finished, with the trace id the model derived and the
start it back-dated, which the SDK ``Tracer`` cannot do. Log records go through ``Logger.emit``
in their span's context or, where the pipeline is the bridge's own, straight onto its export
queues as the record its ``Logger.emit`` would make (:meth:`Emitter.emit_log`). Strings are
clipped and cleaned so that no record can fail an export, and exceptions go where
``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN`` says. Design: ``docs/trace-model.md`` (Exceptions:
span events or log records), ``docs/guarantees.md``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

from opentelemetry import trace as trace_api
from opentelemetry._logs import Logger, LogRecord, SeverityNumber
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk._logs import LogRecordLimits, ReadableLogRecord
from opentelemetry.sdk.environment_variables import OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

from elastic_otel.model.logs import to_log
from elastic_otel.model.snapshots import STOP
from elastic_otel.model.spans import STATUS_ERROR, STATUS_OK, Output, SpanRecord
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from elastic_otel.parsing.torch_events import ElasticEvent

DEFAULT_VALUE_LIMIT = 16384
"""Characters kept per string value when ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` is unset."""

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_STATUS = {STATUS_OK: StatusCode.OK, STATUS_ERROR: StatusCode.ERROR}


def value_limit() -> int:
    raw = os.environ.get(OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT, "").strip()
    try:
        return max(1, int(raw)) if raw else DEFAULT_VALUE_LIMIT
    except ValueError:
        return DEFAULT_VALUE_LIMIT


def clean(text: str, limit: int) -> str:
    """Clip to ``limit`` and make the string encodable as UTF-8."""
    if len(text) > limit:
        text = text[:limit]
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def clean_attributes(attrs: dict, limit: int) -> dict:
    """``attrs`` itself when every key and string is short ASCII (the common case), else a
    cleaned copy."""
    for key, value in attrs.items():
        if not key.isascii() or (
            isinstance(value, str) and (len(value) > limit or not value.isascii())
        ):
            break
    else:
        return attrs
    out = {}
    for key, value in attrs.items():
        if isinstance(value, str):
            value = clean(value, limit)
        out[key if key.isascii() else clean(key, 256)] = value
    return out


LogSink = Callable[[ReadableLogRecord], None]
"""Where a finished log record goes: an export queue's ``put``."""


class Emitter:
    """Turns model output into OTel data on the given logger and span processor.

    ``log_sinks`` and ``log_limits``: the export queues behind ``logger`` and its provider's
    limits, where the pipeline built both: log records then go to the queues directly."""

    def __init__(
        self,
        logger: Logger | None,
        span_processor: SpanProcessor | None,
        resource: Resource,
        scope_version: str = "",
        exception_signal: str | None = None,
        log_sinks: Sequence[LogSink] = (),
        log_limits: LogRecordLimits | None = None,
    ) -> None:
        self.logger = logger
        self.log_sinks = tuple(log_sinks)
        self.log_limits = log_limits or LogRecordLimits()
        self.exceptions_as_logs = exception_signal in (
            env.EXCEPTIONS_AS_LOGS,
            env.EXCEPTIONS_AS_LOGS_AND_SPAN_EVENTS,
        )
        self.exceptions_as_span_events = exception_signal != env.EXCEPTIONS_AS_LOGS
        self.span_processor = span_processor
        self.resource = resource
        self.scope = InstrumentationScope(A.INSTRUMENTATION_SCOPE, scope_version)
        self.limit = value_limit()
        # What every span would repeat of its resource: left out of the span (a backend shows
        # the resource's on each span; 4,096 nodes' join spans share one trace).
        self._on_resource = {
            key: resource.attributes[key]
            for key in (A.HOST_NAME, A.PROCESS_PID)
            if key in resource.attributes
        }

    def emit_output(self, out: Output) -> None:
        """Emit what one step of the trace model handed out: its spans, then its logs."""
        for span in out.spans:
            self.emit_span(span)
        for event, trace_id, span_id in out.logs:
            self.emit_log(event, trace_id, span_id)

    def emit_log(self, event: ElasticEvent, trace_id: int, span_id: int) -> None:
        if self.logger is None:
            return
        model = to_log(event, self.exceptions_as_logs)
        context = None
        if trace_id and span_id:
            span = trace_api.NonRecordingSpan(SpanContext(trace_id, span_id, False, _SAMPLED))
            context = trace_api.set_span_in_context(span)
        attributes: dict | BoundedAttributes = clean_attributes(model.attributes, self.limit)
        limits = self.log_limits
        if self.log_sinks and (
            limits.max_log_record_attribute_length is not None
            or len(attributes) > (limits.max_log_record_attributes or 0)
        ):  # what the SDK's record would cut, cut (and counted) as it does
            attributes = BoundedAttributes(
                maxlen=limits.max_log_record_attributes,
                attributes=attributes,
                immutable=False,
                max_value_len=limits.max_log_record_attribute_length,
                extended_attributes=True,
            )
        record = LogRecord(
            timestamp=model.time_ns,
            observed_timestamp=model.time_ns,
            context=context,
            severity_number=SeverityNumber(model.severity_number),
            severity_text=model.severity_text,
            body=clean(model.body, self.limit),
            attributes=attributes,
            event_name=clean(model.event_name, 256),
        )
        if not self.log_sinks:
            self.logger.emit(record)
            return
        # The record the pipeline's own Logger.emit would make, less the work of no use here:
        # it checks every attribute again (the emitter cleaned them) and its processor copies
        # the record again (no other processor shares it): a fifth of an event's CPU (§3).
        readable = ReadableLogRecord(record, self.resource, self.scope, limits)
        for put in self.log_sinks:
            put(readable)

    def emit_span(self, record: SpanRecord) -> None:
        if self.span_processor is None or not record.trace_id:
            return
        self.span_processor.on_end(self._readable(record, record.end_ns))

    def emit_partial(self, record: SpanRecord, event: str, now_ns: int, frequency: str) -> None:
        """A snapshot of ``record`` as a ``partial-span-processor`` log record (``event``:
        ``heartbeat`` for a span still open, ``stop`` for one that ended)."""
        if self.logger is None or not record.trace_id:
            return
        # Imported here: its OTLP JSON modules take ~6 ms to import, and only snapshots use it.
        from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans

        span = self._readable(record, record.end_ns if event == STOP else None)
        body = json.dumps(encode_spans([span]).to_dict(), separators=(",", ":"))
        context = trace_api.set_span_in_context(
            trace_api.NonRecordingSpan(
                SpanContext(record.trace_id, record.span_id, False, _SAMPLED)
            )
        )
        self.logger.emit(
            timestamp=now_ns,
            observed_timestamp=now_ns,
            context=context,
            severity_number=SeverityNumber.INFO,
            severity_text="INFO",
            body=body,
            attributes={
                A.PARTIAL_EVENT: event,
                A.PARTIAL_FREQUENCY: frequency,
                A.PARTIAL_BODY_TYPE: "json/v1",
            },
        )

    def _readable(self, record: SpanRecord, end_ns: int | None) -> ReadableSpan:
        limit = self.limit
        context = SpanContext(record.trace_id, record.span_id, False, _SAMPLED)
        parent = (
            SpanContext(record.trace_id, record.parent_span_id, False, _SAMPLED)
            if record.parent_span_id
            else None
        )
        events: Sequence[Event] = [
            Event(e.name, clean_attributes(e.attributes, limit), e.time_ns)
            for e in record.events
            if self.exceptions_as_span_events or e.name != A.EXCEPTION_EVENT
        ]
        links = [
            Link(
                SpanContext(lk.trace_id, lk.span_id, False, _SAMPLED),
                clean_attributes(lk.attributes, limit),
            )
            for lk in record.links
        ]
        attributes = record.attributes
        on_resource = self._on_resource
        if on_resource and any(attributes.get(k) == v for k, v in on_resource.items()):
            attributes = {k: v for k, v in attributes.items() if on_resource.get(k) != v}
        status_code = _STATUS.get(record.status, StatusCode.UNSET)
        status = Status(
            status_code,
            clean(record.status_message, 1024) if status_code is StatusCode.ERROR else None,
        )
        return ReadableSpan(
            name=record.name,
            context=context,
            parent=parent,
            resource=self.resource,
            attributes=clean_attributes(attributes, limit),
            events=events,
            links=links,
            status=status,
            start_time=record.start_ns,
            end_time=end_ns,
            instrumentation_scope=self.scope,
        )
