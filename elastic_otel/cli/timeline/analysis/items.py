"""Reading OTLP items: the values, identities and errors of spans and log records that every
analysis shares (an attribute as an int or ranks, the emitting process, a node's name, a span's
error), and the two ways an exception or a worker's last words reach a span from the logs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from elastic_otel.names import attributes as A

Item = dict[str, Any]
"""A span or a log record, as :func:`~elastic_otel.cli.otlp_json_reader.read_otlp_json` reads it."""


def as_int(value: Any) -> int | None:
    """An attribute value as an int (``None``: absent, a bool, or not a number)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def as_number(value: Any) -> float | None:
    """An attribute value as a float (``None``: absent, a bool, or not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def as_ranks(value: Any) -> tuple[int, ...]:
    """``[0, 2]`` (an int array), or ``"0,2"`` (exports from before the arrays) → ``(0, 2)``;
    what is not a rank is left out."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list | tuple):
        ranks = (as_int(part) for part in value)
    else:
        ranks = (as_int(part.strip()) for part in str(value or "").split(","))
    return tuple(sorted({r for r in ranks if r is not None}))


def distinct(items: Iterable[Item]) -> list[Item]:
    """``items`` in order, each record once. Delivery is at least once (``docs/guarantees.md``):
    a batch whose answer was lost, or one still under way when the exit path sent the backlog,
    is sent again, and the backend or file then holds its records twice, alike in every field
    (their times to the nanosecond, their attributes, their process). Only such copies go: a
    second record of the same error, from another process or at another time, differs."""
    seen: set[str] = set()
    out = []
    for item in items:
        key = json.dumps(item, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def rank_key(rank: int | None) -> int:
    """Sort key of a global rank; an unknown one last."""
    return rank if rank is not None else 1 << 30


def union_ns(spans: Iterable[Item]) -> int:
    """Nanoseconds covered by at least one of ``spans``."""
    total, end = 0, None
    for span in sorted(spans, key=lambda s: s["start_ns"]):
        start, stop = span["start_ns"], span["end_ns"]
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def instance_id(span: Item) -> str:
    """The process that emitted ``span`` (its resource's ``service.instance.id``)."""
    return str(span.get("resource", {}).get("service.instance.id", ""))


def host_of(span: Item) -> str:
    """Its ``host.name``: the span's own, else its resource's."""
    host = span["attributes"].get(A.HOST_NAME) or span.get("resource", {}).get(A.HOST_NAME)
    return str(host or "")


def node_name(host: object, pid: object, local_id: int | None = None) -> str:
    """How the timeline names a node: ``host pid N`` (``/local_id`` when not 0)."""
    label = f"{host or '?'} pid {pid}" if pid is not None else str(host or "?")
    return f"{label}/{local_id}" if local_id else label


def node_label(span: Item) -> str:
    """The name of the node that emitted ``span``, from its host and process id."""
    attrs, resource = span["attributes"], span.get("resource", {})
    host = attrs.get(A.HOST_NAME) or resource.get(A.HOST_NAME)
    return node_name(host, attrs.get(A.PROCESS_PID, resource.get(A.PROCESS_PID)))


def error_message(span: Item) -> str:
    """A span's error: its ``exception`` event (``type: message``), else its ERROR status."""
    for event in span.get("events", ()):
        if event["name"] == A.EXCEPTION_EVENT:
            a = event["attributes"]
            kind, msg = str(a.get(A.EXCEPTION_TYPE, "")), str(a.get(A.EXCEPTION_MESSAGE, ""))
            if kind or msg:
                return f"{kind}: {msg}" if kind and msg else kind or msg
    if span["status_code"] == "ERROR":
        return str(span.get("status_message", ""))
    return ""


def exception_type(span: Item) -> str:
    """The type of a span's ``exception`` event (``""``: none)."""
    for event in span.get("events", ()):
        if event["name"] == A.EXCEPTION_EVENT:
            return str(event["attributes"].get(A.EXCEPTION_TYPE, ""))
    return ""


def source_event_name(record: Item) -> str:
    """A log record's event name, torch's for an exception's record (named ``exception`` under
    ``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN``; torch's name is in ``torchelastic.event.name``)."""
    name = str(record.get("event_name", "") or "")
    if name == A.EXCEPTION_EVENT:
        return str(record.get("attributes", {}).get(A.EVENT_NAME, "") or name)
    return name


def with_logged_exceptions(spans: list[Item], logs: Iterable[Item]) -> list[Item]:
    """``spans``, each with its exception however it was exported: an ``exception`` span event,
    or (``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN=logs``) a log record with the event name
    ``exception`` in the span's context, which becomes that span's ``exception`` event here."""
    logged: dict[str, Item] = {}
    for record in logs:
        if record.get("event_name") == A.EXCEPTION_EVENT and record.get("span_id"):
            logged.setdefault(str(record["span_id"]), record)
    if not logged:
        return spans
    out = []
    for span in spans:
        found = logged.get(span["span_id"])
        events = span.get("events", ())
        if found is not None and not any(e["name"] == A.EXCEPTION_EVENT for e in events):
            attributes = found.get("attributes", {})
            exception = {k: v for k, v in attributes.items() if k.startswith("exception.")}
            event = {"name": A.EXCEPTION_EVENT, "time_ns": found.get("time_ns", 0)}
            span = {**span, "events": [*events, {**event, "attributes": exception}]}
        out.append(span)
    return out


def with_last_words(spans: list[Item], logs: Iterable[Item]) -> list[Item]:
    """``spans``, a worker span with the ``torchelastic.last_words`` of the log record in its
    context (the root cause's ``FAILED`` record) unless it has them itself."""
    words: dict[str, Any] = {}
    for record in logs:
        value = record.get("attributes", {}).get(A.LAST_WORDS)
        if value and record.get("span_id"):
            words[str(record["span_id"])] = value
    if not words:
        return spans
    return [
        {**s, "attributes": {**s["attributes"], A.LAST_WORDS: words[s["span_id"]]}}
        if s["span_id"] in words and not s["attributes"].get(A.LAST_WORDS)
        else s
        for s in spans
    ]
