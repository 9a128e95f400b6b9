"""Goodput as OpenTelemetry metrics, read at each collection (nothing recorded on torch's threads):

* ``torchelastic.goodput`` (gauge, unit ``1``): the job's productive step time over its wall
  time so far, by ``torchelastic.run_id``;
* ``torchelastic.badput.duration`` (counter, ``s``) by ``torchelastic.badput.category`` and
  ``torchelastic.run_id``: the wall time that did not train.

Only the node that runs global rank 0 observes them (:mod:`elastic_otel.model.goodput`), so a
sum over the job's nodes counts each attempt once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from elastic_otel.names import attributes as A

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation


@dataclass(frozen=True, slots=True)
class GoodputPoint:
    """One job's values for the metrics, as the reporting node has them."""

    run_id: str
    ratio: float | None  # None: this node does not report the ratio now
    badput_s: dict[str, float]


def observe(meter: Meter, read: Callable[[], list[GoodputPoint]]) -> None:
    """Register the two instruments on ``meter``; ``read`` returns the current points."""
    from opentelemetry.metrics import Observation

    def ratio(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(p.ratio, {A.RUN_ID: p.run_id}) for p in read() if p.ratio is not None]

    def badput(_options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(seconds, {A.RUN_ID: p.run_id, A.BADPUT_CATEGORY: category})
            for p in read()
            for category, seconds in p.badput_s.items()
        ]

    meter.create_observable_gauge(
        A.METRIC_GOODPUT, [ratio], "1", "Share of the job's wall time spent on steps that count"
    )
    meter.create_observable_counter(
        A.METRIC_BADPUT_DURATION, [badput], "s", "Wall time of the job that did not train"
    )
