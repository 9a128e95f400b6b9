"""Slowdowns: a process group's collectives lastingly slower than the job's own baseline, dated,
and split into the part that grew.

A degraded link makes every rank slower alike, so no rank or node is late and the straggler
scores see nothing. What does change is the group's interval between collectives and, for a
link, the time every rank spends inside them. Per window, :class:`SlowdownWatch` takes each
group's collectives (the earliest local arrival of each) and each local rank's time inside them
(the device's where the record times them, else the sampled share of time a collective was
open); after :data:`WARMUP` measurements it keeps the next :data:`BASELINE` as the job's own
baseline (medians), then runs a CUSUM of log(interval / baseline): a change that lasts
:data:`LASTING` measurements over the ratio is a slowdown, dated on the collectives themselves
(the kink in arrival time against collective count), reported every window while it lasts and
ended with what it cost. Pure: no torch, no SDK, no clock of its own.
Design: ``docs/hangs.md`` (Slow links and slowdowns).
"""

from __future__ import annotations

import datetime
import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elastic_otel.model.spans import SpanAttributes
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import group_name

WARMUP = 2
"""Measurements skipped at the start (the first steps, communicators being set up)."""
BASELINE = 5
"""Measurements after the warm-up before the baseline is set; it then follows the job's pace:
the medians of the last :data:`BASELINE_KEPT` measurements that were neither over the ratio nor
part of a slowdown."""
BASELINE_KEPT = 9
LASTING = 3
"""Consecutive measurements over the ratio that make a slowdown (and under it, its end): one
slow window (a checkpoint, a hiccup) is no slowdown."""
NOISE_SIGMAS = 3.0
"""A measurement counts as over the ratio only this many of the baseline's sigmas out."""
MIN_COLLECTIVES = 2
"""Collectives one measurement needs; a window with fewer is merged into the next."""
MAX_ARRIVALS = 4096
"""Arrivals kept per group for dating a change and counting what it cost."""
MAX_GROUPS = 16

COMMUNICATION = "communication"
"""The time inside the collectives grew: a link, a NIC, the fabric."""
COMPUTE = "compute"
"""The time between the collectives grew: the ranks' own work (compute, data loading, a
checkpoint)."""
UNKNOWN = "unknown"
"""Neither timed nor sampled: the time inside is not known."""
TIMED = "timed"
SAMPLED = "sampled"


@dataclass(frozen=True, slots=True)
class GroupWindow:
    """One process group on one node over one window."""

    group: str
    arrivals: tuple[int, ...]  # earliest local arrival (ns) of each collective, in order
    inside_s: Mapping[int, float] = field(default_factory=dict)
    """Global rank → seconds inside per collective, from device time (timed)."""
    open_share: Mapping[int, float] = field(default_factory=dict)
    """Global rank → share of the window it had a collective open (sampled)."""


@dataclass(frozen=True, slots=True)
class Slowdown:
    """A slowdown of one group, as reported now (``ended``: its end record)."""

    group: str
    began_ns: int
    seconds: float
    interval_before_s: float
    interval_now_s: float
    inside_before_s: float | None
    inside_now_s: float | None
    part: str
    alike: bool | None
    basis: str
    lost_s: float
    collectives: int
    reports: int
    ended: bool = False

    @property
    def ratio(self) -> float:
        return self.interval_now_s / self.interval_before_s

    @property
    def inside_ratio(self) -> float | None:
        if self.inside_before_s is None or self.inside_now_s is None:
            return None
        return self.inside_now_s / self.inside_before_s if self.inside_before_s > 0 else None


@dataclass(slots=True)
class _Measure:
    """Collectives of one or more windows: their interval and time inside."""

    first_ns: int  # the first arrival of the measurement
    count: int
    interval_s: float
    inside: dict[int, float]  # rank → seconds inside per collective
    basis: str


@dataclass(slots=True)
class _Group:
    last_ns: int = 0  # the last arrival of the last measurement (0: none yet)
    pending: list[GroupWindow] = field(default_factory=list)  # windows with too few collectives
    measures: int = 0
    baseline: list[_Measure] = field(default_factory=list)
    base_interval: float = 0.0
    base_inside: dict[int, float] = field(default_factory=dict)
    base_spread: float = 0.0  # the baseline's own spread: a robust sigma of log(interval)
    arrivals: deque[int] = field(default_factory=lambda: deque(maxlen=MAX_ARRIVALS))
    starts: deque[int] = field(default_factory=lambda: deque(maxlen=64))  # measures' first ns
    cusum: float = 0.0
    cusum_from: int = 0  # first arrival of the measure where the CUSUM last left zero
    over: int = 0
    under: int = 0
    onset_ns: int = 0  # 0: no slowdown under way
    since: list[_Measure] = field(default_factory=list)  # the measures since the onset
    reports: int = 0
    ratio: float = 0.0  # the last measure's interval / baseline (0: no baseline yet)


