"""Agent and worker state machine: ``torchelastic.worker.status.*`` events as spans.

Under the node's ``rendezvous.member`` span of the round: the agent's steps (back-dated by
their ``duration_ms``), one ``worker`` span per global rank, and each recovery
(``agent.recovery`` with its phases); ``agent.run`` spans the agent's life. The workers' span
ids are chosen before they start (:meth:`AgentModel.reserve_workers`), for their
``TRACEPARENT``. The rendezvous side is seen only through :class:`RoundView`. Spans:
``docs/trace-model.md``; the seams: ``docs/architecture.md`` (The trace model's parts).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from elastic_otel.model.agent_outcome import run_outcome
from elastic_otel.model.agent_workers import (
    ReservedSpan,
    WorkerSpans,
    agent_attributes,
    agent_span,
    failure_link,
)
from elastic_otel.model.recovery import RecoveryHold
from elastic_otel.model.spans import (
    DEFAULT_EVENT_LIMIT,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_UNSET,
    LogOut,
    Output,
    SpanAttributes,
    SpanLink,
    SpanRecord,
    SpanRef,
    new_span_id,
)
from elastic_otel.model.stalls import STALL_STATE, TRAINING, Wait
from elastic_otel.model.trace_ids import TraceIds
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import NCCL_TIMING_STATE, STACKS_STATE, WorkerState
from elastic_otel.parsing.torch_events import ElasticEvent, EventKind

__all__ = [  # ReservedSpan and agent_attributes live in agent_workers, importable from here too
    "Agent",
    "AgentModel",
    "ReservedSpan",
    "RoundView",
    "WorkerLaunch",
    "agent_attributes",
]

_MAX_AGENT_LINKS = 32
_AGENT_STEPS = {  # torch's, recorded once done with their duration
    "RENDEZVOUS": A.SPAN_AGENT_RENDEZVOUS,
    "ASSIGN_WORKER_RANKS": A.SPAN_AGENT_ASSIGN_RANKS,
}
_OBSERVED_STEPS = {  # the bridge's own (agent_instrumentation), recorded at start and end
    "EXIT_BARRIER": A.SPAN_AGENT_EXIT_BARRIER,
    "STOP_WORKERS": A.SPAN_AGENT_STOP_WORKERS,
    "START_WORKERS": A.SPAN_AGENT_START_WORKERS,
}
_RESTART = "RESTART_WORKERS"  # observed too: the whole recovery
_AGENT_OUTCOMES = frozenset({WorkerState.SUCCEEDED, WorkerState.FAILED})
_WAIT_KIND = {"EXIT_BARRIER": "exit_barrier", "STOP_WORKERS": "stop_workers"}
_STALL_FACTS = frozenset(
    {A.STALLED_RANKS, A.STALLED_SECONDS, A.STACK_FRAME, A.STALLED_COLLECTIVE, A.STALLED_REMOTE_HOST}
)
_WAIT_CONTEXT = frozenset({A.RUN_ID, A.RANK, A.HOST_NAME, A.ROLE, A.AGENT_RESTARTS})


class RoundView(Protocol):
    """What the agent model may ask the rendezvous side about the node of a run: read-only.

    :class:`~elastic_otel.model.rendezvous.RendezvousModel` satisfies it; defined here, beside
    the side that asks, so that this module needs nothing else of the rendezvous model."""

    def member_context(self, run_id: str) -> SpanRef | None:
        """The ids of the node's open ``rendezvous.member`` span (``None``: between rounds)."""

    def round_context(self, run_id: str) -> SpanRef | None:
        """The round's trace and the node's join span in it, when the node's spans are in a
        trace of their own (a large round); ``None`` otherwise."""

    def joined_round(self, run_id: str) -> int | None:
        """The round the node last joined (``None``: no join seen)."""

    def node_known(self, run_id: str) -> SpanAttributes:
        """What the node knows of its round: round, rank, world size, last message."""


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """The trace context a group of workers is started with (see ``reserve_workers``)."""

    trace_id: int
    span_ids: dict[int, int]  # local rank → the id its ``worker`` span will have
    recovery_cause: str = ""  # set when a recovery starts these workers
    recovery_start_ns: int = 0


