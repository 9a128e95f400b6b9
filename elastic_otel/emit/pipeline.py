"""Environment set-up: the OpenTelemetry SDK pipeline, configured as the OTel spec says.

Exporters, protocol and retries are the SDK's own, resolved from the standard ``OTEL_*``
variables with its configuration helpers and entry points; batching honours the SDK's variables,
on the process's one export thread (:mod:`elastic_otel.emit.export_thread`); providers the
application already installed are used instead of a second pipeline. :meth:`Pipeline.shutdown`
bounds the exit flush, which the SDK's own exit hooks do not. Design: ``docs/architecture.md``
(Life cycle, Threads); the variables: ``docs/configuration.md``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from opentelemetry import trace as trace_api
from opentelemetry._logs import Logger, get_logger_provider
from opentelemetry.environment_variables import (
    OTEL_LOGS_EXPORTER,
    OTEL_METRICS_EXPORTER,
    OTEL_TRACES_EXPORTER,
)
from opentelemetry.sdk._logs import LoggerProvider, LogRecordLimits
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_COMPRESSION,
    OTEL_EXPORTER_OTLP_LOGS_COMPRESSION,
    OTEL_EXPORTER_OTLP_METRICS_COMPRESSION,
    OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
    OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED,
    OTEL_SDK_DISABLED,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, SynchronousMultiSpanProcessor, TracerProvider

from elastic_otel.config.environment import env_flag
from elastic_otel.config.settings import Settings
from elastic_otel.emit import counters as C
from elastic_otel.emit.bounded import run_bounded
from elastic_otel.emit.counters import DeliveryCounters
from elastic_otel.emit.delivery import (
    ExportWarnings,
    LogOutageBuffer,
    OutageBuffer,
    SpanOutageBuffer,
    install_export_warnings,
)
from elastic_otel.emit.emitter import Emitter, LogSink
from elastic_otel.emit.export_gate import ExportGate, gate_grpc_calls
from elastic_otel.emit.export_queue import (
    BatchSettings,
    ExportQueue,
    QueuedLogRecordProcessor,
    QueueDrops,
    QueuedSpanProcessor,
)
from elastic_otel.emit.export_thread import ExportThread
from elastic_otel.emit.scheduler_resource import scheduler_attributes
from elastic_otel.names.attributes import INSTRUMENTATION_SCOPE

if TYPE_CHECKING:  # the metrics SDK is imported when metrics are installed
    from opentelemetry.sdk.metrics import MeterProvider

_logger = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "torchelastic"
_SIGNAL_ENV = {
    "traces": OTEL_TRACES_EXPORTER,
    "logs": OTEL_LOGS_EXPORTER,
    "metrics": OTEL_METRICS_EXPORTER,
}
_ENTRY_POINT_GROUP = {signal: f"opentelemetry_{signal}_exporter" for signal in _SIGNAL_ENV}
_COMPRESSION_ENV = {
    "traces": OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
    "logs": OTEL_EXPORTER_OTLP_LOGS_COMPRESSION,
    "metrics": OTEL_EXPORTER_OTLP_METRICS_COMPRESSION,
}
_OTLP_MODULE = "opentelemetry.exporter.otlp.proto."
_SPAN_AND_LOG = ("traces", "logs")


def sdk_disabled() -> bool:
    return os.environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true"


def build_resource(extra: dict[str, Any] | None = None) -> Resource:
    """``Resource.create()`` (reads ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``) with
    ``service.name`` defaulting to ``torchelastic`` instead of ``unknown_service``, and the
    batch scheduler's identity of the job (``slurm.*``) where those did not set a key."""
    resource = Resource.create(extra or {})
    name = str(resource.attributes.get("service.name", ""))
    defaults: dict[str, Any] = {
        key: value
        for key, value in scheduler_attributes().items()
        if key not in resource.attributes
    }
    if not name or name.startswith("unknown_service"):
        defaults["service.name"] = DEFAULT_SERVICE_NAME
    if "host.name" not in resource.attributes:
        defaults["host.name"] = socket.gethostname()
    if defaults:
        resource = resource.merge(Resource(defaults))
    return _HashOnceResource(resource.attributes, resource.schema_url)


