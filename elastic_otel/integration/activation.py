"""Activation: whether this process wants the bridge, decided in one place, and turning it on.

*Registered*, the ``otel`` destination exists in torch's registry (cheap); *activated*, the
SDK pipeline is also built at once on this (main) thread, ``dynamic_rendezvous`` is routed to
the bridge and torchelastic's metrics are reported. At once, on the main thread: a pipeline
built lazily on a background thread can race interpreter shutdown and lose everything.
The rule: ``docs/architecture.md`` (How activation works).
"""

from __future__ import annotations

import logging
from typing import Any

from elastic_otel.config.settings import Settings
from elastic_otel.integration import torchrun_args
from elastic_otel.integration.registration import current_registration, register
from elastic_otel.names.torch_names import DESTINATION

_logger = logging.getLogger("elastic_otel")


def setting(settings: Settings | None = None) -> bool | None:
    """``ELASTIC_OTEL_ENABLED``: ``True``, ``False``, or ``None`` (unset: decide from context)."""
    return (Settings.from_environment() if settings is None else settings).enabled


def requested(context_requests: bool = False, settings: Settings | None = None) -> bool:
    """Whether this process should be activated (the rule: ``docs/architecture.md``)."""
    explicit = setting(settings)
    if explicit is not None:
        return explicit
    return context_requests or torchrun_args.asks_for_bridge()


def activate(context_requests: bool = False) -> bool:
    """Register the ``otel`` destination; activate the bridge when :func:`requested`.

    ``context_requests``: the caller (an ``otel-*`` backend, ``opentelemetry-instrument``)
    asks for telemetry by being used. Not requested and ``ELASTIC_OTEL_ENABLED`` unset, torch's
    agent can still ask when it starts (:func:`agent_asks`). Returns whether the bridge was
    activated; never raises.
    """
    try:
        settings = Settings.from_environment()  # read once: the process's handler gets them
        if requested(context_requests, settings):
            register(start=True, settings=settings)
            return True
        register(route_rendezvous=False, start=False, settings=settings)
        registration = current_registration()
        if setting(settings) is None and registration is not None:
            registration.watch_agent_runs(agent_asks)
    except Exception as e:  # never break torchrun's start-up
        _logger.warning("elastic-otel: not activated: %s", e)
    return False


def agent_asks(agent: Any) -> None:
    """Before torch's elastic agent runs: activate when it records its events to ``otel``.

    ``LaunchConfig(event_log_handler="otel")`` given to torch's ``elastic_launch`` (or to
    ``launch_agent``) asks for the bridge as ``torchrun --event-log-handler otel`` does, but no
    command line or environment variable shows it: only the agent's spec does. The agent runs
    before its first rendezvous, so activating here routes that rendezvous and instruments the
    agent in time. ``ELASTIC_OTEL_ENABLED=false`` still wins (:func:`activate` asks
    :func:`requested`).
    """
    spec = getattr(agent.get_worker_group(), "spec", None)
    if getattr(spec, "event_log_handler", None) == DESTINATION:
        activate(context_requests=True)
