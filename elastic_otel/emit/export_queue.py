"""The export queues, and the SDK's span and log record processor interfaces over them: what the
SDK's ``BatchSpanProcessor`` and ``BatchLogRecordProcessor`` do, with the SDK's variables, but
without a thread of their own: the process's export thread (:mod:`elastic_otel.emit.export_thread`)
sends their batches. Handing a record over only appends it to a bounded queue, and wakes the
export thread when the queue holds a batch: it never blocks and never waits on the network.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, Context, attach, detach, set_value
from opentelemetry.sdk._logs import LogRecordProcessor, ReadableLogRecord, ReadWriteLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

from elastic_otel.config.environment import env_float, env_int
from elastic_otel.emit.export_thread import ExportThread

_SHUTDOWN_EXPORT_MS = 30_000  # the SDK's batch processors' bound on their last export

_logger = logging.getLogger("elastic_otel")


@dataclass(frozen=True)
class BatchSettings:
    """How a queue batches: the SDK's ``OTEL_BSP_*`` (spans) or ``OTEL_BLRP_*`` (logs)."""

    signal: str
    delay_s: float
    batch_size: int
    max_queue_size: int
    queue_variable: str  # named in the queue-full warning

    @classmethod
    def from_environment(cls, signal: str, max_queue_size: int | None = None) -> BatchSettings:
        """``signal``'s (``traces`` or ``logs``) variables, with the SDK's defaults;
        ``max_queue_size``: the queue's size unless its variable is set."""
        prefix, default_delay_ms = _VARIABLES[signal]
        queue = prefix + "MAX_QUEUE_SIZE"
        size = _positive(queue, 2048)
        if max_queue_size is not None and not os.environ.get(queue, "").strip():
            size = max_queue_size
        delay_s = _positive(prefix + "SCHEDULE_DELAY", default_delay_ms) / 1e3
        batch_size = min(_positive(prefix + "MAX_EXPORT_BATCH_SIZE", 512), size)
        return cls(signal, delay_s, batch_size, size, queue)


_VARIABLES = {"traces": ("OTEL_BSP_", 5000), "logs": ("OTEL_BLRP_", 1000)}
"""Each signal's variables' prefix (the SDK's names) and default delay in milliseconds."""


def _positive(name: str, default: int) -> int:
    value = env_int(name, default)
    return value if value > 0 else default


def millis_variable(name: str, default: float) -> float:
    """A positive duration in milliseconds from ``name``, else ``default``."""
    value = env_float(name, default)
    return value if value > 0 else default


