"""torch registration: the ``otel`` destination in torch's event handler registry, and the one
owner of everything registering changes.

:class:`Registration` installs the ``otel`` destination (and ``dynamic_rendezvous``, without
which torch builds no rendezvous event, with a cheaper naming of those events), torchelastic's
metrics, the agent instrumentation and an exit step, keeping what it replaced on the instance;
:meth:`Registration.uninstall` undoes exactly that, as OpenTelemetry's ``BaseInstrumentor``
does. The bridge handler itself outlives :func:`unregister`. Design: ``docs/architecture.md``
(Life cycle).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from elastic_otel.bridge.handler import OtelHandler, get_handler
from elastic_otel.config.settings import Settings
from elastic_otel.integration import agent_instrumentation, rendezvous_names
from elastic_otel.integration import torch_metrics as metrics
from elastic_otel.names.torch_names import DESTINATION, RDZV_DESTINATION, TORCH_EVENT_LOGGER_PREFIX

_lock = threading.RLock()


def _torch_registry() -> dict[str, logging.Handler]:
    from torch.distributed.elastic.events import handlers as torch_handlers

    return torch_handlers._log_handlers


def _event_logger(destination: str) -> logging.Logger:
    return logging.getLogger(TORCH_EVENT_LOGGER_PREFIX + destination)


class Registration:
    """What :func:`register` changed in this process, and how to put it back.

    ``handler``: the bridge handler torch's destinations are routed to; its settings are the
    registration's (read once, when the handler was made).
    """

    def __init__(
        self,
        handler: OtelHandler,
        agent: agent_instrumentation.AgentInstrumentation | None = None,
    ) -> None:
        self.handler = handler
        self.settings: Settings = handler.settings
        self.agent = agent if agent is not None else agent_instrumentation.AgentInstrumentation()
        self._lock = threading.RLock()
        # torch's registry entries this registration replaced: destination → what was there (None:
        # nothing was), to put back while the entry is still ours.
        self.replaced: dict[str, logging.Handler | None] = {}
        self.rendezvous_logger: logging.Logger | None = None  # the bridge was added to it
        self.restore_method_names: Callable[[], None] | None = None  # torch's, put back
        self.metrics: metrics.TorchMetrics | None = None
        self.agent_wrapped = False

    # --- install ------------------------------------------------------------------------------

    def install(self, route_rendezvous: bool | None = None, start: bool = True) -> OtelHandler:
        """Route torch's destinations to the handler; with ``start``, also build its pipeline,
        report torchelastic's metrics and instrument torch's agent. Idempotent: what is
        installed already stays as it is."""
        if route_rendezvous is None:
            route_rendezvous = self.settings.rdzv_events
        with self._lock:
            registry = _torch_registry()
            self._replace(registry, DESTINATION)
            # torch caches the destination's logger with the handler registered when it was
            # made: after an unregister() that logger lost the bridge, and torch will not add it
            # again. Attach it to a logger torch made already (addHandler ignores duplicates).
            cached = logging.Logger.manager.loggerDict.get(TORCH_EVENT_LOGGER_PREFIX + DESTINATION)
            if isinstance(cached, logging.Logger):
                cached.addHandler(self.handler)
            if route_rendezvous:
                self._route_rendezvous(registry)
            if start:
                self.handler.start()
                self._install_metrics()
                self._instrument_agent()
            return self.handler

    def _replace(self, registry: dict[str, logging.Handler], destination: str) -> None:
        if registry.get(destination) is self.handler:
            return
        self.replaced.setdefault(destination, registry.get(destination))
        registry[destination] = self.handler

    def _route_rendezvous(self, registry: dict[str, logging.Handler]) -> None:
        if type(registry.get(RDZV_DESTINATION)) is logging.NullHandler:
            self._replace(registry, RDZV_DESTINATION)
        # torch caches one logger per destination on first use, with the handler registered
        # then (it may exist already, or a custom handler stays registered): attach the bridge
        # to that logger directly too. Logger.addHandler ignores a handler that is already
        # there, so torch adding the registered bridge again later is harmless.
        logger = _event_logger(RDZV_DESTINATION)
        if self.handler not in logger.handlers:
            logger.addHandler(self.handler)
            self.rendezvous_logger = logger
        if self.restore_method_names is None:  # torch names each event: cheaply, now
            self.restore_method_names = rendezvous_names.install()

    def _install_metrics(self) -> None:
        if self.metrics is not None:
            return
        installation = metrics.TorchMetrics(
            self.handler, self.settings, watch=self.agent.watch, goodput=self.agent.goodput
        )
        if installation.install():
            self.metrics = installation

    def _instrument_agent(self) -> None:
        wanted = self.settings.agent_instrumentation
        if wanted is False or self.agent_wrapped:
            return  # unset: on the tested torch versions; true: on any
        if not self.agent.instrumented:
            self.agent_wrapped = self.agent.instrument(force=wanted is True, handler=self.handler)

    # --- uninstall ----------------------------------------------------------------------------

    def uninstall(self) -> None:
        """Undo everything :meth:`install` changed: the agent's methods, torch's metric lookup
        (a provider built for it is shut down, bounded, and its exit step dropped), torch's
        registry entries, the rendezvous logger's handler and torch's event naming. The handler
        keeps running."""
        with self._lock:
            if self.agent_wrapped:
                self.agent.uninstrument()
                self.agent_wrapped = False
            installation, self.metrics = self.metrics, None
            if installation is not None:
                installation.uninstall()
            registry = _torch_registry()
            for destination, previous in self.replaced.items():
                if registry.get(destination) is not self.handler:
                    continue  # someone replaced the bridge since: theirs stays
                if previous is None:
                    del registry[destination]
                else:
                    registry[destination] = previous
            self.replaced.clear()
            for destination in (DESTINATION, RDZV_DESTINATION):
                # torch's cached loggers got the bridge when they were made while it was
                # registered (or from _route_rendezvous): it leaves them all.
                _event_logger(destination).removeHandler(self.handler)
            self.rendezvous_logger = None
            restore, self.restore_method_names = self.restore_method_names, None
            if restore is not None:
                restore()


# --- the process's registration ------------------------------------------------------------

_registration: Registration | None = None


def current_registration() -> Registration | None:
    """The process's :class:`Registration`, if :func:`register` made one."""
    return _registration