class Agent:
    """One elastic agent (per run id) and its running workers' spans (a
    :class:`~elastic_otel.model.agent_workers.WorkerGroup`)."""

    __slots__ = (
        "ended",
        "failed",
        "failed_end",
        "links",
        "recovery",
        "reserved",
        "restarts",
        "run_id",
        "stall",
        "start_ns",
        "steps",
        "stop_ns",
        "workers",
    )

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.workers: dict[int, SpanRecord] = {}
        self.ended: dict[int, SpanRecord] = {}  # this attempt's workers the agent saw end
        self.failed: SpanRecord | None = None  # this attempt's first failed worker
        self.failed_end: SpanRecord | None = None  # its first worker that ended failed, any kind
        self.stall: SpanAttributes = {}  # the latest training stall report of this attempt
        self.steps: dict[str, SpanRecord] = {}  # observed steps under way (exit barrier...)
        self.restarts = 0
        self.start_ns = 0
        self.stop_ns = 0  # when the workers were stopped for a new rendezvous
        self.links: list[SpanLink] = []
        self.recovery = RecoveryHold()
        self.reserved: dict[int, ReservedSpan] = {}  # by local rank

    def new_attempt(self) -> None:
        self.ended.clear()
        self.failed = None
        self.failed_end = None
        self.stall = {}