class QueueDrops:
    """Records the export queues refused (full, or closed), counted; a full queue is said
    once. One per pipeline, shared by its queues."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._warned = False

    def add(self, full: BatchSettings | None = None) -> None:
        """Count one record refused; ``full``: the settings of the full queue that refused it."""
        with self._lock:
            self.count += 1
            warn = full is not None and not self._warned
            self._warned = self._warned or warn
        if warn and full is not None:
            _logger.warning(
                "elastic-otel: the %s export queue is full (%d records); dropping new ones "
                "(counted in elastic_otel.stats() as dropped_sdk_queue; raise %s)",
                full.signal,
                full.max_queue_size,
                full.queue_variable,
            )

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork


class ExportQueue:
    """One exporter's bounded queue of spans or log records. The export thread exports it when
    its delay is up or it holds a batch, :meth:`flush` at once; the lock taken around each
    export is shared, so its exporter never exports on two threads at once."""

    def __init__(
        self,
        exporter: Any,
        thread: ExportThread,
        settings: BatchSettings,
        drops: QueueDrops | None = None,
    ) -> None:
        self.exporter = exporter
        self.settings = settings
        self.drops = QueueDrops() if drops is None else drops
        self.closed = False  # shut down, or inherited by a forked child: records are refused
        self._forked = False
        self._records: deque[Any] = deque()
        self._export_lock = threading.Lock()
        self._due = time.monotonic() + settings.delay_s
        self._thread = thread
        self._warned = False
        self._shut = False
        thread.add(self)

    def put(self, record: Any) -> None:
        """Queue ``record``, or count it dropped; wakes the thread at a full batch."""
        records = self._records
        if self.closed:
            self.drops.add()
        elif len(records) >= self.settings.max_queue_size:
            self.drops.add(self.settings)
        else:
            records.append(record)
            if len(records) >= self.settings.batch_size:
                self._thread.wake()

    def due_at(self) -> float:
        return self._due

    def run(self, now: float) -> None:
        if now >= self._due:
            self._due = now + self.settings.delay_s
            full_batches_only = False
        elif len(self._records) >= self.settings.batch_size:
            full_batches_only = True
        else:
            return
        with self._export_lock:
            self._send(len(self._records), full_batches_only, float("inf"))

    def flush(self, timeout_millis: float = 30_000) -> bool:
        """Export what is queued now, waiting at most ``timeout_millis`` for an export under
        way and between batches; ``True`` when it all went to the exporter."""
        if self._forked:
            return False
        deadline = time.monotonic() + timeout_millis / 1e3
        if not self._export_lock.acquire(timeout=max(0.0, timeout_millis / 1e3)):
            return False
        try:
            return self._send(len(self._records), False, deadline)
        finally:
            self._export_lock.release()

    def close(self) -> None:
        """Refuse records from now on (counted as dropped); off the export thread."""
        self.closed = True
        self._thread.remove(self)

    def shutdown(self) -> None:
        """Close, export what is left, and shut the exporter down."""
        if self._shut or self._forked:  # a child's: the parent's exporter, not the child's
            return
        self._shut = True
        self.close()
        self.flush(_SHUTDOWN_EXPORT_MS)
        self.exporter.shutdown()

    def take_all(self) -> int:
        """Take every record still queued (at exit, to count them lost); how many."""
        taken = 0
        while self._take(1):
            taken += 1
        return taken

    def after_fork_in_child(self) -> None:
        self.closed = self._forked = True
        self._records.clear()
        self._export_lock = threading.Lock()
        self.drops.after_fork_in_child()

    def _send(self, count: int, full_batches_only: bool, deadline: float) -> bool:
        """Export up to ``count`` records in batches (under the export lock)."""
        size = self.settings.batch_size
        while count > 0 and not self._forked:
            if full_batches_only and len(self._records) < size:
                return True
            if time.monotonic() > deadline:
                return False
            batch = self._take(min(count, size))
            if not batch:  # taken at exit meanwhile
                return True
            count -= len(batch)
            self._export(batch)
        return not self._forked

    def _take(self, n: int) -> list[Any]:
        batch = []
        try:
            for _ in range(n):
                batch.append(self._records.popleft())
        except IndexError:  # another thread took the rest
            pass
        return batch

    def _export(self, batch: Sequence[Any]) -> None:
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            self.exporter.export(batch)
        except Exception as e:  # the bridge's exporters catch their own; a bare one may not
            if not self._warned:
                self._warned = True
                _logger.warning(
                    "elastic-otel: %s export failed (%s: %s)",
                    self.settings.signal,
                    type(e).__name__,
                    e,
                )
        finally:
            detach(token)


class QueuedSpanProcessor(SpanProcessor):
    """A ``BatchSpanProcessor`` whose batches ``thread`` exports (``OTEL_BSP_*``).

    ``settings``: default, from the environment; ``drops``: where refused spans are counted
    (default: a count of its own)."""

    def __init__(
        self,
        exporter: SpanExporter,
        thread: ExportThread,
        settings: BatchSettings | None = None,
        drops: QueueDrops | None = None,
    ) -> None:
        settings = settings or BatchSettings.from_environment("traces")
        self.queue = ExportQueue(exporter, thread, settings, drops)

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self.queue.put(span)

    def shutdown(self) -> None:
        self.queue.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.queue.flush(timeout_millis)


class QueuedLogRecordProcessor(LogRecordProcessor):
    """A ``BatchLogRecordProcessor`` whose batches ``thread`` exports (``OTEL_BLRP_*``).

    ``settings`` and ``drops`` as for :class:`QueuedSpanProcessor`."""

    def __init__(
        self,
        exporter: LogRecordExporter,
        thread: ExportThread,
        settings: BatchSettings | None = None,
        drops: QueueDrops | None = None,
    ) -> None:
        settings = settings or BatchSettings.from_environment("logs")
        self.queue = ExportQueue(exporter, thread, settings, drops)

    def on_emit(self, log_record: ReadWriteLogRecord) -> None:
        # As the SDK's batch processor: a shallow copy without the context, which may hold
        # much more than the record needs while it waits in the queue.
        record = copy.copy(log_record.log_record)
        record.context = Context()
        resource = log_record.resource if log_record.resource is not None else Resource.get_empty()
        self.queue.put(
            ReadableLogRecord(
                log_record=record,
                resource=resource,
                instrumentation_scope=log_record.instrumentation_scope,
                limits=log_record.limits,
            )
        )

    def shutdown(self) -> None:
        self.queue.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.queue.flush(timeout_millis)