def register(
    route_rendezvous: bool | None = None, start: bool = True, settings: Settings | None = None
) -> OtelHandler:
    """Register the ``otel`` destination with torch; idempotent and thread-safe.

    Unless ``route_rendezvous`` is false (default: ``ELASTIC_OTEL_RDZV_EVENTS``, true),
    ``dynamic_rendezvous`` also feeds the bridge; a non-null handler already there keeps
    receiving events too. ``start`` builds the SDK pipeline now, on this thread, reports
    torch's elastic metrics as OTel metrics (unless ``ELASTIC_OTEL_METRICS=false``) and
    instruments torch's elastic agent (:mod:`elastic_otel.integration.agent_instrumentation`).
    ``settings``: for the process's handler if it is made now (default: the environment's).
    """
    global _registration
    with _lock:
        handler = get_handler(settings)
        if _registration is not None and _registration.handler is not handler:
            _registration.uninstall()  # the process's handler was replaced (tests do): start over
            _registration = None
        if _registration is None:
            _registration = Registration(handler)
        return _registration.install(route_rendezvous, start)


def rendezvous_routed(handler: logging.Handler) -> bool:
    """Whether torch's ``dynamic_rendezvous`` events reach ``handler``."""
    current = _torch_registry().get(RDZV_DESTINATION)
    if current is None or isinstance(current, logging.NullHandler):
        return False  # torch builds no rendezvous event at all
    if current is handler:
        return True
    return handler in _event_logger(RDZV_DESTINATION).handlers


def unregister() -> None:
    """Undo :func:`register`: torch's own handlers, metric lookup and agent methods are put
    back (:meth:`Registration.uninstall`); the handler keeps running."""
    with _lock:
        registration = _registration
    if registration is not None:
        registration.uninstall()
