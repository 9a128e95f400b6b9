"""The export gate: no export of the bridge is inside gRPC when the process forks.

gRPC's fork handlers give up when another thread is inside a gRPC call at ``fork()`` ("Other
threads are currently calling into gRPC, skipping fork() handlers"); the child's gRPC is then
left half set up, and its first exports can hang until their deadline: a forked child's
telemetry is lost although the collector is up (seen: 2 children of 80 forked while the
parent exported steadily). So every export of the bridge's exporters (spans, logs, metrics)
passes this gate; before a fork the gate closes, waits for the exports under way to return
(at most :data:`FORK_WAIT_S`), and opens again right after the fork, in parent and child.
Exports that start meanwhile wait for it to open (on the SDK's export threads, never torch's).

The wait is bounded because an export to a collector that does not answer can take
``OTEL_EXPORTER_OTLP_TIMEOUT``: past the bound the fork goes ahead as it would without the
bridge. Imports nothing of the SDK: the fork guard hooks it in before the SDK is loaded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

FORK_WAIT_S = 0.5
"""Longest a fork waits for the exports under way (a healthy collector answers in ms)."""

T = TypeVar("T")


class ExportGate:
    """Counts the exports under way; closes around a fork. One per process (:data:`GATE`)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = 0
        self._forking = False
        self.forks_waited_out = 0  # forks that went ahead with an export still under way

    @contextmanager
    def exporting(self) -> Iterator[None]:
        """Hold the gate open around one export call."""
        with self._cond:
            while self._forking:
                self._cond.wait(FORK_WAIT_S)
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def run(self, call: Callable[[], T]) -> T:
        """``call()`` inside the gate."""
        with self.exporting():
            return call()

    def before_fork(self) -> None:
        with self._cond:
            self._forking = True
            if not self._cond.wait_for(lambda: self._busy == 0, FORK_WAIT_S):
                self.forks_waited_out += 1

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()

    def after_fork_in_child(self) -> None:
        # The threads that were exporting do not exist here; the lock may have been held.
        self._cond = threading.Condition()
        self._busy = 0
        self._forking = False


GATE = ExportGate()
"""This process's gate: gRPC's state, like fork, is process-wide."""
