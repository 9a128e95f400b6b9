"""NVIDIA resiliency-ext's ``ft_launcher`` (0.4): the bridge on its copy of torch's elastic agent.

``ft_launcher`` runs its own agent on a vendored copy of torch 2.3's elastic package
(``NVRX_ELASTIC``): its events go to that copy's handler registry, all of them to its ``null``
destination, and it never imports torch's rendezvous package, whose ``torchrun.handlers`` entry
points activate the bridge under torchrun. It does import torch first, and torch loads its
``torch.backends`` entry points while it is imported: :func:`torch_imported` is one. Where the
environment asks for the bridge (``ELASTIC_OTEL_ENABLED=true`` or ``PET_EVENT_LOG_HANDLER=otel``)
it waits for the vendored agent module to be imported, and when the first agent is made (on the
launcher's main thread) :class:`FtLauncherAttachment` starts the bridge, routes the copy's
``null`` and ``dynamic_rendezvous`` destinations to it and instruments the launcher's agent
classes. Anywhere else (a worker, or no bridge asked for) it costs this module's import, about
5 ms, and an environment read per ``import torch`` (torch scans the entry points anyway).
Design: ``docs/launchers.md`` (NVIDIA resiliency-ext's ``ft_launcher``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import logging
import os
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from elastic_otel.names.torch_names import NVRX_ELASTIC, NVRX_EVENT_HANDLERS

AGENT_API = f"{NVRX_ELASTIC}.agent.server.api"
ROUTED = ("null", "dynamic_rendezvous")
"""The copy's destinations the bridge gets: its agent records every event to ``null``, and it
builds no rendezvous event while ``dynamic_rendezvous`` is a ``NullHandler``."""
_HOOK_FLAG = "__elastic_otel_ft_launcher__"

_logger = logging.getLogger("elastic_otel")


def torch_imported() -> None:
    """``torch.backends`` entry point, called by every ``import torch`` (torch 2.5 on; off with
    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``): where the environment asks for the bridge, attach to
    ``ft_launcher``'s agent once its module is imported. Never raises (torch would fail)."""
    with contextlib.suppress(Exception):
        if "TORCHELASTIC_RUN_ID" in os.environ or not _environment_asks():
            return  # a worker (an agent started it) runs no agent; or no bridge asked for
        if AGENT_API in sys.modules:
            attach(sys.modules[AGENT_API])
        elif not any(isinstance(f, _AgentModuleFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _AgentModuleFinder())


def _environment_asks() -> bool:
    """``ELASTIC_OTEL_ENABLED=true``, or ``PET_EVENT_LOG_HANDLER=otel`` unless it is false."""
    from elastic_otel.config.environment import env_switch
    from elastic_otel.names import environment_variables as env

    enabled = env_switch(env.ELASTIC_OTEL_ENABLED)
    if enabled is not None:
        return enabled
    return os.environ.get(env.PET_EVENT_LOG_HANDLER, "").strip() == "otel"


class _AgentModuleFinder:
    """Finds nothing itself: runs :func:`attach` right after the vendored agent module ran."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != AGENT_API:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)  # once
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            with contextlib.suppress(Exception):
                attach(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def attach(api: ModuleType) -> None:
    """Wrap the vendored ``SimpleElasticAgent.__init__``: the first agent made starts the
    bridge (:meth:`FtLauncherAttachment.start`). Idempotent."""
    cls = getattr(api, "SimpleElasticAgent", None)
    original = getattr(cls, "__init__", None)
    if cls is None or original is None or getattr(original, _HOOK_FLAG, False):
        return

    @functools.wraps(original)
    def __init__(agent: Any, *args: Any, **kwargs: Any) -> None:
        original(agent, *args, **kwargs)
        with contextlib.suppress(Exception):  # never break the launcher
            _attachment.start(type(agent))

    setattr(__init__, _HOOK_FLAG, True)
    cls.__init__ = __init__


class FtLauncherAttachment:
    """What the bridge changed in ``ft_launcher``'s vendored package, and how to put it back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.handler: logging.Handler | None = None  # the bridge's, once started
        self.replaced: dict[str, logging.Handler | None] = {}  # the copy's destination → its own
        self.loggers: list[logging.Logger] = []  # the copy's cached loggers given the bridge

    def start(self, agent_cls: type) -> bool:
        """Start the bridge for an agent of ``agent_cls`` (once): the process's registration
        with the agent instrumentation on the launcher's classes, then the copy's routes."""
        with self._lock:
            if self.handler is not None:
                return True
            from elastic_otel.config.settings import Settings
            from elastic_otel.integration import registration

            settings = Settings.from_environment()
            registration.register(route_rendezvous=False, start=False, settings=settings)
            current = registration.current_registration()
            if current is None:
                return False
            current.agent.classes = functools.partial(vendored_classes, agent_cls)
            handler = current.install(route_rendezvous=False, start=True)
            self._route(handler)
            self.handler = handler
            current.attachments.append(self.stop)  # unregister() puts the copy's back
            _logger.debug("elastic-otel: attached to ft_launcher's agent %s", agent_cls.__name__)
            return True

    def _route(self, handler: logging.Handler) -> None:
        handlers = importlib.import_module(NVRX_EVENT_HANDLERS)
        events = importlib.import_module(f"{NVRX_ELASTIC}.events")
        registry: dict[str, logging.Handler] = handlers._log_handlers
        for destination in ROUTED:
            if registry.get(destination) is not handler:
                self.replaced.setdefault(destination, registry.get(destination))
                registry[destination] = handler
            cached = getattr(events, "_events_loggers", {}).get(destination)
            if isinstance(cached, logging.Logger) and handler not in cached.handlers:
                cached.addHandler(handler)  # made before: it kept the handler of then
                self.loggers.append(cached)

    def stop(self) -> None:
        """Put the copy's handlers back (``unregister()`` calls it)."""
        with self._lock:
            handler, self.handler = self.handler, None
            if handler is None:
                return
            handlers = importlib.import_module(NVRX_EVENT_HANDLERS)
            registry = handlers._log_handlers
            for destination, previous in self.replaced.items():
                if registry.get(destination) is handler and previous is not None:
                    registry[destination] = previous
            for logger in self.loggers:
                logger.removeHandler(handler)
            self.replaced.clear()
            self.loggers.clear()


def vendored_classes(agent_cls: type) -> dict[str, type]:
    """The classes the agent instrumentation wraps, as ``ft_launcher`` has them: its own
    ``LocalElasticAgent`` (``agent_cls``) and the copy's ``SimpleElasticAgent`` and
    ``PContext``."""
    api = importlib.import_module(AGENT_API)
    processes = importlib.import_module(f"{NVRX_ELASTIC}.multiprocessing.api")
    return {
        "SimpleElasticAgent": api.SimpleElasticAgent,
        "LocalElasticAgent": agent_cls,
        "PContext": processes.PContext,
    }


_attachment = FtLauncherAttachment()