class _HashOnceResource(Resource):
    """A Resource that computes its hash once.

    The SDK's OTLP encoders group records by resource, hashing it once per record, and
    ``Resource.__hash__`` serializes every attribute to JSON each time (a share of an event's
    CPU worth saving: ``BENCHMARKS.md`` §3). A Resource never changes after creation, so its
    hash cannot either.
    """

    def __hash__(self) -> int:
        try:
            return self._hash_once
        except AttributeError:
            self._hash_once: int = super().__hash__()
            return self._hash_once


def exporter_names(signal: str) -> list[str]:
    """Entry-point names for ``signal``, after the SDK's OTLP protocol resolution."""
    raw = os.environ.get(_SIGNAL_ENV[signal], "").strip() or "otlp"
    if raw.lower() == "none":
        return []
    names = []
    for name in raw.split(","):
        name = name.strip()
        if name and name.lower() != "none":
            names.append(_entry_point_name(name, signal))
    return names


def _entry_point_name(name: str, signal: str) -> str:
    """``otlp`` → ``otlp_proto_grpc`` / ``otlp_proto_http`` per ``OTEL_EXPORTER_OTLP_*PROTOCOL``,
    as the SDK's own configurator resolves it (its helper is private: used, not copied, so
    that the resolution stays the SDK's)."""
    try:
        from opentelemetry.sdk._configuration import _get_exporter_entry_point
    except ImportError:  # pragma: no cover - older or newer SDK layout
        return name
    return str(_get_exporter_entry_point(name, signal))  # type: ignore[arg-type]


def exporter_class(signal: str, name: str) -> Any:
    """The exporter (or metric reader) class registered as ``name`` for ``signal``."""
    for ep in entry_points(group=_ENTRY_POINT_GROUP[signal], name=name):
        return ep.load()
    raise ValueError(f"unknown {signal} exporter {name!r} in {_SIGNAL_ENV[signal]}")


def export_thread(gate: ExportGate | None) -> ExportThread:
    """The export thread of the process ``gate`` belongs to (what is built with one gate shares
    one thread); without a gate, a new one."""
    return ExportThread() if gate is None else gate.export_thread()


