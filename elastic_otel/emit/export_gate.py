"""The export gate: no gRPC call of the bridge's exporters is under way when the process forks.

gRPC's fork handlers give up when another thread is inside a gRPC call at ``fork()``, and the
child's exports can then hang until their deadline although the collector is up. So every RPC
of the bridge's OTLP/gRPC exporters passes this gate (:func:`gate_grpc_calls`), which closes
before a fork, waits for the calls under way at most :data:`FORK_WAIT_S`, and opens after it.
The gate also holds the process's export thread, so that what is built with the same gate
exports on one thread. Imports nothing of the SDK. Design: ``docs/guarantees.md`` (Forked
processes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # imports the SDK: made only once something exports
    from elastic_otel.emit.export_thread import ExportThread

FORK_WAIT_S = 0.5
"""Longest a fork waits for the RPCs under way (a healthy collector answers in ms)."""

E = TypeVar("E")


class ExportGate:
    """Counts the RPCs under way; closes around a fork; holds the process's export thread. One
    per process, held by the bridge's process state (:mod:`elastic_otel.bridge.process`) and
    hooked into ``os.fork`` by its fork guard."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = 0
        self._forking = False
        self.forks_waited_out = 0  # forks that went ahead with an RPC still under way
        self._export_thread: ExportThread | None = None

    def export_thread(self) -> ExportThread:
        """The process's export thread (:mod:`elastic_otel.emit.export_thread`), made on first
        use: the pipeline, the meter provider and a worker's providers built with this gate
        share it. A forked child keeps the object; its thread and jobs are the child's own."""
        with self._cond:
            if self._export_thread is None:
                from elastic_otel.emit.export_thread import ExportThread

                self._export_thread = ExportThread()
            return self._export_thread

    @contextmanager
    def exporting(self) -> Iterator[None]:
        """Hold the gate open around one RPC."""
        with self._cond:
            self._cond.wait_for(lambda: not self._forking)
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

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


class _GatedStub:
    """An OTLP service stub whose ``Export`` RPC passes the gate."""

    def __init__(self, inner: Any, gate: ExportGate) -> None:
        self._inner = inner
        self._gate = gate

    def Export(self, *args: Any, **kwargs: Any) -> Any:  # gRPC's method name
        with self._gate.exporting():
            return self._inner.Export(*args, **kwargs)


def gate_grpc_calls(exporter: E, gate: ExportGate | None) -> E:
    """Route the RPCs of an OTLP/gRPC exporter (``OTLPExporterMixin``: spans, logs, metrics)
    through ``gate`` (``None``: no gate), including the stubs it makes when it reconnects;
    other exporters are returned unchanged. Returns ``exporter``."""
    make_stub: Callable[[Any], Any] | None = getattr(exporter, "_stub", None)
    if gate is None or not callable(make_stub) or not hasattr(exporter, "_channel"):
        return exporter
    held: ExportGate = gate

    def gated_stub(channel: Any) -> _GatedStub:
        return _GatedStub(make_stub(channel), held)

    exporter._stub = gated_stub  # type: ignore[attr-defined]
    client = getattr(exporter, "_client", None)
    if client is not None:
        exporter._client = _GatedStub(client, held)  # type: ignore[attr-defined]
    return exporter
