"""A rendezvous node and the life of its spans: ``rendezvous.join``, then ``rendezvous.member``.

:class:`NodeSpans` is how one node's spans are opened, given their trace (the round's, or the
node's own in a large round), linked, ended, and how the node's log records find the span they
belong to, holding join-phase logs until the round is known. Which node an event is about and
which step it means is :class:`~elastic_otel.model.rendezvous.RendezvousModel`'s concern: it
keeps the nodes and calls the steps here. What the agent side must hear of a node goes out
through :class:`RoundListener`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from elastic_otel.model.spans import (
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
from elastic_otel.model.trace_ids import TraceIds
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import ElasticEvent, RdzvAction

_MAX_PENDING_LOGS = 256


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


class NodeSpans:
    """The steps of a node's spans, each applied to the :class:`Node` it is given."""

    def __init__(
        self,
        trace_ids: TraceIds,
        listener: RoundListener,
        event_limit: int,
        round_trace_max_nodes: int = 0,
    ) -> None:
        self._trace = trace_ids
        self._listener = listener
        self.event_limit = event_limit
        self.round_trace_max_nodes = round_trace_max_nodes

    def start_join(self, node: Node, ev: ElasticEvent, out: Output) -> None:
        """A join attempt: the node's membership and any join left open end first."""
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

    def resolve_join(self, node: Node, out: Output) -> None:
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

    def joined(self, node: Node, ev: ElasticEvent, out: Output) -> None:
        """The node joined a round: its join ends, its member span of the round starts."""
        t = ev.time_ns
        rnd = ev.round if ev.round is not None else (node.hint if node.hint is not None else 0)
        if node.member is not None:
            if node.round == rnd and node.join is None:  # duplicate
                node.member.add_event("duplicate_joined", t, {})
                self.log(node, ev, out)
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

    def failed(self, node: Node, ev: ElasticEvent, out: Output) -> None:
        """torch reported the node FAILED: the open join or membership ends in error."""
        t = ev.time_ns
        if node.join is not None:
            join = node.join
            node.hint = node.next_round_guess()
            self.resolve_join(node, out)
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

    def close(
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
            self.resolve_join(node, out)
            if error:
                join.set_error(reason)
            self._emit_join(node, join.end(t, STATUS_UNSET, reason), out)
        self._flush_pending(node, out)
        if node.member is not None:
            if ev is not None:
                node.member.add_event(
                    ev.action.value if ev.action else RdzvAction.CLOSED.value,
                    t,
                    event_attrs(ev),
                    important=True,
                )
            if error:
                node.member.set_error(reason)
            closed = ev is not None and ev.action is RdzvAction.CLOSED
            status = STATUS_ERROR if error else (STATUS_OK if closed else STATUS_UNSET)
            self._end_member(node, t, status, reason, out)

    def log(
        self,
        node: Node,
        ev: ElasticEvent,
        out: Output,
        fallback: MemberRef | None = None,
    ) -> None:
        """``ev`` as a log record of the node's open span; a join's waits for its round."""
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


def event_attrs(ev: ElasticEvent) -> SpanAttributes:
    """A rendezvous event as the attributes of a span event."""
    attrs: SpanAttributes = {A.NODE_STATE: ev.node_state}
    if ev.round is not None:
        attrs[A.ROUND] = ev.round
    if ev.body:
        attrs[A.MESSAGE] = ev.body
    return attrs
