"""The slow-node exchange: each node's time inside, through the agents' rendezvous store.

Once per straggler window a node publishes one small value (:mod:`elastic_otel.model.slow_nodes`)
under its own key, and node 0 of the round reads every node's key once (one ``multi_get``),
compares them and reports a slow node. Store I/O runs on a daemon thread of its own, on a clone
of the store with a short timeout: a cut link delays only this thread, never the training watch.
Kept apart from the stall path's store exchange on purpose (the two may merge).
Design: ``docs/hangs.md`` (Stragglers).
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from typing import Any

from elastic_otel.model.slow_nodes import NodeInside, SlowNode, SlowNodeWatch, decode, encode

_logger = logging.getLogger("elastic_otel")

PREFIX = "elastic_otel/slow_nodes"
"""Keys: ``<PREFIX>/<round>/<node rank>``, one per node, replaced each window."""
STORE_TIMEOUT_S = 5.0
"""Longest wait of one store operation on the exchange's clone of the store."""


def key(round_: int, node_rank: int) -> str:
    return f"{PREFIX}/{round_}/{node_rank}"


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
    ) -> None:
        self.round = round_
        self.node_rank = node_rank
        self.nodes = nodes
        self.watch = SlowNodeWatch(threshold) if node_rank == 0 and nodes > 1 else None
        self._report = report
        self._store = store
        self._pending: NodeInside | None = None
        self._seen: dict[int, int] = {}  # node rank → the window of its value last compared
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def publish(self, value: NodeInside) -> None:
        """Hand this window's value to the exchange thread (never blocks: a value not yet
        sent is replaced by the newer one)."""
        if self.nodes < 2 or self._closed:
            return
        with self._lock:
            self._pending = value
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
            if value is None or self._closed:
                continue
            try:
                if store is None:
                    store = _bounded(self._store)
                store.set(key(self.round, self.node_rank), encode(value))
                if self.watch is not None:
                    self._compare(store)
            except Exception:  # a cut link, a store gone with its round: never the agent's
                _logger.debug("elastic-otel: slow-node exchange failed", exc_info=True)

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
    agent: Any, worker_group: Any, threshold: float, report: Callable[[SlowNode], None]
) -> StragglerExchange | None:
    """The exchange for the round torch's agent just joined (``WorkerGroup.store`` and its
    group rank, set by ``_rendezvous``); ``None`` for a one-node round or without a store."""
    store = getattr(worker_group, "store", None)
    node_rank = getattr(worker_group, "group_rank", None)
    nodes = getattr(worker_group, "group_world_size", None)
    if store is None or not isinstance(node_rank, int) or not isinstance(nodes, int) or nodes < 2:
        return None
    return StragglerExchange(
        store, _round(agent, worker_group), node_rank, nodes, threshold, report
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
