"""The straggler score (elastic_otel.model.stragglers): a rank that is late at every collective
is named after consecutive windows; equal ranks, and uneven arrivals that shift from rank to
rank, name nobody. Arrivals as the workers' collectives files carry them."""

from __future__ import annotations

import random

from elastic_otel.model.stragglers import (
    REPORT_EVERY,
    WINDOWS,
    StragglerWatch,
    describe_straggler,
    straggler_attributes,
)
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import parse_collectives

MS = 1_000_000
STEP = 300 * MS
PER_WINDOW = 10


def _window(
    watch: StragglerWatch, w: int, late: dict[int, float], ranks: tuple[int, ...] = (0, 1)
) -> None:
    """Window ``w``'s collectives: rank r issues each ``late[r]`` seconds after the step's
    start (a callable per collective where given)."""
    for rank in ranks:
        pairs = []
        for i in range(PER_WINDOW):
            seq = w * PER_WINDOW + i + 1
            delay = late.get(rank, 0.0)
            offset = delay(seq) if callable(delay) else delay
            pairs.append((seq, 10**18 + seq * STEP + int(offset * 1e9)))
        watch.observe(rank, [("0", pairs)], {"0": ranks})


def test_a_slow_rank_is_named_after_consecutive_windows() -> None:
    watch = StragglerWatch(0.75)
    found = []
    for w in range(WINDOWS + REPORT_EVERY):
        _window(watch, w, {1: 0.25})
        found.append(watch.close_window((0, 1)))
    assert found[: WINDOWS - 1] == [None] * (WINDOWS - 1)
    straggler = found[WINDOWS - 1]
    assert straggler is not None
    assert straggler.rank.global_rank == 1 and straggler.waiting == (0,)
    assert straggler.windows == WINDOWS
    assert abs(straggler.rank.lateness_s - 0.25) < 1e-6
    assert abs(straggler.rank.interval_s - 0.3) < 1e-6
    assert abs(straggler.rank.score - (1 - 0.25 / 0.3)) < 1e-6
    assert abs(straggler.rank.waited_share - 0.25 / 0.3) < 1e-6
    # reported again every REPORT_EVERY windows while it lasts, not every window
    assert found[WINDOWS : WINDOWS + REPORT_EVERY - 1] == [None] * (REPORT_EVERY - 1)
    assert found[-1] is not None and found[-1].windows == WINDOWS + REPORT_EVERY
    assert watch.scores[0].score == 1.0 and watch.scores[0].lateness_s == 0.0
    assert watch.scores[1].score < 0.75

    attrs = straggler_attributes(straggler)
    assert attrs[A.STRAGGLER_RANK] == 1 and attrs[A.STRAGGLER_WAITING] == (0,)
    body = describe_straggler(attrs)
    assert body.startswith("global rank 1 is a straggler: score 0.17 over 3 windows"), body
    assert "global ranks 0 spend 83 % of that time waiting for it" in body


def test_equal_ranks_name_nobody() -> None:
    watch = StragglerWatch(0.75)
    for w in range(4 * WINDOWS):
        _window(watch, w, {1: lambda seq: 0.001 * (seq % 2)})
        assert watch.close_window((0, 1)) is None
    assert all(s.score > 0.99 for s in watch.scores.values())


def test_uneven_but_shifting_arrivals_name_nobody() -> None:
    rng = random.Random(7)
    jitter = {r: (lambda seq, r=r: rng.uniform(0, 0.25)) for r in range(4)}
    watch = StragglerWatch(0.75)
    for w in range(6 * WINDOWS):
        _window(watch, w, jitter, ranks=(0, 1, 2, 3))  # late ranks change every collective
        assert watch.close_window((0, 1, 2, 3)) is None
    # a slow rank that changes from window to window: never the same one for long enough
    watch = StragglerWatch(0.75)
    for w in range(6 * WINDOWS):
        _window(watch, w, {w % 2: 0.25})
        assert watch.close_window((0, 1)) is None
    assert watch.scores[(6 * WINDOWS - 1) % 2].score < 0.75  # the score still says it


def test_arrivals_that_come_in_other_windows_still_score() -> None:
    """The workers' windows are not the agent's: a rank's arrivals may come a window later."""
    watch = StragglerWatch(0.75)
    found = []
    prev: list[tuple[int, int]] = []
    for w in range(WINDOWS + 1):
        pairs = {
            r: [
                (seq, 10**18 + seq * STEP + (250 * MS if r == 1 else 0))
                for seq in range(w * 10 + 1, w * 10 + 11)
            ]
            for r in (0, 1)
        }
        watch.observe(0, [("0", pairs[0])])
        if w:  # rank 1's come one window late
            watch.observe(1, [("0", prev)])
        prev = pairs[1]
        watch.observe(0, [("0", pairs[0])])  # a file read twice adds nothing
        found.append(watch.close_window((0, 1)))
    assert found[0] is None and found[-1] is not None and found[-1].rank.global_rank == 1


def test_ranks_outside_the_group_or_on_other_nodes_are_not_compared() -> None:
    watch = StragglerWatch(0.75)
    for w in range(WINDOWS):
        # group "1" has one local member (rank 0) and one elsewhere (rank 2): nothing to compare
        for rank in (0, 1):
            pairs = [
                (s, 10**18 + s * STEP + (250 * MS if rank == 1 else 0))
                for s in range(w * 10 + 1, w * 10 + 11)
            ]
            watch.observe(rank, [("1", pairs)] if rank == 0 else [], {"1": (0, 2)})
        assert watch.close_window((0, 1)) is None
    assert watch.scores == {}


def test_the_collectives_file_carries_arrivals() -> None:
    data = {
        "pid": 7,
        "progress_ns": 1,
        "groups": [],
        "arrivals": {"0": [[1, 100], [2, 200]]},
        "window_ns": 5,
    }
    parsed = parse_collectives(data)
    assert parsed is not None
    assert parsed.arrivals == (("0", ((1, 100), (2, 200))),) and parsed.window_ns == 5
    assert parse_collectives({**data, "arrivals": [1]}) is None