class SlowdownWatch:
    """A node's process groups, window by window (see the module docstring)."""

    def __init__(self, ratio: float) -> None:
        self.threshold = ratio
        self._k = math.sqrt(ratio)  # the CUSUM's allowance: halfway to the ratio, in log
        self._groups: dict[str, _Group] = {}

    @property
    def ratios(self) -> dict[str, float]:
        """Each group's last interval against its baseline (the gauge), once it has one."""
        return {name: g.ratio for name, g in self._groups.items() if g.ratio > 0}

    @property
    def under_way(self) -> list[str]:
        """The groups slowed down now."""
        return [name for name, g in self._groups.items() if g.onset_ns]

    def close(self, window: GroupWindow) -> Slowdown | None:
        """Take one group's window; the report due now (a slowdown, or its end), if any."""
        group = self._groups.get(window.group)
        if group is None:
            if len(self._groups) >= MAX_GROUPS or not window.arrivals:
                return None
            group = self._groups[window.group] = _Group()
        measure = self._measure(group, window)
        if measure is None:
            return None
        group.measures += 1
        if group.measures <= WARMUP:
            return None
        if not group.base_interval:
            group.baseline.append(measure)
            if len(group.baseline) == BASELINE:
                self._set_baseline(group)
            return None
        report = self._step(group, window.group, measure)
        if not group.onset_ns and group.over == 0 and report is None:
            group.baseline = [*group.baseline[1 - BASELINE_KEPT :], measure]
            self._set_baseline(group)
        return report

    def _measure(self, group: _Group, window: GroupWindow) -> _Measure | None:
        """The window as a measurement, merged with earlier windows that had too few
        collectives; ``None`` until there are enough (or before the first arrival)."""
        if group.last_ns == 0:  # the first arrivals: a start to measure from
            if window.arrivals:
                group.last_ns = window.arrivals[-1]
                group.arrivals.extend(window.arrivals)
            return None
        group.pending.append(window)
        arrivals = [a for w in group.pending for a in w.arrivals if a > group.last_ns]
        if len(arrivals) < MIN_COLLECTIVES:
            return None
        windows, group.pending = group.pending, []
        interval = (arrivals[-1] - group.last_ns) / len(arrivals) / 1e9
        inside: dict[int, float] = {}
        basis = ""
        for rank in {r for w in windows for r in (*w.inside_s, *w.open_share)}:
            timed = [w.inside_s[rank] for w in windows if rank in w.inside_s]
            shares = [w.open_share[rank] for w in windows if rank in w.open_share]
            if timed:
                inside[rank], basis = statistics.fmean(timed), TIMED
            elif shares:
                inside[rank] = statistics.fmean(shares) * interval
                basis = basis or SAMPLED
        measure = _Measure(arrivals[0], len(arrivals), interval, inside, basis)
        group.last_ns = arrivals[-1]
        group.arrivals.extend(arrivals)
        group.starts.append(arrivals[0])
        return measure

    @staticmethod
    def _set_baseline(group: _Group) -> None:
        group.base_interval = statistics.median(m.interval_s for m in group.baseline)
        logs = [math.log(m.interval_s / group.base_interval) for m in group.baseline]
        group.base_spread = 1.4826 * statistics.median(abs(v) for v in logs)
        ranks = {r for m in group.baseline for r in m.inside}
        group.base_inside = {
            r: statistics.median(m.inside[r] for m in group.baseline if r in m.inside)
            for r in ranks
        }

    def _step(self, group: _Group, name: str, measure: _Measure) -> Slowdown | None:
        ratio = measure.interval_s / group.base_interval if group.base_interval > 0 else 1.0
        group.ratio = ratio
        increment = math.log(max(ratio, 1e-9)) - math.log(self._k)
        if group.cusum <= 0:
            group.cusum_from = measure.first_ns
        group.cusum = max(0.0, group.cusum + increment)
        if not group.onset_ns:
            # Over the ratio, and clearly out of the baseline's own noise.
            out = math.log(max(ratio, 1e-9)) >= NOISE_SIGMAS * group.base_spread
            group.over = group.over + 1 if ratio >= self.threshold and out else 0
            group.since = [*group.since[-(LASTING - 1) :], measure] if group.over else []
            if group.over < LASTING:
                return None
            group.onset_ns = self._onset(group)
            group.under, group.reports = 0, 0
        else:
            group.since.append(measure)
            # Back nearer the baseline than the slowdown's level (and under the ratio).
            slow = [m for m in group.since[:-1] if m.interval_s >= group.base_interval]
            level = statistics.fmean(m.interval_s for m in slow) if slow else measure.interval_s
            end = min(self.threshold, math.sqrt(level / group.base_interval))
            group.under = group.under + 1 if ratio < end else 0
            if group.under >= LASTING:
                return self._ended(group, name)
        group.reports += 1
        return self._report(group, name, group.arrivals[-1], ended=False)

    def _onset(self, group: _Group) -> int:
        """When the change began: the kink of the arrivals from one measure before the CUSUM
        left zero (a stretch at the old rate) to now."""
        starts = [s for s in group.starts if s < group.cusum_from]
        since = starts[-1] if starts else group.cusum_from
        series = [a for a in group.arrivals if a >= since]
        return series[kink(series, slower=True)] if len(series) >= 3 else group.cusum_from

    def _ended(self, group: _Group, name: str) -> Slowdown:
        """The end record; the group measures against its baseline again."""
        recovered = group.since[-LASTING:]
        starts = [s for s in group.starts if s < recovered[0].first_ns]
        since = starts[-1] if starts else recovered[0].first_ns
        series = [a for a in group.arrivals if a >= since]
        end_ns = series[kink(series, slower=False)] if len(series) >= 3 else since
        group.since = group.since[:-LASTING]  # the slowdown's own measures
        report = self._report(group, name, max(end_ns, group.onset_ns), ended=True)
        group.onset_ns, group.since, group.over, group.under = 0, [], 0, 0
        group.cusum = 0.0
        return report

    def _report(self, group: _Group, name: str, until_ns: int, ended: bool) -> Slowdown:
        collectives = sum(1 for a in group.arrivals if group.onset_ns < a <= until_ns)
        seconds = max(until_ns - group.onset_ns, 0) / 1e9
        interval_now = seconds / collectives if collectives else group.since[-1].interval_s
        lost = max(seconds - collectives * group.base_interval, 0.0)
        inside_before, inside_now, part, alike, basis = self._split(group, interval_now)
        return Slowdown(
            group=name,
            began_ns=group.onset_ns,
            seconds=seconds,
            interval_before_s=group.base_interval,
            interval_now_s=interval_now,
            inside_before_s=inside_before,
            inside_now_s=inside_now,
            part=part,
            alike=alike,
            basis=basis,
            lost_s=lost,
            collectives=collectives,
            reports=group.reports,
            ended=ended,
        )

    @staticmethod
    def _split(
        group: _Group, interval_now: float
    ) -> tuple[float | None, float | None, str, bool | None, str]:
        """Time inside before and now (mean over the local ranks), the part that grew, whether
        every rank's time inside grew alike, and how it was measured."""
        measures = [m for m in group.since if m.inside]
        ranks = [r for r in group.base_inside if any(r in m.inside for m in measures)]
        if not ranks:
            return None, None, UNKNOWN, None, ""
        now = {}
        for r in ranks:
            held = [m for m in measures if r in m.inside]
            now[r] = sum(m.inside[r] * m.count for m in held) / sum(m.count for m in held)
        before_mean = statistics.fmean(group.base_inside[r] for r in ranks)
        now_mean = statistics.fmean(now.values())
        grew_inside = now_mean - before_mean
        grew_between = (interval_now - now_mean) - (group.base_interval - before_mean)
        part = COMMUNICATION if grew_inside > 0 and grew_inside >= grew_between else COMPUTE
        alike = grew_inside > 0 and all(
            now[r] - group.base_inside[r] >= grew_inside / 2 for r in ranks
        )
        return before_mean, now_mean, part, alike, measures[-1].basis or SAMPLED


