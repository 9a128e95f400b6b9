"""torch registration: the ``otel`` destination in torch's event handler registry, and the one
owner of everything registering changes.

:class:`Registration` installs the ``otel`` destination (and ``dynamic_rendezvous``, without
which torch builds no rendezvous event, with a cheaper naming of those events), torchelastic's
metrics, the agent instrumentation and an exit step, lets torch's events through its event
loggers whatever ``LOGLEVEL`` says, and can watch torch's agent start (for activation), keeping
what it replaced on the instance;
:meth:`Registration.uninstall` undoes exactly that, as OpenTelemetry's ``BaseInstrumentor``
does. The bridge handler itself outlives :func:`unregister`. Design: ``docs/architecture.md``
(Life cycle).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from elastic_otel.bridge.handler import OtelHandler, get_handler
from elastic_otel.config.settings import Settings
from elastic_otel.integration import rendezvous_names
from elastic_otel.names.torch_names import DESTINATION, RDZV_DESTINATION, TORCH_EVENT_LOGGER_PREFIX

if TYPE_CHECKING:  # imported when the bridge is activated, not when it is registered
    from elastic_otel.integration.agent_instrumentation import AgentInstrumentation
    from elastic_otel.integration.torch_metrics import TorchMetrics

_lock = threading.RLock()
_RUN_HOOK_FLAG = "__elastic_otel_run_hook__"  # on the wrapper of torch's agent run


class _AsBefore(logging.Filter):
    """On a handler that shares a torch event logger with the bridge: drops that logger's records
    below the level the logger had before the bridge lowered it, so that the handler gets what it
    got before (torch's console handler prints no more than ``LOGLEVEL`` lets through)."""

    def __init__(self, logger_name: str, level: int) -> None:
        super().__init__()
        self.logger_name = logger_name
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != self.logger_name or record.levelno >= self.level


def _torch_registry() -> dict[str, logging.Handler]:
    from torch.distributed.elastic.events import handlers as torch_handlers

    return torch_handlers._log_handlers


def _event_logger(destination: str) -> logging.Logger:
    return logging.getLogger(TORCH_EVENT_LOGGER_PREFIX + destination)


def _torch_event_logger(destination: str) -> logging.Logger | None:
    """torch's logger for ``destination``, made now the way torch makes it on first use (its
    level from ``LOGLEVEL``, the registered handler) if it is not made yet; ``None`` when torch
    has no such function or refuses (a ``LOGLEVEL`` that ``setLevel`` does not know)."""
    try:
        from torch.distributed.elastic import events

        logger = events._get_or_create_logger(destination)
    except Exception:
        return None
    return logger if isinstance(logger, logging.Logger) else None


class Registration:
    """What :func:`register` changed in this process, and how to put it back.

    ``handler``: the bridge handler torch's destinations are routed to; its settings are the
    registration's (read once, when the handler was made).
    """

    def __init__(
        self,
        handler: OtelHandler,
        agent: AgentInstrumentation | None = None,
    ) -> None:
        self.handler = handler
        self.settings: Settings = handler.settings
        self._agent = agent
        self._lock = threading.RLock()
        # torch's registry entries this registration replaced: destination → what was there (None:
        # nothing was), to put back while the entry is still ours.
        self.replaced: dict[str, logging.Handler | None] = {}
        self.rendezvous_logger: logging.Logger | None = None  # the bridge was added to it
        self.restore_method_names: Callable[[], None] | None = None  # torch's, put back
        self.metrics: TorchMetrics | None = None
        self.agent_wrapped = False
        # torch's event loggers whose level was lowered → their level before; the filters given
        # to the other handlers on them
        self.lowered: dict[logging.Logger, int] = {}
        self.filters: list[tuple[logging.Handler, logging.Filter]] = []
        self.agent_run: tuple[type, Any] | None = None  # torch's agent class, its own run
        self.attachments: list[Callable[[], None]] = []  # each puts back what a launcher's
        # attachment changed beside torch (ft_launcher's copy of torch's registry)

    @property
    def agent(self) -> AgentInstrumentation:
        """The instrumentation of torch's agent, made (and its modules imported) on first use:
        a process where the bridge is registered but never activated imports none of it, the
        larger part of the package (``BENCHMARKS.md`` §4, import rendezvous)."""
        if self._agent is None:
            from elastic_otel.integration.agent_instrumentation import AgentInstrumentation

            self._agent = AgentInstrumentation()
        return self._agent

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
                if self.settings.gc_freeze:  # before the SDK's imports: see its docstring
                    self.handler.process.freeze_heap()
                self._admit_events(DESTINATION)
                if route_rendezvous:
                    self._admit_events(RDZV_DESTINATION)
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

    def _admit_events(self, destination: str) -> None:
        """Let torch's events for ``destination`` reach the bridge whatever ``LOGLEVEL`` says.

        torch makes one logger per destination on first use, sets its level from ``LOGLEVEL``
        (default ``INFO``) and records every event at ``INFO``: under ``LOGLEVEL=WARNING``
        (TorchX's ``dist`` components set it) the logger drops them all before any handler
        sees them, and no handler-side setting can undo that. So the logger is made now, as
        torch makes it (torch would set its level again when it makes it later), and only its
        level is lowered to ``INFO``: the level of every other logger (torch's console logging
        included) stays as ``LOGLEVEL`` set it, and any other handler on this logger gets a
        filter that drops what it did not get before. :meth:`uninstall` puts both back.
        """
        logger = _torch_event_logger(destination)
        if logger is None or logger in self.lowered or logger.getEffectiveLevel() <= logging.INFO:
            return
        if self.handler not in logger.handlers:
            return  # torch's logger sends this destination elsewhere: not the bridge's to open
        before = logger.level
        for other in logger.handlers:
            if other is self.handler or isinstance(other, logging.NullHandler):
                continue
            if other.level < before:
                kept = _AsBefore(logger.name, before)
                other.addFilter(kept)
                self.filters.append((other, kept))
        logger.setLevel(logging.INFO)
        self.lowered[logger] = before

    def watch_agent_runs(self, on_run: Callable[[Any], None]) -> None:
        """Call ``on_run(agent)`` when one of torch's elastic agents starts to run, before torch
        runs it (idempotent); an exception from ``on_run`` is dropped. Not done while torch is
        still importing its agent module (this runs from torch's own imports)."""
        with self._lock:
            if self.agent_run is not None:
                return
            try:
                from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
            except ImportError:  # torch is importing its agent module right now
                return
            original = SimpleElasticAgent.__dict__.get("run")
            if not callable(original) or getattr(original, _RUN_HOOK_FLAG, False):
                return

            @functools.wraps(original)
            def run(agent: Any, *args: Any, **kwargs: Any) -> Any:
                with contextlib.suppress(Exception):  # never break torch's agent
                    on_run(agent)
                return original(agent, *args, **kwargs)

            setattr(run, _RUN_HOOK_FLAG, True)
            SimpleElasticAgent.run = run  # type: ignore[method-assign]
            self.agent_run = (SimpleElasticAgent, original)

    def _install_metrics(self) -> None:
        if self.metrics is not None:
            return
        from elastic_otel.integration.torch_metrics import TorchMetrics

        installation = TorchMetrics(
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
        registry entries, the rendezvous logger's handler, torch's event naming, its event
        loggers' levels and its agent's ``run``. The handler keeps running."""
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
            for logger, before in self.lowered.items():
                if logger.level == logging.INFO:  # else someone set it since: theirs stays
                    logger.setLevel(before)
            self.lowered.clear()
            for other, kept in self.filters:
                other.removeFilter(kept)
            self.filters.clear()
            while self.attachments:
                self.attachments.pop()()
            if self.agent_run is not None:
                cls, original = self.agent_run
                if getattr(cls.__dict__.get("run"), _RUN_HOOK_FLAG, False):
                    cls.run = original  # type: ignore[attr-defined]
                self.agent_run = None


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
