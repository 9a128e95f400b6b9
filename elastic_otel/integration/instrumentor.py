"""``opentelemetry-instrument`` support: an instrumentor for torch elastic.

Running a program under ``opentelemetry-instrument`` is itself a request for telemetry:
:class:`ElasticOtelInstrumentor` activates the bridge, on the auto-instrumentation's
providers, in every process that imports torch's elastic rendezvous, unless
``ELASTIC_OTEL_ENABLED=false``. Nothing happens before the program imports torch.
Design: ``docs/architecture.md`` (How activation works).
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
