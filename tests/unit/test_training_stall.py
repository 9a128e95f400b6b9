"""Who waits for whom in a training stall (elastic_otel.model.stalls.training_stall): the
decision from the ranks' progress records, and the report's text."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.events import Event, EventSource

from elastic_otel.model.stalls import (
    STALL_EVENT_NAME,
    STALL_STATE,
    TRAINING,
    RankProgress,
    describe_training_stall,
    training_stall,
)
from elastic_otel.names import attributes as A
from tests.support.jobs import use_receiver
from tests.support.otlp_receiver import OtlpReceiver

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
        A.STALLED_WAITING: (2, 3),
        A.STALLED_COLLECTIVE: "all_reduce",
        A.STALLED_COLLECTIVE_NUMBER: 5,
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


def test_a_rank_that_left_training_is_no_stall_but_is_named_when_waited_for() -> None:
    """A rank that destroyed its process group or is exiting is past training: ranks slow to
    exit are no stall; a rank that left while the others wait in a collective it never
    entered (it ran out of data first: uneven inputs) is the one waited for, said so."""
    exiting = [RankProgress(r, None, 9, 4, 10 * S, left=True) for r in (0, 1)]
    assert training_stall(exiting, 600 * S, AFTER) is None
    one_slow = [exiting[0], RankProgress(1, None, 9, 4, 10 * S)]  # not left: behind nobody
    stall = training_stall(one_slow, 75 * S, AFTER)
    assert stall is not None and (stall.waiting, stall.waited_for, stall.left) == ((), (), ())
    uneven = [rank(0, "all_reduce", 10, at=10 * S), RankProgress(1, None, 9, 4, 10 * S, left=True)]
    stall = training_stall(uneven, 75 * S, AFTER)
    assert stall is not None
    assert (stall.waiting, stall.waited_for, stall.left) == ((0,), (1,), (1,))
    attributes = {
        A.STALLED_SECONDS: 65.0,
        A.STALLED_WAITING: (0,),
        A.STALLED_RANKS: (1,),
        A.STALLED_LEFT: (1,),
        A.STALLED_COLLECTIVE: "all_reduce",
        A.STALLED_COLLECTIVE_NUMBER: 10,
        A.STACK_FRAME: "main at train.py:40",
    }
    assert describe_training_stall(attributes) == (
        "stalled 65 s in training: global ranks 0 wait in all_reduce #10; waiting for global "
        "rank 1 (in main at train.py:40), which left training (destroyed its process group, or "
        "exiting)"
    )


def test_a_reports_ranks_reach_the_collector_as_int_arrays(
    monkeypatch: pytest.MonkeyPatch, grpc_receiver: OtlpReceiver, make_logger
) -> None:
    """The agent instrumentation's stall reports (torch ``Event`` s, whose metadata holds
    scalars: the ranks as ``"1,3"``) through the real handler, at a real collector: int arrays a
    query can use; none waited for on this node: left out; text that is no rank: flagged."""
    use_receiver(monkeypatch, grpc_receiver)
    logger, handler = make_logger()
    for seconds, waited_for, waiting in ((61.0, "1,3", "0,2"), (62.0, "", "4,5"), (63.0, "x", "0")):
        metadata = {
            "run_id": "job",
            "state": STALL_STATE,
            "stalled.in": TRAINING,
            "stalled.seconds": seconds,
            "stalled.ranks": waited_for,
            "stalled.waiting": waiting,
            "stalled.collective": "all_reduce",
            "stalled.collective_number": 7,
        }
        logger.info(Event(STALL_EVENT_NAME, EventSource.AGENT, metadata=metadata).serialize())
    assert handler.flush(10)
    reports = grpc_receiver.wait_for_logs(3, where=lambda r: r["event_name"] == STALL_EVENT_NAME)
    by_seconds = {r["attributes"][A.STALLED_SECONDS]: r for r in reports}
    named, elsewhere, flagged = (by_seconds[s] for s in (61.0, 62.0, 63.0))
    assert named["attributes"][A.STALLED_RANKS] == [1, 3]
    assert named["attributes"][A.STALLED_WAITING] == [0, 2]
    assert named["body"] == (
        "stalled 61 s in training: global ranks 0,2 wait in all_reduce #7; "
        "waiting for global rank 1,3"
    )
    assert A.STALLED_RANKS not in elsewhere["attributes"]
    assert elsewhere["attributes"][A.STALLED_WAITING] == [4, 5]
    assert elsewhere["body"].endswith("; waiting for ranks on other nodes")
    assert A.STALLED_RANKS not in flagged["attributes"]
    assert flagged["attributes"][A.INVALID_PREFIX + "stalled.ranks"] == "x"
