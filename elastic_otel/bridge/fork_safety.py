"""Fork safety: threads the bridge brings into a forked child never take a thread id that an
object inherited from the parent still holds.

After ``fork()`` only the forking thread exists in the child, but glibc keeps the stacks of the
parent's other threads in its stack cache and hands them to the next threads the child starts.
A thread's ``pthread_t`` is the address of its descriptor on that stack, so a new thread in the
child gets the id of a parent thread that does not exist here. torch's ``TCPStore`` joins its
libuv daemon thread by id when it is destroyed; a store the child inherited (often garbage the
parent had not collected yet) joins, on destruction, whatever thread now has that id. Without
the bridge that id names nothing (``EINVAL``, torch aborts at once) or a detached Python thread
(the same). With the bridge it could name one of gRPC's joinable threads (its timer thread, its
event-engine pool), started in the child to export telemetry: ``join`` then waits forever with
the GIL held, no Python signal handler runs again, and a fast crash becomes a silent hang
(seen in torch's own agent tests with the collector unreachable: ``TCPStore::~TCPStore`` →
``~LibUVStoreDaemon`` → ``std::thread::join`` on ``grpc_global_timer``).

So in a forked child, before the bridge starts any thread there (at fork when the parent's
bridge was running, else when the child's bridge starts), the bridge parks one idle daemon
thread on each stack the parent's threads left behind. Every thread started later, the
bridge's, gRPC's, torch's, gets a fresh stack and an id no inherited object holds; an
inherited store's ``join`` meets a parked, detached thread and fails fast with ``EINVAL``, as
it does without the bridge. Nothing changes when or where garbage is collected, so a job's
outcome is its outcome without the bridge. The parked threads only wait on an event; their
cost (one thread start each, no new stack memory) is in BENCHMARKS.md.

How many stacks the parent left is counted in the child, from its memory map
(:func:`count_thread_stacks`), not from the parent's threads: a joinable thread that exited
and was never joined keeps its stack, and its id, in glibc's list of stacks in use, so the child
inherits it, but it is no longer a task in ``/proc/self/task``. A store's libuv daemon is such a
thread once the store's loop was stopped (a forked child that destroys its copy of a store
stops the parent's loop too: they share the loop's wakeup descriptor) while the store is still
garbage in the parent. Counting tasks missed those stacks; a thread the child started later
took one, and a store's ``join`` waited on it (the rare hang the fork test saw under load).
"""

from __future__ import annotations

import logging
import os
import threading

from elastic_otel.emit.export_gate import GATE as EXPORT_GATE

_logger = logging.getLogger("elastic_otel")

_THREAD_NAME = "elastic-otel-fork-stack"
_DECOY_MARGIN = 4
"""Decoys beyond the threads counted: a thread may start between the count and the fork."""


def count_threads() -> int:
    """Threads of this process, native ones included (0 where the OS does not say)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def count_thread_stacks() -> int:
    """Thread stacks mapped in this process (0 where the OS does not say): each an anonymous
    read-write mapping right above its guard page. Besides the stacks of running threads this
    counts those of exited threads nobody joined and those in glibc's cache; a mapping of that
    shape that is no stack only adds a parked thread."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return 0
    stacks = 0
    guard_end = b""
    for line in lines:
        fields = line.split()
        start, _, end = fields[0].partition(b"-")
        anonymous = len(fields) == 5
        if anonymous and fields[1] == b"rw-p" and start == guard_end:
            stacks += 1
        guard_end = end if anonymous and fields[1] == b"---p" else b""
    return stacks


class ForkGuard:
    """Keeps the stacks the parent's threads leave in a forked child away from new threads.

    One per process (:data:`GUARD`); :meth:`watch` hooks it into ``os.fork`` once.
    """

    def __init__(self) -> None:
        self._hooked = False
        self._lock = threading.Lock()
        self.bridge_running = False  # set by the bridge once it has started its threads
        self._decoys: threading.Event | None = None
        self.forked = False  # a forked child whose inherited stacks are not reserved yet
        self._parked = threading.Event()

    def watch(self) -> None:
        """Guard every fork from now on (idempotent)."""
        with self._lock:
            if self._hooked or not hasattr(os, "register_at_fork"):
                return
            self._hooked = True
        os.register_at_fork(
            before=self._before_fork,
            after_in_parent=self._after_fork_in_parent,
            after_in_child=self._after_fork_in_child,
        )

    def _before_fork(self) -> None:
        EXPORT_GATE.before_fork()  # no export inside gRPC at the fork (emit/export_gate.py)
        if self.bridge_running:
            # gRPC restarts its threads inside fork(), before any Python code runs in the
            # child, on the stacks of the parent's newest threads (glibc reuses them newest
            # first). Decoys started now are the newest: gRPC's threads take their ids.
            self._decoys = _park(count_threads() + _DECOY_MARGIN, "elastic-otel-fork-decoy")

    def _after_fork_in_parent(self) -> None:
        EXPORT_GATE.after_fork_in_parent()
        decoys, self._decoys = self._decoys, None
        if decoys is not None:
            decoys.set()

    def _after_fork_in_child(self) -> None:
        EXPORT_GATE.after_fork_in_child()
        self._lock = threading.Lock()  # another thread may have held it at fork
        self._parked = threading.Event()
        self._decoys = None
        self.forked = True
        running, self.bridge_running = self.bridge_running, False
        if running:
            # The SDK's own fork hooks are about to restart the parent's export threads here.
            self.reserve_inherited_stacks()

    def reserve_inherited_stacks(self) -> int:
        """In a forked child, once: park a thread on each stack the parent left behind.
        Returns how many were parked; never raises."""
        with self._lock:
            if not self.forked:
                return 0
            self.forked = False
            # Every thread stack mapped, not fewer for the threads the child already runs: a
            # few idle threads too many cost nothing; one too few can cost a hang.
            stacks = count_thread_stacks()
            if stacks <= 0 or _park(stacks, _THREAD_NAME, self._parked) is None:
                return 0
            return stacks


def _park(n: int, name: str, event: threading.Event | None = None) -> threading.Event | None:
    """Start ``n`` daemon threads that wait on ``event`` (a new one by default); ``None`` if
    they could not all start (e.g. at interpreter shutdown). Never raises."""
    event = threading.Event() if event is None else event
    try:
        for _ in range(n):
            threading.Thread(target=event.wait, name=name, daemon=True).start()
    except Exception:
        _logger.debug("elastic-otel: fork guard threads not started", exc_info=True)
        return None
    return event


GUARD = ForkGuard()
"""This process's guard: glibc's stack cache, like the threads in it, is process-wide."""
