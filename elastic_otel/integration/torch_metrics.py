"""torchelastic's metrics (``torch.distributed.elastic.metrics``) as OpenTelemetry metrics.

torch's agent publishes metrics with ``put_metric(name, value, group)`` and the ``@prof``
decorator (``<fn>.success``, ``<fn>.failure``, ``<fn>.duration.ms``). :func:`install` turns
every value into an OTel data point named ``torchelastic.<name>`` (lower-cased, as the SDK
exports instrument names; characters OTel does not allow become ``_``):

* ``<fn>.duration.ms`` → histogram ``torchelastic.<fn>.duration``, unit ``ms``;
* ``<fn>.success``, ``<fn>.failure``, ``*_total``, ``run_*`` and the worker-state counts
  (``healthy``, ``failed``, ...) → counters;
* ``remaining_restarts``, ``flakiness`` (unit ``%``) and any name not known here → gauges
  (the last value: nothing is assumed about how a user's values add up);
* ``workers.<role>.<name>`` → ``torchelastic.workers.<name>`` with ``torchelastic.role``.

The bridge adds its own: the recovery histograms of :mod:`elastic_otel.emit.recovery_metrics`
and its health counters (:mod:`elastic_otel.emit.bridge_health`).

Every point carries ``torchelastic.metric_group``, ``torchelastic.role`` for ``workers.<role>.*``
and ``torchelastic.run_id`` once known (:func:`set_run_id`, else torchrun's ``--rdzv-id``).

**How the handler is installed, and why this way.** torch resolves a handler per value with
``getStream(group)``: the handler ``configure()``-d for the group, else the default one. The
launcher calls ``metrics.initialize_metrics(MetricsConfig(...))`` before the agent runs; in
open-source torch it does nothing, but it is where a deployment's ``metrics.static_init`` installs
*its* handlers with ``configure()``, which would replace one configured here, and users configure
their own handlers per group too. A configured handler can therefore be silently undone, and a
group nobody configured in advance would be missed. So :func:`install` wraps the lookup itself:
the stream ``getStream`` returns feeds the bridge *and* the handler torch's table resolves, for
every group, whatever is configured before or after. :func:`uninstall` puts the lookup back.

Where points go: the application's SDK ``MeterProvider`` when one is installed (e.g. by
``opentelemetry-instrument``), else one built here from ``OTEL_METRICS_EXPORTER`` (default
``otlp``) with a ``PeriodicExportingMetricReader`` (``OTEL_METRIC_EXPORT_INTERVAL``), shut down
at exit within ``ELASTIC_OTEL_EXIT_TIMEOUT`` like the log and span pipeline.
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from elastic_otel.bridge.handler import current_handler
from elastic_otel.emit import bridge_health as bridge_metrics
from elastic_otel.emit.recovery_metrics import RecoveryMetrics
from elastic_otel.integration import torchrun_args
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env

if TYPE_CHECKING:  # the SDK is imported when metrics are installed, not when torch loads this
    from opentelemetry.metrics import Meter
    from opentelemetry.sdk.metrics import MeterProvider

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

_run_id: str | None = None


def set_run_id(run_id: str) -> None:
    """The rendezvous run id to put on every data point (the traced rendezvous sets it)."""
    global _run_id
    _run_id = run_id or None


def current_run_id() -> str | None:
    """:func:`set_run_id`'s value, else torchrun's ``--rdzv-id`` (not with ``--standalone``)."""
    return _run_id if _run_id is not None else torchrun_args.rdzv_run_id()


# --- provider ---------------------------------------------------------------------------------


class _Installed:
    def __init__(self, handler: OtelMetricHandler, provider: MeterProvider, owned: bool) -> None:
        self.handler, self.provider, self.owned = handler, provider, owned
        self.closed = False
        self.originals: dict[Any, Callable[[str], Any]] = {}


_lock = threading.RLock()
_installed: _Installed | None = None


def enabled() -> bool:
    """Whether metrics are wanted: ``ELASTIC_OTEL_METRICS`` unset/true and the SDK enabled."""
    from elastic_otel.emit.pipeline import sdk_disabled

    return env.env_flag(env.ELASTIC_OTEL_METRICS, True) and not sdk_disabled()


def install(meter_provider: MeterProvider | None = None) -> OtelMetricHandler | None:
    """Report torchelastic's metrics as OTel metrics (idempotent; see the module docstring).

    ``meter_provider`` defaults to the application's SDK ``MeterProvider``, else one built from
    the environment. Returns the handler, or ``None`` when metrics are disabled or torch's
    metrics API is missing.
    """
    global _installed
    if not enabled():
        return None
    with _lock:
        if _installed is not None:
            return _installed.handler
        try:
            from torch.distributed.elastic import metrics as torch_metrics
            from torch.distributed.elastic.metrics import api as torch_metrics_api
        except ImportError:
            return None
        try:
            provider, owned = (meter_provider, False) if meter_provider is not None else _provider()
        except Exception as e:
            _logger.warning("elastic-otel: metrics disabled, set-up failed: %s", e)
            return None
        from elastic_otel.version import __version__

        meter = provider.get_meter("elastic_otel", __version__)
        handler = OtelMetricHandler(meter)
        try:
            bridge_metrics.observe(meter, _bridge_stats, _current_stalls)
            bridge = current_handler()
            if bridge is not None:
                bridge.observe_spans(RecoveryMetrics(meter).record_spans)
        except Exception as e:  # the bridge's own counters stay in elastic_otel.stats()
            _logger.warning("elastic-otel: bridge counters not reported as metrics: %s", e)
        state = _Installed(handler, provider, owned)
        original = torch_metrics_api.getStream

        def get_stream(group: str) -> Any:
            stream = original(group)
            return torch_metrics_api.MetricStream(group, _TeeHandler(handler, stream.handler))

        for module in (torch_metrics_api, torch_metrics):
            state.originals[module] = getattr(module, "getStream")  # noqa: B009
            setattr(module, "getStream", get_stream)  # noqa: B010
        _installed = state
        if owned:
            atexit.register(_at_exit, state)
        return handler


def uninstall() -> None:
    """Put torch's metric lookup back and shut down a provider built here (bounded)."""
    global _installed
    with _lock:
        state, _installed = _installed, None
    if state is None:
        return
    bridge = current_handler()
    if bridge is not None:
        bridge.observe_spans(None)
    for module, original in state.originals.items():
        module.getStream = original
    _shutdown(state)


