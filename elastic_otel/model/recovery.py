"""Recovery holding: a restart of an agent's worker group, held until its round is known.

A recovery's ``agent.recovery`` span, its phases and their log records belong to the trace of
the round it leads to, known only when it ends: :class:`RecoveryHold`, one per agent, keeps
them back and hands them out together, and lets everything else pass straight out. Spans:
``docs/trace-model.md`` (Recoveries and the training code); why a part of its own:
``docs/architecture.md`` (The trace model's parts).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from elastic_otel.model.spans import STATUS_OK, Output, SpanLink, SpanRecord, SpanRef
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import ElasticEvent

_RECOVERY_KEYS = (A.RECOVERY_CAUSE, A.RECOVERY_DETECTION_MS)


@dataclass(frozen=True, slots=True)
class HeldLog:
    """A log record of a held span, written once the span's trace is final."""

    event: ElasticEvent
    span: SpanRecord


@dataclass(slots=True)
class Recovery:
    """A restart of the worker group under way: its span, and its ended phases and their
    logs, held until the round it leads to (its trace) is known."""

    span: SpanRecord
    phases: list[SpanRecord] = field(default_factory=list)
    logs: list[HeldLog] = field(default_factory=list)

    def holds(self, span: SpanRecord) -> bool:
        return span is self.span or span.parent_span_id == self.span.span_id


class RecoveryHold:
    """One agent's recovery under way (if any) and what it holds back."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: Recovery | None = None

    @property
    def active(self) -> bool:
        return self.current is not None

    @property
    def cause(self) -> str:
        """``torchelastic.recovery.cause`` of the recovery under way (``""``: none known)."""
        if self.current is None:
            return ""
        return str(self.current.span.attributes.get(A.RECOVERY_CAUSE) or "")

    @property
    def start_ns(self) -> int:
        return self.current.span.start_ns if self.current is not None else 0

    def open_spans(self) -> Iterator[SpanRecord]:
        if self.current is not None:
            yield self.current.span

    def parent(self, default: SpanRef) -> SpanRef:
        """Where an agent step goes: under the recovery under way, else ``default``."""
        if self.current is None:
            return default
        return self.current.span.ref

    # --- start and end ------------------------------------------------------------------------

    def start(
        self, span: SpanRecord, ev: ElasticEvent, failure: SpanLink | None, left: SpanRef
    ) -> None:
        """Hold ``span``, the recovery ``ev`` starts; ``failure`` links to this attempt's failed
        worker (unless the recovery is for a membership change), ``left`` is the node's member
        span of the round it leaves (``span_id`` 0: none)."""
        for key in _RECOVERY_KEYS:
            if key in ev.attributes:
                span.attributes[key] = ev.attributes[key]
        cause = span.attributes.get(A.RECOVERY_CAUSE)
        if failure is not None and cause != A.CAUSE_MEMBERSHIP_CHANGE:
            span.links.append(failure)
        if left.span_id:
            span.links.append(SpanLink(left.trace_id, left.span_id, {}))
        self.current = Recovery(span)

    def adopt(self, span: SpanRecord) -> None:
        """Hold ``span``, a recovery whose start was not seen (back-dated by its caller)."""
        self.current = Recovery(span)

    def end(self, ev: ElasticEvent, trace: int, out: Output) -> None:
        """The recovery ended (``ev``): hand it out in ``trace`` with what it held."""
        recovery = self.current
        if recovery is None:
            return
        if ev.error is not None:
            recovery.span.record_error(ev)
        recovery.logs.append(HeldLog(ev, recovery.span))
        self.release(ev.time_ns, trace, out)

    def abandon(self, t: int, reason: str, error: bool, trace: int, out: Output) -> None:
        """End a recovery that will not end by itself (exit, signal, eviction, a new one)."""
        recovery = self.current
        if recovery is None:
            return
        recovery.span.attributes[A.END_REASON] = reason
        if error:
            recovery.span.set_error(reason)
        self.release(t, trace, out)

    def release(self, t: int, trace: int, out: Output) -> None:
        """End the recovery in ``trace`` (the round it led to) with its held phases and logs."""
        recovery = self.current
        if recovery is None:
            return
        self.current = None
        root = recovery.span
        root.trace_id, root.parent_span_id = trace, 0
        for phase in recovery.phases:
            phase.trace_id = trace
        out.spans.extend(recovery.phases)
        out.spans.append(root.end(t, STATUS_OK))
        for held in recovery.logs:
            out.log(held.event, held.span)

    # --- what passes through ------------------------------------------------------------------

    def finish(self, span: SpanRecord, out: Output) -> None:
        """Hand out an ended span; a phase of the recovery under way waits for it."""
        recovery = self.current
        if recovery is not None and recovery.holds(span):
            recovery.phases.append(span)
        else:
            out.spans.append(span)

    def log(self, ev: ElasticEvent, span: SpanRecord, out: Output) -> None:
        """A log record of ``span``: held with the recovery while its trace is not known."""
        recovery = self.current
        if recovery is not None and recovery.holds(span):
            recovery.logs.append(HeldLog(ev, span))
        else:
            out.log(ev, span)
