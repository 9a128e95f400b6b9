"""Delivery: between the export queues and the network, survive collector outages.

The OTLP exporters retry a batch until their timeout, then drop it, and log every attempt: a job
that outlives a collector restart would lose events and flood its console. :class:`OutageBuffer`
keeps failed batches in a bounded backlog and sends them again once the collector answers;
:class:`ExportWarnings` reduces export problems to one concise line. Both run on the export
thread (:mod:`elastic_otel.emit.export_thread`) and on flushes. Design: ``docs/guarantees.md``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol
from urllib.parse import unquote

from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from elastic_otel.emit.counters import DeliveryCounters
from elastic_otel.names.environment_variables import DEFAULT_RETRY_QUEUE_SIZE

_CHUNK = 512
_DRAIN_WAIT_S = 0.05  # at exit: how long to wait for an export under way before leaving it be
_FIRST_BACKOFF_S = 1.0
_MAX_BACKOFF_S = 30.0

_logger = logging.getLogger("elastic_otel")


class Exporter(Protocol):
    """What :class:`OutageBuffer` needs of a span or log record exporter."""

    def export(self, batch: Sequence[Any], /) -> Any: ...

    def shutdown(self) -> None: ...


class OutageBuffer:
    """An exporter wrapper that holds failed batches and re-sends them when the collector is back.

    Works for span and log exporters alike: it only forwards ``export`` / ``shutdown`` /
    ``force_flush`` and compares the result's name with ``SUCCESS``.
    """

    def __init__(
        self,
        inner: Exporter,
        stats: DeliveryCounters,
        signal: str,
        max_items: int = DEFAULT_RETRY_QUEUE_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.stats = stats
        self.signal = signal
        self.max_items = max(1, max_items)
        self._backlog: deque[Any] = deque()
        self._lock = threading.Lock()
        self._clock = clock
        self._retry_at = 0.0
        self._backoff = _FIRST_BACKOFF_S
        self._warned_overflow = False
        self._warned_invalid = False
        self._interrupted = False
        self._success = _result(inner, "SUCCESS")
        self._failure = _result(inner, "FAILURE")

    @property
    def pending(self) -> int:
        return len(self._backlog)

    def export(self, batch: Sequence[Any]) -> Any:
        if self._interrupted:  # exiting with the collector down: the exporter is closed
            self.stats.add("lost_at_exit", len(batch))
            return self._failure
        with self._lock:
            self._backlog.extend(batch)
            if self._clock() < self._retry_at:
                self._trim()
                return self._success  # deferred; the SDK would only log a failure
            result = self._send_backlog()
            self._trim()  # after the attempt: a batch is never cut while the collector answers
            return result

    def _send_backlog(self) -> Any:
        while self._backlog:
            if self._interrupted:  # exiting: the exporter is closed, nothing more will go out
                self.stats.add("lost_at_exit", len(self._backlog))
                self._backlog.clear()
                return self._failure
            chunk = [self._backlog.popleft() for _ in range(min(_CHUNK, len(self._backlog)))]
            try:
                ok = _is_success(self.inner.export(chunk))
            except Exception as e:
                if self._interrupted:  # closed under an export in flight: not the records' fault
                    self.stats.add("lost_at_exit", len(chunk))
                    continue
                # Not an outage: this chunk cannot be encoded or sent, and retrying it would
                # block every record behind it. Drop it, count it, say so once.
                self.stats.add("dropped_invalid", len(chunk))
                if not self._warned_invalid:
                    self._warned_invalid = True
                    _logger.warning(
                        "elastic-otel: dropped %d %s records the exporter rejected (%s: %s)",
                        len(chunk),
                        self.signal,
                        type(e).__name__,
                        e,
                    )
                continue
            if ok:
                self.stats.add("exported", len(chunk))
                self._backoff = _FIRST_BACKOFF_S
                self._retry_at = 0.0
                continue
            if self._interrupted:  # its exporter was closed under it at exit: not coming back
                self.stats.add("lost_at_exit", len(chunk))
                continue
            self.stats.add("export_failed_attempts", 1)
            self._backlog.extendleft(reversed(chunk))
            self._retry_at = self._clock() + self._backoff
            self._backoff = min(self._backoff * 2, _MAX_BACKOFF_S)
            return self._failure
        return self._success

    def _trim(self) -> None:
        excess = len(self._backlog) - self.max_items
        if excess <= 0:
            return
        for _ in range(excess):
            self._backlog.popleft()
        self.stats.add("dropped_collector_outage", excess)
        if not self._warned_overflow:
            self._warned_overflow = True
            _logger.warning(
                "elastic-otel: collector unreachable and %d %s records buffered; dropping the "
                "oldest (counted in elastic_otel.stats(); raise ELASTIC_OTEL_RETRY_QUEUE_SIZE)",
                self.max_items,
                self.signal,
            )

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Try the backlog now, ignoring the back-off."""
        with self._lock:
            if self._backlog:
                self._retry_at = 0.0
                self._send_backlog()
            pending = bool(self._backlog)
        flush = getattr(self.inner, "force_flush", None)
        if callable(flush):
            flush(timeout_millis)
        return not pending

    def shutdown(self) -> None:
        if not self._interrupted:  # already shut down
            self.inner.shutdown()

    def drain(self) -> int:
        """At exit, after the exporter's shutdown: take what is still held back, to be counted
        as lost. An export still under way (holding the lock) counts its own records and the
        rest when it looks again: each record is counted once."""
        if not self._lock.acquire(timeout=_DRAIN_WAIT_S):
            self._interrupted = True
            return 0
        try:
            held = len(self._backlog)
            self._backlog.clear()
            return held
        finally:
            self._lock.release()

    def interrupt(self) -> None:
        """At exit with the collector down: close the exporter now, which cuts its retry
        back-off short; what is still exported afterwards counts as ``lost_at_exit``."""
        self._interrupted = True
        self.inner.shutdown()


