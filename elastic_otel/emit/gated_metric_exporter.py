"""A metric exporter whose exports pass the export gate (:mod:`elastic_otel.emit.export_gate`).

Span and log exports pass it in :class:`~elastic_otel.emit.delivery.OutageBuffer`; metric
exports go from the SDK's periodic reader straight to the exporter, so they are wrapped here.
Its own module: it loads the metrics SDK, which only a bridge with metrics on needs.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from elastic_otel.emit.export_gate import GATE


class GatedMetricExporter(MetricExporter):
    """Forwards to ``inner``, with its preferred temporality and aggregation."""

    def __init__(self, inner: MetricExporter) -> None:
        super().__init__(inner._preferred_temporality, inner._preferred_aggregation)
        self.inner = inner

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        with GATE.exporting():
            return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)
