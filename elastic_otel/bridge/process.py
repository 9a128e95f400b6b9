"""The bridge's process-wide state, with one owner: what the operating system makes one per
process (the exit path, run by ``atexit`` and on SIGTERM; the fork guard and the export gate,
hooked into ``os.fork``; the filter on the process-wide OpenTelemetry loggers that reports the
first export warning), the process's bridge handler that torch's registry and the traced
rendezvous backends share, and the rendezvous run id the process is in.

:func:`bridge_process` makes it on first use. Why one object: these are hooked into the
process in a set order (the fork guard before any hook that starts threads in a child), a
forked child resets them together, and a reader finds every piece of process-wide bridge
state here and nowhere else (design: ``docs/architecture.md``).
"""

from __future__ import annotations

import gc
import logging
import threading
from typing import TYPE_CHECKING

from elastic_otel.bridge.fork_safety import ForkGuard
from elastic_otel.bridge.process_exit import ExitPath
from elastic_otel.emit.export_gate import ExportGate

if TYPE_CHECKING:  # the SDK loads only once the bridge starts
    from elastic_otel.emit.delivery import ExportWarnings


class BridgeProcess:
    """The bridge's one-per-process parts.

    ``handler`` is the process's bridge handler once :func:`elastic_otel.bridge.handler.get_handler`
    made it; ``run_id`` the rendezvous run id set by the traced rendezvous (metrics carry it).
    """

    def __init__(self) -> None:
        self.export_gate = ExportGate()
        self.fork_guard = ForkGuard(self.export_gate)
        self.exit_path = ExitPath()
        self._export_warnings: ExportWarnings | None = None
        self.lock = threading.RLock()
        self.handler: logging.Handler | None = None
        self.run_id: str | None = None
        self.heap_frozen = False

    def freeze_heap(self) -> None:
        """Once per process, when the bridge is activated: move every object alive now
        (torch's and the host's modules: ~170,000 in torchrun's agent) out of the GC's scans.

        Each full collection walks every tracked object, ~90 ms for torchrun's heap, and the
        bridge makes them come: its SDK imports set one off before the rendezvous, a burst of
        records one a second (``BENCHMARKS.md`` §3, §4). Frozen objects are still freed by
        reference counting; only a reference cycle among them that dies later is never
        collected, so the young generations are collected first (their cycles are the ones
        that die). ``ELASTIC_OTEL_GC_FREEZE=false`` leaves the collector alone."""
        if self.heap_frozen:
            return
        self.heap_frozen = True
        gc.collect(1)
        gc.freeze()

    @property
    def export_warnings(self) -> ExportWarnings:
        """The process's filter on the OpenTelemetry loggers (made when first asked for)."""
        with self.lock:
            if self._export_warnings is None:
                from elastic_otel.emit.delivery import ExportWarnings

                self._export_warnings = ExportWarnings()
            return self._export_warnings


_process: BridgeProcess | None = None
_lock = threading.Lock()


def bridge_process() -> BridgeProcess:
    """This process's :class:`BridgeProcess` (made on first use)."""
    global _process
    process = _process
    if process is None:
        with _lock:
            if _process is None:
                _process = BridgeProcess()
            process = _process
    return process
