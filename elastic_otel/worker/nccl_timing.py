"""NCCL's timing events in a worker: on where they are cheap (``ELASTIC_OTEL_NCCL_TIMING``).

With timing events NCCL's record says whether a rank's GPU *started* a collective and how long
each ran on the device: what names a stuck or slow GPU. They cost each collective a few
microseconds, so what they cost a job is its collective rate times that. In ``auto`` (the
default) the worker's collectives thread measures its NCCL collective rate for
:data:`~elastic_otel.names.environment_variables.NCCL_TIMING_MEASURE_S` after the first one
completed, then turns timing on at run time (``ProcessGroup._enable_collectives_timing()``) when
rate x cost is within the budget, for every NCCL group and each made later; a window in which no
collective completed measured nothing (a job stuck in its first steps), so it measures again.
Collectives enqueued before that never get a start event: each group's ``timed_from`` says from
which one its states count. Design: ``docs/hangs.md`` (NCCL timing by default).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from elastic_otel.names.environment_variables import (
    DEFAULT_NCCL_TIMING,
    DEFAULT_NCCL_TIMING_BUDGET_PERCENT,
    DEFAULT_NCCL_TIMING_COST_US,
    ELASTIC_OTEL_NCCL_TIMING,
    ELASTIC_OTEL_NCCL_TIMING_BUDGET,
    ELASTIC_OTEL_NCCL_TIMING_COST_US,
    NCCL_TIMING_MEASURE_S,
    NCCL_TIMING_MODES,
    TORCH_NCCL_ENABLE_TIMING,
)
from elastic_otel.parsing.collectives import (
    TIMING_FORCED,
    TIMING_MEASURING,
    TIMING_NOT_AT_RUN_TIME,
    TIMING_OVER_BUDGET,
    TIMING_SET_BY_JOB,
    TIMING_WITHIN_BUDGET,
    NcclTiming,
)

NCCL = "nccl"
_TORCH_TRUE = frozenset({"y", "yes", "1", "t", "true"})
"""What torch's ``getCvarBool`` reads as on (any case; "on" is not among them)."""

Enable = Callable[[str], bool]
"""``enable(group name)``: turn timing on for that process group; ``False`` where torch cannot."""


def timing_mode(environ: MutableMapping[str, str] | None = None) -> str:
    """``ELASTIC_OTEL_NCCL_TIMING`` as one of ``auto``, ``true``, ``false`` (``1``/``on`` read
    as ``true``, ``0``/``off`` as ``false``; anything else as the default, with a warning)."""
    raw = (environ if environ is not None else os.environ).get(ELASTIC_OTEL_NCCL_TIMING, "")
    raw = raw.strip().lower()
    if raw in ("1", "yes", "on"):
        return "true"
    if raw in ("0", "no", "off"):
        return "false"
    if raw and raw not in NCCL_TIMING_MODES:
        logging.getLogger("elastic_otel").warning(
            "elastic-otel: %s=%r is none of auto, true, false; using %s",
            ELASTIC_OTEL_NCCL_TIMING,
            raw[:40],
            DEFAULT_NCCL_TIMING,
        )
        return DEFAULT_NCCL_TIMING
    return raw or DEFAULT_NCCL_TIMING


def arm(environ: MutableMapping[str, str] | None = None) -> TimingSwitch:
    """At the worker's start-up, before torch makes its process groups: ``true`` sets
    ``TORCH_NCCL_ENABLE_TIMING=1`` unless the job set it; the switch that decides the rest."""
    env: MutableMapping[str, str] = environ if environ is not None else os.environ
    mode = timing_mode(env)
    job = env.get(TORCH_NCCL_ENABLE_TIMING)
    if job is not None and job.strip():
        on = job.lower() in _TORCH_TRUE
        return TimingSwitch(mode, NcclTiming(on, TIMING_SET_BY_JOB))
    if mode == "true":
        env[TORCH_NCCL_ENABLE_TIMING] = "1"
        return TimingSwitch(mode, NcclTiming(True, TIMING_FORCED))
    if mode == "false":
        return TimingSwitch(mode, NcclTiming(False, TIMING_FORCED))
    return TimingSwitch(
        mode,
        None,
        budget_percent=_number(
            env, ELASTIC_OTEL_NCCL_TIMING_BUDGET, DEFAULT_NCCL_TIMING_BUDGET_PERCENT
        ),
        cost_us=_number(env, ELASTIC_OTEL_NCCL_TIMING_COST_US, DEFAULT_NCCL_TIMING_COST_US),
    )


