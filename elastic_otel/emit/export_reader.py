"""The SDK's ``PeriodicExportingMetricReader`` without its thread: the process's export thread
(:mod:`elastic_otel.emit.export_thread`) collects every ``OTEL_METRIC_EXPORT_INTERVAL`` and
exports through the SDK's metric exporter. Its own module: the metrics SDK is imported only
where metrics are installed.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.environment_variables import (
    OTEL_METRIC_EXPORT_INTERVAL,
    OTEL_METRIC_EXPORT_TIMEOUT,
)
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, MetricsData

from elastic_otel.emit.export_queue import millis_variable
from elastic_otel.emit.export_thread import ExportThread

_logger = logging.getLogger("elastic_otel")


class ScheduledMetricReader(MetricReader):
    """Collects and exports on ``thread`` every ``OTEL_METRIC_EXPORT_INTERVAL`` (60 s), within
    ``OTEL_METRIC_EXPORT_TIMEOUT`` (30 s), with the exporter's preferred temporality and
    aggregation; ``force_flush`` and ``shutdown`` collect and export on the caller's thread,
    as the SDK's periodic reader does. One export at a time."""

    def __init__(self, exporter: MetricExporter, thread: ExportThread) -> None:
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self._exporter = exporter
        self._export_lock = threading.Lock()
        self._interval_s = millis_variable(OTEL_METRIC_EXPORT_INTERVAL, 60_000) / 1e3
        self._timeout_ms = millis_variable(OTEL_METRIC_EXPORT_TIMEOUT, 30_000)
        self._due = time.monotonic() + self._interval_s
        self._thread = thread
        self._closed = False  # shutdown began
        self._exporter_closed = False  # its exporter is shut down: nothing more to export
        self._forked = False  # inherited by a forked child: the exporter is the parent's
        self._warned = False
        thread.add(self)

    def due_at(self) -> float:
        return self._due

    def run(self, now: float) -> None:
        if now < self._due:
            return
        self._due = now + self._interval_s
        try:
            self.collect(timeout_millis=self._timeout_ms)
        except Exception as e:  # a collection that timed out or failed: tried again next time
            self._warn("collection", e)

    def after_fork_in_child(self) -> None:
        self._forked = True
        self._export_lock = threading.Lock()

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        if self._forked:
            return
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            with self._export_lock:
                if not self._exporter_closed:
                    self._exporter.export(metrics_data, timeout_millis=timeout_millis)
        except Exception as e:
            self._warn("export", e)
        finally:
            detach(token)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        if self._forked:
            return False
        super().force_flush(timeout_millis=timeout_millis)
        self._exporter.force_flush(timeout_millis=timeout_millis)
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Off the export thread, one last collection and export (as the SDK's periodic
        reader makes), then the exporter's shutdown, within ``timeout_millis``."""
        if self._closed:
            return
        self._closed = True
        self._thread.remove(self)
        if self._forked:
            return
        deadline = time.monotonic() + timeout_millis / 1e3
        try:
            self.collect(timeout_millis=timeout_millis)
        except Exception as e:
            self._warn("collection", e)
        locked = self._export_lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
        self._exporter_closed = True
        if locked:
            self._export_lock.release()
        remaining_ms = max(0.0, deadline - time.monotonic()) * 1e3
        self._exporter.shutdown(timeout_millis=remaining_ms)

    def _warn(self, what: str, error: Exception) -> None:
        if not self._warned:
            self._warned = True
            _logger.warning(
                "elastic-otel: metric %s failed (%s: %s)", what, type(error).__name__, error
            )
