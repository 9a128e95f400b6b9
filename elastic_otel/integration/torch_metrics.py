"""torchelastic's metrics (``torch.distributed.elastic.metrics``) as OpenTelemetry metrics.

:func:`install` wraps torch's metric lookup ``getStream``, so that every value torch's agent
(or a user) puts, in any group and whatever handler is configured before or after, also
becomes an OpenTelemetry data point named ``torchelastic.<name>``; the bridge's own instruments
share its meter provider. Names and instruments: ``docs/attributes.md`` (Metrics); why the
lookup is wrapped, and where points go: ``docs/architecture.md`` (torchelastic's metrics).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from elastic_otel.bridge.process import bridge_process
from elastic_otel.config.settings import Settings
from elastic_otel.emit import bridge_health, goodput_metrics, straggler_metrics
from elastic_otel.emit.bounded import run_bounded
from elastic_otel.emit.recovery_metrics import RecoveryMetrics
from elastic_otel.integration import torchrun_args
from elastic_otel.model.stalls import TRAINING
from elastic_otel.names import attributes as A

if TYPE_CHECKING:  # the SDK is imported when metrics are installed, not when torch loads this
    from opentelemetry.metrics import Meter
    from opentelemetry.sdk.metrics import MeterProvider

    from elastic_otel.bridge.handler import OtelHandler
    from elastic_otel.integration.goodput import GoodputWatch
    from elastic_otel.integration.training_watch import TrainingWatch

try:  # torch is optional for the package; the handler is a MetricHandler where it exists.
    from torch.distributed.elastic.metrics.api import MetricHandler as _MetricHandlerBase
except ImportError:  # pragma: no cover - exercised only without torch
    _MetricHandlerBase = object  # type: ignore[assignment,misc]

_logger = logging.getLogger("elastic_otel")

PREFIX = "torchelastic."
COUNTER, HISTOGRAM, GAUGE = "counter", "histogram", "gauge"

_GAUGES = {"remaining_restarts": "1", "flakiness": "%"}
_WORKER_STATES = frozenset(
    {"init", "healthy", "unhealthy", "stopped", "succeeded", "failed", "unknown"}
)
_INVALID = re.compile(r"[^-_./a-zA-Z0-9]")


def classify(name: str, group: str = "torchelastic") -> tuple[str, str, str, dict[str, str]]:
    """(OTel name, instrument kind, unit, attributes) of one torchelastic metric."""
    attrs: dict[str, str] = {A.METRIC_GROUP: group}
    rest = name
    otel_prefix = PREFIX
    if name.startswith("workers.") and name.count(".") >= 2:
        # torch's are workers.<role>.<one word>: a role may contain dots, the metric does not
        role, rest = name[len("workers.") :].rsplit(".", 1)
        attrs[A.ROLE] = role
        otel_prefix = PREFIX + "workers."
    if rest.endswith(".duration.ms"):
        kind, unit, rest = HISTOGRAM, "ms", rest[: -len(".ms")]
    elif rest in _GAUGES:
        kind, unit = GAUGE, _GAUGES[rest]
    elif (
        rest.endswith((".success", ".failure", "_total"))
        or rest.startswith("run_")
        or rest in _WORKER_STATES
    ):
        kind, unit = COUNTER, "1"
    else:
        kind, unit = GAUGE, "1"
    return _metric_name(otel_prefix + rest), kind, unit, attrs


def _metric_name(name: str) -> str:
    # Instrument names are case-insensitive; the SDK exports them lower-cased: say so here.
    return _INVALID.sub("_", name).lower()[:255]


class OtelMetricHandler(_MetricHandlerBase):
    """A torchelastic ``MetricHandler`` recording every value on an OTel ``Meter``."""

    def __init__(self, meter: Meter) -> None:
        self._meter = meter
        self._instruments: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self.errors = 0

    def emit(self, metric_data: Any) -> None:
        try:
            name, kind, unit, attrs = classify(
                str(metric_data.name), str(metric_data.group_name or "")
            )
            self.record(kind, name, metric_data.value, attrs, unit)
        except Exception:  # metrics must never break the agent
            self.errors += 1

    def record(
        self, kind: str, name: str, value: float, attrs: Mapping[str, Any], unit: str = "1"
    ) -> None:
        """Record ``value`` on the instrument ``name`` of ``kind`` (created once)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return
        attributes = dict(attrs)
        run_id = current_run_id()
        if run_id and A.RUN_ID not in attributes:
            attributes[A.RUN_ID] = run_id
        instrument = self._instrument(kind, name, unit)
        if kind == COUNTER:
            if value >= 0:
                instrument.add(value, attributes)
        elif kind == HISTOGRAM:
            instrument.record(value, attributes)
        else:
            instrument.set(value, attributes)

    def _instrument(self, kind: str, name: str, unit: str) -> Any:
        key = (kind, name)
        instrument = self._instruments.get(key)
        if instrument is None:
            with self._lock:
                instrument = self._instruments.get(key)
                if instrument is None:
                    meter = self._meter
                    if kind == COUNTER:
                        instrument = meter.create_counter(name, unit=unit)
                    elif kind == HISTOGRAM:
                        instrument = meter.create_histogram(name, unit=unit)
                    else:
                        instrument = meter.create_gauge(name, unit=unit)
                    self._instruments[key] = instrument
        return instrument


