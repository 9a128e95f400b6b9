"""Agent and worker state machine: ``torchelastic.worker.status.*`` events as spans.

Under the node's ``rendezvous.member`` span of the round (:mod:`elastic_otel.model.rendezvous`)::

    agent.rendezvous, agent.assign_worker_ranks   back-dated by the event's duration_ms
    worker (one per global rank)                   START → SUCCEEDED / FAILED / TERMINATED

The agent's own span, ``agent.run``, ends with its SUCCEEDED / FAILED event, in the trace of
the round it finished in, and links to the rounds before.

**Recoveries.** Each restart of the worker group the instrumented agent reports
(``elastic_otel.agent.restart_workers`` start / end) is an ``agent.recovery`` span, from the
agent noticing the failure (or the waiting node) to its workers running again, with its
phases as children: ``agent.stop_workers``, ``agent.rendezvous``, ``agent.assign_worker_ranks``,
``agent.start_workers``. It belongs to the round it leads to, so the recovery and its phases
(and their log records) are held until it ends, when that round's trace is known; it is a
root of that trace, linked to the failed worker's span and to the node's previous round
(:mod:`elastic_otel.model.recovery` does the holding).

**Worker trace context.** Before torch starts the workers, the instrumentation asks
:meth:`AgentModel.reserve_workers` for the ids their ``worker`` spans will have, to give
each worker process its ``TRACEPARENT``; the spans the START events open then use them.

Worker outcomes come from two places. With the agent instrumented
(:mod:`elastic_otel.integration.agent_instrumentation`), the agent's own view arrives as it
happens: a FAILED worker (exit code, error file, failure time) or a SUCCEEDED one when the
agent's monitor sees it, then ``elastic_otel.agent.stop_workers`` start / end, which ends the
workers still running as ``STOPPED`` with a link to the failed worker's span;
``elastic_otel.agent.exit_barrier`` is a span of its own. torch's own worker events, which come
later (after the exit barrier) or never (before a restart), then only add log records to the
spans already ended. Without instrumentation, torch's events are all there is: a worker that
fails before a restart has no FAILED event, the next START with a higher ``agent_restarts`` is
the only sign, so the workers of the replaced group end ``REPLACED``; a START of a rank already
running (a membership change) ends them ``RESTARTED``.

**Seams.** What is left here is the state machine of the agent's steps and workers (with the
span ids reserved for ``TRACEPARENT``, which are worker spans chosen early). The rest sits
behind narrow seams, so that each part can be read without the others' internals:

* the rendezvous side is only asked, through :class:`RoundView` (the node's member span ids,
  its round, what it knows), and only tells, through ``RoundListener`` (re-joins, ended
  memberships); neither module imports the other, and
  :class:`~elastic_otel.model.trace_model.TraceModel` builds and wires both;
* recovery holding is :class:`~elastic_otel.model.recovery.RecoveryHold`, one per agent: every
  span this module ends and every log it writes passes through it, and it keeps back what
  belongs to the recovery under way;
* stalls: :meth:`AgentModel.waits` lists the steps that wait on others;
  :mod:`elastic_otel.model.stalls` decides when to report them.

Worker states are :class:`~elastic_otel.names.torch_names.WorkerState` members; attribute
values are set from ``.value`` so that what is exported stays plain text.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Protocol

from elastic_otel.model.failures import describe, error_type
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
from elastic_otel.model.stalls import Wait
from elastic_otel.model.trace_ids import TraceIds
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import STACKS_STATE, WorkerState
from elastic_otel.parsing.torch_events import ElasticEvent, EventKind

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
_FAILURE_FACTS = frozenset(
    {
        A.RUN_ID,
        A.HOST_NAME,
        A.GLOBAL_RANK,
        A.LOCAL_RANK,
        A.STATE,
        A.FAILURE_KIND,
        A.ERROR_TYPE,
        A.PROCESS_EXIT_CODE,
        A.OOM_KILL,
        A.AGENT_RESTARTS,
    }
)
"""What a ``worker.failure`` span repeats of the worker span it stands for."""
_WAIT_CONTEXT = frozenset({A.RUN_ID, A.RANK, A.HOST_NAME, A.ROLE, A.AGENT_RESTARTS})
_SPAN_KEYS = (
    A.RUN_ID,
    A.RANK,
    A.GLOBAL_RANK,
    A.GROUP_RANK,
    A.LOCAL_RANK,
    A.ROLE,
    A.ROLE_RANK,
    A.ROLE_WORLD_SIZE,
    A.GROUP_WORLD_SIZE,
    A.WORKER_ID,
    A.WORKER_PID,
    A.EXIT_CODE,
    A.STATE,
    A.AGENT_RESTARTS,
    A.DURATION_MS,
    A.RDZV_BACKEND,
    A.HOST_NAME,
    A.ENTRY_POINT,
    A.ERROR_CATEGORY,
    A.OBSERVED_BY,
    A.FAILURE_KIND,
    A.OOM_KILL,
)


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


@dataclass(frozen=True, slots=True)
class ReservedSpan:
    """A ``worker`` span whose ids were chosen before its START (the worker's ``TRACEPARENT``)."""

    trace_id: int
    span_id: int
    parent_span_id: int


class Agent:
    """One elastic agent (per run id) and its running workers' spans."""

    __slots__ = (
        "ended",
        "failed",
        "links",
        "recovery",
        "reserved",
        "restarts",
        "run_id",
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
        """Choose the span ids of the workers about to start (see the module docstring)."""
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
                self._worker_start(agent, ev, parent, out)
            else:
                self._worker_end(agent, ev, parent, out)
        elif ev.state in _AGENT_STEPS:
            self._agent_step(agent, ev, parent, out)
        elif ev.state == STACKS_STATE:
            self._worker_stacks(agent, ev, parent, out)
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
        return SpanRecord(
            name,
            start_ns,
            agent_attributes(ev),
            trace_id=parent.trace_id,
            parent_span_id=parent.span_id,
            event_limit=self.event_limit,
        )

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
            self._end_workers(agent, t, out, WorkerState.STOPPED, "", link_to=agent.failed)

    def _recovery(self, agent: Agent, ev: ElasticEvent, parent: SpanRef, out: Output) -> None:
        t = ev.time_ns
        root = SpanRef(parent.trace_id, 0)  # a root of the trace of the round it leads to
        if ev.attributes.get(A.PHASE) == "start":
            if agent.recovery.active:  # its end was never seen
                self._end_recovery(agent, t, out, "a new recovery started", error=False)
            span = self._span(A.SPAN_AGENT_RECOVERY, t, ev, root)
            failure = _failure_link(agent.failed) if agent.failed is not None else None
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
        t = ev.time_ns
        reason, killed = f"agent {ev.state.lower()}", False
        if ev.error is not None and ev.error.type.endswith("SignalException"):
            # torchrun turns SIGTERM/SIGINT into SignalException("... got signal: 15")
            self.terminated_by = f"process terminated ({ev.error.message.strip()[:80]})"
            reason, killed = self.terminated_by, True
        self._end_everything(agent, t, out, WorkerState.TERMINATED, reason, killed)
        span = self._span(A.SPAN_AGENT_RUN, agent.start_ns or t, ev, SpanRef(trace, 0))
        span.links = [link for link in agent.links if link.trace_id != trace]
        if ev.state == WorkerState.FAILED:
            span.record_error(ev)
        succeeded = ev.state == WorkerState.SUCCEEDED
        out.spans.append(span.end(t, STATUS_OK if succeeded else STATUS_ERROR))
        out.log(ev, span)
        self.agents.pop(ev.run_id, None)

    def _worker_start(self, agent: Agent, ev: ElasticEvent, parent: SpanRef, out: Output) -> None:
        t = ev.time_ns
        restarts = ev.agent_restarts or 0
        if restarts > agent.restarts:
            self._end_workers(
                agent,
                agent.stop_ns or t,
                out,
                WorkerState.REPLACED,
                f"worker group restarted after a failure (restart {restarts})",
                error=True,
            )
            agent.new_attempt()
        elif ev.global_rank is not None and ev.global_rank in agent.workers:
            self._end_workers(
                agent,
                agent.stop_ns or t,
                out,
                WorkerState.RESTARTED,
                "worker group restarted for a membership change",
            )
            agent.new_attempt()
        elif ev.global_rank is not None and ev.global_rank in agent.ended:
            agent.new_attempt()  # the agent stopped them itself, then started them again
        agent.restarts = max(agent.restarts, restarts)
        agent.stop_ns = 0
        if not agent.start_ns:
            agent.start_ns = t
        local_rank = ev.attributes.get(A.LOCAL_RANK)
        reserved = agent.reserved.pop(local_rank, None) if isinstance(local_rank, int) else None
        if reserved is not None:  # the worker was told these ids (TRACEPARENT)
            parent = SpanRef(reserved.trace_id, reserved.parent_span_id)
        span = self._span(A.SPAN_WORKER, t, ev, parent)
        if reserved is not None:
            span.span_id = reserved.span_id
        key = ev.global_rank if ev.global_rank is not None else -1 - len(agent.workers)
        agent.workers[key] = span
        out.log(ev, span)

    def _worker_stacks(self, agent: Agent, ev: ElasticEvent, parent: SpanRef, out: Output) -> None:
        """A worker's stacks: a log record on its span (open, or just ended by the stop they
        were taken before), the frames as its body."""
        rank = ev.global_rank
        span = agent.workers.get(rank) if rank is not None else None
        if span is None and rank is not None:
            span = agent.ended.get(rank)
        attributes = dict(ev.attributes)
        stacks = attributes.pop(A.STACKS, None)
        body = stacks if isinstance(stacks, str) and stacks else ev.body
        record = replace(ev, body=body, attributes=attributes)
        if span is not None:
            out.log(record, span)
        else:
            out.logs.append(LogOut(record, parent.trace_id, parent.span_id))

    def _worker_end(self, agent: Agent, ev: ElasticEvent, parent: SpanRef, out: Output) -> None:
        t = ev.time_ns
        rank = ev.global_rank
        span = agent.workers.pop(rank, None) if rank is not None else None
        if span is None and rank is not None and rank in agent.ended:
            out.log(ev, agent.ended[rank])  # torch's late word on an outcome already exported
            return
        if span is None:  # its START was never seen (out of order, or state evicted)
            span = self._span(A.SPAN_WORKER, t, ev, parent)
            span.attributes = {A.START_UNKNOWN: True}
        span.attributes.update(agent_attributes(ev))
        code = ev.attributes.get(A.EXIT_CODE)
        if code is not None and ev.state != WorkerState.SUCCEEDED:
            span.attributes[A.PROCESS_EXIT_CODE] = code
        if ev.state == WorkerState.FAILED:
            _failed(span, ev, code)
            status = STATUS_ERROR
            if agent.failed is None:
                agent.failed = span
            self._failure_in_round(agent, span, t, out)
        elif ev.state == WorkerState.PEER_FAILED:
            _peer_failed(span, ev, agent.failed)
            status = STATUS_UNSET
        elif ev.state == WorkerState.STOPPED:
            _stopped_by_agent(span, agent.failed)
            status = STATUS_UNSET
        else:
            status = STATUS_OK if ev.state == WorkerState.SUCCEEDED else STATUS_UNSET
        out.spans.append(span.end(t, status))
        out.log(ev, span)
        if rank is not None:
            agent.ended[rank] = span

    def _failure_in_round(self, agent: Agent, worker: SpanRecord, t: int, out: Output) -> None:
        """In a round with a trace per node, a root cause also shows in the round's trace: a
        ``worker.failure`` span under the node's join span, linked to the ``worker`` span."""
        round_ref = self._rounds.round_context(agent.run_id)
        if round_ref is None or round_ref.trace_id == worker.trace_id:
            return
        attributes = {k: v for k, v in worker.attributes.items() if k in _FAILURE_FACTS}
        span = SpanRecord(
            A.SPAN_WORKER_FAILURE,
            worker.start_ns,
            attributes,
            trace_id=round_ref.trace_id,
            parent_span_id=round_ref.span_id,
            event_limit=self.event_limit,
        )
        span.links.append(_failure_link(worker))
        span.status_message = worker.status_message
        out.spans.append(span.end(t, STATUS_ERROR))

    def _end_workers(
        self,
        agent: Agent,
        t: int,
        out: Output,
        state: WorkerState,
        reason: str,
        error: bool = False,
        link_to: SpanRecord | None = None,
    ) -> None:
        for rank, span in agent.workers.items():
            span.attributes[A.STATE] = state.value  # exported: the plain text
            if error:
                span.set_error(reason)
            if state is WorkerState.STOPPED:
                _stopped_by_agent(span, link_to)
            out.spans.append(span.end(t, STATUS_UNSET, reason))
            if rank >= 0:
                agent.ended[rank] = span
        agent.workers.clear()

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
        self._end_workers(agent, t, out, state, reason)
        self._end_steps(agent, t, out, reason, error)
        self._end_recovery(agent, t, out, reason, error)


def _back_dated(t: int, duration_ms: float | None) -> int:
    """When a step of ``duration_ms`` that ended at ``t`` began (never before the epoch)."""
    return max(0, t - int((duration_ms or 0.0) * 1_000_000))


def _failed(span: SpanRecord, ev: ElasticEvent, code: object) -> None:
    """A worker that failed on its own (a root cause, or one torch reported without the
    instrumentation's classification): ERROR, ``error.type``, what killed it."""
    span.record_error(ev)
    err = ev.error
    span.attributes[A.ERROR_TYPE] = error_type(code, err.type if err is not None else None)
    exception = f"{err.type}: {err.message}" if err and err.type else (err.message if err else "")
    oom = ev.attributes.get(A.OOM_KILL) is True
    if code is not None or exception:
        span.status_message = describe(code, exception, oom)


def _peer_failed(span: SpanRecord, ev: ElasticEvent, failed: SpanRecord | None) -> None:
    """A victim: its collective failed because a peer died. Not an error of its own."""
    first_line = (ev.error.message.strip().splitlines() or [""])[0] if ev.error else ""
    reason = "its collective failed after a peer died"
    span.attributes[A.END_REASON] = f"{reason}: {first_line[:200]}" if first_line else reason
    if failed is not None:
        span.links.append(_failure_link(failed))


def _stopped_by_agent(span: SpanRecord, failed: SpanRecord | None) -> None:
    """Mark a worker the agent stopped; link it to the failure that made the agent stop it."""
    if failed is None:
        span.attributes[A.END_REASON] = "stopped by the agent"
        return
    rank = failed.attributes.get(A.GLOBAL_RANK)
    span.attributes[A.END_REASON] = f"stopped by the agent after global rank {rank} failed"
    span.links.append(_failure_link(failed))


def _failure_link(failed: SpanRecord) -> SpanLink:
    """A link to a failed worker's span, saying what it is."""
    attrs: SpanAttributes = {A.STATE: WorkerState.FAILED.value}
    rank = failed.attributes.get(A.GLOBAL_RANK)
    if rank is not None:
        attrs[A.GLOBAL_RANK] = rank
    return SpanLink(failed.trace_id, failed.span_id, attrs)


def agent_attributes(ev: ElasticEvent) -> SpanAttributes:
    """The event attributes that belong on agent and worker spans."""
    src = ev.attributes
    return {k: src[k] for k in _SPAN_KEYS if k in src}