def build_meter_provider(resource: Resource, gate: ExportGate | None = None) -> MeterProvider:
    """A ``MeterProvider`` with a reader per ``OTEL_METRICS_EXPORTER`` entry (an exporter is
    read every ``OTEL_METRIC_EXPORT_INTERVAL`` on the export thread of ``gate``'s process, a
    reader entry point is used as it is); shut down by its owner within the exit bound, not by
    the SDK's own exit hook."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

    from elastic_otel.emit.export_reader import ScheduledMetricReader

    readers: list[MetricReader] = []
    thread = export_thread(gate)
    for name in exporter_names("metrics"):
        cls = exporter_class("metrics", name)
        if isinstance(cls, type) and issubclass(cls, MetricReader):
            readers.append(cls())
        else:
            exporter = gate_grpc_calls(cls(**otlp_defaults("metrics", cls)), gate)
            readers.append(ScheduledMetricReader(exporter, thread))
    return MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)


def load_exporter(signal: str, name: str, gate: ExportGate | None = None) -> Any:
    """Instantiate the exporter registered as ``name`` (it reads its own env configuration),
    its gRPC calls through ``gate`` when one is given."""
    cls = exporter_class(signal, name)
    return gate_grpc_calls(cls(**otlp_defaults(signal, cls)), gate)


def otlp_defaults(signal: str, cls: Any) -> dict[str, Any]:
    """What the bridge passes an OTLP exporter beyond its own variables: gzip, unless
    ``OTEL_EXPORTER_OTLP_COMPRESSION`` or the signal's own variable chose (why:
    ``docs/configuration.md``, Compression). Nothing for any other exporter."""
    chosen = os.environ.get(OTEL_EXPORTER_OTLP_COMPRESSION) or os.environ.get(
        _COMPRESSION_ENV[signal]
    )
    module = getattr(cls, "__module__", "")
    if (chosen and chosen.strip()) or not module.startswith(_OTLP_MODULE):
        return {}
    if module.startswith(_OTLP_MODULE + "grpc"):
        from opentelemetry.exporter.otlp.proto.grpc.exporter import Compression as Grpc

        return {"compression": Grpc.Gzip}
    if module.startswith(_OTLP_MODULE + "http"):
        from opentelemetry.exporter.otlp.proto.http import Compression

        return {"compression": Compression.Gzip}
    return {}


@dataclass
class Pipeline:
    """Where the bridge's logs and spans go, and how to flush them."""

    logger: Logger | None
    span_processor: SpanProcessor | None
    resource: Resource
    owned: bool  # built here (we flush and shut it down) or borrowed from the application
    delivery: DeliveryCounters = field(default_factory=DeliveryCounters)
    warnings: ExportWarnings = field(default_factory=ExportWarnings)
    buffers: list[OutageBuffer] = field(default_factory=list)
    queues: list[ExportQueue] = field(default_factory=list)  # the export queues it built
    drops: QueueDrops = field(default_factory=QueueDrops)  # what its queues refused
    # Where the emitter may put log records itself: the queues behind ``logger`` and its
    # provider's limits, when both are the pipeline's own (none: through ``logger``).
    log_sinks: list[LogSink] = field(default_factory=list)
    log_limits: LogRecordLimits | None = None
    _closers: list[Callable[[], Any]] = field(default_factory=list)
    _flushers: list[Callable[[], Any]] = field(default_factory=list)

    def emitter(self, version: str, traces: bool, exception_signal: str | None) -> Emitter:
        """An emitter onto this pipeline (``traces``: spans as well as logs)."""
        return Emitter(
            self.logger,
            self.span_processor if traces else None,
            self.resource,
            version,
            exception_signal,
            self.log_sinks,
            self.log_limits,
        )

    def pending(self) -> int:
        """Records held back because the collector did not answer."""
        return sum(b.pending for b in self.buffers)

    def counters(self) -> dict[str, int]:
        """The delivery counters and gauges of ``elastic_otel.stats()``."""
        counters = self.delivery.as_dict()
        counters[C.PENDING_EXPORT] = self.pending()
        counters[C.EXPORT_WARNINGS_SUPPRESSED] = self.warnings.suppressed
        counters[C.DROPPED_SDK_QUEUE] = self.drops.count
        return counters

    def flush(self, timeout_s: float, stop_on_failure: bool = False) -> bool:
        """Export what is buffered, waiting at most ``timeout_s``; ``True`` when it all got
        out (nothing is held back for a collector that did not answer). With
        ``stop_on_failure`` (at exit) stop waiting as soon as an export fails: the collector
        is down, and waiting would only delay the exit."""
        seen = self.warnings.seen
        give_up = (lambda: self.warnings.seen > seen) if stop_on_failure else None
        return run_bounded(self._flushers, timeout_s, give_up) and self.pending() == 0

    def shutdown(self, timeout_s: float) -> bool:
        """Flush, then stop exporters (which also interrupts their retry back-off)."""
        deadline = time.monotonic() + timeout_s
        install_export_warnings(self.warnings)  # exporters may have created loggers late
        ok = self.flush(max(0.0, timeout_s * 0.75), stop_on_failure=True)
        if self.owned:
            # Exporters first: their shutdown interrupts a retry back-off still in progress,
            # which the processors' shutdown would otherwise wait out.
            interrupt = [b.interrupt for b in self.buffers] if not ok else []
            calls = [*interrupt, *self._closers]
            ok = run_bounded(calls, max(0.05, deadline - time.monotonic())) and ok
        drained = sum(buffer.drain() for buffer in self.buffers)
        self.delivery.add("lost_at_exit", drained + self._take_stranded())
        return ok

    def _take_stranded(self) -> int:
        """Records still in the export queues once the bounded shutdown gave up on them (a
        loaded machine, a collector down): taken out and counted, so that each is counted
        once, here or by the buffer an export under way may still hand it to. The queues
        are closed first: a record emitted later is counted as dropped."""
        taken = 0
        for queue in self.queues:
            queue.close()
            taken += queue.take_all()
        return taken


def build_pipeline(
    version: str = "",
    settings: Settings | None = None,
    gate: ExportGate | None = None,
    warnings: ExportWarnings | None = None,
) -> Pipeline | None:
    """The pipeline the environment asks for; ``None`` when ``OTEL_SDK_DISABLED=true``.
    ``settings``: the caller's (default: read now); ``gate``: the process's export gate, which
    its gRPC exporters' calls pass (``None``: no gate); ``warnings``: the process's export
    warnings filter (``None``: one of its own)."""
    if sdk_disabled():
        return None
    app_tracer = trace_api.get_tracer_provider()
    app_logger = get_logger_provider()
    app_span_processor = getattr(app_tracer, "_active_span_processor", None)
    if isinstance(app_tracer, TracerProvider) and app_span_processor is not None:
        return _borrowed(app_tracer, app_logger, app_span_processor, version)
    return _owned(version, settings or Settings.from_environment(), gate, warnings)