class _TeeHandler(_MetricHandlerBase):
    """Feeds the bridge, then the handler torch resolved for the group."""

    __slots__ = ("_first", "_second")

    def __init__(self, first: Any, second: Any) -> None:
        self._first, self._second = first, second

    def emit(self, metric_data: Any) -> None:
        self._first.emit(metric_data)
        self._second.emit(metric_data)


# --- run id -----------------------------------------------------------------------------------


def set_run_id(run_id: str) -> None:
    """The rendezvous run id to put on every data point (the traced rendezvous sets it)."""
    bridge_process().run_id = run_id or None


def current_run_id() -> str | None:
    """:func:`set_run_id`'s value, else torchrun's ``--rdzv-id`` (not with ``--standalone``)."""
    run_id = bridge_process().run_id
    return run_id if run_id is not None else torchrun_args.rdzv_run_id()


# --- installation ------------------------------------------------------------------------------


class TorchMetrics:
    """One installation: torch's metric lookup wrapped in both of its modules, the handler on
    a meter, the provider (built here and owned, or the application's), and the last export as
    a step of the process's exit path (:mod:`elastic_otel.bridge.process_exit`).

    ``handler``: the bridge handler whose counters, stalls and recovery spans are reported
    beside torch's metrics (``None``: torch's metrics only); ``watch`` and ``goodput``: the
    agent instrumentation's training watch (stall, straggler scores) and goodput accounting,
    reported too when given. ``settings``: default, the handler's, else read now.
    :meth:`install` and :meth:`uninstall` are symmetric, in the shape of OpenTelemetry's
    ``BaseInstrumentor._instrument`` / ``_uninstrument``, with the state on the instance;
    torch's lookup is process-wide, so one installation is in effect at a time
    (:func:`installed`).
    """

    def __init__(
        self,
        handler: OtelHandler | None = None,
        settings: Settings | None = None,
        meter_provider: MeterProvider | None = None,
        watch: TrainingWatch | None = None,
        goodput: GoodputWatch | None = None,
    ) -> None:
        self.handler = handler
        self.watch = watch  # the agent's training watch: stalls, straggler scores
        self.goodput = goodput  # the agent's goodput accounting
        if settings is None:
            settings = handler.settings if handler is not None else Settings.from_environment()
        self.settings = settings
        self.metric_handler: OtelMetricHandler | None = None
        self.provider: MeterProvider | None = meter_provider
        self.owned = False
        self.closed = False
        self.originals: dict[Any, Callable[[str], Any]] = {}
        self._exit_step = f"torchelastic metrics {id(self):x}"

    def enabled(self) -> bool:
        """Whether metrics are wanted: ``ELASTIC_OTEL_METRICS`` unset/true and the SDK enabled."""
        from elastic_otel.emit.pipeline import sdk_disabled

        return self.settings.metrics and not sdk_disabled()

    def install(self) -> bool:
        """Wrap torch's lookup and start reporting (idempotent); ``False`` when metrics are
        off, torch's metrics API is missing, set-up failed, or another installation is in
        effect."""
        if self.closed or not self.enabled():
            return False
        with _lock:
            try:
                from torch.distributed.elastic import metrics as torch_metrics
                from torch.distributed.elastic.metrics import api as torch_metrics_api
            except ImportError:
                return False
            current = installed()
            if current is not None:
                return current is self
            try:
                if self.provider is None:
                    self.provider, self.owned = _provider()
            except Exception as e:
                _logger.warning("elastic-otel: metrics disabled, set-up failed: %s", e)
                return False
            from elastic_otel.version import __version__

            meter = self.provider.get_meter("elastic_otel", __version__)
            metric_handler = self.metric_handler = OtelMetricHandler(meter)
            if self.handler is not None:
                try:
                    bridge_health.observe(meter, self._bridge_stats, self._current_stalls)
                    self.handler.observe_spans(RecoveryMetrics(meter).record_spans)
                    if self.settings.goodput and self.goodput is not None:
                        goodput_metrics.observe(meter, self.goodput.points)
                    if self.settings.straggler_window_s > 0 and self.watch is not None:
                        straggler_metrics.observe(meter, self.watch.straggler_scores)
                        if self.settings.slowdown > 0:
                            straggler_metrics.observe_slowdowns(meter, self.watch.slowdown_ratios)
                except Exception as e:  # the bridge's own counters stay in elastic_otel.stats()
                    _logger.warning("elastic-otel: bridge counters not reported as metrics: %s", e)
            original = torch_metrics_api.getStream

            def get_stream(group: str) -> Any:
                stream = original(group)
                return torch_metrics_api.MetricStream(
                    group, _TeeHandler(metric_handler, stream.handler)
                )

            setattr(get_stream, _INSTALLATION, self)
            for module in (torch_metrics_api, torch_metrics):
                self.originals[module] = getattr(module, "getStream")  # noqa: B009
                setattr(module, "getStream", get_stream)  # noqa: B010
        if self.owned:  # an application's provider is the application's to flush at exit
            bridge_process().exit_path.add(
                self._exit_step, self.last_export, self.settings.exit_timeout_s
            )
        return True

    def uninstall(self) -> None:
        """Put torch's lookup back, stop observing the bridge, and export once more (a provider
        built here is shut down), bounded by the exit timeout."""
        with _lock:
            if installed() is not self:
                return
            for module, original in self.originals.items():
                module.getStream = original
            self.originals.clear()
        if self.handler is not None:
            self.handler.observe_spans(None)
        bridge_process().exit_path.remove(self._exit_step)
        self.last_export()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Collect and export now; ``True`` when done within ``timeout_s``."""
        provider = self.provider
        if provider is None or self.closed:
            return True
        timeout_s = self.settings.exit_timeout_s if timeout_s is None else timeout_s
        return run_bounded([provider.force_flush], timeout_s)

    def last_export(self, reason: str = "process exit", error: bool = False) -> bool:
        """The last metric export (an owned provider's ``shutdown`` collects and exports once
        more, then stops its exporters), bounded by the exit timeout; the exit path runs it
        beside the bridge's own shutdown.

        The bridge's counters make every collection non-empty, so with the collector down the
        last export would retry for the whole exit bound: it is abandoned at the first export
        failure seen during the exit, as the log and span flush is.
        """
        if self.closed or self.provider is None:
            return True
        self.closed = True
        from elastic_otel.emit.delivery import install_export_warnings

        warnings = bridge_process().export_warnings
        install_export_warnings(warnings)  # exporters may have created loggers late
        seen = warnings.seen
        final = self.provider.shutdown if self.owned else self.provider.force_flush
        return run_bounded([final], self.settings.exit_timeout_s, lambda: warnings.seen > seen)

    def _current_stalls(self) -> dict[str, float]:
        """The bridge's stalls (its trace model's waits) and the agent's training stall."""
        handler = self.handler
        if handler is None or self.closed:
            return {}
        training = self.watch.current if self.watch is not None else 0.0
        return {**handler.current_stalls(), TRAINING: training}

    def _bridge_stats(self) -> dict[str, int] | None:
        handler = self.handler
        return handler.all_stats() if handler is not None and not self.closed else None


