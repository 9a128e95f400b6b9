"""Straggler scores as OpenTelemetry metrics, read at each collection (nothing recorded on
torch's threads), by ``torchelastic.global_rank``, for the ranks of this node:

* ``torchelastic.straggler.score`` (gauge, unit ``1``): ``1 - lateness / interval`` over the
  node's last straggler window (1: as fast as the fastest local peer);
* ``torchelastic.straggler.lateness`` (gauge, ``s``): the mean seconds per collective the rank
  issued after its earliest local peer.

Each node reports its own ranks (:mod:`elastic_otel.model.stragglers`): a rank appears once.
With slowdown reports on, ``torchelastic.slowdown.ratio`` (gauge, ``1``), by
``torchelastic.slowdown.process_group``: the node's last interval between the group's
collectives over the job's own baseline (:mod:`elastic_otel.model.slowdowns`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from elastic_otel.model.stragglers import RankScore
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import group_name

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation


def observe(meter: Meter, read: Callable[[], list[RankScore]]) -> None:
    """Register the two gauges on ``meter``; ``read`` returns the current scores."""
    from opentelemetry.metrics import Observation

    def score(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(s.score, {A.GLOBAL_RANK: s.global_rank}) for s in read()]

    def lateness(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(s.lateness_s, {A.GLOBAL_RANK: s.global_rank}) for s in read()]

    meter.create_observable_gauge(
        A.METRIC_STRAGGLER_SCORE, [score], "1", "1 - lateness / interval against local peers"
    )
    meter.create_observable_gauge(
        A.METRIC_STRAGGLER_LATENESS,
        [lateness],
        "s",
        "Mean seconds per collective after the earliest local peer",
    )


def observe_slowdowns(meter: Meter, read: Callable[[], list[tuple[str, float]]]) -> None:
    """Register ``torchelastic.slowdown.ratio`` on ``meter``; ``read`` returns each watched
    process group's (key, ratio)."""
    from opentelemetry.metrics import Observation

    def ratio(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(r, {A.SLOWDOWN_PROCESS_GROUP: group_name(key)}) for key, r in read()]

    meter.create_observable_gauge(
        A.METRIC_SLOWDOWN_RATIO,
        [ratio],
        "1",
        "Interval between a process group's collectives / the job's own baseline",
    )
