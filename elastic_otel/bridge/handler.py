"""The ``otel`` destination: a :class:`logging.Handler` that never slows the job it observes.

torch calls :meth:`OtelHandler.emit` on its own threads; ``emit`` only appends the message to a
bounded queue and returns (no parsing, no lock held across I/O, no network), and the event
thread (:mod:`elastic_otel.bridge.event_thread`) does the rest. The process-wide handler is
:func:`get_handler`; its settings are read once, and its shutdown is a step of the process's
exit path. Design: ``docs/architecture.md`` (Life cycle, What the bridge costs the job).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from elastic_otel.bridge.event_thread import EventThread, Task, bridge_section, inside_bridge
from elastic_otel.bridge.process import BridgeProcess, bridge_process
from elastic_otel.config.settings import Settings
from elastic_otel.emit.counters import ALL_KEYS, EventCounters
from elastic_otel.parsing.torch_events import safe_text

if TYPE_CHECKING:  # the SDK, and the trace model: imported once the bridge starts
    from opentelemetry._logs import Logger

    from elastic_otel.bridge.conversion import Conversion, SpanObserver
    from elastic_otel.emit.emitter import Emitter
    from elastic_otel.emit.pipeline import Pipeline
    from elastic_otel.model.trace_model import WorkerLaunch

_logger = logging.getLogger("elastic_otel")

PipelineFactory = Callable[[], "Pipeline | None"]


class OtelHandler(logging.Handler):
    """The bridge handler registered as torch's ``otel`` event destination.

    ``pipeline_factory`` builds the :class:`~elastic_otel.emit.pipeline.Pipeline` (default: from
    the environment); ``None`` from it means nothing is exported (events are still counted).
    ``settings``: default, read from the environment now.
    """

    def __init__(
        self,
        pipeline_factory: PipelineFactory | None = None,
        settings: Settings | None = None,
        process: BridgeProcess | None = None,
    ) -> None:
        super().__init__(level=logging.NOTSET)
        self._factory = pipeline_factory
        self.process = bridge_process() if process is None else process
        self.settings = Settings.from_environment() if settings is None else settings
        self._exit_timeout = self.settings.exit_timeout_s
        self._traces = self.settings.traces
        self._exit_step = f"bridge handler {id(self):x}"
        self._start_lock = threading.Lock()
        self._new_process()
        if self.settings.fork_guard:
            # first: its hook must run in a child before any that starts threads
            self.process.fork_guard.watch()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        self.process.exit_path.after_fork_in_child()  # the parent's signal watcher is not ours
        if self._event_thread is not None:
            self._event_thread.after_fork_in_child()
        self._new_process()

    def _new_process(self) -> None:
        # Also the child's state after fork: it must not inherit the parent's queue, model,
        # (dead) event thread, counts, or exporters (a gRPC channel does not survive fork).
        # Its first event builds its own pipeline, as the parent's did.
        self.counters = EventCounters()
        self._pipeline: Pipeline | None = None
        self._event_thread: EventThread | None = None
        self._started = False
        self._closed = False  # shutdown began: no more flushes
        self._span_observer: SpanObserver | None = None

    # --- torch-facing API -----------------------------------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if record.args:
            try:
                msg = record.getMessage()
            except Exception as e:  # a bad %-format is still an event to show
                msg = f"{safe_text(record.msg)} % {safe_text(record.args)} ({type(e).__name__})"
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
        if inside_bridge():
            return  # a log record caused by our own emission: never re-enter
        try:
            if self._closed and not self._started:
                self.counters.received += 1
                self.counters.dropped_after_shutdown += 1  # shut down before it ever started
                return
            if not self._started:
                self.start()
            self.counters.received += 1
            event_thread = self._event_thread
            if event_thread is not None:
                event_thread.put(payload, created)
        except Exception:  # the training job must never see our failures
            self.counters.internal_errors += 1

    def worker_launch(
        self, run_id: str, local_ranks: list[int], timeout_s: float = 0.5
    ) -> WorkerLaunch | None:
        """The trace context for the workers ``run_id``'s agent is about to start, chosen by
        the event thread once what is queued (the agent's last events) was processed.

        Waits at most ``timeout_s``; ``None`` when the bridge has no trace model to ask
        (not started, traces off) or it did not answer in time.
        """
        running = self._running()
        if running is None or running[0].closed:
            return None
        event_thread, sink = running
        answer: list[WorkerLaunch | None] = []
        if not event_thread.call(
            lambda: answer.append(sink.reserve_workers(run_id, local_ranks)), timeout_s
        ):
            return None
        return answer[0] if answer else None

    def output_logger(self) -> Logger | None:
        """The SDK logger the bridge emits on (``None`` before it started, or exporting
        nothing): for records that need no trace model, such as the workers' output."""
        pipeline = self._pipeline
        return pipeline.logger if self._started and pipeline is not None else None

    def observe_spans(self, observer: SpanObserver | None) -> None:
        """Have ``observer`` see every batch of ended spans, on the event thread."""
        self._span_observer = observer
        running = self._running()
        if running is not None:
            running[1].span_observer = observer

    def schedule(self, task: Task, delay_s: float = 0.0) -> bool:
        """:meth:`EventThread.schedule` on this handler's; ``False`` when none runs."""
        event_thread = self._event_thread
        return event_thread is not None and event_thread.schedule(task, delay_s)

    def can_schedule(self) -> bool:
        """Whether :meth:`schedule` would run a task now."""
        event_thread = self._event_thread
        return event_thread is not None and event_thread.thread_alive and not self._closed

    def current_stalls(self) -> dict[str, float]:
        """Longest current wait per ``torchelastic.stalled.in`` kind, in seconds (0: none)."""
        running = self._running()
        return running[1].current_stalls() if running is not None else {}

    def _running(self) -> tuple[EventThread, Conversion] | None:
        """The event thread and the conversion it feeds, once started."""
        from elastic_otel.bridge.conversion import Conversion

        event_thread = self._event_thread
        if event_thread is None or not isinstance(event_thread.sink, Conversion):
            return None
        return event_thread, event_thread.sink

    def all_stats(self) -> dict[str, int]:
        """This handler's counters and its pipeline's delivery counters."""
        counters = dict.fromkeys(ALL_KEYS, 0)
        counters.update(self.counters.as_dict())
        pipeline = self._pipeline
        if pipeline is not None:
            counters.update(pipeline.counters())
        return counters

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Build the pipeline and start the event thread (idempotent; called on first event)."""
        with self._start_lock:
            if self._started:
                return
            self.process.fork_guard.hold_inherited_stacks()  # before the first bridge thread here
            with bridge_section():
                emitter = self._build_pipeline()
            from elastic_otel.bridge.conversion import Conversion
            from elastic_otel.model.trace_ids import job_salt
            from elastic_otel.model.trace_model import TraceModel

            settings = self.settings
            conversion = Conversion(
                TraceModel(
                    salt=job_salt(),
                    max_tracked=settings.max_open_spans,
                    heartbeat_logs=settings.heartbeat_logs,
                    stall_after_s=settings.stall_after_s,
                    round_trace_max_nodes=settings.round_trace_max_nodes,
                ),
                emitter,
                self.counters,
                traces=self._traces,
                raw_limit=settings.raw_limit,
                open_span_interval_s=settings.open_span_interval_s,
            )
            conversion.span_observer = self._span_observer
            self._event_thread = EventThread(conversion, self.counters, settings.queue_size)
            self._event_thread.start()
            self.process.exit_path.add(self._exit_step, self.shutdown, self._exit_timeout)
            watcher = self.process.exit_path.watch_signals(self.terminate)
            if watcher is not None:
                self._event_thread.watch_fd(watcher.reader.fileno(), watcher.on_readable)
            self.process.fork_guard.bridge_running = True
            self._started = True

    def _build_pipeline(self) -> Emitter | None:
        try:
            if self._factory is not None:
                self._pipeline = self._factory()
            else:
                from elastic_otel.emit.pipeline import build_pipeline

                self._pipeline = build_pipeline(
                    settings=self.settings,
                    gate=self.process.export_gate,
                    warnings=self.process.export_warnings,
                )
            if self._pipeline is None:
                return None
            from elastic_otel.version import __version__

            signal = self.settings.exception_signal
            return self._pipeline.emitter(__version__, self._traces, signal)
        except Exception as e:
            _logger.warning("elastic-otel: telemetry disabled, set-up failed: %s", e)
            self._pipeline = None
            return None

    def flush(self, timeout_s: float | None = None) -> bool:  # type: ignore[override]
        """Process queued events and export them; ``True`` when all got out in time.

        (``logging.Handler.flush`` returns nothing; ``logging.shutdown`` ignores the result.)
        """
        event_thread = self._event_thread
        if self._closed or event_thread is None:
            return (
                event_thread is None or event_thread.closed
            )  # logging.shutdown() flushes after our exit
        timeout_s = self._exit_timeout if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        drained = event_thread.drain(timeout_s)
        if self._pipeline is None:
            return drained
        return self._pipeline.flush(max(0.0, deadline - time.monotonic())) and drained

    def terminate(self, reason: str) -> None:
        """End the open spans as terminated by a signal (ERROR) and export them, bounded by
        the exit timeout; unlike :meth:`shutdown`, events recorded later are still processed.

        Called on the event thread, which reads the signal wakeup fd
        (:mod:`elastic_otel.bridge.process_exit`), while the main thread may be blocked in
        torch's C++ code, where torch's own signal handler cannot run yet; the export then
        runs on a thread of its own.
        """
        if self._closed or not self._started:
            return
        try:
            deadline = time.monotonic() + self._exit_timeout
            with bridge_section():
                running = self._running()
                if running is None:
                    return
                event_thread, sink = running

                def end_open_spans() -> None:
                    if not event_thread.closed:  # shutdown got there first: nothing is open
                        sink.terminate(reason)

                event_thread.call(end_open_spans, self._exit_timeout * 0.5)
                pipeline = self._pipeline
                if pipeline is None or self._closed:
                    return
                flush = functools.partial(
                    pipeline.flush, max(0.05, deadline - time.monotonic()), stop_on_failure=True
                )
                if event_thread.on_thread():  # the event thread never waits on the network
                    threading.Thread(target=flush, name="elastic-otel-flush", daemon=True).start()
                else:
                    flush()
        except Exception:  # the training job must never see our failures
            self.counters.internal_errors += 1

    def shutdown(self, reason: str = "process exit", error: bool = False) -> None:
        """End open spans, flush, and stop exporting; bounded by the exit timeout."""
        if self._closed:
            return
        self._closed = True
        self.process.exit_path.remove(self._exit_step)  # done here: not again at exit
        deadline = time.monotonic() + self._exit_timeout
        with bridge_section():
            event_thread = self._event_thread
            if event_thread is not None:
                event_thread.close(reason, error, self._exit_timeout * 0.5)
                event_thread.stop()
            pipeline = self._pipeline
            if pipeline is None:
                return
            try:
                pipeline.shutdown(max(0.05, deadline - time.monotonic()))
            except Exception:
                self.counters.internal_errors += 1
            lost = pipeline.delivery.lost_at_exit
            if lost and not pipeline.warnings.reported:
                _logger.warning(
                    "elastic-otel: %d telemetry records could not be exported before exit "
                    "(collector unreachable)",
                    lost,
                )


# --- the process's handler ---------------------------------------------------------------------


def get_handler(settings: Settings | None = None) -> OtelHandler:
    """The process's bridge handler (made on first use, with ``settings`` or those of the
    environment then, without starting the SDK); held by the process's
    :class:`~elastic_otel.bridge.process.BridgeProcess`."""
    process = bridge_process()
    with process.lock:
        if not isinstance(process.handler, OtelHandler):
            process.handler = OtelHandler(settings=settings, process=process)
        return process.handler


def current_handler() -> OtelHandler | None:
    """The process's handler if one was made, without making one."""
    handler = bridge_process().handler
    return handler if isinstance(handler, OtelHandler) else None