_lock = threading.RLock()
_INSTALLATION = "_elastic_otel_installation"
"""The attribute of the lookup an installation puts in torch's modules that names it."""


def installed() -> TorchMetrics | None:
    """The installation whose lookup is in effect in torch's modules, if any."""
    api = sys.modules.get("torch.distributed.elastic.metrics.api")
    installation = getattr(getattr(api, "getStream", None), _INSTALLATION, None)
    return installation if isinstance(installation, TorchMetrics) else None


def enabled(settings: Settings | None = None) -> bool:
    """Whether metrics are wanted: ``ELASTIC_OTEL_METRICS`` unset/true and the SDK enabled."""
    return TorchMetrics(settings=settings or Settings.from_environment()).enabled()


def install(
    meter_provider: MeterProvider | None = None,
    handler: OtelHandler | None = None,
    settings: Settings | None = None,
) -> OtelMetricHandler | None:
    """Report torchelastic's metrics as OTel metrics (idempotent; see the module docstring):
    a :class:`TorchMetrics` installed, unless one is in effect already.

    ``meter_provider`` defaults to the application's SDK ``MeterProvider``, else one built from
    the environment; ``handler``: the bridge handler to report beside them (``None``: none).
    Returns the metric handler, or ``None`` when metrics are disabled or torch's metrics API is
    missing.
    """
    with _lock:
        installation = installed() or TorchMetrics(handler, settings, meter_provider)
        return installation.metric_handler if installation.install() else None


def uninstall() -> None:
    """Undo the installation in effect (:meth:`TorchMetrics.uninstall`)."""
    installation = installed()
    if installation is not None:
        installation.uninstall()


def installed_handler() -> OtelMetricHandler | None:
    """The installed metric handler, if any (for other parts of the bridge to record on)."""
    installation = installed()
    return installation.metric_handler if installation is not None else None


def flush(timeout_s: float | None = None) -> bool:
    """Collect and export now; ``True`` when done within ``timeout_s``."""
    installation = installed()
    return True if installation is None else installation.flush(timeout_s)


def _provider() -> tuple[MeterProvider, bool]:
    from opentelemetry import metrics as metrics_api
    from opentelemetry.sdk.metrics import MeterProvider

    from elastic_otel.emit.pipeline import build_meter_provider, build_resource

    app = metrics_api.get_meter_provider()
    if isinstance(app, MeterProvider):
        return app, False
    return build_meter_provider(build_resource(), bridge_process().export_gate), True
