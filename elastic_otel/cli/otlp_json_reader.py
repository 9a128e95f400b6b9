"""Read OTLP JSON files: what ``elastic-otel timeline`` and ``demo`` take as input.

Newline-delimited OTLP/JSON export requests (``ExportTraceServiceRequest``,
``ExportLogsServiceRequest``, ``ExportMetricsServiceRequest``): the protobuf JSON mapping with
lowerCamelCase names, enums as integers, 64-bit integers as strings or numbers, trace and
span ids in hex. That is what the bridge's ``elastic_otel_file`` exporter writes, what
OpenTelemetry's own ``otlp_json_file`` exporter (``opentelemetry-exporter-otlp-json-file``)
writes, and what the Collector's ``file`` exporter writes (its ``otlpjsonfile`` receiver
reads all of them back). Metric lines are valid input; their points are not needed here.
Plain or gzip files.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
from collections.abc import Iterator
from typing import IO, Any

Item = dict[str, Any]

_STATUS_NAMES = {0: "UNSET", 1: "OK", 2: "ERROR"}
# The spec writes enums as integers; their names are accepted too (a tolerant reader).
_ENUM_NAMES = {
    "STATUS_CODE_UNSET": 0,
    "STATUS_CODE_OK": 1,
    "STATUS_CODE_ERROR": 2,
    **{
        f"SPAN_KIND_{k}": i
        for i, k in enumerate(
            ["UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"]
        )
    },
    **{
        f"SEVERITY_NUMBER_{k}": n
        for k, n in (
            ("UNSPECIFIED", 0),
            ("TRACE", 1),
            ("DEBUG", 5),
            ("INFO", 9),
            ("WARN", 13),
            ("ERROR", 17),
            ("FATAL", 21),
        )
    },
}


def _enum(value: Any) -> int:
    if isinstance(value, str) and value in _ENUM_NAMES:
        return _ENUM_NAMES[value]
    return int(value)


# --- reading --------------------------------------------------------------------------------


class OtlpJsonError(ValueError):
    """A line of the file is not OTLP/JSON."""


def read_otlp_json(path: str | os.PathLike[str]) -> tuple[list[Item], list[Item]]:
    """All spans and log records of an OTLP JSON file (plain or gzip), one flat dict each.

    Spans: ``trace_id``, ``span_id``, ``parent_span_id`` (hex), ``name``, ``start_ns``,
    ``end_ns``, ``attributes``, ``events``, ``links``, ``status_code`` (``UNSET``/``OK``/
    ``ERROR``), ``status_message``, ``resource``, ``scope``. Logs: ``time_ns``,
    ``severity_number``, ``severity_text``, ``body``, ``event_name``, ``attributes``,
    ``trace_id``, ``span_id``, ``resource``, ``scope``.
    """
    spans: list[Item] = []
    logs: list[Item] = []
    with _open_text(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                line_spans, line_logs = decode_line(line)
            except OtlpJsonError as e:
                raise OtlpJsonError(f"{os.fspath(path)}:{number}: {e}") from None
            spans += line_spans
            logs += line_logs
    return spans, logs


def decode_line(line: str) -> tuple[list[Item], list[Item]]:
    """The spans and log records of one OTLP/JSON line (see :func:`read_otlp_json`)."""
    try:
        data = json.loads(line)
    except ValueError as e:
        raise OtlpJsonError(f"not JSON ({e})") from None
    if not isinstance(data, dict) or not (
        "resourceSpans" in data or "resourceLogs" in data or "resourceMetrics" in data
    ):
        raise OtlpJsonError("not an OTLP/JSON export request")
    try:
        return list(_decode_spans(data)), list(_decode_logs(data))
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise OtlpJsonError(f"malformed OTLP/JSON ({type(e).__name__}: {e})") from None


def _open_text(path: str | os.PathLike[str]) -> IO[str]:
    raw = open(path, "rb")  # noqa: SIM115 - handed to the caller's with-block
    if raw.peek(2)[:2] == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8", errors="replace")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace")


def _decode_spans(data: Item) -> Iterator[Item]:
    for resource_spans in data.get("resourceSpans", ()):
        resource = attributes_dict(resource_spans.get("resource", {}).get("attributes", ()))
        for scope_spans in resource_spans.get("scopeSpans", ()):
            scope = scope_spans.get("scope", {}).get("name", "")
            for span in scope_spans.get("spans", ()):
                status = span.get("status", {})
                yield {
                    "trace_id": span.get("traceId", ""),
                    "span_id": span.get("spanId", ""),
                    "parent_span_id": span.get("parentSpanId", ""),
                    "name": span.get("name", ""),
                    "kind": _enum(span.get("kind", 0)),
                    "start_ns": int(span.get("startTimeUnixNano", 0)),
                    "end_ns": int(span.get("endTimeUnixNano", 0)),
                    "attributes": attributes_dict(span.get("attributes", ())),
                    "events": [
                        {
                            "name": event.get("name", ""),
                            "time_ns": int(event.get("timeUnixNano", 0)),
                            "attributes": attributes_dict(event.get("attributes", ())),
                        }
                        for event in span.get("events", ())
                    ],
                    "links": [
                        {
                            "trace_id": link.get("traceId", ""),
                            "span_id": link.get("spanId", ""),
                            "attributes": attributes_dict(link.get("attributes", ())),
                        }
                        for link in span.get("links", ())
                    ],
                    "status_code": _STATUS_NAMES.get(_enum(status.get("code", 0)), "UNSET"),
                    "status_message": status.get("message", ""),
                    "resource": resource,
                    "scope": scope,
                }


def _decode_logs(data: Item) -> Iterator[Item]:
    for resource_logs in data.get("resourceLogs", ()):
        resource = attributes_dict(resource_logs.get("resource", {}).get("attributes", ()))
        for scope_logs in resource_logs.get("scopeLogs", ()):
            scope = scope_logs.get("scope", {}).get("name", "")
            for record in scope_logs.get("logRecords", ()):
                yield {
                    "time_ns": int(record.get("timeUnixNano", 0)),
                    "observed_time_ns": int(record.get("observedTimeUnixNano", 0)),
                    "severity_number": _enum(record.get("severityNumber", 0)),
                    "severity_text": record.get("severityText", ""),
                    "body": any_value(record.get("body", {})),
                    "event_name": record.get("eventName", ""),
                    "attributes": attributes_dict(record.get("attributes", ())),
                    "trace_id": record.get("traceId", ""),
                    "span_id": record.get("spanId", ""),
                    "resource": resource,
                    "scope": scope,
                }


def attributes_dict(key_values: Any) -> dict[str, Any]:
    """OTLP/JSON ``[{"key": k, "value": AnyValue}]`` as a plain dict."""
    return {kv["key"]: any_value(kv.get("value", {})) for kv in key_values}


def any_value(value: Item) -> Any:
    """An OTLP/JSON ``AnyValue`` as the plain Python value (``None`` when empty)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in value["arrayValue"].get("values", ())]
    if "kvlistValue" in value:
        return attributes_dict(value["kvlistValue"].get("values", ()))
    if "bytesValue" in value:
        return base64.b64decode(value["bytesValue"])
    return None
