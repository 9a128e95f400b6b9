"""The store side of the stall exchange: a stalled node's few reads and writes in the round's
store, on a daemon thread of their own, so that every node's report names the late rank.

The training watch only asks (:meth:`StallExchange.exchanged`, :meth:`StallExchange.publish`)
and reads what the thread last found: it never waits on the store, which a cut link can block
for the store's whole timeout. What is published and what a value means:
:mod:`elastic_otel.model.stall_exchange`; the protocol: docs/hangs.md ("Every node names the
rank").
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from elastic_otel.model.stall_exchange import (
    MAX_ENTRIES,
    Culprit,
    count_key,
    culprits_key,
    decode_culprits,
    decode_waiting,
    encode_culprit,
    encode_waiting,
    in_no_collective,
    names_local_culprits,
    own_groups,
    stall_group,
    waiting_key,
    waits_on_other_nodes,
    with_remote_culprits,
    with_waiting_peers,
)
from elastic_otel.model.stalls import RankProgress, TrainingStall

_logger = logging.getLogger("elastic_otel")

STORE_TIMEOUT_S = 5.0
"""Longest wait of one store operation of the exchange (its own connection's timeout)."""
_MAX_PENDING = 32

Op = tuple[str, str, bytes]  # (kind, key, value)


class StallExchange:
    """One watched worker group's exchange, over its round's store (see the module docstring).
    Nothing touches the store until the group stalls."""

    def __init__(self, store: Any, wake: Callable[[], None], timeout_s: float = STORE_TIMEOUT_S):
        self._store = store  # torch's round store: cloned on the thread, never used here
        self._wake = wake
        self._timeout_s = timeout_s
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._lock = threading.Condition()
        self._pending: dict[str, Op] = {}  # by key: one pending operation per key
        self._published: set[tuple[str, bytes]] = set()
        self._found: dict[str, bytes] = {}  # key → the value last read
        self._thread: threading.Thread | None = None
        self._closed = False

    # --- the training watch's side: never blocks ---------------------------------------------

    def exchanged(self, stall: TrainingStall, ranks: list[RankProgress]) -> TrainingStall:
        """``stall`` with what other nodes said: the ranks they name when every local rank
        waits, the local ranks that are late when none is in a collective. Asks the thread to
        publish what this node waits in and to read again."""
        group = stall_group(stall)
        if group is not None and waits_on_other_nodes(stall):
            self._request("set", waiting_key(group), encode_waiting(stall))
            key = culprits_key(group, stall.number)
            self._request("get", key)
            local = {r.global_rank for r in ranks}
            return with_remote_culprits(stall, decode_culprits(self._value(key)), local)
        if in_no_collective(stall):
            for group in own_groups(ranks):
                key = waiting_key(group)
                self._request("get", key)
                waiting = decode_waiting(self._value(key))
                if waiting is not None:
                    named = with_waiting_peers(stall, ranks, group, waiting)
                    if named is not stall:
                        return named
        return stall

    def publish(self, stall: TrainingStall, frame: str) -> None:
        """Once per collective: this node's ranks the collective waits for (``frame``: the
        first one's innermost frame), for the nodes whose ranks all wait in it."""
        group = stall_group(stall)
        if group is None or not names_local_culprits(stall):
            return
        culprit = Culprit(
            self._host, self._pid, stall.waited_for, frame, stall.not_reached, stall.left
        )
        self._request("append", culprits_key(group, stall.number), encode_culprit(culprit))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._pending.clear()
            self._lock.notify_all()

    # --- the thread ----------------------------------------------------------------------------

    def _value(self, key: str) -> bytes | None:
        with self._lock:
            return self._found.get(key)

    def _request(self, kind: str, key: str, value: bytes = b"") -> None:
        with self._lock:
            if self._closed or (kind != "get" and (key, value) in self._published):
                return
            if kind != "get":
                self._published.add((key, value))  # once: a publication is never repeated
            if key not in self._pending and len(self._pending) < _MAX_PENDING:
                self._pending[key] = (kind, key, value)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="elastic-otel-stall-exchange", daemon=True
                )
                self._thread.start()
            self._lock.notify()

    def _run(self) -> None:
        store = None
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                key = next(iter(self._pending))
                op = self._pending.pop(key)
            try:
                if store is None:
                    store = self._store.clone()  # a connection of its own (see docs/hangs.md)
                    store.set_timeout(timedelta(seconds=self._timeout_s))
                self._apply(store, op)
            except Exception:  # a cut link, a store without clone: never the agent's problem
                _logger.debug("elastic-otel: stall exchange %s failed", key, exc_info=True)

    def _apply(self, store: Any, op: Op) -> None:
        kind, key, value = op
        if kind == "set":
            store.set(key, value)
        elif kind == "append":
            # A counter caps the entries: the value stays bounded however many nodes name one.
            if store.add(count_key(key), 1) <= MAX_ENTRIES:
                store.append(key, value)
        elif store.check([key]):  # never a get of a missing key: it blocks
            found = store.get(key)
            with self._lock:
                changed = self._found.get(key) != found
                self._found[key] = found
            if changed:
                self._wake()  # the watch reports what it names now, not an interval later
