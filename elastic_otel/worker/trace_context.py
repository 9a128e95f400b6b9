"""The rank's ``worker`` span as the training process's current OpenTelemetry context.

The instrumented agent starts each worker with ``TRACEPARENT`` naming its ``worker`` span
(OpenTelemetry's environment variables as context carriers). :func:`worker_context` reads it;
:func:`attach_to_main_thread`, which the worker start-up runs once the process imports
OpenTelemetry's tracing API, makes it the main thread's current context, so that the spans a
framework or the script starts without a parent are its children, in the round's trace. Other
threads and the worker's children: ``docs/trace-model.md`` (The worker span as the current
context).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from elastic_otel.names import environment_variables as env

if TYPE_CHECKING:
    from opentelemetry.context import Context


def worker_context(environ: Mapping[str, str] | None = None) -> Context:
    """The OpenTelemetry ``Context`` of this worker's ``worker`` span (from ``TRACEPARENT``);
    an empty one, so that spans become roots, when the agent set none."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    environ = os.environ if environ is None else environ
    carrier = {
        "traceparent": environ.get(env.TRACEPARENT, ""),
        "tracestate": environ.get(env.TRACESTATE, ""),
    }
    return TraceContextTextMapPropagator().extract(carrier)


def attach_to_main_thread() -> bool:
    """Make :func:`worker_context` current on the calling thread when it is the main thread and
    ``TRACEPARENT`` names a span; ``True`` when it did. It is never detached: spans the script
    makes current stack on it, and it is current again when they end."""
    if threading.current_thread() is not threading.main_thread():
        return False  # a thread that imported OpenTelemetry first: not the training thread
    from opentelemetry import context, trace

    ctx = worker_context()
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return False
    context.attach(ctx)
    return True
