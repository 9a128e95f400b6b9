"""One event's way through the bridge: parse → trace model → OpenTelemetry emission.

:class:`Conversion` is the :class:`~elastic_otel.bridge.event_thread.Sink` of the bridge's event
thread, the only thread that calls it, so the trace model it owns needs no lock. It is also
what ``elastic-otel replay`` (:mod:`elastic_otel.cli.replay`) feeds the events it finds in log
files, one conversion per file: :meth:`Conversion.convert` is the one place where a parsed
event becomes model updates and emitted records, so a replayed log and a live job cannot
diverge there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from elastic_otel.emit.counters import EventCounters
from elastic_otel.model.snapshots import HEARTBEAT, STOP, SnapshotSchedule
from elastic_otel.model.spans import LogOut, Output, SpanRecord
from elastic_otel.model.trace_model import TraceModel, WorkerLaunch
from elastic_otel.names.environment_variables import DEFAULT_RAW_LIMIT
from elastic_otel.parsing.torch_events import ElasticEvent, EventKind, parse_event

SpanObserver = Callable[[list[SpanRecord]], None]

if TYPE_CHECKING:  # the emitter imports the OpenTelemetry SDK
    from elastic_otel.emit.emitter import Emitter


class Conversion:
    """Turns events into log records and spans on ``emitter`` (``None``: count only)."""

    def __init__(
        self,
        model: TraceModel,
        emitter: Emitter | None,
        counters: EventCounters | None = None,
        traces: bool = True,
        raw_limit: int = DEFAULT_RAW_LIMIT,
        open_span_interval_s: float = 0.0,
    ) -> None:
        self.snapshots = SnapshotSchedule(open_span_interval_s)
        self.model = model
        self.emitter = emitter
        self.counters = EventCounters() if counters is None else counters
        self.traces = traces
        self.raw_limit = raw_limit
        self.span_observer: SpanObserver | None = None  # e.g. the recovery metrics

    def process(self, payload: object, created: float) -> None:
        """Parse and convert one event recorded at ``created`` (seconds since the epoch)."""
        self.convert(self.parse(payload, int(created * 1e9)))

    def parse(self, payload: object, created_ns: int) -> ElasticEvent:
        """``payload`` (JSON text, dict, torch's event object) as an event; never raises."""
        return parse_event(payload, created_ns, self.raw_limit)

    def convert(self, event: ElasticEvent) -> Output:
        """Count ``event``, apply it to the trace model and emit what that ended; returns what
        was handed to the emitter (nothing without one; without traces, the event's log)."""
        self.counters.processed += 1
        if event.kind is EventKind.UNPARSED:
            self.counters.unparsed += 1
        emitter = self.emitter
        if emitter is None:
            return Output()
        if not self.traces:
            out = Output(logs=[LogOut(event, 0, 0)])  # a log record of no span
            emitter.emit_output(out)
            return out
        out = self.model.process(event)
        self._emit(emitter, out)
        self.counters.heartbeat_logs_skipped = self.model.heartbeat_logs_skipped
        return out

    def tick(self, now_ns: int) -> None:
        """Time-driven output: stall reports (:mod:`elastic_otel.model.stalls`) and open-span
        snapshots (:mod:`elastic_otel.model.snapshots`)."""
        emitter = self.emitter
        if emitter is None or not self.traces:
            return
        out = self.model.tick(now_ns)
        if out.logs or out.spans:
            self._emit(emitter, out)
        heartbeats, stopped = self.snapshots.due(self.model.open_spans(), now_ns)
        for span in heartbeats:
            emitter.emit_partial(span, HEARTBEAT, now_ns, self.snapshots.frequency)
        for span in stopped:
            emitter.emit_partial(span, STOP, now_ns, self.snapshots.frequency)

    def _emit(self, emitter: Emitter, out: Output) -> None:
        emitter.emit_output(out)
        observer = self.span_observer
        if observer is not None and out.spans:
            try:
                observer(out.spans)
            except Exception:  # the spans are out; only what is derived from them is lost
                self.counters.internal_errors += 1

    def reserve_workers(self, run_id: str, local_ranks: list[int]) -> WorkerLaunch | None:
        """The trace context of the workers about to start (``None``: no traces)."""
        if self.emitter is None or not self.traces:
            return None
        return self.model.reserve_workers(run_id, local_ranks)

    def current_stalls(self) -> dict[str, float]:
        """Longest current wait per kind, in seconds (read from any thread)."""
        return self.model.stall_watch.current

    def close(self, reason: str, error: bool) -> None:
        """End open spans; when torch said the agent was killed by a signal, say that."""
        if self.model.terminated_by and not error:
            reason, error = self.model.terminated_by, True
        self.end_all(time.time_ns(), reason, error)

    def end_all(self, time_ns: int, reason: str, error: bool = False) -> Output:
        """End every open span at ``time_ns`` and emit them; returns what was emitted.
        :meth:`close` is this at a process's exit; replay calls it at a log's last event."""
        out = self.model.close_all(time_ns, reason, error)
        if self.emitter is not None:
            self._emit(self.emitter, out)
        return out

    def terminate(self, reason: str) -> None:
        """End every open span as terminated by a signal; the sink stays open for the events
        torch records afterwards (see :meth:`TraceModel.terminate`)."""
        out = self.model.terminate(time.time_ns(), reason)
        if self.emitter is not None:
            self._emit(self.emitter, out)
