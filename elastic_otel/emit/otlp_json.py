"""The ``elastic_otel_file`` exporters: a job's traces, logs and metrics in one OTLP JSON file.

Lines are encoded with OpenTelemetry's own OTLP JSON encoder; what is kept here is what its file
exporter lacks for a job: the file named by ``ELASTIC_OTEL_OTLP_JSON_FILE``, one file shared by
the job's agents (each line one ``os.write`` on an ``O_APPEND`` descriptor) and metrics beside
spans and logs. Why a name of its own and not a dependency: ``docs/cli.md``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.exporter.otlp.json.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.json.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from elastic_otel.names import environment_variables as env

ENTRY_POINT_NAME = "elastic_otel_file"


def output_path(path: str | os.PathLike[str] | None) -> str:
    """``path``, else ``ELASTIC_OTEL_OTLP_JSON_FILE``; a clear error when neither is set."""
    if path is None:
        path = os.environ.get(env.ELASTIC_OTEL_OTLP_JSON_FILE, "").strip()
    path = os.fspath(path)
    if not path:
        raise ValueError(
            f"the {ENTRY_POINT_NAME} exporter needs an output file: set "
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


def to_line(request: Any) -> str:
    """One export request of the official encoder as a single line of OTLP/JSON."""
    return json.dumps(request.to_dict(), separators=(",", ":"), ensure_ascii=False)


class _JsonLines:
    """What the three exporters share: one OTLP/JSON line per batch, appended."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._file = AppendOnlyFile(output_path(path))
        self.exported = 0  # records written
        self.failed = 0  # records that could not be written

    @property
    def path(self) -> str:
        return self._file.path

    def _write(self, batch: Sequence[Any], encode: Callable[[Any], Any], count: int) -> bool:
        if not count:
            return True
        try:
            self._file.write_line(to_line(encode(batch)))
        except (OSError, ValueError):
            self.failed += count
            return False
        self.exported += count
        return True

    def shutdown(self, timeout_millis: float = 30_000, **_kwargs: Any) -> None:
        self._file.close()

    def force_flush(self, timeout_millis: float = 30_000) -> bool:
        return True  # every line is written when exported


class OtlpJsonFileSpanExporter(_JsonLines, SpanExporter):
    """Appends each batch of spans to the file as one OTLP/JSON line."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ok = self._write(spans, encode_spans, len(spans))
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE


class OtlpJsonFileLogExporter(_JsonLines, LogRecordExporter):
    """Appends each batch of log records to the file as one OTLP/JSON line."""

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        ok = self._write(batch, encode_logs, len(batch))
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE


class OtlpJsonFileMetricExporter(_JsonLines, MetricExporter):
    """Appends each collection of metrics to the file as one OTLP/JSON line."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        MetricExporter.__init__(self)
        _JsonLines.__init__(self, path)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **_kwargs: Any
    ) -> MetricExportResult:
        points = sum(
            len(metric.data.data_points)
            for rm in metrics_data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
        )
        ok = self._write(metrics_data, encode_metrics, points)  # type: ignore[arg-type]
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE
