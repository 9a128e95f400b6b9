"""The slow-node and slow-link exchange: each node's time inside and its links' statistics,
through the agents' rendezvous store.

Once per straggler window a node publishes small values under its own keys: its ranks' time
inside (:mod:`elastic_otel.model.slow_nodes`) and, with link statistics on, what its TCP
connections and RDMA ports showed over the window (:mod:`elastic_otel.model.links`, read here,
off the training watch's thread) with its ranks' point-to-point edges. Node 0 of the round reads
every node's keys once (one ``multi_get`` each), compares them and reports a slow node, or,
while a slowdown is under way, the slow link. Store I/O runs on a daemon thread of its own, on a
clone of the store with a short timeout: a cut link delays only this thread, never the training
watch. Kept apart from the stall path's store exchange on purpose (the two may merge).
Design: ``docs/hangs.md`` (Stragglers; Slow links and slowdowns).
"""

from __future__ import annotations

import datetime
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from elastic_otel.integration.link_stats import LinkStats
from elastic_otel.model import link_records, links
from elastic_otel.model.p2p_edges import Edge
from elastic_otel.model.slow_nodes import NodeInside, SlowNode, SlowNodeWatch, decode, encode

if TYPE_CHECKING:
    from elastic_otel.config.settings import Settings

_logger = logging.getLogger("elastic_otel")

PREFIX = "elastic_otel/slow_nodes"
"""Keys: ``<PREFIX>/<round>/<node rank>``, one per node, replaced each window."""
LINKS_PREFIX = "elastic_otel/links"
"""Keys of the nodes' link statistics: ``<LINKS_PREFIX>/<round>/<node rank>``."""
STORE_TIMEOUT_S = 5.0
"""Longest wait of one store operation on the exchange's clone of the store."""


def key(round_: int, node_rank: int, prefix: str = PREFIX) -> str:
    return f"{prefix}/{round_}/{node_rank}"


class StragglerExchange:
    """One node's side of the exchange for one round (the reader's too on node 0)."""

    def __init__(
        self,
        store: Any,
        round_: int,
        node_rank: int,
        nodes: int,
        threshold: float,
        report: Callable[[SlowNode], None],
        link_stats: LinkStats | None = None,
        report_link: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.round = round_
        self.node_rank = node_rank
        self.nodes = nodes
        self.watch = SlowNodeWatch(threshold) if node_rank == 0 and nodes > 1 else None
        self._report = report
        self._store = store
        self._pending: NodeInside | None = None
        self._pids: list[int] = []
        self._window = 0
        self._communication = False  # a communication slowdown under way: name the link
        self._slowing = False  # a slowdown of any part under way: name a slow edge
        self._edges: tuple[tuple[int, ...], tuple[Edge, ...]] = ((), ())  # ranks, their edges
        self._link_stats = link_stats
        self._link_watch = links.LinkWatch() if node_rank == 0 and link_stats else None
        self._report_link = report_link
        self._local: links.NodeLinks | None = None  # this node's last link statistics
        self._links_seen: dict[int, int] = {}
        self._seen: dict[int, int] = {}  # node rank → the window of its value last compared
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def publish(
        self,
        value: NodeInside | None,
        pids: list[int] | None = None,
        window: int = 0,
        communication: bool = False,
        slowing: bool = False,
        edges: tuple[tuple[int, ...], tuple[Edge, ...]] = ((), ()),
    ) -> None:
        """Hand this window's value to the exchange thread (never blocks: what is not yet sent
        is replaced by the newer), with what the link reads need: the processes whose
        connections to read, the window's number, whether a slowdown is under way (of the time
        inside: ``communication``; of any part: ``slowing``) and the node's ranks with their
        point-to-point edges."""
        if self.nodes < 2 or self._closed or (value is None and self._link_stats is None):
            return
        with self._lock:
            self._pending = value
            self._pids, self._window, self._communication = pids or [], window, communication
            self._slowing, self._edges = slowing, edges
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="elastic-otel-straggler-exchange", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _run(self) -> None:
        store = None
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                value, self._pending = self._pending, None
                pids, window, communication = self._pids, self._window, self._communication
                slowing, edges = self._slowing, self._edges
                self._pids = []
            if self._closed or (value is None and not pids):
                continue
            try:
                if store is None:
                    store = _bounded(self._store)
                if value is not None:
                    store.set(key(self.round, self.node_rank), encode(value))
                    if self.watch is not None:
                        self._compare(store)
                if self._link_stats is not None and pids:
                    self._links(store, pids, window, communication, slowing, edges)
            except Exception:  # a cut link, a store gone with its round: never the agent's
                _logger.debug("elastic-otel: slow-node exchange failed", exc_info=True)

    def local_evidence(self) -> dict[str, Any]:
        """This node's own link evidence over its last window (empty: none read)."""
        local = self._local
        return dict(link_records.local_evidence(local)) if local is not None else {}

    def _links(
        self,
        store: Any,
        pids: list[int],
        window: int,
        communication: bool,
        slowing: bool,
        edges: tuple[tuple[int, ...], tuple[Edge, ...]],
    ) -> None:
        """Read this node's links, publish them; on node 0, compare every node's. A slow
        point-to-point edge is named during a slowdown of any part: a pipeline's sends and
        receives are not collectives, their time is between them."""
        assert self._link_stats is not None
        value = self._link_stats.read(pids, window)
        if value is None:
            return
        value = replace(value, ranks=edges[0], edges=edges[1])
        self._local = value
        store.set(key(self.round, self.node_rank, LINKS_PREFIX), links.encode(value))
        if self._link_watch is None:
            return
        keys = [key(self.round, n, LINKS_PREFIX) for n in range(self.nodes)]
        fresh = []
        for data in _read(store, keys):
            node = links.decode(data)
            if node is not None and node.window != self._links_seen.get(node.node_rank):
                self._links_seen[node.node_rank] = node.window
                fresh.append(node)
        report = self._link_watch.close_window(fresh)
        due = communication or (slowing and report is not None and report.transport == "p2p")
        if report is not None and due and self._report_link and not self._closed:
            self._report_link(dict(link_records.link_attributes(report)))

    def _compare(self, store: Any) -> None:
        """Read every node's value once; compare the fresh ones; report a slow node."""
        assert self.watch is not None
        keys = [key(self.round, n) for n in range(self.nodes)]
        values = _read(store, keys)
        fresh = []
        for data in values:
            node = decode(data)
            if node is not None and node.window != self._seen.get(node.node_rank):
                self._seen[node.node_rank] = node.window
                fresh.append(node)
        if len(fresh) < 2:
            return
        slow = self.watch.close_window(fresh)
        if slow is not None and not self._closed:
            self._report(slow)


def _bounded(store: Any) -> Any:
    """A clone of ``store`` (a connection of its own) whose operations time out after
    :data:`STORE_TIMEOUT_S`: the agent's own connection, which its rendezvous keep-alives use,
    is never used here, and keeps its timeout. Raises where the store cannot be cloned: no
    exchange then."""
    clone = store.clone()
    clone.set_timeout(datetime.timedelta(seconds=STORE_TIMEOUT_S))
    return clone


def _read(store: Any, keys: list[str]) -> list[bytes]:
    """The values of ``keys`` that exist: all of them in one ``multi_get`` once ``check`` says
    they are all there; else each present one (a node yet to publish)."""
    if store.check(keys):
        if hasattr(store, "multi_get"):
            return [bytes(v) for v in store.multi_get(keys)]
        return [bytes(store.get(k)) for k in keys]
    return [bytes(store.get(k)) for k in keys if store.check([k])]


def for_workers(
    agent: Any,
    worker_group: Any,
    threshold: float,
    report: Callable[[SlowNode], None],
    link_settings: Settings | None = None,
    report_link: Callable[[dict[str, Any]], None] | None = None,
) -> StragglerExchange | None:
    """The exchange for the round torch's agent just joined (``WorkerGroup.store`` and its
    group rank, set by ``_rendezvous``); ``None`` for a one-node round or without a store.
    With ``link_settings`` (where link statistics are on), it reads and compares the
    nodes' links too and hands a slow link to ``report_link``."""
    store = getattr(worker_group, "store", None)
    node_rank = getattr(worker_group, "group_rank", None)
    nodes = getattr(worker_group, "group_world_size", None)
    if store is None or not isinstance(node_rank, int) or not isinstance(nodes, int) or nodes < 2:
        return None
    stats = None
    if link_settings is not None:
        stats = LinkStats(node_rank, socket.gethostname(), link_settings.rdma_sysfs)
    return StragglerExchange(
        store, _round(agent, worker_group), node_rank, nodes, threshold, report, stats, report_link
    )


def _round(agent: Any, worker_group: Any) -> int:
    """The rendezvous round (dynamic backends), else the agent's restart count: keys of an
    earlier round are never read for this one."""
    try:
        return int(worker_group.spec.rdzv_handler._state_holder.state.round)
    except Exception:
        pass
    try:
        return int(worker_group.spec.max_restarts - agent._remaining_restarts)
    except Exception:
        return 0
