"""What each failure and recovery cost, as OpenTelemetry metrics.

``torchelastic.worker.failures`` counts root-cause worker failures only, so one rank's crash
counts once however many ranks the job has; ``torchelastic.recovery.duration`` and
``torchelastic.recovery.phase.duration`` measure recoveries from their spans, in the span's
context, so that an exemplar opens the recovery's trace. Recorded on the bridge's event thread,
never on torch's. Design: ``docs/trace-model.md`` (Root cause or victim;
Recoveries and the training code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elastic_otel.model.spans import SpanRecord
from elastic_otel.names import attributes as A

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import Meter

BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""Recoveries take from under a second (one node, no store) to tens of minutes."""
_PHASE_PREFIX = "agent."


def span_context(trace_id: int, span_id: int) -> Context:
    """A context holding a sampled span of these ids (what exemplars are taken from)."""
    from opentelemetry import trace

    span = trace.NonRecordingSpan(
        trace.SpanContext(trace_id, span_id, False, trace.TraceFlags(trace.TraceFlags.SAMPLED))
    )
    return trace.set_span_in_context(span)


class RecoveryMetrics:
    """The failure counter and the two recovery histograms on ``meter``."""

    def __init__(self, meter: Meter) -> None:
        self.failures = meter.create_counter(
            A.METRIC_WORKER_FAILURES,
            unit="{failure}",
            description="Worker failures that were a root cause (not the peers that died of one)",
        )
        self.duration = meter.create_histogram(
            A.METRIC_RECOVERY_DURATION,
            unit="s",
            description="Time from a failure or a membership change to workers running again",
            explicit_bucket_boundaries_advisory=BUCKETS_S,
        )
        self.phase = meter.create_histogram(
            A.METRIC_RECOVERY_PHASE_DURATION,
            unit="s",
            description="Time spent in one phase of a recovery",
            explicit_bucket_boundaries_advisory=BUCKETS_S,
        )

    def record_spans(self, spans: list[SpanRecord]) -> None:
        """Count the root-cause ``worker`` spans in ``spans``; record the ``agent.recovery``
        spans and their phases (which are handed out in the same batch as their recovery)."""
        for span in spans:
            if span.attributes.get(A.FAILURE_KIND) == A.KIND_ROOT_CAUSE:
                attrs: dict[str, str | bool] = {
                    A.ERROR_TYPE: str(span.attributes.get(A.ERROR_TYPE, "_OTHER"))
                }
                if span.attributes.get(A.OOM_KILL) is True:
                    attrs[A.OOM_KILL] = True
                context = span_context(span.trace_id, span.span_id)
                self.failures.add(1, attrs, context=context)
        causes = {
            s.span_id: str(s.attributes.get(A.RECOVERY_CAUSE, ""))
            for s in spans
            if s.name == A.SPAN_AGENT_RECOVERY
        }
        if not causes:
            return
        for span in spans:
            seconds = (span.end_ns - span.start_ns) / 1e9
            context = span_context(span.trace_id, span.span_id)
            if span.name == A.SPAN_AGENT_RECOVERY:
                attrs = {
                    A.RECOVERY_CAUSE: causes[span.span_id],
                    A.RECOVERY_UNTIL: A.UNTIL_WORKERS_STARTED,
                }
                self.duration.record(seconds, attrs, context=context)
            elif span.parent_span_id in causes:
                phase = span.name.removeprefix(_PHASE_PREFIX)
                attrs = {A.RECOVERY_PHASE: phase, A.RECOVERY_CAUSE: causes[span.parent_span_id]}
                self.phase.record(seconds, attrs, context=context)

    def record_first_step(
        self, since_start_s: float, since_recovery_s: float, cause: str, context: Context
    ) -> None:
        """The first step of a training script a recovery restarted: ``since_start_s`` after
        its process started, ``since_recovery_s`` after the recovery began."""
        attrs = {A.RECOVERY_PHASE: A.UNTIL_FIRST_STEP, A.RECOVERY_CAUSE: cause}
        self.phase.record(since_start_s, attrs, context=context)
        attrs = {A.RECOVERY_CAUSE: cause, A.RECOVERY_UNTIL: A.UNTIL_FIRST_STEP}
        self.duration.record(since_recovery_s, attrs, context=context)
