"""OTLP JSON files: the format of the OpenTelemetry Collector's ``file`` exporter.

Each line is one ``ExportTraceServiceRequest`` or ``ExportLogsServiceRequest`` in the OTLP/JSON
encoding (the protobuf JSON mapping with lowerCamelCase names, enums as integers, 64-bit
integers as strings, and trace and span ids as hex rather than base64). The collector's
``otlpjsonfile`` receiver reads such files back, and so does :func:`read_otlp_json`.

The exporters are registered under the names ``otlp_json_file`` in the SDK's exporter
entry-point groups, so ``OTEL_TRACES_EXPORTER=otlp_json_file OTEL_LOGS_EXPORTER=otlp_json_file``
with ``ELASTIC_OTEL_OTLP_JSON_FILE=/path/out.jsonl`` writes the bridge's telemetry there.
Every line goes out in a single ``write`` on an ``O_APPEND`` descriptor, so several processes
(the agents of a job) can share one file without interleaving lines.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from elastic_otel import environment_variables as env

Item = dict[str, Any]

_STATUS_NAMES = {0: "UNSET", 1: "OK", 2: "ERROR"}
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


# --- encoding -------------------------------------------------------------------------------


def to_otlp_json(request: Message) -> str:
    """One export request as a single line of OTLP/JSON (no trailing newline)."""
    data = MessageToDict(request, use_integers_for_enums=True)
    for resource in data.get("resourceSpans", ()):
        for scope in resource.get("scopeSpans", ()):
            for span in scope.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    for resource in data.get("resourceLogs", ()):
        for scope in resource.get("scopeLogs", ()):
            for record in scope.get("logRecords", ()):
                _hex_ids(record)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _hex_ids(item: Item) -> None:
    """The protobuf JSON mapping writes bytes as base64; OTLP/JSON wants ids in hex."""
    for key in _ID_KEYS:
        value = item.get(key)
        if value:
            item[key] = base64.b64decode(value).hex()


def spans_to_json(spans: Sequence[ReadableSpan]) -> str:
    return to_otlp_json(encode_spans(spans))


def logs_to_json(records: Sequence[ReadableLogRecord]) -> str:
    return to_otlp_json(encode_logs(records))


# --- writing --------------------------------------------------------------------------------


def output_path(path: str | os.PathLike[str] | None) -> str:
    """``path``, else ``ELASTIC_OTEL_OTLP_JSON_FILE``; a clear error when neither is set."""
    if path is None:
        path = os.environ.get(env.ELASTIC_OTEL_OTLP_JSON_FILE, "").strip()
    path = os.fspath(path)
    if not path:
        raise ValueError(
            "the otlp_json_file exporter needs an output file: set "
            + env.ELASTIC_OTEL_OTLP_JSON_FILE
        )
    return path


class AppendOnlyFile:
    """A file that takes whole lines, each in one ``os.write`` on an ``O_APPEND`` descriptor."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write_line(self, text: str) -> None:
        data = (text + "\n").encode("utf-8", "replace")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path} is closed")
            written = os.write(self._fd, data)
            while written < len(data):  # only on a full disk or a signal: finish the line
                written += os.write(self._fd, data[written:])

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class _JsonFileWriter:
    """What the span and the log exporter share: one OTLP/JSON line per batch, appended."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._file = AppendOnlyFile(output_path(path))
        self.exported = 0  # records written
        self.failed = 0  # records that could not be written

    @property
    def path(self) -> str:
        return self._file.path

    def _write(self, batch: Sequence[Any], encode: Callable[[Sequence[Any]], str]) -> bool:
        if not batch:
            return True
        try:
            self._file.write_line(encode(batch))
        except (OSError, ValueError):
            self.failed += len(batch)
            return False
        self.exported += len(batch)
        return True

    def shutdown(self) -> None:
        self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class OtlpJsonFileSpanExporter(_JsonFileWriter, SpanExporter):
    """Appends each batch of spans to a file as one OTLP/JSON line."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ok = self._write(spans, spans_to_json)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE


class OtlpJsonFileLogExporter(_JsonFileWriter, LogRecordExporter):
    """Appends each batch of log records to a file as one OTLP/JSON line."""

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        ok = self._write(batch, logs_to_json)
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE


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
                    "kind": int(span.get("kind", 0)),
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
                    "status_code": _STATUS_NAMES.get(int(status.get("code", 0)), "UNSET"),
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
                    "severity_number": int(record.get("severityNumber", 0)),
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
