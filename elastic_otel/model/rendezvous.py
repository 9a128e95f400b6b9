"""Rendezvous state machine: torch's ``RdzvEvent``s of one process as spans, per node and round.

Per node (hostname, pid, local_id) and round, ``rendezvous.join`` from "attempts to join" to
"has joined round N", then ``rendezvous.member`` until a re-join, the close, a failure or the
process's exit, with the keep-alives counted on it. The round, and so the trace id, is known
only from torch's message, so a join's log records wait for it; a large round gives each node
a trace of its own. Spans: ``docs/trace-model.md``; the seams with the agent side and
:class:`~elastic_otel.model.rendezvous_node.NodeSpans`: ``docs/architecture.md``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from elastic_otel.model.rendezvous_node import Node, NodeKey, NodeSpans, RoundListener, event_attrs
from elastic_otel.model.spans import (
    DEFAULT_EVENT_LIMIT,
    Output,
    SpanAttributes,
    SpanRecord,
    SpanRef,
)
from elastic_otel.model.stalls import Wait
from elastic_otel.model.trace_ids import TraceIds
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import NodeState
from elastic_otel.parsing.torch_events import ElasticEvent, RdzvAction

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
        self._spans = NodeSpans(trace_ids, listener, event_limit, round_trace_max_nodes)
        self.heartbeat_logs = heartbeat_logs
        self.heartbeat_logs_skipped = 0
        self.nodes: OrderedDict[NodeKey, Node] = OrderedDict()  # least recently active first
        # The same nodes by run id, in the same order: the lookups by run id, once per event,
        # must not walk every node a replay of thousands of nodes or an aggregator tracks.
        self._runs: dict[str, OrderedDict[NodeKey, Node]] = {}

    # --- queries ----------------------------------------------------------------------------

    def latest_node(self, run_id: str, pid: int | None = None) -> Node | None:
        """The most recently active node of ``run_id`` (of process ``pid`` when given)."""
        for node in reversed(self._runs.get(run_id, {}).values()):
            if pid is None or node.pid == pid:
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
        for node in reversed(self._runs.get(run_id, {}).values()):
            if node.rank == rank:
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
            self._runs.setdefault(ev.run_id, OrderedDict())[key] = node
            return node, True
        self.nodes.move_to_end(key)
        self._runs[node.run_id].move_to_end(key)
        return node, False

    def _apply(self, node: Node, ev: ElasticEvent, out: Output) -> None:
        action = ev.action
        t = ev.time_ns
        if action not in _AGGREGATED:
            node.last_message = ev.body
        if action is RdzvAction.JOIN_ATTEMPT:
            self._spans.start_join(node, ev, out)
        elif action is RdzvAction.JOINED:
            self._spans.joined(node, ev, out)
            return
        elif action in _ROUND_HINTS and node.join is not None:
            if node.hint is None and ev.round is not None:
                node.hint = ev.round  # the wait list names the round it waits for
                self._spans.resolve_join(node, out)
            node.join.add_event(
                action.value, t, event_attrs(ev), important=action is RdzvAction.MARKED_COMPLETE
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
            node.member.add_event(action.value, t, event_attrs(ev), important=True)
        elif action is RdzvAction.CLOSED:
            self._spans.close(node, t, "rendezvous closed", False, out, ev)
            self._spans.log(node, ev, out, node.prev_member)
            return
        elif ev.node_state == NodeState.FAILED:
            self._spans.failed(node, ev, out)
            return
        else:
            span = node.join or node.member
            if span is not None:
                span.add_event(
                    action.value if action else RdzvAction.OTHER.value,
                    t,
                    event_attrs(ev),
                    important=ev.node_state == NodeState.SUCCEEDED,
                )
        self._spans.log(node, ev, out)

    def end_open(self, t: int, reason: str, error: bool, out: Output) -> None:
        """End every node's open spans; what is known of the nodes (round, rank) stays."""
        for node in list(self.nodes.values()):
            self._spans.close(node, t, reason, error, out)

    def evict_oldest(self, t: int, out: Output) -> None:
        key, node = self.nodes.popitem(last=False)
        run = self._runs[node.run_id]
        del run[key]
        if not run:
            del self._runs[node.run_id]
        self._spans.close(node, t, "evicted: state limit reached", False, out)

    def forget(self) -> None:
        """Drop every node (after :meth:`end_open`)."""
        self.nodes.clear()
        self._runs.clear()


def _count(attrs: SpanAttributes, key: str) -> int:
    """A counter this model keeps among a span's attributes (0 before the first)."""
    value = attrs.get(key, 0)
    return value if isinstance(value, int) else 0
