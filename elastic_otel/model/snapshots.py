"""Open-span snapshots: spans that never end (a lost host, a SIGKILL) still reach the backend.

A span is exported when it ends; a process killed before that takes its open spans with it,
so a lost node would leave nothing of its round but its join. Every
``ELASTIC_OTEL_OPEN_SPAN_INTERVAL`` seconds (default 30; 0: off) each span open longer than
that is exported as a snapshot log record, following the ``partial-span-processor`` package
(G-Research/otel-partial-python) so that a partial-span collector or ``elastic-otel timeline``
can show it: ``partial.event`` = ``heartbeat``, ``partial.frequency`` = ``"<ms>ms"``,
``partial.body.type`` = ``json/v1``, the span's ids on the record, the span as OTLP JSON in
the body. A span that had a heartbeat gets a ``partial.event`` = ``stop`` record when it ends.

Bounded: a process holds its own node's member span and its workers' spans, so a 4,096-node
job sends (1 + workers per node) x nodes records per interval; nothing is done between due
times (one comparison per tick). Pure: no SDK, no clock of its own.
"""

from __future__ import annotations

from collections.abc import Iterable

from elastic_otel.model.spans import SpanRecord

HEARTBEAT = "heartbeat"
STOP = "stop"
_CHECK_NS = 1_000_000_000  # open spans are looked at once a second at most


class SnapshotSchedule:
    """Which open spans are due for a heartbeat, and which snapshotted spans have ended."""

    def __init__(self, interval_s: float) -> None:
        self.interval_ns = int(interval_s * 1e9) if interval_s > 0 else 0
        self._last: dict[int, tuple[SpanRecord, int]] = {}  # span id → (span, last snapshot)
        self._checked_ns = 0

    @property
    def enabled(self) -> bool:
        return self.interval_ns > 0

    @property
    def frequency(self) -> str:
        """``partial.frequency`` as partial-span-processor writes it."""
        return f"{self.interval_ns // 1_000_000}ms"

    def due(
        self, open_spans: Iterable[SpanRecord], now_ns: int
    ) -> tuple[list[SpanRecord], list[SpanRecord]]:
        """(spans due for a heartbeat now, snapshotted spans that ended since)."""
        if not self.enabled or now_ns - self._checked_ns < _CHECK_NS:
            return [], []
        self._checked_ns = now_ns
        heartbeats: list[SpanRecord] = []
        still_open: set[int] = set()
        for span in open_spans:
            still_open.add(span.span_id)
            if now_ns - span.start_ns < self.interval_ns:
                continue
            seen = self._last.get(span.span_id)
            if seen is None or now_ns - seen[1] >= self.interval_ns:
                heartbeats.append(span)
                self._last[span.span_id] = (span, now_ns)
        ended = [span for span_id, (span, _) in self._last.items() if span_id not in still_open]
        for span in ended:
            del self._last[span.span_id]
        return heartbeats, [span for span in ended if span.end_ns]
