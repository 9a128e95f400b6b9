"""A worker's output records (:mod:`elastic_otel.parsing.worker_output`) as OpenTelemetry log
records in the context of the worker's ``worker`` span.

They bypass the trace model: the agent chose the span's ids before the worker started (its
``TRACEPARENT``), so each record is emitted straight into the pipeline's log processor, whose
queue is bounded and whose drops the bridge counts (``dropped_sdk_queue``).
"""

from __future__ import annotations

from opentelemetry import trace as trace_api
from opentelemetry._logs import Logger, SeverityNumber
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, TraceFlags

from elastic_otel.emit.emitter import clean, value_limit
from elastic_otel.names import attributes as A
from elastic_otel.parsing.worker_output import OutputRecord

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def span_context(trace_id: int, span_id: int) -> Context | None:
    """The context of the worker's span (``None`` without ids: the record has none)."""
    if not trace_id or not span_id:
        return None
    span = trace_api.NonRecordingSpan(SpanContext(trace_id, span_id, False, _SAMPLED))
    return trace_api.set_span_in_context(span)


class OutputEmitter:
    """Emits one worker stream's records on ``logger`` with the stream's fixed attributes."""

    def __init__(self, logger: Logger, context: Context | None, attributes: dict) -> None:
        self.logger = logger
        self.context = context
        self.attributes = attributes
        self.limit = value_limit()

    def emit(self, record: OutputRecord, time_ns: int) -> None:
        attributes = self.attributes
        truncated = record.truncated or len(record.body) > self.limit
        if truncated or record.invalid_utf8 or record.dropped_before:
            attributes = dict(attributes)
            if truncated:
                attributes[A.OUTPUT_TRUNCATED] = True
                attributes[A.OUTPUT_LENGTH] = record.length
            if record.invalid_utf8:
                attributes[A.OUTPUT_INVALID_UTF8] = True
            if record.dropped_before:
                attributes[A.OUTPUT_DROPPED] = record.dropped_before
        number, text = record.severity
        self.logger.emit(
            timestamp=time_ns,
            observed_timestamp=time_ns,
            context=self.context,
            severity_number=SeverityNumber(number),
            severity_text=text,
            body=clean(record.body, self.limit),
            attributes=attributes,
        )
