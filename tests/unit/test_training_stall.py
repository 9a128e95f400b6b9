"""Who waits for whom in a training stall (elastic_otel.model.stalls.training_stall): the
decision from the ranks' progress records, and the report's text."""

from __future__ import annotations

from elastic_otel.model.stalls import RankProgress, describe_training_stall, training_stall
from elastic_otel.names import attributes as A

S = 1_000_000_000
AFTER = 60 * S


def rank(r: int, collective: str | None, entered: int, step: int | None = None, at: int = 0):
    return RankProgress(r, collective, entered, step, at)


def test_the_rank_outside_the_collective_is_the_one_waited_for() -> None:
    ranks = [rank(0, "all_reduce", 5, at=10 * S), rank(1, None, 4, at=10 * S)]
    stall = training_stall(ranks, 75 * S, AFTER)
    assert stall is not None
    assert (stall.waiting, stall.waited_for) == ((0,), (1,))
    assert (stall.collective, stall.number, stall.seconds) == ("all_reduce", 5, 65.0)


def test_a_rank_in_an_earlier_collective_is_waited_for_too() -> None:
    ranks = [rank(2, "all_reduce", 9), rank(3, "barrier", 8), rank(4, "all_reduce", 9)]
    stall = training_stall(ranks, 61 * S, AFTER)
    assert stall is not None and (stall.waiting, stall.waited_for) == ((2, 4), (3,))


def test_all_local_ranks_waiting_means_the_culprit_is_on_another_node() -> None:
    stall = training_stall([rank(2, "all_reduce", 5), rank(3, "all_reduce", 5)], 61 * S, AFTER)
    assert stall is not None and (stall.waiting, stall.waited_for) == ((2, 3), ())
    attributes = {
        A.STALLED_SECONDS: 61.0,
        A.STALLED_WAITING: "2,3",
        A.STALLED_COLLECTIVE: "all_reduce",
        A.STALLED_COLLECTIVE_NUMBER: 5,
        A.STALLED_RANKS: "",
    }
    assert describe_training_stall(attributes) == (
        "stalled 61 s in training: global ranks 2,3 wait in all_reduce #5; "
        "waiting for ranks on other nodes"
    )


def test_behind_in_marked_steps_without_a_collective() -> None:
    stall = training_stall([rank(0, None, 0, step=7), rank(1, None, 0, step=6)], 61 * S, AFTER)
    assert stall is not None and (stall.waiting, stall.waited_for) == ((0,), (1,))


def test_no_stall_while_anyone_progresses_or_before_training_begins() -> None:
    ranks = [rank(0, "all_reduce", 5, at=0), rank(1, None, 5, at=30 * S)]
    assert training_stall(ranks, 61 * S, AFTER) is None  # rank 1 progressed 31 s ago
    starting = [rank(0, None, 0), rank(1, None, 0)]  # importing, init_process_group
    assert training_stall(starting, 600 * S, AFTER) is None
    assert training_stall(ranks, 10_000 * S, 0) is None  # ELASTIC_OTEL_STALL_AFTER=0
    assert training_stall([], 61 * S, AFTER) is None