def kink(arrivals: Sequence[int], slower: bool) -> int:
    """The index where a series of arrival times bends: furthest below the chord from its first
    to its last point where it got ``slower`` (the curve is convex), above it where faster."""
    first, last, n = arrivals[0], arrivals[-1], len(arrivals)
    best, at = 0.0, 0
    for i in range(1, n - 1):
        chord = first + (last - first) * i / (n - 1)
        distance = chord - arrivals[i] if slower else arrivals[i] - chord
        if distance > best:
            best, at = distance, i
    return at


def iso(ns: int) -> str:
    """``ns`` since the epoch as ISO 8601 in UTC, to the millisecond."""
    moment = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def slowdown_attributes(slowdown: Slowdown) -> SpanAttributes:
    """The report's facts, as the ``torchelastic.slowdown`` record's attributes."""
    attributes: SpanAttributes = {
        A.SLOWDOWN_PROCESS_GROUP: group_name(slowdown.group),
        A.SLOWDOWN_BEGAN: iso(slowdown.began_ns),
        A.SLOWDOWN_SECONDS: round(slowdown.seconds, 3),
        A.SLOWDOWN_INTERVAL_BEFORE: round(slowdown.interval_before_s, 4),
        A.SLOWDOWN_INTERVAL_NOW: round(slowdown.interval_now_s, 4),
        A.SLOWDOWN_RATIO: round(slowdown.ratio, 3),
        A.SLOWDOWN_PART: slowdown.part,
        A.SLOWDOWN_LOST: round(slowdown.lost_s, 3),
        A.SLOWDOWN_COLLECTIVES: slowdown.collectives,
        A.SLOWDOWN_REPORTS: slowdown.reports,
    }
    if slowdown.inside_before_s is not None and slowdown.inside_now_s is not None:
        attributes[A.SLOWDOWN_INSIDE_BEFORE] = round(slowdown.inside_before_s, 4)
        attributes[A.SLOWDOWN_INSIDE_NOW] = round(slowdown.inside_now_s, 4)
        attributes[A.SLOWDOWN_BASIS] = slowdown.basis
        if slowdown.inside_ratio is not None:
            attributes[A.SLOWDOWN_INSIDE_RATIO] = round(slowdown.inside_ratio, 3)
    if slowdown.alike is not None:
        attributes[A.SLOWDOWN_ALIKE] = slowdown.alike
    return attributes


