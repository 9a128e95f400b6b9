"""Trace model: torch elastic events of one process → ended spans and correlated log records.

Rendezvous events go to :class:`~elastic_otel.model.rendezvous.RendezvousModel`, agent and
worker events to :class:`~elastic_otel.model.agent.AgentModel`; this module builds both and
joins them, since neither imports the other. Bounded state, one owner thread (the bridge's
event thread), no torch, no SDK. Design: ``docs/architecture.md`` (The trace model's parts).
"""

from __future__ import annotations

from collections.abc import Iterator

from elastic_otel.model.agent import AgentModel, WorkerLaunch
from elastic_otel.model.rendezvous import RendezvousModel
from elastic_otel.model.spans import DEFAULT_EVENT_LIMIT, Output, SpanLink, SpanRecord, SpanRef
from elastic_otel.model.stalls import StallWatch
from elastic_otel.model.trace_ids import TraceIds
from elastic_otel.names import attributes as A
from elastic_otel.names.environment_variables import DEFAULT_MAX_OPEN_SPANS
from elastic_otel.parsing.torch_events import ElasticEvent, EventKind

_TICK_NS = 1_000_000_000  # waits are looked at once a second at most


class TraceModel:
    """Feed :meth:`process` the events of one process in order; collect ended spans and logs."""

    def __init__(
        self,
        salt: str = "",
        max_tracked: int = DEFAULT_MAX_OPEN_SPANS,
        event_limit: int = DEFAULT_EVENT_LIMIT,
        heartbeat_logs: bool = True,
        stall_after_s: float = 0.0,
        round_trace_max_nodes: int = 0,
    ) -> None:
        self.max_tracked = max(1, max_tracked)
        self.stall_watch = StallWatch(stall_after_s)
        self._last_tick = 0
        trace_ids = TraceIds(salt)
        # The rendezvous model tells this model (a RoundListener relaying to the agent model);
        # the agent model asks the rendezvous model (its RoundView).
        self.rendezvous = RendezvousModel(
            trace_ids, self, event_limit, heartbeat_logs, round_trace_max_nodes
        )
        self.agents = AgentModel(trace_ids, self.rendezvous, event_limit)
        self.evicted = 0

    def process(self, event: ElasticEvent) -> Output:
        """The spans ended and the log records released by ``event``."""
        out = Output()
        if event.kind is EventKind.RENDEZVOUS:
            if self.rendezvous.process(event, out) is not None:
                self._evict(out, event.time_ns)
        elif event.kind in (EventKind.AGENT, EventKind.WORKER):
            backend = event.attributes.get(A.RDZV_BACKEND)
            if isinstance(backend, str):
                # The agent's first events follow the first join: label its open member span.
                self.rendezvous.label_backend(event.run_id, backend)
            if self.agents.process(event, out):
                self._evict(out, event.time_ns)
        else:
            member = self.rendezvous.member_span(event.run_id) if event.run_id else None
            out.log(event, member)
            self.agents.stalled(event)  # a training stall: the agent keeps the latest
        return out

    # --- RoundListener: what the rendezvous model tells, relayed to the agent model ----------

    def node_rejoining(self, run_id: str, time_ns: int) -> None:
        self.agents.node_rejoining(run_id, time_ns)

    def member_ended(self, run_id: str, link: SpanLink) -> None:
        self.agents.member_ended(run_id, link)

    def tick(self, now_ns: int) -> Output:
        """Time-driven output: stall reports for waits past ``stall_after_s`` (0: none)."""
        out = Output()
        if self.stall_watch.enabled and now_ns - self._last_tick >= _TICK_NS:
            self._last_tick = now_ns
            waits = [*self.rendezvous.waits(), *self.agents.waits()]
            out.logs.extend(self.stall_watch.reports(waits, now_ns))
        return out

    def close_all(self, time_ns: int, reason: str, error: bool = False) -> Output:
        """End every open span (process exit or signal); flush logs still waiting."""
        out = Output()
        self.agents.end_open(time_ns, reason, error, out)
        self.rendezvous.end_open(time_ns, reason, error, out)
        self.agents.agents.clear()
        self.rendezvous.forget()
        return out

    def terminate(self, time_ns: int, reason: str) -> Output:
        """End every open span as terminated by a signal (ERROR, ``reason``).

        Unlike :meth:`close_all`, nodes and agents stay known: torch's own handler of the
        signal runs later, once its main thread is back in Python, and records the agent's
        FAILED event, which must still land in the round's trace with the agent's start.
        """
        out = Output()
        self.agents.end_open(time_ns, reason, True, out)
        self.rendezvous.end_open(time_ns, reason, True, out)
        return out

    def reserve_workers(self, run_id: str, local_ranks: list[int]) -> WorkerLaunch:
        """The trace context of the workers ``run_id``'s agent is about to start."""
        return self.agents.reserve_workers(run_id, local_ranks)

    def current_span(self, run_id: str, rank: int) -> SpanRef | None:
        """(trace id, span id) of the open span of the node holding ``rank`` in ``run_id``."""
        span = self.rendezvous.open_span_of_rank(run_id, rank)
        return span.ref if span is not None else None

    def open_spans(self) -> Iterator[SpanRecord]:
        """Spans started and not yet ended, with their trace ids (for open-span snapshots)."""
        yield from self.rendezvous.open_spans()
        yield from self.agents.open_spans()

    @property
    def terminated_by(self) -> str:
        """How the agent said it was killed (``""`` when it was not)."""
        return self.agents.terminated_by

    @property
    def heartbeat_logs_skipped(self) -> int:
        return self.rendezvous.heartbeat_logs_skipped

    @property
    def tracked(self) -> int:
        return len(self.rendezvous.nodes) + len(self.agents.agents)

    def _evict(self, out: Output, t: int) -> None:
        while len(self.rendezvous.nodes) > self.max_tracked:
            self.rendezvous.evict_oldest(t, out)
            self.evicted += 1
        while len(self.agents.agents) > self.max_tracked:
            self.agents.evict_oldest(t, out)
            self.evicted += 1
