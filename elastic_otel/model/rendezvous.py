"""Rendezvous state machine: torch's ``RdzvEvent``s of one process as spans, per node and round.

Per node (hostname, pid, local_id) and rendezvous round, in the round's shared trace
(:mod:`elastic_otel.model.trace_ids`)::

    rendezvous.join      "attempts to join" → "has joined round N as rank R" (OK) or FAILED (ERROR)
     └─ rendezvous.member  joined → re-join / close / failure / exit; keep-alives aggregated

**Large rounds.** A round of more than ``round_trace_max_nodes`` nodes (the world size is in
the "has joined" message, so every node decides alike without asking the others) would make
one trace too large for Tempo (5 MB) and Jaeger (10,000 spans per query): there each node's
member span, and so everything under it (agent steps, workers, the training script's spans),
is the root of a trace of the node's own, derived from (run, round, rank); the round's trace
keeps one ``rendezvous.join`` per node, and the two are linked both ways (``LINK_KIND``).

The round is only in torch's message text, and only after the join began, so the join span
gets its trace id once the round is known; its log records wait for it (bounded), so that
each log carries the trace and span id it belongs to. Each member span links to the same
node's member span of the round before. Keep-alives, heartbeat updates and syncs arrive every
few seconds for the whole job: they are counted on the open span, not kept as span events.

**Seams.** This model knows nothing of agents. What the agent side must hear (a node
re-joining, a membership ending) goes out through :class:`RoundListener`, defined here; what
it may ask about a node (its member span's ids, its round, what it knows) it asks through the
read-only queries below, which are :class:`~elastic_otel.model.agent.RoundView` (defined
beside the side that asks). Neither module imports the other; :class:`Node` stays this
model's own, and :mod:`elastic_otel.model.trace_model` wires the two.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

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
)
from elastic_otel.model.stalls import Wait
from elastic_otel.model.trace_ids import TraceIds
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import NodeState
from elastic_otel.parsing.torch_events import ElasticEvent, RdzvAction

_MAX_PENDING_LOGS = 256

_AGGREGATED = {
    RdzvAction.KEEP_ALIVE: A.KEEP_ALIVE_COUNT,
    RdzvAction.HEARTBEAT_UPDATED: A.HEARTBEAT_UPDATE_COUNT,
    RdzvAction.SYNCED: A.SYNC_COUNT,
}
_ROUND_HINTS = frozenset(
    {
        RdzvAction.ADDED_TO_PARTICIPANTS,
        RdzvAction.ADDED_TO_WAIT_LIST,
        RdzvAction.ADDED_TO_REDUNDANCY_LIST,
        RdzvAction.MARKED_COMPLETE,
    }
)


class NodeKey(NamedTuple):
    """A rendezvous participant as torch's ``_NodeDesc`` names it, within its run (a dict key)."""

    run_id: str
    hostname: str
    pid: int | None
    local_id: int | None


@dataclass(frozen=True, slots=True)
class MemberRef:
    """A node's ``rendezvous.member`` span of a round it left: the next round links to it."""

    trace_id: int
    span_id: int
    round: int

    def link(self) -> SpanLink:
        return SpanLink(self.trace_id, self.span_id, {A.ROUND: self.round})


class RoundListener(Protocol):
    """What the agent side needs to hear from the rendezvous side."""

    def node_rejoining(self, run_id: str, time_ns: int) -> None:
        """A node of ``run_id`` started a new join (torch stopped its workers first)."""

    def member_ended(self, run_id: str, link: SpanLink) -> None:
        """A node's membership of a round ended; ``link`` points at its member span."""