def _number(env: MutableMapping[str, str], name: str, default: float) -> float:
    """A non-negative number from ``env``; ``default`` when unset or malformed."""
    try:
        value = float(env.get(name, "").strip() or default)
    except ValueError:
        return default
    return value if value >= 0 else default


class TimingSwitch:
    """Decides a worker's NCCL timing once and applies it to its NCCL groups; owns the
    decision. Fed the collectives thread's group states (dicts with ``name``, ``backend``,
    ``issued``, ``completed``, ``timed_from``) at each poll."""

    def __init__(
        self,
        mode: str,
        decided: NcclTiming | None,
        budget_percent: float = DEFAULT_NCCL_TIMING_BUDGET_PERCENT,
        cost_us: float = DEFAULT_NCCL_TIMING_COST_US,
        measure_s: float = NCCL_TIMING_MEASURE_S,
    ) -> None:
        self.mode = mode
        self.decision = decided
        self.budget_percent = budget_percent
        self.cost_us = cost_us
        self.measure_ns = int(measure_s * 1e9)
        self._from_start = decided is not None and decided.on  # timed since groups were made
        self._start: tuple[int, int, int] | None = None  # (ns, issued, completed) measured from
        self._completed = 0  # collectives completed when a window saw none complete
        self._enabled: set[str] = set()  # group names timing was turned on for at run time
        self._failed: set[str] = set()  # group names torch refused it for

    def observe(self, now_ns: int, groups: Iterable[dict[str, Any]], enable: Enable) -> bool:
        """Measure, decide, and turn timing on for NCCL groups not yet on; whether anything
        the collectives file says changed (the decision, a group's ``timed_from``)."""
        nccl = [g for g in groups if g["backend"] == NCCL and not g.get("_placeholder")]
        if not nccl:
            return False
        changed = False
        if self.decision is None or self.decision.reason == TIMING_MEASURING:
            decided = self._measure(now_ns, nccl) or self.decision
            decided = decided or NcclTiming(False, TIMING_MEASURING)
            changed = decided != self.decision
            self.decision = decided
        if not self.decision.on:
            return changed
        for group in nccl:
            name = group["name"]
            if group.get("timed_from") or name in self._failed:
                continue
            if self._from_start:
                group["timed_from"] = 1
            elif enable(name):
                self._enabled.add(name)
                # Its collectives from the next one on have start events; those enqueued before
                # (up to ``issued``, read after the switch) never will.
                group["timed_from"] = int(group["issued"]) + 1
            elif not self._enabled:  # the first one failed: this torch cannot at run time
                d = self.decision
                self.decision = NcclTiming(
                    False,
                    TIMING_NOT_AT_RUN_TIME,
                    d.rate,
                    d.share_percent,
                    d.budget_percent,
                    d.cost_us,
                )
                return True
            else:
                self._failed.add(name)  # gone already, say: not tried again
                continue
            changed = True
        return changed

    def _measure(self, now_ns: int, nccl: list[dict[str, Any]]) -> NcclTiming | None:
        """The decision once the rate has been measured long enough; ``None`` until then.

        A window in which no collective completed is no measurement: its rate (0, or what a
        stuck GPU let the rank enqueue) says nothing of what timing would cost once the job
        runs, and a decision on it would turn timing on for any job stuck in its first steps,
        however fast it runs later. So the worker keeps measuring and says so (still
        ``measuring``, at a rate of 0), and the next window begins when a collective completes
        again, so that it measures the job at work. A stuck job loses nothing by the wait: no
        collective enqueued before the switch would get timing events anyway."""
        issued = sum(int(g["issued"]) for g in nccl)
        completed = sum(int(g["completed"]) for g in nccl)
        if self._start is None:
            if completed > self._completed:  # the communicator is up, or working again
                self._start = (now_ns, issued, completed)
            return None
        started_ns, started_issued, started_completed = self._start
        elapsed_ns = now_ns - started_ns
        if elapsed_ns < self.measure_ns:
            return None
        if completed == started_completed:
            self._start, self._completed = None, completed
            return NcclTiming(False, TIMING_MEASURING, 0.0, None, self.budget_percent, self.cost_us)
        rate = (issued - started_issued) / (elapsed_ns / 1e9)
        share = rate * self.cost_us * 1e-6 * 100
        within = share <= self.budget_percent
        reason = TIMING_WITHIN_BUDGET if within else TIMING_OVER_BUDGET
        return NcclTiming(
            within, reason, round(rate, 1), round(share, 4), self.budget_percent, self.cost_us
        )