class AgentModel:
    """Feed :meth:`process` a process's agent and worker events in order.

    Spans are parented under the node's open member span, asked of ``rounds``; the
    rendezvous side reports re-joins and ended memberships back (``RoundListener``).
    """

    def __init__(
        self,
        trace_ids: TraceIds,
        rounds: RoundView,
        event_limit: int = DEFAULT_EVENT_LIMIT,
    ) -> None:
        self._trace = trace_ids
        self._rounds = rounds
        self.event_limit = event_limit
        self._workers = WorkerSpans(rounds, event_limit)
        self.agents: OrderedDict[str, Agent] = OrderedDict()
        self.terminated_by = ""  # set when the agent reports it was killed by a signal

    # --- RoundListener ----------------------------------------------------------------------

    def node_rejoining(self, run_id: str, time_ns: int) -> None:
        agent = self.agents.get(run_id)
        if agent is not None and agent.workers and not agent.stop_ns:
            agent.stop_ns = time_ns  # torch stops the workers before it re-joins

    def member_ended(self, run_id: str, link: SpanLink) -> None:
        agent = self.agents.get(run_id)
        if agent is not None and len(agent.links) < _MAX_AGENT_LINKS:
            agent.links.append(link)

    def stalled(self, ev: ElasticEvent) -> None:
        """A training stall report of an agent's workers: kept until its attempt ends, so that
        a job ended while it lasts names the ranks everyone waited for."""
        agent = self.agents.get(ev.run_id)
        training = ev.state == STALL_STATE and ev.attributes.get(A.STALLED_IN) == TRAINING
        if agent is not None and training:
            agent.stall = {k: v for k, v in ev.attributes.items() if k in _STALL_FACTS}

    # --- queries ----------------------------------------------------------------------------

    def open_spans(self) -> Iterator[SpanRecord]:
        """The spans of the workers that run now."""
        for agent in self.agents.values():
            yield from agent.workers.values()
            yield from agent.steps.values()
            yield from agent.recovery.open_spans()

    def waits(self) -> Iterator[Wait]:
        """Agent steps under way that wait on others (for stall reports)."""
        for agent in self.agents.values():
            for state, span in agent.steps.items():
                if state not in _WAIT_KIND:
                    continue
                context = {k: v for k, v in span.attributes.items() if k in _WAIT_CONTEXT}
                context.update(self._rounds.node_known(agent.run_id))
                yield Wait(_WAIT_KIND[state], span, context)

    def open_step(self, run_id: str, state: str) -> SpanRecord | None:
        """The observed step (``EXIT_BARRIER``, ``STOP_WORKERS``) under way, if any."""
        agent = self.agents.get(run_id)
        return agent.steps.get(state) if agent is not None else None

    def reserve_workers(self, run_id: str, local_ranks: list[int]) -> WorkerLaunch:
        """Choose the span ids of the workers about to start, for their ``TRACEPARENT``."""
        agent = self.agents.get(run_id)
        if agent is None:
            agent = self.agents[run_id] = Agent(run_id)
        parent = self._context(agent)
        ids = {rank: new_span_id() for rank in local_ranks}
        agent.reserved = {
            rank: ReservedSpan(parent.trace_id, span_id, parent.span_id)
            for rank, span_id in ids.items()
        }
        recovery = agent.recovery
        if not recovery.active:
            return WorkerLaunch(parent.trace_id, ids)
        return WorkerLaunch(parent.trace_id, ids, recovery.cause, recovery.start_ns)

    # --- events -----------------------------------------------------------------------------

    def process(self, ev: ElasticEvent, out: Output) -> bool:
        """Apply one agent or worker event; ``True`` when it created a new agent."""
        agent = self.agents.get(ev.run_id)
        created = agent is None
        if agent is None:
            agent = self.agents[ev.run_id] = Agent(ev.run_id)
        else:
            self.agents.move_to_end(ev.run_id)
        parent = self._context(agent, ev.agent_restarts)

        if ev.kind is EventKind.WORKER:
            if ev.state == WorkerState.START:
                self._workers.start(agent, ev, parent, out)
                if not agent.start_ns:
                    agent.start_ns = ev.time_ns
            else:
                self._workers.end(agent, ev, parent, out)
        elif ev.state in _AGENT_STEPS:
            self._agent_step(agent, ev, parent, out)
        elif ev.state in (STACKS_STATE, NCCL_TIMING_STATE):
            self._workers.about_worker(agent, ev, parent, out)
        elif ev.state == _RESTART and ev.attributes.get(A.PHASE) in ("start", "end"):
            self._recovery(agent, ev, parent, out)
        elif ev.state in _OBSERVED_STEPS and ev.attributes.get(A.PHASE) in ("start", "end"):
            self._observed_step(agent, ev, parent, out)
        elif ev.state in _AGENT_OUTCOMES:
            self._agent_end(agent, ev, parent.trace_id, out)
        else:
            out.logs.append(LogOut(ev, parent.trace_id, parent.span_id))
        return created

    def _context(self, agent: Agent, restarts: int | None = None) -> SpanRef:
        """The trace and parent span of the agent's spans: the node's round if known."""
        member = self._rounds.member_context(agent.run_id)
        if member is not None:
            return member
        rnd = self._rounds.joined_round(agent.run_id)
        if rnd is not None:
            return SpanRef(self._trace(agent.run_id, rnd), 0)
        # No rendezvous events (routing off, or a backend that records none).
        restarts = restarts if restarts is not None else agent.restarts
        return SpanRef(self._trace(agent.run_id, f"restart-{restarts}"), 0)

    def _span(self, name: str, start_ns: int, ev: ElasticEvent, parent: SpanRef) -> SpanRecord:
        return agent_span(name, start_ns, ev, parent, self.event_limit)

    def _agent_step(self, agent: Agent, ev: ElasticEvent, parent: SpanRef, out: Output) -> None:
        t = ev.time_ns
        start = _back_dated(t, ev.duration_ms)
        if not agent.start_ns or start < agent.start_ns:
            agent.start_ns = start
        span = self._span(_AGENT_STEPS[ev.state], start, ev, agent.recovery.parent(parent))
        agent.recovery.finish(span.end(t, STATUS_OK), out)
        agent.recovery.log(ev, span, out)

    def _observed_step(self, agent: Agent, ev: ElasticEvent, parent: SpanRef, out: Output) -> None:
        t = ev.time_ns
        name = _OBSERVED_STEPS[ev.state]
        parent = agent.recovery.parent(parent)
        if ev.attributes.get(A.PHASE) == "start":
            span = self._span(name, t, ev, parent)
            agent.steps[ev.state] = span
            agent.recovery.log(ev, span, out)
            return
        started = agent.steps.pop(ev.state, None)
        if started is None:  # its start was not seen: back-date by the duration
            start = _back_dated(t, ev.duration_ms)
            started = self._span(name, start, ev, parent)
        span = started
        if ev.error is not None:
            span.record_error(ev)
        agent.recovery.finish(span.end(t, STATUS_OK), out)
        agent.recovery.log(ev, span, out)
        if ev.state == "STOP_WORKERS" and agent.workers:
            self._workers.end_all(agent, t, out, WorkerState.STOPPED, "", link_to=agent.failed)

    def _recovery(self, agent: Agent, ev: ElasticEvent, parent: SpanRef, out: Output) -> None:
        t = ev.time_ns
        root = SpanRef(parent.trace_id, 0)  # a root of the trace of the round it leads to
        if ev.attributes.get(A.PHASE) == "start":
            if agent.recovery.active:  # its end was never seen
                self._end_recovery(agent, t, out, "a new recovery started", error=False)
            span = self._span(A.SPAN_AGENT_RECOVERY, t, ev, root)
            failure = failure_link(agent.failed) if agent.failed is not None else None
            agent.recovery.start(span, ev, failure, left=parent)
            agent.recovery.log(ev, span, out)
            return
        if not agent.recovery.active:  # its start was not seen: back-date by the duration
            start = _back_dated(t, ev.duration_ms)
            agent.recovery.adopt(self._span(A.SPAN_AGENT_RECOVERY, start, ev, root))
        agent.recovery.end(ev, parent.trace_id, out)

    def _end_recovery(self, agent: Agent, t: int, out: Output, reason: str, error: bool) -> None:
        """End a recovery that will not end by itself (exit, signal, eviction), with its steps."""
        if not agent.recovery.active:
            return
        self._end_steps(agent, t, out, reason, error)
        agent.recovery.abandon(t, reason, error, self._context(agent).trace_id, out)

    def _agent_end(self, agent: Agent, ev: ElasticEvent, trace: int, out: Output) -> None:
        """The agent's final event: its outcome as what happened says (docs/outcomes.md)."""
        t = ev.time_ns
        outcome = run_outcome(ev, agent.failed or agent.failed_end, agent.stall)
        ev = outcome.event
        reason, killed = f"agent {ev.state.lower()}", False
        if outcome.signal:
            self.terminated_by = reason = f"process terminated ({outcome.signal})"
            killed = True
        self._end_everything(agent, t, out, WorkerState.TERMINATED, reason, killed)
        span = self._span(A.SPAN_AGENT_RUN, agent.start_ns or t, ev, SpanRef(trace, 0))
        span.links = [link for link in agent.links if link.trace_id != trace]
        span.attributes.update(outcome.attributes)
        if outcome.root is not None:
            span.links.append(failure_link(outcome.root))
        if ev.state == WorkerState.FAILED:
            if ev.error is not None:
                span.record_error(ev)
            span.set_error(outcome.description or span.status_message)
        succeeded = ev.state == WorkerState.SUCCEEDED
        out.spans.append(span.end(t, STATUS_OK if succeeded else STATUS_ERROR))
        out.log(ev, span)
        self.agents.pop(ev.run_id, None)

    def _end_steps(self, agent: Agent, t: int, out: Output, reason: str, error: bool) -> None:
        for span in agent.steps.values():
            if error:
                span.set_error(reason)
            agent.recovery.finish(span.end(t, STATUS_UNSET, reason), out)
        agent.steps.clear()

    # --- exit and bounds --------------------------------------------------------------------

    def end_open(self, t: int, reason: str, error: bool, out: Output) -> None:
        """End every agent's open spans (``error``: as terminated by a signal); the agents
        stay known, so that their later events (torch's FAILED) keep their start and trace."""
        state = WorkerState.TERMINATED if error else WorkerState.UNKNOWN
        for agent in self.agents.values():
            self._end_everything(agent, t, out, state, reason, error)

    def evict_oldest(self, t: int, out: Output) -> None:
        _, agent = self.agents.popitem(last=False)
        reason = "evicted: state limit reached"
        self._end_everything(agent, t, out, WorkerState.UNKNOWN, reason, False)

    def _end_everything(
        self, agent: Agent, t: int, out: Output, state: WorkerState, reason: str, error: bool
    ) -> None:
        """End an agent's open spans: its workers (as ``state``), steps and recovery. A signal
        that ends the agent (``error``) is an error of the agent's spans, not of its workers:
        they were running, and are victims of it (``TERMINATED``, with the reason)."""
        self._workers.end_all(agent, t, out, state, reason)
        self._end_steps(agent, t, out, reason, error)
        self._end_recovery(agent, t, out, reason, error)


def _back_dated(t: int, duration_ms: float | None) -> int:
    """When a step of ``duration_ms`` that ended at ``t`` began (never before the epoch)."""
    return max(0, t - int((duration_ms or 0.0) * 1_000_000))