def installed_handler() -> OtelMetricHandler | None:
    """The installed handler, if any (for other parts of the bridge to record on)."""
    state = _installed
    return state.handler if state is not None else None


def flush(timeout_s: float | None = None) -> bool:
    """Collect and export now; ``True`` when done within ``timeout_s``."""
    state = _installed
    if state is None:
        return True
    from elastic_otel.emit.pipeline import run_bounded

    timeout_s = _exit_timeout() if timeout_s is None else timeout_s
    return run_bounded([state.provider.force_flush], timeout_s)


def _exit_timeout() -> float:
    return env.env_float(env.ELASTIC_OTEL_EXIT_TIMEOUT, env.DEFAULT_EXIT_TIMEOUT_S)


def _current_stalls() -> dict[str, float]:
    bridge = current_handler()
    return bridge.current_stalls() if bridge is not None else {}


def _bridge_stats() -> dict[str, int] | None:
    bridge = current_handler()
    return bridge.all_stats() if bridge is not None else None


def _shutdown(state: _Installed, also: tuple[Callable[[], Any], ...] = ()) -> None:
    """The last metric export, and ``also`` (the bridge's own bounded shutdown) beside it.

    The bridge's counters make every collection non-empty, so with the collector down the
    last export would retry for the whole exit bound: it is abandoned at the first export
    failure seen during the exit, as the log and span flush is.
    """
    if state.closed:
        return
    state.closed = True
    from elastic_otel.emit.delivery import EXPORT_WARNINGS, install_export_warnings
    from elastic_otel.emit.pipeline import run_bounded

    install_export_warnings(EXPORT_WARNINGS)  # exporters may have created loggers late
    seen = EXPORT_WARNINGS.seen
    timeout = _exit_timeout()
    # An owned provider's shutdown() collects and exports once more, then stops the exporters.
    final = state.provider.shutdown if state.owned else state.provider.force_flush
    last_export = threading.Thread(
        target=run_bounded,
        args=([final], timeout, lambda: EXPORT_WARNINGS.seen > seen),
        name="elastic-otel-metrics-exit",
        daemon=True,
    )
    last_export.start()
    run_bounded(list(also), timeout)
    last_export.join(timeout)


def _at_exit(state: _Installed) -> None:
    """Flush metrics and the bridge's logs and spans side by side: one exit bound for both.

    This hook runs before the bridge handler's own (registered earlier); its shutdown is
    idempotent, so the later call returns at once.
    """
    bridge = current_handler()
    _shutdown(state, (bridge.shutdown,) if bridge is not None else ())


def _provider() -> tuple[MeterProvider, bool]:
    from opentelemetry import metrics as metrics_api
    from opentelemetry.sdk.metrics import MeterProvider

    from elastic_otel.emit.pipeline import build_meter_provider, build_resource

    app = metrics_api.get_meter_provider()
    if isinstance(app, MeterProvider):
        return app, False
    return build_meter_provider(build_resource()), True
