"""Log model: how one :class:`~elastic_otel.parsing.torch_events.ElasticEvent` reads as an
OTel log record."""

from __future__ import annotations

from dataclasses import dataclass

from elastic_otel.model.goodput import describe_summary
from elastic_otel.model.link_records import describe_link
from elastic_otel.model.slow_nodes import describe_slow_node
from elastic_otel.model.slowdowns import describe_slowdown
from elastic_otel.model.stalls import (
    STALL_EVENT_NAME,
    STALL_STATE,
    TRAINING,
    describe_nccl_timing,
    describe_training_stall,
)
from elastic_otel.model.stragglers import (
    STRAGGLER_EVENT_NAME,
    STRAGGLER_STATE,
    describe_straggler,
)
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import NCCL_TIMING_EVENT, NodeState, WorkerState
from elastic_otel.parsing.torch_events import ElasticEvent, EventKind, RdzvAction

# OpenTelemetry SeverityNumber values (the API enum is not imported: this module is SDK-free).
SEVERITY_INFO = (9, "INFO")
SEVERITY_WARN = (13, "WARN")
SEVERITY_ERROR = (17, "ERROR")

UNPARSED_EVENT_NAME = "elastic_otel.unparsed"


@dataclass(slots=True)
class LogModel:
    time_ns: int
    severity_number: int
    severity_text: str
    body: str
    event_name: str
    attributes: dict


def severity(event: ElasticEvent) -> tuple[int, str]:
    """FAILED → ERROR; TERMINATED, PEER_FAILED, a stall or straggler report, unparseable
    input → WARN; else INFO."""
    if event.kind is EventKind.RENDEZVOUS:
        return SEVERITY_ERROR if event.node_state == NodeState.FAILED else SEVERITY_INFO
    if event.kind is EventKind.UNPARSED:
        return SEVERITY_WARN
    if event.state == WorkerState.FAILED:
        return SEVERITY_ERROR
    if event.state in (
        WorkerState.TERMINATED,
        WorkerState.PEER_FAILED,
        STALL_STATE,
        STRAGGLER_STATE,
        A.SLOWDOWN_STATE,
        A.LINK_STATE,
    ):
        return SEVERITY_WARN
    return SEVERITY_INFO


def rendezvous_event_name(action: RdzvAction) -> str:
    """The ``event_name`` of a rendezvous event's log record."""
    return f"torchelastic.rendezvous.{action.value}"


def carries_exception(event: ElasticEvent) -> bool:
    """Whether the event's record describes an exception (``exception.type`` or
    ``exception.message``, as the semantic conventions require one of them)."""
    attrs = event.attributes
    return A.EXCEPTION_TYPE in attrs or A.EXCEPTION_MESSAGE in attrs


def event_name(event: ElasticEvent, exceptions_as_logs: bool = False) -> str:
    """The log record's ``event_name``: torch's event name, or one per rendezvous action; with
    ``exceptions_as_logs`` (``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN``), ``exception`` for a record
    that carries one, as the conventions name an exception's log record (torch's name stays in
    ``torchelastic.event.name``)."""
    if exceptions_as_logs and carries_exception(event):
        return A.EXCEPTION_EVENT
    if event.kind is EventKind.RENDEZVOUS:
        return rendezvous_event_name(event.action or RdzvAction.OTHER)
    if event.kind is EventKind.UNPARSED:
        return UNPARSED_EVENT_NAME
    return event.name


def body(event: ElasticEvent) -> str:
    """The record's body: a worker's whole traceback (or fatal-signal stack) when it has one,
    which spans keep only the innermost part of (:data:`~elastic_otel.model.spans.
    SPAN_TEXT_LIMIT`); else the event's name."""
    err = event.error
    if event.kind is EventKind.WORKER and err is not None and err.stacktrace:
        return err.stacktrace
    if event.name == STALL_EVENT_NAME and event.attributes.get(A.STALLED_IN) == TRAINING:
        return describe_training_stall(event.attributes)
    if event.name == A.GOODPUT_EVENT_NAME:
        return describe_summary(event.attributes)
    if event.name == STRAGGLER_EVENT_NAME and A.STRAGGLER_NODE in event.attributes:
        return describe_slow_node(event.attributes)  # a slow node, compared between nodes
    if event.name == STRAGGLER_EVENT_NAME:
        return describe_straggler(event.attributes)
    if event.name == A.LINK_EVENT_NAME:
        return describe_link(event.attributes)
    if event.name == A.SLOWDOWN_EVENT_NAME:
        return describe_slowdown(event.attributes, event.state == A.SLOWDOWN_ENDED_STATE)
    if event.name == NCCL_TIMING_EVENT:
        return "NCCL timing " + describe_nccl_timing(event.attributes)
    return event.body


def to_log(event: ElasticEvent, exceptions_as_logs: bool = False) -> LogModel:
    """The event's log record (``exceptions_as_logs``: see :func:`event_name`)."""
    number, text = severity(event)
    return LogModel(
        time_ns=event.time_ns,
        severity_number=number,
        severity_text=text,
        body=body(event),
        event_name=event_name(event, exceptions_as_logs),
        attributes=event.attributes,
    )
