"""The bridge's counters, each named once: what :func:`elastic_otel.stats` returns.

Two owners count: the handler (events received from torch, processed, dropped before the
worker) and the pipeline's delivery (records exported, held or lost on the way out). The names
of their fields are the keys of ``elastic_otel.stats()`` and, through :data:`DROP_REASONS`, the
``elastic_otel.reason`` values of the ``elastic_otel.dropped`` metric
(:mod:`elastic_otel.emit.bridge_health`). A forked child starts from zero: its counters are new.
"""

from __future__ import annotations

import threading


class Counters:
    """Integer counters named by ``__slots__`` (``_``-prefixed slots are not counters)."""

    __slots__ = ()

    def __init__(self) -> None:
        for name in self.names():
            setattr(self, name, 0)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        slots: tuple[str, ...] = cls.__slots__
        return tuple(n for n in slots if not n.startswith("_"))

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.names()}


class EventCounters(Counters):
    """Counted by the handler. Written on torch's threads without a lock: ``+=`` on an int
    attribute may, rarely, lose an increment between threads; a lock per event would cost
    every caller more than the count is worth."""

    __slots__ = (
        "dropped_after_shutdown",
        "dropped_queue_full",
        "heartbeat_logs_skipped",
        "internal_errors",
        "processed",
        "received",
        "unparsed",
        "worker_output_dropped",
        "worker_output_records",
    )
    received: int
    processed: int
    unparsed: int
    dropped_queue_full: int  # the bridge's own queue was full
    dropped_after_shutdown: int  # not processed: recorded after the exit flush closed the trace
    # model, or still queued when the exit flush ran out of time
    internal_errors: int
    heartbeat_logs_skipped: int
    worker_output_records: int  # workers' output lines (or tracebacks) made log records
    worker_output_dropped: int  # workers' output lines past the rate limit


class DeliveryCounters(Counters):
    """Counted on the export thread and on flushes, so updates take a lock."""

    __slots__ = (
        "_lock",
        "dropped_collector_outage",
        "dropped_invalid",
        "export_failed_attempts",
        "exported",
        "lost_at_exit",
    )
    exported: int
    export_failed_attempts: int
    dropped_collector_outage: int  # oldest records past the retry bound
    dropped_invalid: int  # records an exporter raised on (e.g. unencodable)
    lost_at_exit: int  # still buffered when the exit flush ran out of time

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def add(self, name: str, n: int) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)


PENDING_EXPORT = "pending_export"
"""Records held back while the collector does not answer (a gauge, not a counter)."""
DROPPED_SDK_QUEUE = "dropped_sdk_queue"
"""Records the export queues refused: full, or closed by the shutdown
(:class:`elastic_otel.emit.export_queue.QueueDrops`)."""
EXPORT_WARNINGS_SUPPRESSED = "export_warnings_suppressed"
"""Export warnings counted instead of printed."""

PIPELINE_KEYS = (PENDING_EXPORT, DROPPED_SDK_QUEUE, EXPORT_WARNINGS_SUPPRESSED)
ALL_KEYS = (*EventCounters.names(), *DeliveryCounters.names(), *PIPELINE_KEYS)
"""Every key of ``elastic_otel.stats()``, present (as 0) before the pipeline exists."""

DROP_REASONS = {
    "queue_full": "dropped_queue_full",
    "after_shutdown": "dropped_after_shutdown",
    "sdk_queue": DROPPED_SDK_QUEUE,
    "collector_outage": "dropped_collector_outage",
    "rejected": "dropped_invalid",
    "lost_at_exit": "lost_at_exit",
    "worker_output_rate": "worker_output_dropped",
}
"""``elastic_otel.reason`` value of the ``elastic_otel.dropped`` metric → the counter it reads."""
