"""torch registration: the ``otel`` destination in torch's event handler registry.

``events.get_logging_handler("otel")`` then returns the bridge handler, and
``events.record(event, "otel")`` / ``torchrun --event-log-handler otel`` reach it. torch's
``dynamic_rendezvous`` destination is routed to the bridge too, unless asked not to: torch
builds no rendezvous event at all while that destination is a ``NullHandler``.
"""

from __future__ import annotations

import logging
import threading

from elastic_otel.bridge.handler import OtelHandler, current_handler, get_handler
from elastic_otel.integration import agent_instrumentation
from elastic_otel.integration import torch_metrics as metrics
from elastic_otel.names import environment_variables as env
from elastic_otel.names.torch_names import DESTINATION, RDZV_DESTINATION, TORCH_EVENT_LOGGER_PREFIX

_lock = threading.RLock()
_saved: dict[str, logging.Handler] = {}  # torch's handlers we replaced, to put back


def register(route_rendezvous: bool | None = None, start: bool = True) -> OtelHandler:
    """Register the ``otel`` destination with torch; idempotent and thread-safe.

    Unless ``route_rendezvous`` is false (default: ``ELASTIC_OTEL_RDZV_EVENTS``, true),
    ``dynamic_rendezvous`` also feeds the bridge; a non-null handler already there keeps
    receiving events too. ``start`` builds the SDK pipeline now, on this thread, reports
    torch's elastic metrics as OTel metrics (unless ``ELASTIC_OTEL_METRICS=false``) and
    instruments torch's elastic agent (:mod:`elastic_otel.integration.agent_instrumentation`).
    """
    from torch.distributed.elastic.events import handlers as torch_handlers

    if route_rendezvous is None:
        route_rendezvous = env.env_flag(env.ELASTIC_OTEL_RDZV_EVENTS, True)
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
            metrics.install()
            wanted = env.env_switch(env.ELASTIC_OTEL_AGENT_INSTRUMENTATION)
            if wanted is not False:  # unset: on the tested torch versions; true: on any
                agent_instrumentation.instrument(force=wanted is True)
        return handler


def _route_rendezvous(registry: dict[str, logging.Handler], handler: OtelHandler) -> None:
    current = registry.get(RDZV_DESTINATION)
    if current is not handler and type(current) is logging.NullHandler:
        _saved.setdefault(RDZV_DESTINATION, current)
        registry[RDZV_DESTINATION] = handler
    # torch caches one logger per destination on first use, with the handler registered then
    # (it may exist already, or a custom handler stays registered): attach the bridge to that
    # logger directly too. Logger.addHandler ignores a handler that is already there, so torch
    # adding the registered bridge again later is harmless.
    logging.getLogger(TORCH_EVENT_LOGGER_PREFIX + RDZV_DESTINATION).addHandler(handler)


def rendezvous_routed(handler: logging.Handler) -> bool:
    """Whether torch's ``dynamic_rendezvous`` events reach ``handler``."""
    from torch.distributed.elastic.events import handlers as torch_handlers

    current = torch_handlers._log_handlers.get(RDZV_DESTINATION)
    if current is None or isinstance(current, logging.NullHandler):
        return False  # torch builds no rendezvous event at all
    if current is handler:
        return True
    return handler in logging.getLogger(TORCH_EVENT_LOGGER_PREFIX + RDZV_DESTINATION).handlers


def unregister() -> None:
    """Undo :func:`register` (torch's own handlers and agent methods are put back); the
    handler keeps running."""
    from torch.distributed.elastic.events import handlers as torch_handlers

    agent_instrumentation.uninstrument()
    with _lock:
        handler = current_handler()
        if handler is None:
            return
        registry = torch_handlers._log_handlers
        for dest in (DESTINATION, RDZV_DESTINATION):
            if registry.get(dest) is handler:
                if dest in _saved:
                    registry[dest] = _saved.pop(dest)
                else:
                    del registry[dest]
            logging.getLogger(TORCH_EVENT_LOGGER_PREFIX + dest).removeHandler(handler)