def describe_slowdown(attributes: SpanAttributes, ended: bool) -> str:
    """The record's body: "the job slowed at 12:01:14 UTC: process group 0's collectives come
    every 0.410 s, 1.9x the 0.210 s before; each rank spends 0.300 s inside each (4.1x), every
    rank alike: communication; 19.6 s of training lost so far"; once ended, what it cost."""
    group = attributes.get(A.SLOWDOWN_PROCESS_GROUP)
    began = str(attributes.get(A.SLOWDOWN_BEGAN, ""))
    clock = began[11:19] + " UTC" if len(began) >= 19 else began
    before, now = (
        attributes.get(A.SLOWDOWN_INTERVAL_BEFORE),
        attributes.get(A.SLOWDOWN_INTERVAL_NOW),
    )
    ratio, lost = attributes.get(A.SLOWDOWN_RATIO), attributes.get(A.SLOWDOWN_LOST)
    part = attributes.get(A.SLOWDOWN_PART)
    inside_before = attributes.get(A.SLOWDOWN_INSIDE_BEFORE)
    inside_now = attributes.get(A.SLOWDOWN_INSIDE_NOW)
    inside_ratio = attributes.get(A.SLOWDOWN_INSIDE_RATIO)
    if ended:
        seconds = attributes.get(A.SLOWDOWN_SECONDS)
        text = f"the slowdown of process group {group} that began at {clock} ended after "
        text += f"{_num(seconds, '.0f')} s: its collectives came every {_num(now, '.3f')} s"
        text += f" ({_num(ratio, '.1f')}x the {_num(before, '.3f')} s before)"
        text += f", {part}; it cost {_num(lost, '.1f')} s of training"
        return text
    text = f"the job slowed at {clock}: process group {group}'s collectives come every "
    text += f"{_num(now, '.3f')} s, {_num(ratio, '.1f')}x the {_num(before, '.3f')} s before"
    if isinstance(inside_now, int | float) and isinstance(inside_before, int | float):
        text += f"; each rank spends {inside_now:.3f} s inside each"
        text += f" ({inside_ratio:.1f}x)" if isinstance(inside_ratio, int | float) else ""
        if part == COMMUNICATION:
            alike = attributes.get(A.SLOWDOWN_ALIKE)
            text += ", every rank alike" if alike else ", not every rank alike"
        elif part == COMPUTE:
            text += f" (against {inside_before:.3f} s): the time between them grew"
    text += f": {part}; {_num(lost, '.1f')} s of training lost so far"
    return text


def _num(value: object, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else "?"
