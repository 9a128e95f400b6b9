"""The ``otel`` destination: a :class:`logging.Handler` that never slows the job it observes.

torch calls :meth:`OtelHandler.emit` on its agent thread, its keep-alive timer thread, or
wherever an event is recorded. ``emit`` only appends the message and its creation time to a
bounded queue (a deque append; no parsing, no locks held across I/O, no network) and returns.
One worker thread parses, runs the trace model and feeds the SDK's batch processors, which
export on their own threads. Past the queue bound, events are dropped and counted
(:func:`elastic_otel.stats`), and one warning says so.

At exit the queue is drained, spans still open are ended and marked, and the SDK pipeline is
flushed, all within ``ELASTIC_OTEL_EXIT_TIMEOUT`` seconds (default 2).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from elastic_otel import environment_variables as env
from elastic_otel.environment_variables import DEFAULT_QUEUE_SIZE, env_flag, env_float, env_int
from elastic_otel.parsing import DEFAULT_RAW_LIMIT, EventKind, _safe_text, parse_event
from elastic_otel.trace_ids import job_salt
from elastic_otel.tracing import DEFAULT_MAX_TRACKED, Output, TraceModel

_logger = logging.getLogger("elastic_otel")

DEFAULT_EXIT_TIMEOUT_S = 2.0
# The worker wakes itself this often; torch's thread wakes it only for a backlog. Waking a
# sleeping thread per event costs the caller a futex call and often a context switch.
_POLL_S = 0.05
_WAKE_BACKLOG = 256
# Keys of the pipeline's delivery counters, present (as 0) before the pipeline exists.
_DELIVERY_KEYS = (
    "exported",
    "export_failed_attempts",
    "dropped_collector_outage",
    "lost_at_exit",
    "pending_export",
    "export_warnings_suppressed",
    "dropped_sdk_queue",
    "dropped_invalid",
)


class Stats:
    """Counters a user can read with :func:`elastic_otel.stats`."""

    __slots__ = ("dropped_queue_full", "internal_errors", "processed", "received", "unparsed")

    def __init__(self) -> None:
        self.received = 0
        self.processed = 0
        self.dropped_queue_full = 0
        self.unparsed = 0
        self.internal_errors = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class OtelHandler(logging.Handler):
    """The bridge handler registered as torch's ``otel`` event destination.

    ``pipeline_factory`` builds the :class:`~elastic_otel.pipeline.Pipeline`; it is called
    once, on the thread of the first event (or eagerly through :meth:`start`), never on the
    worker thread, so that it cannot race interpreter shutdown.
    """

    def __init__(self, pipeline_factory: Callable[[], Any] | None = None) -> None:
        super().__init__(level=logging.NOTSET)
        self._factory = pipeline_factory  # None: elastic_otel.pipeline.build_pipeline
        self._queue_size = max(1, env_int(env.ELASTIC_OTEL_QUEUE_SIZE, DEFAULT_QUEUE_SIZE))
        self._exit_timeout = env_float(env.ELASTIC_OTEL_EXIT_TIMEOUT, DEFAULT_EXIT_TIMEOUT_S)
        self._raw_limit = env_int(env.ELASTIC_OTEL_RAW_LIMIT, DEFAULT_RAW_LIMIT)
        self._traces = env_flag(env.ELASTIC_OTEL_TRACES, True)
        self.stats = Stats()
        self._init_state()
        self._start_lock = threading.Lock()
        self._pipeline: Any = None
        self._emitter: Any = None
        self._started = False
        self._closed = False  # shutdown began: no more flushes
        self._stopped = False  # shutdown done: the worker thread ends
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def _init_state(self) -> None:
        self._queue: deque[tuple[object, float]] = deque()
        self._wake = threading.Event()
        self._idle = threading.Condition(threading.Lock())
        self._busy = False
        self._worker: threading.Thread | None = None
        self._local = threading.local()
        self._model = TraceModel(
            salt=job_salt(),
            max_tracked=env_int(env.ELASTIC_OTEL_MAX_OPEN_SPANS, DEFAULT_MAX_TRACKED),
            heartbeat_logs=env_flag(env.ELASTIC_OTEL_HEARTBEAT_LOGS, True),
        )
        self._warned_drop = False

    # --- torch-facing API -----------------------------------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if record.args:
            try:
                msg = record.getMessage()
            except Exception as e:  # a bad %-format is still an event to show
                msg = f"{_safe_text(record.msg)} % {_safe_text(record.args)} ({type(e).__name__})"
        self._put(msg, record.created)

    def info(self, event: object) -> None:
        """torch documents ``get_logging_handler(dest).info(event)``; accept it."""
        self._put(event, time.time())

    def handle(self, record: logging.LogRecord) -> bool:
        # logging.Handler.handle takes the handler lock around emit; our emit is lock-free.
        if self.filters and not self.filter(record):
            return False
        self.emit(record)
        return True

    def _put(self, payload: object, created: float) -> None:
        if getattr(self._local, "inside", False):
            return  # a log record caused by our own emission: never re-enter
        try:
            if not self._started:
                self.start()
            self.stats.received += 1
            if len(self._queue) >= self._queue_size:
                self.stats.dropped_queue_full += 1
                if not self._warned_drop:
                    self._warned_drop = True
                    _logger.warning(
                        "elastic-otel: event queue full (%d); dropping events, see "
                        "elastic_otel.stats() (raise %s)",
                        self._queue_size,
                        env.ELASTIC_OTEL_QUEUE_SIZE,
                    )
                return
            self._queue.append((payload, created))
            if len(self._queue) >= _WAKE_BACKLOG and not self._wake.is_set():
                self._wake.set()
        except Exception:  # the training job must never see our failures
            self.stats.internal_errors += 1

    def all_stats(self) -> dict[str, int]:
        """This handler's counters and its pipeline's delivery counters."""
        counters = self.stats.as_dict()
        counters["heartbeat_logs_skipped"] = self._model.heartbeat_logs_skipped
        counters.update(dict.fromkeys(_DELIVERY_KEYS, 0))
        pipeline = self._pipeline
        if pipeline is not None and hasattr(pipeline, "delivery"):
            counters.update(pipeline.delivery.as_dict())
            counters["pending_export"] = pipeline.pending()
            counters["export_warnings_suppressed"] = pipeline.warnings.suppressed
            counters["dropped_sdk_queue"] = pipeline.warnings.queue_full
        return counters

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Build the pipeline and start the worker (idempotent; called on first event)."""
        with self._start_lock:
            if self._started:
                return
            self._local.inside = True
            try:
                factory = self._factory
                if factory is None:
                    from elastic_otel.pipeline import build_pipeline as factory
                self._pipeline = factory()
                if self._pipeline is not None:
                    from elastic_otel import __version__
                    from elastic_otel.emitter import Emitter

                    p = self._pipeline
                    self._emitter = Emitter(
                        p.logger,
                        p.span_processor if self._traces else None,
                        p.resource,
                        __version__,
                    )
            except Exception as e:
                _logger.warning("elastic-otel: telemetry disabled, set-up failed: %s", e)
                self._pipeline = None
            finally:
                self._local.inside = False
            self._start_worker()
            atexit.register(self.shutdown)
            self._install_sigterm()
            self._started = True

    def _install_sigterm(self) -> None:
        """Flush on SIGTERM where nobody handles it (the default would skip atexit).

        torchrun installs its own handler once workers start (raising SignalException, which
        exits through atexit); before that, and in plain scripts, this one applies.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):
            pass

    def _on_sigterm(self, signum: int, _frame: object) -> None:
        self.shutdown(reason=f"process terminated ({signal.Signals(signum).name})", error=True)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _start_worker(self) -> None:
        self._worker = threading.Thread(target=self._run, name="elastic-otel", daemon=True)
        try:
            self._worker.start()
        except RuntimeError:  # interpreter shutting down: events are processed inline
            self._worker = None

    def flush(self, timeout_s: float | None = None) -> bool:
        """Process queued events and export them; ``True`` when all got out in time."""
        if self._closed:
            return not self._queue  # logging.shutdown() flushes handlers after our exit flush
        timeout_s = self._exit_timeout if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        drained = self._drain(timeout_s)
        if self._pipeline is None:
            return drained
        return self._pipeline.flush(max(0.0, deadline - time.monotonic())) and drained

    def shutdown(self, reason: str = "process exit", error: bool = False) -> None:
        """End open spans, flush, and stop exporting; bounded by the exit timeout."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self._exit_timeout
        try:
            self._drain(self._exit_timeout * 0.5)
            self._local.inside = True
            if self._model.terminated_by and not error:
                reason, error = self._model.terminated_by, True
            self._deliver(self._model.close_all(time.time_ns(), reason, error))
            pipeline = self._pipeline
            if pipeline is not None:
                pipeline.shutdown(max(0.05, deadline - time.monotonic()))
                lost = pipeline.delivery.lost_at_exit
                if lost and not pipeline.warnings.reported:
                    _logger.warning(
                        "elastic-otel: %d telemetry records could not be exported before exit "
                        "(collector unreachable)",
                        lost,
                    )
        except Exception:
            self.stats.internal_errors += 1
        finally:
            self._local.inside = False
            self._stopped = True
            self._wake.set()

    # --- worker ---------------------------------------------------------------------------

    def _drain(self, timeout_s: float) -> bool:
        """Wait until the queue is empty and the worker idle (or process inline)."""
        if self._worker is None or not self._worker.is_alive():
            self._process_all()
            return True
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        with self._idle:
            while self._queue or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(min(remaining, 0.05))
                self._wake.set()
        return True

    def _run(self) -> None:
        self._local.inside = True
        while not self._stopped:
            self._wake.wait(_POLL_S)
            self._wake.clear()
            with self._idle:
                self._busy = True
            try:
                self._process_all()
            except BaseException:  # keep the worker alive whatever happens
                self.stats.internal_errors += 1
            finally:
                with self._idle:
                    self._busy = False
                    self._idle.notify_all()

    def _process_all(self) -> None:
        queue = self._queue
        while queue:
            try:
                payload, created = queue.popleft()
            except IndexError:
                return
            try:
                self._process(payload, created)
            except Exception:
                self.stats.internal_errors += 1
                if self.stats.internal_errors == 1:
                    _logger.warning("elastic-otel: failed to convert an event", exc_info=True)

    def _process(self, payload: object, created: float) -> None:
        event = parse_event(payload, int(created * 1e9), self._raw_limit)
        self.stats.processed += 1
        if event.kind is EventKind.UNPARSED:
            self.stats.unparsed += 1
        if self._emitter is None:
            return
        if self._traces:
            self._deliver(self._model.process(event))
        else:
            self._emitter.emit_log(event, 0, 0)

    def _deliver(self, out: Output) -> None:
        emitter = self._emitter
        if emitter is None:
            return
        for span in out.spans:
            emitter.emit_span(span)
        for event, trace_id, span_id in out.logs:
            emitter.emit_log(event, trace_id, span_id)

    def _after_fork(self) -> None:
        # The child must not inherit the parent's queue, model, (dead) worker thread, or its
        # exporters: a gRPC channel does not survive fork. The child's first event builds its
        # own pipeline, as the parent's did; the parent's atexit hook stays idempotent.
        self._init_state()
        self._start_lock = threading.Lock()
        self._pipeline = self._emitter = None
        self._started = self._closed = self._stopped = False
