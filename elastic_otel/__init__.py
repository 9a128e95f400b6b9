"""elastic-otel: PyTorch elastic (torchrun) events as OpenTelemetry logs and traces.

Zero-code: ``torchrun --event-log-handler otel ... train.py``. In code: :func:`register`,
:func:`flush`, :func:`stats`; in the training script torchrun starts:
:func:`start_worker_telemetry`, :func:`worker_context`, :func:`mark_first_step`,
:func:`mark_step`, :func:`saving_checkpoint`. Importing this package imports neither torch nor
the OpenTelemetry SDK. Usage: ``README.md``; design: ``docs/architecture.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from elastic_otel.bridge.handler import OtelHandler
    from elastic_otel.worker.training import WorkerTelemetry

from elastic_otel.version import __version__
from elastic_otel.worker.progress import mark_checkpoint, mark_step, saving_checkpoint

__all__ = [
    "OtelEventHandler",
    "__version__",
    "flush",
    "get_handler",
    "mark_checkpoint",
    "mark_first_step",
    "mark_step",
    "register",
    "saving_checkpoint",
    "start_worker_telemetry",
    "stats",
    "unregister",
    "worker_context",
]


def __getattr__(name: str) -> Any:
    # Lazy: the torchelastic 0.2 event handler is imported only when asked for.
    if name == "OtelEventHandler":
        from elastic_otel.integration.torchelastic_events import OtelEventHandler

        return OtelEventHandler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(route_rendezvous: bool | None = None, start: bool = True) -> OtelHandler:
    """Register the ``otel`` destination with torch (see :func:`registration.register`)."""
    from elastic_otel.integration.registration import register as register_with_torch

    return register_with_torch(route_rendezvous=route_rendezvous, start=start)


def unregister() -> None:
    """Put torch's own event destinations back."""
    from elastic_otel.integration.registration import unregister as unregister_from_torch

    unregister_from_torch()


def get_handler() -> OtelHandler:
    """The process-wide :class:`~elastic_otel.bridge.handler.OtelHandler`."""
    from elastic_otel.bridge.handler import get_handler as process_handler

    return process_handler()


def flush(timeout_s: float | None = None) -> bool:
    """Export everything recorded so far; ``True`` when it all got out within the timeout."""
    return get_handler().flush(timeout_s)


def stats() -> dict[str, int]:
    """Counters of the bridge (see :mod:`elastic_otel.emit.counters`): events received, processed,
    unparsed, dropped (queue full, after shutdown), records exported, export failures, records
    dropped during a collector outage or at exit."""
    return get_handler().all_stats()


def worker_context() -> Context:
    """In a worker torchrun started: the context of its rank's ``worker`` span
    (:func:`elastic_otel.worker.trace_context.worker_context`). The worker start-up already
    makes it the main thread's current context."""
    from elastic_otel.worker.trace_context import worker_context as from_environment

    return from_environment()


def mark_first_step() -> bool:
    """In a worker: its first training step
    (:func:`elastic_otel.worker.training.mark_first_step`)."""
    from elastic_otel.worker.training import mark_first_step as mark

    return mark()


def start_worker_telemetry(attach: bool = True) -> WorkerTelemetry:
    """In a worker: export its spans and metrics from the ``OTEL_*`` variables
    (:func:`elastic_otel.worker.training.start_worker_telemetry`)."""
    from elastic_otel.worker.training import start_worker_telemetry as start

    return start(attach)
