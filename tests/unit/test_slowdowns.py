"""The slowdown watch on windows made as the agent's training watch makes them: a job's
collectives at its own pace, then slower for a stretch (inside the collectives, every rank alike,
or between them), then back; and a job with noise but no fault."""

from __future__ import annotations

import random

import pytest

from elastic_otel.model.slowdowns import (
    COMMUNICATION,
    COMPUTE,
    SAMPLED,
    TIMED,
    GroupWindow,
    Slowdown,
    SlowdownWatch,
    describe_slowdown,
    kink,
    slowdown_attributes,
)
from elastic_otel.names import attributes as A

S = 1_000_000_000
WINDOW_S = 2.0
START = 1_800_000_000 * S


def run(
    phases: list[tuple[float, float, float]],
    ranks: tuple[int, ...] = (0, 1),
    timed: bool = False,
    noise: float = 0.0,
    seed: int = 0,
) -> tuple[list[Slowdown], list[float]]:
    """Windows of ``WINDOW_S`` over ``phases`` of (seconds, interval, time inside per
    collective); the reports, and the phases' start times (s after the start)."""
    rng = random.Random(seed)
    times, insides, t = [], [], 0.0
    starts = []
    for seconds, interval, inside in phases:
        starts.append(t)
        end = t + seconds
        while t < end:
            step = interval * (1 + rng.uniform(-noise, noise))
            t += step
            times.append(t)
            insides.append(inside * (1 + rng.uniform(-noise, noise)))
    watch = SlowdownWatch(1.3)
    reports: list[Slowdown] = []
    w = 0.0
    i = 0
    while w < t:
        arrivals, inside = [], []
        while i < len(times) and times[i] < w + WINDOW_S:
            arrivals.append(START + int(times[i] * S))
            inside.append(insides[i])
            i += 1
        if arrivals:
            mean_inside = sum(inside) / len(inside)
            interval = WINDOW_S / len(arrivals)
            window = GroupWindow(
                "gloo:0",
                tuple(arrivals),
                inside_s={r: mean_inside for r in ranks} if timed else {},
                open_share={} if timed else {r: min(mean_inside / interval, 1.0) for r in ranks},
            )
        else:
            window = GroupWindow("gloo:0", ())
        report = watch.close(window)
        if report is not None:
            reports.append(report)
        w += WINDOW_S
    return reports, starts


def began_s(report: Slowdown) -> float:
    return (report.began_ns - START) / S


@pytest.mark.parametrize("timed", [False, True])
def test_a_slower_link_is_dated_read_as_communication_and_ended_with_its_cost(timed: bool) -> None:
    reports, starts = run([(20, 0.2, 0.05), (16, 0.5, 0.35), (16, 0.2, 0.05)], timed=timed)
    assert reports, "no slowdown reported"
    first, last = reports[0], reports[-1]
    assert starts[1] - 0.5 <= began_s(first) <= starts[1] + 0.5
    assert first.part == COMMUNICATION and first.alike
    assert first.basis == (TIMED if timed else SAMPLED)
    assert first.ratio == pytest.approx(2.5, rel=0.15)
    assert all(not r.ended for r in reports[:-1]) and last.ended
    assert [r.reports for r in reports[:-1]] == list(range(1, len(reports)))
    assert starts[2] - 0.6 <= began_s(last) + last.seconds <= starts[2] + 0.6
    # 16 s at 0.5 s a collective: 32 collectives, 6.4 s at the baseline: 9.6 s lost
    assert last.lost_s == pytest.approx(9.6, abs=0.8)


def test_slower_compute_on_every_rank_is_read_as_compute() -> None:
    reports, starts = run([(20, 0.2, 0.05), (16, 0.45, 0.05), (16, 0.2, 0.05)])
    assert reports and reports[0].part == COMPUTE
    assert starts[1] - 0.5 <= began_s(reports[0]) <= starts[1] + 0.5
    assert reports[-1].ended


def test_one_slow_window_is_no_slowdown() -> None:
    reports, _ = run([(20, 0.2, 0.05), (2, 0.6, 0.05), (20, 0.2, 0.05)])
    assert reports == []


@pytest.mark.parametrize("seed", range(40))
def test_a_noisy_job_with_no_fault_reports_nothing(seed: int) -> None:
    reports, _ = run([(120, 0.2, 0.05)], noise=0.5, seed=seed)
    assert reports == []


def test_a_stall_of_windows_without_collectives_merges_them() -> None:
    reports, starts = run([(20, 0.2, 0.05), (20, 3.0, 2.8), (20, 0.2, 0.05)])
    assert reports and reports[0].part == COMMUNICATION
    assert starts[1] - 0.5 <= began_s(reports[0]) <= starts[1] + 3.5
    assert reports[-1].ended


def test_the_record_reads_as_the_issue_asks() -> None:
    reports, _ = run([(20, 0.2, 0.05), (16, 0.5, 0.35), (16, 0.2, 0.05)])
    attributes = slowdown_attributes(reports[0])
    text = describe_slowdown(attributes, ended=False)
    assert text.startswith("the job slowed at ")
    assert "process group 0's collectives come every 0.5" in text
    assert "every rank alike: communication" in text and "lost so far" in text
    assert attributes[A.SLOWDOWN_PART] == COMMUNICATION
    ended = describe_slowdown(slowdown_attributes(reports[-1]), ended=True)
    assert "ended after" in ended and "s of training" in ended


def test_kink() -> None:
    series = [0, 1, 2, 3, 4, 6, 8, 10, 12]
    assert kink(series, slower=True) == 4
    assert kink(list(reversed([-x for x in series])), slower=False) == 4
