"""The bridge's own health as OpenTelemetry metrics: what :func:`elastic_otel.stats` returns.

Loss must be visible where operators look, not only in a Python call: every counter of
``elastic_otel.stats()``, and the longest current stall, is an observable instrument read at
each collection (nothing is added on torch's threads). The instruments and what each drop
reason means: ``docs/guarantees.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from elastic_otel.emit import counters as S
from elastic_otel.names import attributes as A

if TYPE_CHECKING:  # the API is imported when the bridge starts, not when torch loads this
    from opentelemetry.metrics import CallbackOptions, Meter, Observation

REASON = "elastic_otel.reason"


def observe(
    meter: Meter,
    read: Callable[[], dict[str, int] | None],
    stalls: Callable[[], dict[str, float]] | None = None,
) -> None:
    """Register the bridge's counters on ``meter``; ``read`` returns them (``None``: no bridge).

    ``stalls`` returns the longest current wait per kind (``torchelastic.stalled.seconds``).
    """
    from opentelemetry.metrics import Observation

    def values(key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            stats = read()
            return [] if stats is None else [Observation(stats.get(key, 0))]

        return callback

    def drops(_options: CallbackOptions) -> Iterable[Observation]:
        stats = read()
        if stats is None:
            return []
        return [Observation(stats.get(k, 0), {REASON: r}) for r, k in S.DROP_REASONS.items()]

    counter = meter.create_observable_counter
    counter("elastic_otel.events.received", [values("received")], "{event}")
    counter("elastic_otel.events.unparsed", [values("unparsed")], "{event}")
    counter("elastic_otel.records.exported", [values("exported")], "{record}")
    counter("elastic_otel.dropped", [drops], "{record}")
    meter.create_observable_up_down_counter(
        "elastic_otel.export.pending", [values(S.PENDING_EXPORT)], "{record}"
    )
    if stalls is not None:
        read_stalls = stalls

        def stalled(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(s, {A.STALLED_IN: k}) for k, s in read_stalls().items()]

        meter.create_observable_gauge(A.METRIC_STALLED_SECONDS, [stalled], "s")
