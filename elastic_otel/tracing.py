"""Trace model: a state machine from torch elastic events to spans, without the OTel SDK.

Per node (hostname, pid, local_id) and rendezvous round, in the round's shared trace
(:mod:`elastic_otel.trace_ids`)::

    rendezvous.join      "attempts to join" → "has joined round N as rank R" (OK) or FAILED (ERROR)
     └─ rendezvous.member  joined → re-join / close / failure / exit; keep-alives aggregated
         ├─ agent.rendezvous, agent.assign_worker_ranks   back-dated by duration_ms
         └─ worker (one per global rank)                   START → SUCCEEDED/FAILED/TERMINATED

The agent's own span (``agent.run``) ends with the agent's SUCCEEDED/FAILED event, in the
trace of the round the agent finished in, and links to the rounds before. Each member span
links to the same node's member span of the previous round, so a user can walk the rounds.

Spans are kept here until they end and only then handed out as :class:`SpanRecord`. That
lets the trace id be chosen once the round is known (it is only in torch's message text,
and only after the join began), and lets agent steps be back-dated. Log records of a join
wait for the round, so that each log carries the trace and span id it belongs to.
State is bounded: the least recently used nodes and agents are ended past ``max_tracked``.
The model is not thread-safe by itself; the handler feeds it from one worker thread.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field

from elastic_otel import attributes as A
from elastic_otel.parsing import ElasticEvent, EventKind, RdzvAction
from elastic_otel.trace_ids import SaltWarning, trace_id_for

STATUS_UNSET = "UNSET"
STATUS_OK = "OK"
STATUS_ERROR = "ERROR"

DEFAULT_MAX_TRACKED = 1024  # a torchrun agent tracks one node and one agent per run
DEFAULT_EVENT_LIMIT = 128
_MAX_PENDING_LOGS = 256
_MAX_AGENT_LINKS = 32

_AGGREGATED = {
    RdzvAction.KEEP_ALIVE: A.KEEP_ALIVE_COUNT,
    RdzvAction.HEARTBEAT_UPDATED: "torchelastic.heartbeat_update.count",
    RdzvAction.SYNCED: "torchelastic.sync.count",
}
_ROUND_HINTS = frozenset(
    {
        RdzvAction.ADDED_TO_PARTICIPANTS,
        RdzvAction.ADDED_TO_WAIT_LIST,
        RdzvAction.ADDED_TO_REDUNDANCY_LIST,
        RdzvAction.MARKED_COMPLETE,
    }
)
_AGENT_STEPS = {
    "RENDEZVOUS": A.SPAN_AGENT_RENDEZVOUS,
    "ASSIGN_WORKER_RANKS": A.SPAN_AGENT_ASSIGN_RANKS,
}


def new_span_id() -> int:
    """A random, non-zero 64-bit span id (os.urandom is fork-safe, unlike ``random``)."""
    return int.from_bytes(os.urandom(8), "big") or 1


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict


@dataclass(slots=True)
class SpanLink:
    trace_id: int
    span_id: int
    attributes: dict


@dataclass(slots=True)
class SpanRecord:
    """A span as the model builds it; handed out once ended."""

    name: str
    start_ns: int
    attributes: dict
    span_id: int = field(default_factory=new_span_id)
    trace_id: int = 0
    parent_span_id: int = 0
    end_ns: int = 0
    events: list[SpanEvent] = field(default_factory=list)
    links: list[SpanLink] = field(default_factory=list)
    status: str = STATUS_UNSET
    status_message: str = ""
    dropped_events: int = 0
    event_limit: int = DEFAULT_EVENT_LIMIT

    def add_event(self, name: str, time_ns: int, attributes: dict, important: bool = False) -> None:
        # Important events (failures, closes) may use a small reserve past the limit.
        limit = self.event_limit + (16 if important else 0)
        if len(self.events) < limit:
            self.events.append(SpanEvent(name, time_ns, attributes))
        else:
            self.dropped_events += 1

    def record_error(self, event: ElasticEvent) -> None:
        err = event.error
        self.status = STATUS_ERROR
        if err is None:
            self.status_message = event.body[:256]
            return
        self.status_message = err.type or err.message[:256]
        attrs: dict = {}
        if err.type:
            attrs[A.EXCEPTION_TYPE] = err.type
        if err.message:
            attrs[A.EXCEPTION_MESSAGE] = err.message
        if err.stacktrace:
            attrs[A.EXCEPTION_STACKTRACE] = err.stacktrace
        self.add_event("exception", event.time_ns, attrs, important=True)

    def end(self, time_ns: int, status: str | None = None, reason: str = "") -> SpanRecord:
        self.end_ns = max(time_ns, self.start_ns)
        if status is not None and self.status != STATUS_ERROR:
            self.status = status
        if reason:
            self.attributes[A.END_REASON] = reason
        if self.dropped_events:
            self.attributes["torchelastic.dropped_events"] = self.dropped_events
        return self


LogOut = tuple[ElasticEvent, int, int]
"""A log ready to emit: the event, its trace id and span id (0 when it belongs to none)."""


@dataclass(slots=True)
class Output:
    spans: list[SpanRecord] = field(default_factory=list)
    logs: list[LogOut] = field(default_factory=list)


class _Node:
    __slots__ = (
        "backend",
        "hint",
        "hostname",
        "join",
        "local_id",
        "member",
        "pending",
        "pid",
        "prev_member",
        "rank",
        "round",
        "run_id",
        "world_size",
    )

    def __init__(self, run_id: str, hostname: str, pid: int | None, local_id: int | None) -> None:
        self.run_id, self.hostname, self.pid, self.local_id = run_id, hostname, pid, local_id
        self.join: SpanRecord | None = None
        self.hint: int | None = None  # round the current join attempt is headed for
        self.member: SpanRecord | None = None
        self.round: int | None = None
        self.rank: int | None = None
        self.world_size: int | None = None
        self.pending: list[ElasticEvent] = []  # join-phase logs waiting for their round
        self.prev_member: tuple[int, int, int] | None = None  # (trace, span, round)
        self.backend = ""

    def base_attributes(self) -> dict:
        attrs: dict = {A.RUN_ID: self.run_id}
        if self.hostname:
            attrs[A.HOST_NAME] = self.hostname
        if self.pid is not None:
            attrs[A.PROCESS_PID] = self.pid
        if self.local_id is not None:
            attrs[A.LOCAL_ID] = self.local_id
        if self.backend:
            attrs[A.RDZV_BACKEND] = self.backend
        return attrs


class _Agent:
    __slots__ = ("links", "restarts", "run_id", "start_ns", "stop_ns", "workers")

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.workers: dict[int, SpanRecord] = {}
        self.restarts = 0
        self.start_ns = 0
        self.stop_ns = 0  # when the workers were stopped for a new rendezvous
        self.links: list[SpanLink] = []


class TraceModel:
    """Feed :meth:`process` the events of one process in order; collect ended spans and logs."""

    def __init__(
        self,
        salt: str = "",
        max_tracked: int = DEFAULT_MAX_TRACKED,
        event_limit: int = DEFAULT_EVENT_LIMIT,
        heartbeat_logs: bool = True,
    ) -> None:
        self.salt = salt
        self.heartbeat_logs = heartbeat_logs
        self.heartbeat_logs_skipped = 0
        self.max_tracked = max(1, max_tracked)
        self.event_limit = event_limit
        self._nodes: OrderedDict[tuple, _Node] = OrderedDict()
        self._agents: OrderedDict[str, _Agent] = OrderedDict()
        self._salt_warning = SaltWarning()
        self.evicted = 0
        self.terminated_by = ""  # set when the agent reports it was killed by a signal

    # --- public ---------------------------------------------------------------------------

    def process(self, event: ElasticEvent) -> Output:
        out = Output()
        if event.kind is EventKind.RENDEZVOUS:
            self._rdzv(event, out)
        elif event.kind in (EventKind.AGENT, EventKind.WORKER):
            self._agent_event(event, out)
        else:
            node = self._latest_node(event.run_id) if event.run_id else None
            span = node.member if node else None
            out.logs.append((event, span.trace_id if span else 0, span.span_id if span else 0))
        return out

    def close_all(self, time_ns: int, reason: str, error: bool = False) -> Output:
        """End every open span (process exit or signal); flush logs still waiting."""
        out = Output()
        for agent in list(self._agents.values()):
            self._end_workers(agent, time_ns, out, "TERMINATED" if error else "UNKNOWN", reason)
        for node in list(self._nodes.values()):
            self._close_node(node, time_ns, reason, error, out)
        self._agents.clear()
        self._nodes.clear()
        return out

    def current_span(self, run_id: str, rank: int) -> tuple[int, int] | None:
        """(trace id, span id) of the open span of the node holding ``rank`` in ``run_id``."""
        for node in reversed(self._nodes.values()):
            if node.run_id == run_id and node.rank == rank:
                span = node.member or node.join
                if span is not None and span.trace_id:
                    return span.trace_id, span.span_id
        return None

    @property
    def tracked(self) -> int:
        return len(self._nodes) + len(self._agents)

    # --- rendezvous -----------------------------------------------------------------------

    def _trace(self, run_id: str, round_key: int | str) -> int:
        self._salt_warning.check(self.salt, run_id)
        return trace_id_for(self.salt, run_id, round_key)

    def _node(self, ev: ElasticEvent, out: Output) -> _Node:
        key = (ev.run_id, ev.hostname, ev.pid, ev.local_id)
        node = self._nodes.get(key)
        if node is None and ev.local_id is None:
            # torch's state holder records without a local_id: it is this process's node.
            node = self._latest_node(ev.run_id, pid=ev.pid)
            if node is not None:
                key = (node.run_id, node.hostname, node.pid, node.local_id)
        if node is None:
            node = _Node(ev.run_id, ev.hostname, ev.pid, ev.local_id)
            self._nodes[key] = node
            self._evict(out, ev.time_ns)
        else:
            self._nodes.move_to_end(key)
        return node

    def _latest_node(self, run_id: str, pid: int | None = None) -> _Node | None:
        for node in reversed(self._nodes.values()):
            if node.run_id == run_id and (pid is None or node.pid == pid):
                return node
        return None

    def _rdzv(self, ev: ElasticEvent, out: Output) -> None:
        if ev.local_id is None and self._latest_node(ev.run_id, pid=ev.pid) is None:
            # Backend set-up before any join (e.g. "hosts the TCP store"): no node yet.
            out.logs.append((ev, 0, 0))
            return
        node = self._node(ev, out)
        action = ev.action
        t = ev.time_ns
        if not node.backend:  # torch's own events lack it; the traced backends add it
            backend = ev.attributes.get(A.RDZV_BACKEND)
            if isinstance(backend, str):
                node.backend = backend

        if action is RdzvAction.JOIN_ATTEMPT:
            self._start_join(node, ev, out)
        elif action is RdzvAction.JOINED:
            self._joined(node, ev, out)
            return
        elif action in _ROUND_HINTS and node.join is not None:
            if node.hint is None and ev.round is not None:
                node.hint = ev.round  # the wait list names the round it waits for
                self._resolve_join(node, out)
            node.join.add_event(
                action.value, t, _event_attrs(ev), important=action is RdzvAction.MARKED_COMPLETE
            )
        elif action in _AGGREGATED:
            span = node.join or node.member
            if span is not None:
                key = _AGGREGATED[action]
                span.attributes[key] = int(span.attributes.get(key, 0)) + 1
                if action is RdzvAction.KEEP_ALIVE:
                    span.attributes[A.KEEP_ALIVE_LAST_NS] = t
                if not self.heartbeat_logs:  # counted on the span: that is its record
                    self.heartbeat_logs_skipped += 1
                    return
        elif action is RdzvAction.KEEP_ALIVE_FAILED and node.member is not None:
            attrs = node.member.attributes
            attrs[A.KEEP_ALIVE_FAILURES] = int(attrs.get(A.KEEP_ALIVE_FAILURES, 0)) + 1
            node.member.add_event(action.value, t, _event_attrs(ev), important=True)
        elif action is RdzvAction.CLOSED:
            self._close_node(node, t, "rendezvous closed", False, out, ev)
            self._log(node, ev, out, node.prev_member)
            return
        elif ev.node_state == "FAILED":
            self._failed(node, ev, out)
            return
        else:
            span = node.join or node.member
            if span is not None:
                span.add_event(
                    action.value if action else "other",
                    t,
                    _event_attrs(ev),
                    important=ev.node_state == "SUCCEEDED",
                )
        self._log(node, ev, out)

    def _start_join(self, node: _Node, ev: ElasticEvent, out: Output) -> None:
        t = ev.time_ns
        if node.member is not None:
            self._end_member(node, t, STATUS_UNSET, "re-rendezvous", out)
        if node.join is not None:  # a duplicate or an attempt whose end we never saw
            self._flush_pending(node, out)
            self._emit_join(
                node, node.join.end(t, STATUS_UNSET, "superseded by a new attempt"), out
            )
        agent = self._agents.get(node.run_id)
        if agent is not None and agent.workers and not agent.stop_ns:
            agent.stop_ns = t  # torch stops the workers before it re-joins
        node.join = SpanRecord(
            A.SPAN_RDZV_JOIN, t, node.base_attributes(), event_limit=self.event_limit
        )
        node.hint = None

    def _resolve_join(self, node: _Node, out: Output) -> None:
        """The join's round is known: give it its trace and release the logs that waited."""
        if node.join is not None and not node.join.trace_id and node.hint is not None:
            node.join.trace_id = self._trace(node.run_id, node.hint)
            node.join.attributes[A.ROUND] = node.hint
            if node.prev_member is not None:
                trace, span, rnd = node.prev_member
                node.join.links.append(SpanLink(trace, span, {A.ROUND: rnd}))
        self._flush_pending(node, out)

    def _flush_pending(self, node: _Node, out: Output) -> None:
        span = node.join
        for pending in node.pending:
            out.logs.append((pending, span.trace_id if span else 0, span.span_id if span else 0))
        node.pending.clear()

    def _emit_join(self, node: _Node, span: SpanRecord, out: Output) -> None:
        if not span.trace_id:
            round_key = (
                node.hint
                if node.hint is not None
                else (node.round + 1 if node.round is not None else 0)
            )
            span.trace_id = self._trace(node.run_id, round_key)
            span.attributes.setdefault(A.ROUND, round_key)
        out.spans.append(span)
        node.join = None

    def _joined(self, node: _Node, ev: ElasticEvent, out: Output) -> None:
        t = ev.time_ns
        rnd = ev.round if ev.round is not None else (node.hint if node.hint is not None else 0)
        if node.member is not None:
            if node.round == rnd and node.join is None:  # duplicate
                node.member.add_event("duplicate_joined", t, {})
                self._log(node, ev, out)
                return
            self._end_member(node, t, STATUS_UNSET, "re-rendezvous", out)
        node.round, node.rank, node.world_size = rnd, ev.rank, ev.world_size
        trace = self._trace(node.run_id, rnd)
        round_attrs = {A.ROUND: rnd}
        if ev.rank is not None:
            round_attrs[A.RANK] = ev.rank
        if ev.world_size is not None:
            round_attrs[A.WORLD_SIZE] = ev.world_size

        parent = 0
        join = node.join
        if join is not None:
            if not join.trace_id or node.hint != rnd:
                join.trace_id = trace
            join.attributes.update(round_attrs)
            node.hint = rnd
            self._flush_pending(node, out)
            out.logs.append((ev, join.trace_id, join.span_id))
            join.end(t, STATUS_OK)
            parent = join.span_id if join.trace_id == trace else 0
            self._emit_join(node, join, out)
        else:
            self._flush_pending(node, out)

        member = SpanRecord(
            A.SPAN_RDZV_MEMBER,
            t,
            node.base_attributes(),
            trace_id=trace,
            parent_span_id=parent,
            event_limit=self.event_limit,
        )
        member.attributes.update(round_attrs)
        if node.prev_member is not None:
            p_trace, p_span, p_round = node.prev_member
            member.links.append(SpanLink(p_trace, p_span, {A.ROUND: p_round}))
        node.member = member
        if join is None:
            out.logs.append((ev, trace, member.span_id))

    def _failed(self, node: _Node, ev: ElasticEvent, out: Output) -> None:
        t = ev.time_ns
        if node.join is not None:
            join = node.join
            if node.hint is None:
                node.hint = node.round + 1 if node.round is not None else 0
            self._resolve_join(node, out)
            join.record_error(ev)
            out.logs.append((ev, join.trace_id, join.span_id))
            self._emit_join(node, join.end(t, STATUS_ERROR), out)
            return
        if node.member is not None:
            member = node.member
            member.record_error(ev)
            out.logs.append((ev, member.trace_id, member.span_id))
            if ev.action is not RdzvAction.SHUTDOWN_FAILED:
                self._end_member(node, t, STATUS_ERROR, "rendezvous error", out)
            return
        out.logs.append((ev, 0, 0))

    def _end_member(self, node: _Node, t: int, status: str, reason: str, out: Output) -> None:
        member = node.member
        if member is None:
            return
        out.spans.append(member.end(t, status, reason))
        node.prev_member = (member.trace_id, member.span_id, node.round or 0)
        agent = self._agents.get(node.run_id)
        if agent is not None and len(agent.links) < _MAX_AGENT_LINKS:
            agent.links.append(
                SpanLink(member.trace_id, member.span_id, {A.ROUND: node.round or 0})
            )
        node.member = None

    def _close_node(
        self,
        node: _Node,
        t: int,
        reason: str,
        error: bool,
        out: Output,
        ev: ElasticEvent | None = None,
    ) -> None:
        if node.join is not None:
            join = node.join
            if node.hint is None:
                node.hint = node.round + 1 if node.round is not None else 0
            self._resolve_join(node, out)
            if error:
                join.status, join.status_message = STATUS_ERROR, reason
            self._emit_join(node, join.end(t, STATUS_UNSET, reason), out)
        self._flush_pending(node, out)
        if node.member is not None:
            if ev is not None:
                node.member.add_event(
                    ev.action.value if ev.action else "closed", t, _event_attrs(ev), important=True
                )
            if error:
                node.member.status, node.member.status_message = STATUS_ERROR, reason
            closed = ev is not None and ev.action is RdzvAction.CLOSED
            status = STATUS_ERROR if error else (STATUS_OK if closed else STATUS_UNSET)
            self._end_member(node, t, status, reason, out)

    def _log(
        self,
        node: _Node,
        ev: ElasticEvent,
        out: Output,
        fallback: tuple[int, int, int] | None = None,
    ) -> None:
        if node.join is not None:
            if node.join.trace_id:
                out.logs.append((ev, node.join.trace_id, node.join.span_id))
            elif len(node.pending) < _MAX_PENDING_LOGS:
                node.pending.append(ev)
            else:
                out.logs.append((ev, 0, 0))
        elif node.member is not None:
            out.logs.append((ev, node.member.trace_id, node.member.span_id))
        elif fallback is not None:
            out.logs.append((ev, fallback[0], fallback[1]))
        else:
            out.logs.append((ev, 0, 0))

    # --- agent and workers ----------------------------------------------------------------

    def _agent_event(self, ev: ElasticEvent, out: Output) -> None:
        agent = self._agents.get(ev.run_id)
        if agent is None:
            agent = self._agents[ev.run_id] = _Agent(ev.run_id)
            self._evict(out, ev.time_ns)
        else:
            self._agents.move_to_end(ev.run_id)
        node = self._latest_node(ev.run_id)
        backend = ev.attributes.get(A.RDZV_BACKEND)
        if node is not None and not node.backend and isinstance(backend, str):
            # The agent's first events follow the first join: label its open member span.
            node.backend = backend
            if node.member is not None:
                node.member.attributes.setdefault(A.RDZV_BACKEND, backend)
        t = ev.time_ns
        trace, parent = self._agent_context(agent, node, ev)

        if ev.kind is EventKind.WORKER:
            if ev.state == "START":
                self._worker_start(agent, ev, trace, parent, out)
            else:
                self._worker_end(agent, ev, trace, parent, out)
            return

        step = _AGENT_STEPS.get(ev.state)
        if step is not None:
            start = t - int((ev.duration_ms or 0.0) * 1_000_000)
            if not agent.start_ns or start < agent.start_ns:
                agent.start_ns = start
            span = SpanRecord(
                step,
                start,
                _agent_attrs(ev),
                trace_id=trace,
                parent_span_id=parent,
                event_limit=self.event_limit,
            )
            out.spans.append(span.end(t, STATUS_OK))
            out.logs.append((ev, trace, span.span_id))
            return
        if ev.state in ("SUCCEEDED", "FAILED"):
            reason, killed = f"agent {ev.state.lower()}", False
            if ev.error is not None and ev.error.type.endswith("SignalException"):
                # torchrun turns SIGTERM/SIGINT into SignalException("... got signal: 15")
                self.terminated_by = f"process terminated ({ev.error.message.strip()[:80]})"
                reason, killed = self.terminated_by, True
            self._end_workers(agent, t, out, "TERMINATED", reason, error=killed)
            span = SpanRecord(
                "agent.run",
                agent.start_ns or t,
                _agent_attrs(ev),
                trace_id=trace,
                event_limit=self.event_limit,
            )
            span.links = [link for link in agent.links if link.trace_id != trace]
            if ev.state == "FAILED":
                span.record_error(ev)
            out.spans.append(span.end(t, STATUS_OK if ev.state == "SUCCEEDED" else STATUS_ERROR))
            out.logs.append((ev, trace, span.span_id))
            self._agents.pop(ev.run_id, None)
            return
        out.logs.append((ev, trace, parent))

    def _agent_context(
        self, agent: _Agent, node: _Node | None, ev: ElasticEvent
    ) -> tuple[int, int]:
        if node is not None and node.member is not None:
            return node.member.trace_id, node.member.span_id
        if node is not None and node.round is not None:
            return self._trace(ev.run_id, node.round), 0
        # No rendezvous events (routing off, or a backend that records none).
        restarts = ev.agent_restarts if ev.agent_restarts is not None else agent.restarts
        return self._trace(ev.run_id, f"restart-{restarts}"), 0

    def _worker_start(
        self, agent: _Agent, ev: ElasticEvent, trace: int, parent: int, out: Output
    ) -> None:
        t = ev.time_ns
        restarts = ev.agent_restarts or 0
        if restarts > agent.restarts:
            self._end_workers(
                agent,
                agent.stop_ns or t,
                out,
                "REPLACED",
                f"worker group restarted after a failure (restart {restarts})",
                error=True,
            )
        elif ev.global_rank is not None and ev.global_rank in agent.workers:
            self._end_workers(
                agent,
                agent.stop_ns or t,
                out,
                "RESTARTED",
                "worker group restarted for a membership change",
            )
        agent.restarts = max(agent.restarts, restarts)
        agent.stop_ns = 0
        if not agent.start_ns:
            agent.start_ns = t
        span = SpanRecord(
            A.SPAN_WORKER,
            t,
            _agent_attrs(ev),
            trace_id=trace,
            parent_span_id=parent,
            event_limit=self.event_limit,
        )
        key = ev.global_rank if ev.global_rank is not None else -1 - len(agent.workers)
        agent.workers[key] = span
        out.logs.append((ev, trace, span.span_id))

    def _worker_end(
        self, agent: _Agent, ev: ElasticEvent, trace: int, parent: int, out: Output
    ) -> None:
        t = ev.time_ns
        span = agent.workers.pop(ev.global_rank, None) if ev.global_rank is not None else None
        if span is None:  # its START was never seen (out of order, or state evicted)
            span = SpanRecord(
                A.SPAN_WORKER,
                t,
                {},
                trace_id=trace,
                parent_span_id=parent,
                event_limit=self.event_limit,
            )
            span.attributes["torchelastic.start_unknown"] = True
        span.attributes.update(_agent_attrs(ev))
        if ev.state == "FAILED":
            span.record_error(ev)
            if not ev.error:
                code = ev.attributes.get(A.EXIT_CODE)
                span.status_message = f"exit code {code}" if code is not None else "FAILED"
            status = STATUS_ERROR
        else:
            status = STATUS_OK if ev.state == "SUCCEEDED" else STATUS_UNSET
        out.spans.append(span.end(t, status))
        out.logs.append((ev, span.trace_id, span.span_id))

    def _end_workers(
        self, agent: _Agent, t: int, out: Output, state: str, reason: str, error: bool = False
    ) -> None:
        for span in agent.workers.values():
            span.attributes[A.STATE] = state
            if error:
                span.status, span.status_message = STATUS_ERROR, reason
            out.spans.append(span.end(t, STATUS_UNSET, reason))
        agent.workers.clear()

    # --- bounds ---------------------------------------------------------------------------

    def _evict(self, out: Output, t: int) -> None:
        while len(self._nodes) > self.max_tracked:
            _, node = self._nodes.popitem(last=False)
            self._close_node(node, t, "evicted: state limit reached", False, out)
            self.evicted += 1
        while len(self._agents) > self.max_tracked:
            _, agent = self._agents.popitem(last=False)
            self._end_workers(agent, t, out, "UNKNOWN", "evicted: state limit reached")
            self.evicted += 1


def _event_attrs(ev: ElasticEvent) -> dict:
    attrs: dict = {A.NODE_STATE: ev.node_state}
    if ev.round is not None:
        attrs[A.ROUND] = ev.round
    if ev.body:
        attrs["torchelastic.message"] = ev.body
    return attrs


_AGENT_SPAN_KEYS = (
    A.RUN_ID,
    A.RANK,
    A.GLOBAL_RANK,
    A.GROUP_RANK,
    A.LOCAL_RANK,
    A.ROLE,
    A.ROLE_RANK,
    "torchelastic.role_world_size",
    "torchelastic.group_world_size",
    A.WORKER_ID,
    A.WORKER_PID,
    A.EXIT_CODE,
    A.STATE,
    A.AGENT_RESTARTS,
    A.DURATION_MS,
    A.RDZV_BACKEND,
    A.HOST_NAME,
    "torchelastic.entry_point",
    A.ERROR_CATEGORY,
)


def _agent_attrs(ev: ElasticEvent) -> dict:
    src = ev.attributes
    return {k: src[k] for k in _AGENT_SPAN_KEYS if k in src}