class SpanOutageBuffer(OutageBuffer, SpanExporter):
    """An :class:`OutageBuffer` for a span exporter, typed as one."""


class LogOutageBuffer(OutageBuffer, LogRecordExporter):
    """An :class:`OutageBuffer` for a log record exporter, typed as one."""


def _result(inner: Any, name: str) -> Any:
    """The exporter's own result enum member (SpanExportResult / LogRecordExportResult)."""
    enum = LogRecordExportResult if isinstance(inner, LogRecordExporter) else SpanExportResult
    return enum[name]


def _is_success(result: Any) -> bool:
    return getattr(result, "name", None) == "SUCCESS"


class ExportWarnings(logging.Filter):
    """Lets the first export warning through, concise and scrubbed; counts the rest. One per
    process (held by :class:`elastic_otel.bridge.process.BridgeProcess`): the OpenTelemetry
    loggers are process-wide, and so is "reported once"."""

    def __init__(self) -> None:
        super().__init__()
        self.reported = False
        self.suppressed = 0
        self.seen = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        self.seen += 1
        if self.reported:
            self.suppressed += 1
            return False
        self.reported = True
        try:
            detail = record.getMessage().splitlines()[0]
        except Exception:
            detail = str(record.msg)
        for secret in _header_values():
            detail = detail.replace(secret, "***")
        hint = ""
        if "https" in detail or "SSL" in detail or "certificate" in detail.lower():
            hint = " (check OTEL_EXPORTER_OTLP_CERTIFICATE)"
        record.msg = (
            "elastic-otel: telemetry export problem: %s%s; the job is not affected, export "
            "is retried in the background and further errors are only counted "
            "(elastic_otel.stats())"
        )
        record.args = (detail[:300], hint)
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        return True


def _header_values() -> list[str]:
    """Values of OTEL_EXPORTER_OTLP_*HEADERS, never to be printed."""
    values: list[str] = []
    for name, raw in os.environ.items():
        if name.startswith("OTEL_EXPORTER_OTLP") and name.endswith("HEADERS"):
            for pair in raw.split(","):
                _, _, value = pair.partition("=")
                value = value.strip()
                if len(value) >= 4:
                    values += {value, unquote(value)}
    return values


def install_export_warnings(filt: ExportWarnings) -> None:
    """Attach ``filt`` to every OpenTelemetry logger that exists now (filters do not inherit)."""
    names = [n for n in logging.root.manager.loggerDict if n.startswith("opentelemetry")]
    for name in ["opentelemetry", *names]:
        logger = logging.getLogger(name)
        if filt not in logger.filters:
            # First: the SDK's own DuplicateFilter would otherwise hide repeats from the count.
            logger.filters.insert(0, filt)