def _borrowed(
    tracer_provider: TracerProvider, logger_provider: Any, processor: SpanProcessor, version: str
) -> Pipeline:
    logger = (
        logger_provider.get_logger(INSTRUMENTATION_SCOPE, version)
        if isinstance(logger_provider, LoggerProvider)
        else None
    )
    pipeline = Pipeline(logger, processor, tracer_provider.resource, owned=False)
    pipeline._flushers.append(tracer_provider.force_flush)
    if isinstance(logger_provider, LoggerProvider):
        pipeline._flushers.append(logger_provider.force_flush)
    return pipeline


def _owned(
    version: str, settings: Settings, gate: ExportGate | None, warnings: ExportWarnings | None
) -> Pipeline:
    resource = build_resource()
    delivery = DeliveryCounters()
    buffers: list[OutageBuffer] = []
    retry_size = settings.retry_queue_size

    def span_buffer(name: str) -> SpanOutageBuffer:
        buffer = SpanOutageBuffer(
            load_exporter("traces", name, gate), delivery, "traces", retry_size
        )
        buffers.append(buffer)
        return buffer

    def log_buffer(name: str) -> LogOutageBuffer:
        buffer = LogOutageBuffer(load_exporter("logs", name, gate), delivery, "logs", retry_size)
        buffers.append(buffer)
        return buffer

    def chain(*steps: Callable[[], Any]) -> Callable[[], None]:
        # A processor's flush puts its queue into its buffers; only then are they retried.
        def run() -> None:
            for step in steps:
                step()

        return run

    # The bridge's event thread fills the export queues much faster than torch records events;
    # the SDK default (2048) would drop bursts the bridge's own queue accepted. Unless the user
    # set OTEL_BSP/BLRP_MAX_QUEUE_SIZE, they are sized like the bridge's.
    span_settings = BatchSettings.from_environment("traces", settings.queue_size)
    log_settings = BatchSettings.from_environment("logs", settings.queue_size)
    drops = QueueDrops()
    queues: list[ExportQueue] = []
    thread = export_thread(gate)  # its OS thread starts with the first queue
    span_processor: SynchronousMultiSpanProcessor | None = None
    trace_names = exporter_names("traces")
    if trace_names:
        span_processor = SynchronousMultiSpanProcessor()
        for name in trace_names:
            spans = QueuedSpanProcessor(span_buffer(name), thread, span_settings, drops)
            queues.append(spans.queue)
            span_processor.add_span_processor(spans)
    logger_provider: LoggerProvider | None = None
    log_names = exporter_names("logs")
    log_limits = LogRecordLimits()
    log_queues: list[ExportQueue] = []
    if log_names:
        logger_provider = LoggerProvider(
            resource=resource, shutdown_on_exit=False, log_record_limits=log_limits
        )
        for name in log_names:
            logs = QueuedLogRecordProcessor(log_buffer(name), thread, log_settings, drops)
            log_queues.append(logs.queue)
            logger_provider.add_log_record_processor(logs)
        queues.extend(log_queues)
    # The SDK's logger counts what it emits when its internal metrics are on: through it, then.
    counted = env_flag(OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED, False)
    pipeline = Pipeline(
        logger_provider.get_logger(INSTRUMENTATION_SCOPE, version) if logger_provider else None,
        span_processor,
        resource,
        owned=True,
        delivery=delivery,
        warnings=warnings or ExportWarnings(),
        buffers=buffers,
        queues=queues,
        drops=drops,
        log_sinks=[] if counted else [queue.put for queue in log_queues],
        log_limits=log_limits,
    )
    install_export_warnings(pipeline.warnings)
    by_signal = {s: [b.force_flush for b in buffers if b.signal == s] for s in _SPAN_AND_LOG}
    if span_processor is not None:
        pipeline._flushers.append(chain(span_processor.force_flush, *by_signal["traces"]))
        pipeline._closers.append(span_processor.shutdown)
    if logger_provider is not None:
        pipeline._flushers.append(chain(logger_provider.force_flush, *by_signal["logs"]))
        pipeline._closers.append(logger_provider.shutdown)
    return pipeline
