"""The trace model's data types: spans as the state machines build them, without the OTel SDK.

A :class:`SpanRecord` stays in the model until it ends and is only then handed out in an
:class:`Output`, with the log records (:data:`LogOut`) that belong to it. That lets the trace
id be chosen once the round is known and lets agent steps be back-dated, neither of which the
SDK ``Tracer`` allows. :mod:`elastic_otel.emit.emitter` turns both into SDK objects.

These types are the model's only currency between its state machines and the layers above:
structured values (:class:`SpanRef`, :class:`LogOut`) rather than bare tuples, so that what a
position means is written once, here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import NamedTuple

from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import AttrValue, ElasticEvent, error_attributes
from elastic_otel.parsing.worker_reports import innermost_frames

STATUS_UNSET = "UNSET"
STATUS_OK = "OK"
STATUS_ERROR = "ERROR"

DEFAULT_EVENT_LIMIT = 128
SPAN_TEXT_LIMIT = 2048
"""Bytes of an exception's stack or message kept on a span. Grafana Tempo keeps attribute
values up to 2,048 bytes by default and cuts the rest, which would keep a traceback's
*outermost* frames and lose the message; so spans carry the innermost frames and the message
that fit, and the log record of the same event carries the whole text."""
_IMPORTANT_RESERVE = 16  # failures and closes may go past the event limit by this much

SpanAttributes = dict[str, AttrValue]


def new_span_id() -> int:
    """A random, non-zero 64-bit span id (os.urandom is fork-safe, unlike ``random``)."""
    return int.from_bytes(os.urandom(8), "big") or 1


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: SpanAttributes


@dataclass(slots=True)
class SpanLink:
    trace_id: int
    span_id: int
    attributes: SpanAttributes


@dataclass(slots=True)
class SpanRecord:
    """A span as the model builds it; handed out once ended."""

    name: str
    start_ns: int
    attributes: SpanAttributes
    span_id: int = field(default_factory=new_span_id)
    trace_id: int = 0
    parent_span_id: int = 0
    end_ns: int = 0
    events: list[SpanEvent] = field(default_factory=list)
    links: list[SpanLink] = field(default_factory=list)
    status: str = STATUS_UNSET
    status_message: str = ""
    dropped_events: int = 0
    event_limit: int = DEFAULT_EVENT_LIMIT

    @property
    def ref(self) -> SpanRef:
        """Its trace id and span id (to parent a child under it, or to link to it)."""
        return SpanRef(self.trace_id, self.span_id)

    def add_event(
        self, name: str, time_ns: int, attributes: SpanAttributes, important: bool = False
    ) -> None:
        limit = self.event_limit + (_IMPORTANT_RESERVE if important else 0)
        if len(self.events) < limit:
            self.events.append(SpanEvent(name, time_ns, attributes))
        else:
            self.dropped_events += 1

    def record_error(self, event: ElasticEvent) -> None:
        """ERROR status, and an ``exception`` span event when the event carries an error (which
        the emitter leaves out when exceptions go to log records only: the event's own log
        record, on this span, carries the exception then)."""
        err = event.error
        self.status = STATUS_ERROR
        if err is None:
            self.status_message = event.body[:256]
            return
        self.status_message = err.type or err.message[:256]
        attributes: SpanAttributes = dict(error_attributes(err))
        if err.stacktrace:
            attributes[A.EXCEPTION_STACKTRACE] = innermost_frames(err.stacktrace, SPAN_TEXT_LIMIT)
        if len(err.message.encode()) > SPAN_TEXT_LIMIT:
            message = err.message.encode()[:SPAN_TEXT_LIMIT].decode(errors="ignore")
            attributes[A.EXCEPTION_MESSAGE] = message
        self.add_event(A.EXCEPTION_EVENT, event.time_ns, attributes, important=True)

    def set_error(self, message: str) -> None:
        self.status, self.status_message = STATUS_ERROR, message

    def end(self, time_ns: int, status: str | None = None, reason: str = "") -> SpanRecord:
        """End at ``time_ns`` (never before the start); an ERROR status is kept."""
        self.end_ns = max(time_ns, self.start_ns)
        if status is not None and self.status != STATUS_ERROR:
            self.status = status
        if reason:
            self.attributes[A.END_REASON] = reason
        if self.dropped_events:
            self.attributes[A.DROPPED_EVENTS] = self.dropped_events
        return self


class SpanRef(NamedTuple):
    """A span as its ids: what a child is parented under (``span_id`` 0: a root of the trace).

    A tuple so that a caller outside the model may still unpack or index it."""

    trace_id: int
    span_id: int


class LogOut(NamedTuple):
    """A log ready to emit: the event, its trace id and span id (0 when it belongs to none).

    A tuple because the emitter and tests unpack it (``for event, trace_id, span_id in ...``)."""

    event: ElasticEvent
    trace_id: int
    span_id: int


@dataclass(slots=True)
class Output:
    """What one step of the model hands out: ended spans and logs, in emission order."""

    spans: list[SpanRecord] = field(default_factory=list)
    logs: list[LogOut] = field(default_factory=list)

    def log(self, event: ElasticEvent, span: SpanRecord | None) -> None:
        """Emit ``event`` as a log record of ``span`` (of no span when ``None``)."""
        if span is None:
            self.logs.append(LogOut(event, 0, 0))
        else:
            self.logs.append(LogOut(event, span.trace_id, span.span_id))
