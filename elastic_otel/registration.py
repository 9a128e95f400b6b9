"""torch registration: the ``otel`` destination, rendezvous routing and zero-code activation.

Zero-code activation rides on torch itself: importing ``torch.distributed.elastic.rendezvous``
(torchrun does, before it parses its arguments) loads the ``torchrun.handlers`` entry-point
group, where this package registers rendezvous backends. Loading that entry point calls
:func:`activate_from_environment`. Why this route: a ``.pth`` hook would run in every Python
process on the machine; this one runs only where torch elastic is imported, costs nothing
elsewhere, and needs neither a wrapper command nor a change to the training script.

In such a process the ``otel`` destination is always registered (cheaply: the SDK is only
imported at the first event). The bridge is *activated*, meaning its pipeline is built on the
main thread right away and ``dynamic_rendezvous`` is routed to it, when the job asks for it:
``--event-log-handler otel`` / ``PET_EVENT_LOG_HANDLER=otel``, or ``ELASTIC_OTEL_ENABLED=true``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from elastic_otel import environment_variables as env
from elastic_otel.environment_variables import env_flag
from elastic_otel.handler import OtelHandler

DESTINATION = "otel"
RDZV_DESTINATION = "dynamic_rendezvous"
_TORCH_LOGGER_PREFIX = "torchelastic-events-"

_lock = threading.RLock()
_handler: OtelHandler | None = None
_saved: dict[str, logging.Handler] = {}

_logger = logging.getLogger("elastic_otel")


def get_handler() -> OtelHandler:
    """The process-wide bridge handler (created on first use, without starting the SDK)."""
    global _handler
    with _lock:
        if _handler is None:
            _handler = OtelHandler()
        return _handler


def register(route_rendezvous: bool | None = None, start: bool = True) -> OtelHandler:
    """Register the ``otel`` destination with torch; idempotent and thread-safe.

    ``events.get_logging_handler("otel")`` then returns the bridge handler, and
    ``events.record(event, "otel")`` / ``torchrun --event-log-handler otel`` reach it. Unless
    ``route_rendezvous`` is false (default: ``ELASTIC_OTEL_RDZV_EVENTS``, true), torch's
    ``dynamic_rendezvous`` destination also feeds the bridge; a non-null handler already
    there keeps receiving events too. ``start`` builds the SDK pipeline now, on this thread,
    and reports torch's elastic metrics as OTel metrics (unless ``ELASTIC_OTEL_METRICS=false``).
    """
    from torch.distributed.elastic.events import handlers as torch_handlers

    if route_rendezvous is None:
        route_rendezvous = env_flag(env.ELASTIC_OTEL_RDZV_EVENTS, True)
    with _lock:
        handler = get_handler()
        registry = torch_handlers._log_handlers
        if registry.get(DESTINATION) is not handler:
            if DESTINATION in registry:
                _saved.setdefault(DESTINATION, registry[DESTINATION])
            registry[DESTINATION] = handler
        if route_rendezvous:
            _route_rendezvous(registry, handler)
        if start:
            handler.start()
            activate_metrics()
        return handler


def _route_rendezvous(registry: dict[str, logging.Handler], handler: OtelHandler) -> None:
    current = registry.get(RDZV_DESTINATION)
    if current is not handler and type(current) is logging.NullHandler:
        # torch skips building rendezvous events while this is a NullHandler.
        _saved.setdefault(RDZV_DESTINATION, current)
        registry[RDZV_DESTINATION] = handler
    # torch caches one logger per destination on first use, with the handler registered then
    # (it may exist already, or a custom handler stays registered): attach the bridge to that
    # logger directly too. Logger.addHandler ignores a handler that is already there, so torch
    # adding the registered bridge again later is harmless.
    logging.getLogger(_TORCH_LOGGER_PREFIX + RDZV_DESTINATION).addHandler(handler)


def unregister() -> None:
    """Undo :func:`register` (torch's own handlers are put back); the handler keeps running."""
    from torch.distributed.elastic.events import handlers as torch_handlers

    with _lock:
        if _handler is None:
            return
        registry = torch_handlers._log_handlers
        for dest in (DESTINATION, RDZV_DESTINATION):
            if registry.get(dest) is _handler:
                if dest in _saved:
                    registry[dest] = _saved.pop(dest)
                else:
                    del registry[dest]
            logging.getLogger(_TORCH_LOGGER_PREFIX + dest).removeHandler(_handler)


def requested_by_environment(argv: list[str] | None = None) -> bool:
    """Whether this process asked for the bridge (see module docstring)."""
    explicit = os.environ.get(env.ELASTIC_OTEL_ENABLED, "").strip().lower()
    if explicit:
        return explicit in ("1", "true", "yes", "on")
    if os.environ.get(env.PET_EVENT_LOG_HANDLER, "").strip() == DESTINATION:
        return True
    argv = sys.argv if argv is None else argv
    for i, arg in enumerate(argv):
        if arg in ("--event-log-handler", "--event_log_handler"):
            if i + 1 < len(argv) and argv[i + 1] == DESTINATION:
                return True
        elif arg in ("--event-log-handler=otel", "--event_log_handler=otel"):
            return True
    return False


def activate_from_environment() -> None:
    """Entry-point hook: register ``otel``; activate fully when the process asked for it."""
    try:
        if requested_by_environment():
            register(start=True)
        else:
            register(route_rendezvous=False, start=False)
    except Exception as e:  # never break torchrun's start-up
        _logger.warning("elastic-otel: not activated: %s", e)


def activate_metrics() -> None:
    """Report torchelastic's metrics as OTel metrics too, unless ``ELASTIC_OTEL_METRICS=false``."""
    try:
        from elastic_otel import metrics

        metrics.install()
    except Exception as e:  # never break torchrun's start-up
        _logger.warning("elastic-otel: metrics not activated: %s", e)


def _backend_creator(name: str) -> Any:
    """Activate, then hand torch a creator of the built-in backend ``name``, traced.

    torch's registry calls the creator with ``--rdzv-backend otel-<name>``; the handler it makes
    wraps the built-in one (:mod:`elastic_otel.rendezvous_tracing`). Metrics are reported
    whenever the bridge is activated here.
    """
    activate_from_environment()
    from elastic_otel.rendezvous_tracing import traced_creator

    return traced_creator(name)


def c10d_handler() -> Any:
    """``torchrun.handlers`` entry point ``otel-c10d``."""
    return _backend_creator("c10d")


def static_handler() -> Any:
    """``torchrun.handlers`` entry point ``otel-static``."""
    return _backend_creator("static")


def etcd_handler() -> Any:
    """``torchrun.handlers`` entry point ``otel-etcd``."""
    return _backend_creator("etcd")


def etcd_v2_handler() -> Any:
    """``torchrun.handlers`` entry point ``otel-etcd-v2``."""
    return _backend_creator("etcd-v2")