class Node:
    """One rendezvous participant (torch's ``_NodeDesc``) and its open spans."""

    __slots__ = (
        "backend",
        "hint",
        "hostname",
        "join",
        "last_message",
        "local_id",
        "member",
        "pending",
        "pid",
        "prev_member",
        "rank",
        "round",
        "round_ref",
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
        self.prev_member: MemberRef | None = None
        self.round_ref: SpanRef | None = None  # its join span, when its member has its own trace
        self.backend = ""
        self.last_message = ""  # the last rendezvous message other than a keep-alive

    @property
    def key(self) -> NodeKey:
        return NodeKey(self.run_id, self.hostname, self.pid, self.local_id)

    def base_attributes(self) -> SpanAttributes:
        attrs: SpanAttributes = {A.RUN_ID: self.run_id}
        if self.hostname:
            attrs[A.HOST_NAME] = self.hostname
        if self.pid is not None:
            attrs[A.PROCESS_PID] = self.pid
        if self.local_id is not None:
            attrs[A.LOCAL_ID] = self.local_id
        if self.backend:
            attrs[A.RDZV_BACKEND] = self.backend
        return attrs

    def known(self) -> SpanAttributes:
        """What the node last knew of its round (for stall reports)."""
        known: SpanAttributes = {}
        if self.round is not None:
            known[A.ROUND] = self.round
        if self.rank is not None:
            known[A.RANK] = self.rank
        if self.world_size is not None:
            known[A.WORLD_SIZE] = self.world_size
        if self.last_message:
            known[A.MESSAGE] = self.last_message
        return known

    def next_round_guess(self) -> int:
        """The round a join is headed for when torch has not named it yet."""
        if self.hint is not None:
            return self.hint
        return self.round + 1 if self.round is not None else 0

    def label_backend(self, backend: str) -> None:
        """torch's own events lack the backend; the agent's events and traced backends say it."""
        if self.backend:
            return
        self.backend = backend
        if self.member is not None:
            self.member.attributes.setdefault(A.RDZV_BACKEND, backend)


class RendezvousModel:
    """Feed :meth:`process` a process's rendezvous events in order; spans come out ended."""

    def __init__(
        self,
        trace_ids: TraceIds,
        listener: RoundListener,
        event_limit: int = DEFAULT_EVENT_LIMIT,
        heartbeat_logs: bool = True,
        round_trace_max_nodes: int = 0,
    ) -> None:
        self._trace = trace_ids
        self._listener = listener
        self.round_trace_max_nodes = round_trace_max_nodes
        self.event_limit = event_limit
        self.heartbeat_logs = heartbeat_logs
        self.heartbeat_logs_skipped = 0
        self.nodes: OrderedDict[NodeKey, Node] = OrderedDict()

    # --- queries ----------------------------------------------------------------------------

    def latest_node(self, run_id: str, pid: int | None = None) -> Node | None:
        """The most recently active node of ``run_id`` (of process ``pid`` when given)."""
        for node in reversed(self.nodes.values()):
            if node.run_id == run_id and (pid is None or node.pid == pid):
                return node
        return None

    def member_context(self, run_id: str) -> SpanRef | None:
        """The ids of the open member span of ``run_id``'s latest node (``RoundView``)."""
        node = self.latest_node(run_id)
        return node.member.ref if node is not None and node.member is not None else None

    def round_context(self, run_id: str) -> SpanRef | None:
        """The round's trace and the node's join span in it, when the node's spans are in a
        trace of their own (a large round); ``None`` otherwise (``RoundView``)."""
        node = self.latest_node(run_id)
        return node.round_ref if node is not None and node.member is not None else None

    def joined_round(self, run_id: str) -> int | None:
        """The round ``run_id``'s latest node last joined, if any (``RoundView``)."""
        node = self.latest_node(run_id)
        return node.round if node is not None else None

    def node_known(self, run_id: str) -> SpanAttributes:
        """What ``run_id``'s latest node knows of its round (``RoundView``, stall reports)."""
        node = self.latest_node(run_id)
        return node.known() if node is not None else {}

    def member_span(self, run_id: str) -> SpanRecord | None:
        """The open member span of ``run_id``'s latest node (for the logs of other events)."""
        node = self.latest_node(run_id)
        return node.member if node is not None else None

    def open_span_of_rank(self, run_id: str, rank: int) -> SpanRecord | None:
        """The open span (member, else join) of the node holding ``rank`` in ``run_id``."""
        for node in reversed(self.nodes.values()):
            if node.run_id == run_id and node.rank == rank:
                span = node.member or node.join
                if span is not None and span.trace_id:
                    return span
        return None

    def open_spans(self) -> Iterator[SpanRecord]:
        """Every open span that already has its trace id (joins get one with their round)."""
        for node in self.nodes.values():
            if node.join is not None and node.join.trace_id:
                yield node.join
            if node.member is not None:
                yield node.member

    def waits(self) -> Iterator[Wait]:
        """Joins under way, with what each node knows (for stall reports)."""
        for node in self.nodes.values():
            join = node.join
            if join is None:
                continue
            context = {**node.base_attributes(), **node.known()}
            context[A.ROUND] = node.next_round_guess()  # the round it waits to join
            yield Wait("rendezvous.join", join, context)

    # --- events -----------------------------------------------------------------------------

    def label_backend(self, run_id: str, backend: str) -> None:
        """The agent's events name the backend: label ``run_id``'s latest node with it."""
        node = self.latest_node(run_id)
        if node is not None:
            node.label_backend(backend)

    def process(self, ev: ElasticEvent, out: Output) -> Node | None:
        """Apply one rendezvous event; returns the node it created, if any (for eviction)."""
        if ev.local_id is None and self.latest_node(ev.run_id, pid=ev.pid) is None:
            # Backend set-up before any join (e.g. "hosts the TCP store"): no node yet.
            out.log(ev, None)
            return None
        node, created = self._node(ev)
        backend = ev.attributes.get(A.RDZV_BACKEND)
        if isinstance(backend, str):
            node.label_backend(backend)
        self._apply(node, ev, out)
        return node if created else None

    def _node(self, ev: ElasticEvent) -> tuple[Node, bool]:
        key = NodeKey(ev.run_id, ev.hostname, ev.pid, ev.local_id)
        node = self.nodes.get(key)
        if node is None and ev.local_id is None:
            # torch's state holder records without a local_id: it is this process's node.
            node = self.latest_node(ev.run_id, pid=ev.pid)
            if node is not None:
                key = node.key
        if node is None:
            node = self.nodes[key] = Node(ev.run_id, ev.hostname, ev.pid, ev.local_id)
            return node, True
        self.nodes.move_to_end(key)
        return node, False

    def _apply(self, node: Node, ev: ElasticEvent, out: Output) -> None:
        action = ev.action
        t = ev.time_ns
        if action not in _AGGREGATED:
            node.last_message = ev.body
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
                span.attributes[key] = _count(span.attributes, key) + 1
                if action is RdzvAction.KEEP_ALIVE:
                    span.attributes[A.KEEP_ALIVE_LAST_NS] = t
                if not self.heartbeat_logs:  # counted on the span: that is its record
                    self.heartbeat_logs_skipped += 1
                    return
        elif action is RdzvAction.KEEP_ALIVE_FAILED and node.member is not None:
            attrs = node.member.attributes
            attrs[A.KEEP_ALIVE_FAILURES] = _count(attrs, A.KEEP_ALIVE_FAILURES) + 1
            node.member.add_event(action.value, t, _event_attrs(ev), important=True)
        elif action is RdzvAction.CLOSED:
            self.close_node(node, t, "rendezvous closed", False, out, ev)
            self._log(node, ev, out, node.prev_member)
            return
        elif ev.node_state == NodeState.FAILED:
            self._failed(node, ev, out)
            return
        else:
            span = node.join or node.member
            if span is not None:
                span.add_event(
                    action.value if action else RdzvAction.OTHER.value,
                    t,
                    _event_attrs(ev),
                    important=ev.node_state == NodeState.SUCCEEDED,
                )
        self._log(node, ev, out)

    def _start_join(self, node: Node, ev: ElasticEvent, out: Output) -> None:
        t = ev.time_ns
        if node.member is not None:
            self._end_member(node, t, STATUS_UNSET, "re-rendezvous", out)
        if node.join is not None:  # a duplicate or an attempt whose end we never saw
            self._flush_pending(node, out)
            self._emit_join(
                node, node.join.end(t, STATUS_UNSET, "superseded by a new attempt"), out
            )
        self._listener.node_rejoining(node.run_id, t)
        node.join = SpanRecord(
            A.SPAN_RDZV_JOIN, t, node.base_attributes(), event_limit=self.event_limit
        )
        node.hint = None

    def _resolve_join(self, node: Node, out: Output) -> None:
        """The join's round is known: give it its trace and release the logs that waited."""
        if node.join is not None and not node.join.trace_id and node.hint is not None:
            node.join.trace_id = self._trace(node.run_id, node.hint)
            node.join.attributes[A.ROUND] = node.hint
            if node.prev_member is not None:
                node.join.links.append(node.prev_member.link())
        self._flush_pending(node, out)

    def _flush_pending(self, node: Node, out: Output) -> None:
        for pending in node.pending:
            out.log(pending, node.join)
        node.pending.clear()

    def _emit_join(self, node: Node, span: SpanRecord, out: Output) -> None:
        if not span.trace_id:
            round_key = node.next_round_guess()
            span.trace_id = self._trace(node.run_id, round_key)
            span.attributes.setdefault(A.ROUND, round_key)
        out.spans.append(span)
        node.join = None

    def _joined(self, node: Node, ev: ElasticEvent, out: Output) -> None:
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
        round_attrs: SpanAttributes = {A.ROUND: rnd}
        if ev.rank is not None:
            round_attrs[A.RANK] = ev.rank
        if ev.world_size is not None:
            round_attrs[A.WORLD_SIZE] = ev.world_size

        own = self._node_trace(node, rnd, ev.rank, ev.world_size)
        join = node.join
        member = SpanRecord(
            A.SPAN_RDZV_MEMBER,
            t,
            node.base_attributes(),
            trace_id=own or trace,
            event_limit=self.event_limit,
        )
        member.attributes.update(round_attrs)
        node.round_ref = None
        if join is not None:
            if not join.trace_id or node.hint != rnd:
                join.trace_id = trace
            join.attributes.update(round_attrs)
            node.hint = rnd
            self._flush_pending(node, out)
            out.log(ev, join)
            join.end(t, STATUS_OK)
            if own:  # linked both ways: the ids of both are known now
                # Its events are log records on it already; 4,096 joins share this trace.
                join.events.clear()
                join.links.append(_layout_link(member, rnd, A.LINK_NODE))
                member.links.append(_layout_link(join, rnd, A.LINK_ROUND))
                node.round_ref = SpanRef(join.trace_id, join.span_id)
            elif join.trace_id == trace:
                member.parent_span_id = join.span_id
            self._emit_join(node, join, out)
        else:
            self._flush_pending(node, out)
        if node.prev_member is not None:
            member.links.append(node.prev_member.link())
        node.member = member
        if join is None:
            out.log(ev, member)

    def _node_trace(self, node: Node, rnd: int, rank: int | None, world: int | None) -> int:
        """The trace of the node's own spans in a round too large for one trace (else 0)."""
        limit = self.round_trace_max_nodes
        if limit <= 0 or world is None or world <= limit:
            return 0
        who = f"rank {rank}" if rank is not None else f"{node.hostname} {node.pid} {node.local_id}"
        return self._trace(node.run_id, f"{rnd} {who}")

    def _failed(self, node: Node, ev: ElasticEvent, out: Output) -> None:
        t = ev.time_ns
        if node.join is not None:
            join = node.join
            node.hint = node.next_round_guess()
            self._resolve_join(node, out)
            join.record_error(ev)
            out.log(ev, join)
            self._emit_join(node, join.end(t, STATUS_ERROR), out)
            return
        if node.member is not None:
            member = node.member
            member.record_error(ev)
            out.log(ev, member)
            if ev.action is not RdzvAction.SHUTDOWN_FAILED:
                self._end_member(node, t, STATUS_ERROR, "rendezvous error", out)
            return
        out.log(ev, None)

    def _end_member(self, node: Node, t: int, status: str, reason: str, out: Output) -> None:
        member = node.member
        if member is None:
            return
        out.spans.append(member.end(t, status, reason))
        node.prev_member = MemberRef(member.trace_id, member.span_id, node.round or 0)
        self._listener.member_ended(node.run_id, node.prev_member.link())
        node.member = None

    def close_node(
        self,
        node: Node,
        t: int,
        reason: str,
        error: bool,
        out: Output,
        ev: ElasticEvent | None = None,
    ) -> None:
        """End the node's open spans: rendezvous closed (``ev``), process exit, or eviction."""
        if node.join is not None:
            join = node.join
            node.hint = node.next_round_guess()
            self._resolve_join(node, out)
            if error:
                join.set_error(reason)
            self._emit_join(node, join.end(t, STATUS_UNSET, reason), out)
        self._flush_pending(node, out)
        if node.member is not None:
            if ev is not None:
                node.member.add_event(
                    ev.action.value if ev.action else RdzvAction.CLOSED.value,
                    t,
                    _event_attrs(ev),
                    important=True,
                )
            if error:
                node.member.set_error(reason)
            closed = ev is not None and ev.action is RdzvAction.CLOSED
            status = STATUS_ERROR if error else (STATUS_OK if closed else STATUS_UNSET)
            self._end_member(node, t, status, reason, out)

    def end_open(self, t: int, reason: str, error: bool, out: Output) -> None:
        """End every node's open spans; what is known of the nodes (round, rank) stays."""
        for node in list(self.nodes.values()):
            self.close_node(node, t, reason, error, out)

    def evict_oldest(self, t: int, out: Output) -> None:
        _, node = self.nodes.popitem(last=False)
        self.close_node(node, t, "evicted: state limit reached", False, out)

    def _log(
        self,
        node: Node,
        ev: ElasticEvent,
        out: Output,
        fallback: MemberRef | None = None,
    ) -> None:
        if node.join is not None:
            if node.join.trace_id:
                out.log(ev, node.join)
            elif len(node.pending) < _MAX_PENDING_LOGS:
                node.pending.append(ev)
            else:
                out.log(ev, None)
        elif node.member is not None:
            out.log(ev, node.member)
        elif fallback is not None:
            out.logs.append(LogOut(ev, fallback.trace_id, fallback.span_id))
        else:
            out.log(ev, None)


def _layout_link(span: SpanRecord, rnd: int, kind: str) -> SpanLink:
    return SpanLink(span.trace_id, span.span_id, {A.ROUND: rnd, A.LINK_KIND: kind})


def _count(attrs: SpanAttributes, key: str) -> int:
    """A counter this model keeps among a span's attributes (0 before the first)."""
    value = attrs.get(key, 0)
    return value if isinstance(value, int) else 0


def _event_attrs(ev: ElasticEvent) -> SpanAttributes:
    attrs: SpanAttributes = {A.NODE_STATE: ev.node_state}
    if ev.round is not None:
        attrs[A.ROUND] = ev.round
    if ev.body:
        attrs[A.MESSAGE] = ev.body
    return attrs
