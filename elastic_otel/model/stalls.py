"""Stall reports: a node that waits too long says so while it waits, not when it gives up.

torch says nothing while a join waits for missing nodes (until it times out, 600 s by
default), while the exit barrier waits for a lost node (300 s), or while the agent waits for
its workers to stop. Every open wait the trace model knows of is a :class:`Wait`;
:class:`StallWatch` reports one when it has lasted ``ELASTIC_OTEL_STALL_AFTER`` seconds and
again at that interval while it lasts, as a WARN log record on the waiting span
(``torchelastic.stalled.in``, ``torchelastic.stalled.seconds`` and what the node knows), and
keeps the longest current wait per kind for the ``torchelastic.stalled.seconds`` gauge.

The seam: the rendezvous and agent models only list what waits now (their ``waits()``, each
with the context only it knows); when a wait is due, and what its report says, is decided
here, once for every kind. Pure: no SDK, no torch, no clock of its own (the worker thread
passes the time in).
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_otel.model.spans import LogOut, SpanAttributes, SpanRecord
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import ElasticEvent, EventKind

STALL_EVENT_NAME = "torchelastic.stalled"
STALL_STATE = "STALLED"
WAIT_KINDS = ("rendezvous.join", "exit_barrier", "stop_workers")
"""Values of ``torchelastic.stalled.in``: the join of a round, torch's exit barrier, the agent
waiting for its workers to stop."""


@dataclass(slots=True)
class Wait:
    """Something a node is waiting for, open since its span started."""

    kind: str
    span: SpanRecord
    context: SpanAttributes  # what the node knows: run id, host, rank, round, last message


class StallWatch:
    """Decides which waits to report now; remembers when each was last reported."""

    def __init__(self, after_s: float) -> None:
        self.after_ns = int(after_s * 1e9) if after_s > 0 else 0
        self._reported: dict[int, int] = {}  # span id → when last reported
        self.current: dict[str, float] = dict.fromkeys(WAIT_KINDS, 0.0)
        """Longest wait per kind right now, in seconds (0: none); read by the gauge."""

    @property
    def enabled(self) -> bool:
        return self.after_ns > 0

    def reports(self, waits: list[Wait], now_ns: int) -> list[LogOut]:
        """WARN log records for the waits that are due, each on its waiting span."""
        out: list[LogOut] = []
        current = dict.fromkeys(WAIT_KINDS, 0.0)
        reported: dict[int, int] = {}
        for wait in waits:
            waited_ns = now_ns - wait.span.start_ns
            if waited_ns < self.after_ns:
                continue
            seconds = waited_ns / 1e9
            current[wait.kind] = max(current.get(wait.kind, 0.0), seconds)
            last = self._reported.get(wait.span.span_id)
            if last is not None and now_ns - last < self.after_ns:
                reported[wait.span.span_id] = last
                continue
            reported[wait.span.span_id] = now_ns
            report = stall_event(wait, seconds, now_ns)
            out.append(LogOut(report, wait.span.trace_id, wait.span.span_id))
        self._reported = reported  # waits that ended are forgotten
        self.current = current
        return out


def stall_event(wait: Wait, seconds: float, now_ns: int) -> ElasticEvent:
    """The log record of one stall report."""
    attrs: SpanAttributes = dict(wait.context)
    attrs[A.STALLED_IN] = wait.kind
    attrs[A.STALLED_SECONDS] = round(seconds, 3)
    attrs[A.EVENT_NAME] = STALL_EVENT_NAME
    attrs[A.EVENT_SOURCE] = A.SOURCE_AGENT
    where = f"round {attrs[A.ROUND]}" if A.ROUND in attrs else ""
    body = f"stalled in {wait.kind} for {seconds:.0f} s" + (f" ({where})" if where else "")
    last = attrs.get(A.MESSAGE)
    if isinstance(last, str) and last:
        body += f"; last rendezvous message: {last}"
    run_id = attrs.get(A.RUN_ID)
    return ElasticEvent(
        kind=EventKind.GENERIC,
        name=STALL_EVENT_NAME,
        body=body,
        time_ns=now_ns,
        attributes=attrs,
        run_id=run_id if isinstance(run_id, str) else "",
        state=STALL_STATE,
    )
