"""``opentelemetry-instrument`` support: an instrumentor for torch elastic.

``opentelemetry-instrument torchrun --event-log-handler otel ... train.py`` configures the SDK
from the environment (its configurator installs a ``TracerProvider``, ``LoggerProvider`` and
``MeterProvider``), then calls :class:`ElasticOtelInstrumentor` through the
``opentelemetry_instrumentor`` entry point. The bridge then uses those providers: spans and logs
go to the application's processors (:func:`elastic_otel.emit.pipeline.build_pipeline` borrows them,
so nothing is exported twice), with the auto-instrumentation's resource, and torchelastic's
metrics to its ``MeterProvider``.

Running a program under ``opentelemetry-instrument`` is itself the request for telemetry, so the
bridge is activated in every process that imports torch's elastic rendezvous (torchrun's agent),
with or without ``--event-log-handler otel`` (that flag still decides whether torchrun records its
agent and worker events to the bridge); ``ELASTIC_OTEL_ENABLED=false`` keeps it off. Nothing is
imported before the program imports torch itself: processes that never use torch elastic pay
nothing, and this module imports neither torch nor the SDK.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from elastic_otel.config.settings import Settings

_logger = logging.getLogger("elastic_otel")

_TRIGGER_MODULE = "torch.distributed.elastic.rendezvous"


class ElasticOtelInstrumentor(BaseInstrumentor):
    """Activates the bridge, on the auto-instrumentation's providers, where torch elastic runs."""

    _active = False

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("torch >= 2.4",)

    def _instrument(self, **kwargs: Any) -> None:
        if Settings.from_environment().enabled is False:
            return
        ElasticOtelInstrumentor._active = True
        from wrapt import register_post_import_hook  # a dependency of opentelemetry-instrumentation

        # Runs at once when the module is already imported.
        register_post_import_hook(_activate, _TRIGGER_MODULE)

    def _uninstrument(self, **kwargs: Any) -> None:
        ElasticOtelInstrumentor._active = False
        try:
            from elastic_otel.integration.registration import unregister

            unregister()  # everything register() changed, torchelastic's metrics included
        except ImportError:  # torch was never there
            pass


def _activate(_module: Any) -> None:
    if not ElasticOtelInstrumentor._active:
        return  # uninstrumented before torch elastic was imported
    try:
        from elastic_otel.integration.activation import activate

        activate(context_requests=True)
    except Exception as e:  # never break the program being instrumented
        _logger.warning("elastic-otel: not activated by opentelemetry-instrument: %s", e)
