"""The training script's side: its own spans in its rank's ``worker`` span, and its first step.

The instrumented agent starts each worker with ``TRACEPARENT`` naming its ``worker`` span;
:func:`start_worker_telemetry` exports the script's spans and metrics with the agents' ``OTEL_*``
settings, :func:`~elastic_otel.worker.trace_context.worker_context` parents them under that span
(the worker start-up also makes it the main thread's current context), and :func:`mark_first_step`
marks where training resumed, which only the script can see (imports, process-group set-up,
checkpoint loading). Design, with an example: ``docs/trace-model.md`` (Recoveries and the
training code).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from elastic_otel.bridge.process import bridge_process
from elastic_otel.config import environment
from elastic_otel.config.settings import Settings
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from elastic_otel.worker.trace_context import worker_context

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

_lock = threading.Lock()
_first_step = threading.Event()  # set by the first mark: only that one counts


def mark_first_step(
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> bool:
    """Mark this worker's first training step (see the module docstring); only the first
    call in a process counts (``True`` when it was this one). The global providers are
    used unless others are given."""
    with _lock:
        if _first_step.is_set():
            return False
        _first_step.set()
    from opentelemetry import metrics, trace

    from elastic_otel.emit.recovery_metrics import RecoveryMetrics
    from elastic_otel.version import __version__

    now = time.time_ns()
    started = max(0, environment.env_int(env.ELASTIC_OTEL_WORKER_START_UNIX_NANO, 0)) or now
    cause = os.environ.get(env.ELASTIC_OTEL_RECOVERY_CAUSE, "")
    attrs: dict[str, Any] = {A.RECOVERY_CAUSE: cause} if cause else {}
    tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(
        A.INSTRUMENTATION_SCOPE, __version__
    )
    span = tracer.start_span(
        A.SPAN_WORKER_FIRST_STEP, worker_context(), attributes=attrs, start_time=min(started, now)
    )
    span.end(end_time=now)
    recovery_start = max(0, environment.env_int(env.ELASTIC_OTEL_RECOVERY_START_UNIX_NANO, 0))
    if cause and recovery_start and os.environ.get("LOCAL_RANK", "0") == "0":
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(
            A.INSTRUMENTATION_SCOPE, __version__
        )
        RecoveryMetrics(meter).record_first_step(
            max(0, now - started) / 1e9,
            max(0, now - recovery_start) / 1e9,
            cause,
            trace.set_span_in_context(span),
        )
    return True


class WorkerTelemetry:
    """The SDK providers :func:`start_worker_telemetry` set up; :meth:`shutdown` exports what
    is left (also run at exit, which ``os._exit`` skips: call it yourself then).

    At exit it is one step of the process's exit path (:mod:`elastic_otel.bridge.process_exit`),
    as the bridge's own shutdown is, within the same ``ELASTIC_OTEL_EXIT_TIMEOUT`` bound. It
    asks for no SIGTERM handler: a worker torch stops with SIGTERM dies as it would without it.
    """

    def __init__(self, providers: list[Any], timeout_s: float) -> None:
        self.providers = providers
        self.timeout_s = timeout_s
        self.exit_step = f"worker telemetry {id(self):x}"

    def shutdown(self) -> bool:
        """Flush and stop the providers built here, within ``ELASTIC_OTEL_EXIT_TIMEOUT``."""
        from elastic_otel.emit.bounded import run_bounded

        bridge_process().exit_path.remove(self.exit_step)
        providers, self.providers = self.providers, []
        return run_bounded([p.shutdown for p in providers], self.timeout_s)

    def _at_exit(self, _reason: str, _error: bool) -> bool:
        return self.shutdown()


def start_worker_telemetry(attach: bool = True) -> WorkerTelemetry:
    """Export this process's spans and metrics as the bridge does, from the same ``OTEL_*``
    variables (``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER``, ``OTEL_EXPORTER_OTLP_*``,
    ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), with the worker's rank and run id on
    the resource. Global SDK providers already installed are kept. ``attach``: make
    :func:`worker_context` current on this thread."""
    from opentelemetry import context, metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    from elastic_otel.emit.export_queue import QueuedSpanProcessor
    from elastic_otel.emit.pipeline import (
        build_meter_provider,
        build_resource,
        exporter_names,
        load_exporter,
    )

    owned: list[Any] = []
    gate = bridge_process().export_gate
    resource = build_resource(_worker_resource())
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for name in exporter_names("traces"):  # on the process's one export thread
            exporter = load_exporter("traces", name, gate)
            tracer_provider.add_span_processor(QueuedSpanProcessor(exporter, gate.export_thread()))
        trace.set_tracer_provider(tracer_provider)
        owned.append(tracer_provider)
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        meter_provider = build_meter_provider(resource, gate)
        metrics.set_meter_provider(meter_provider)
        owned.append(meter_provider)
    if attach:
        context.attach(worker_context())
    timeout_s = Settings.from_environment().exit_timeout_s
    telemetry = WorkerTelemetry(owned, timeout_s)
    bridge_process().exit_path.add(
        telemetry.exit_step, telemetry._at_exit, timeout_s, sigterm=False
    )
    return telemetry


def _worker_resource() -> dict[str, Any]:
    """The worker's identity as torchrun sets it in its environment."""
    resource: dict[str, Any] = {}
    for key, var in ((A.GLOBAL_RANK, "RANK"), (A.LOCAL_RANK, "LOCAL_RANK")):
        value = os.environ.get(var, "")
        if value.isdigit():
            resource[key] = int(value)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id:
        resource[A.RUN_ID] = run_id
    return resource
