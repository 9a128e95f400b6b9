"""Hangs in start-up (issue 42): from the workers' start to their first collective, named by
every node. Real two-node torchrun jobs (c10d, gloo, two DDP workers per node,
``tests/scripts/ddp_train.py``): a whole node whose ranks never reach ``init_process_group``
(a checkpoint load on a hung mount), a whole node stuck after it, before the job's first
collective, and one rank alone before it. The other node's ranks wait (inside
``init_process_group``, or in collective #1); the node that has the late ranks learns it from
the round's store and names them, and the waiting node names them through it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import poll_period
from tests.support.jobs import (
    SCRIPTS,
    job_env,
    outputs_after_stopping,
    start_agent,
    stop_agents,
)
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "ddp_train.py"
HANG_LINE = next(
    n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# STARTUP HANG LINE" in line
)
FRAME = f"stuck_loading_checkpoint at ddp_train.py:{HANG_LINE}"
STALL_AFTER_S = 3.0


def _startup_reports(receiver: OtlpReceiver) -> list[dict]:
    return [
        r
        for r in receiver.logs()
        if r["event_name"] == "torchelastic.stalled"
        and r["attributes"].get(A.STALLED_PHASE) == "startup"
    ]


def _run(receiver: OtlpReceiver, tmp_path: Path, ranks: str, at: str, named: object) -> list:
    env = job_env(
        receiver,
        tmp_path,
        STARTUP_HANG_RANKS=ranks,
        STARTUP_HANG_AT=at,
        ELASTIC_OTEL_STALL_AFTER=str(STALL_AFTER_S),
    )
    port, run_id = free_port(), f"startup-{uuid.uuid4().hex[:6]}"
    agents = [start_agent(env, port, run_id, nproc=2, script=SCRIPT) for _ in range(2)]
    try:
        receiver.wait_until(named, 150)
    except TimeoutError as timeout:
        said = [r["body"] for r in receiver.logs() if r["event_name"] == "torchelastic.stalled"]
        raise AssertionError(f"{timeout}\n{said}\n{outputs_after_stopping(agents)}") from None
    finally:
        stop_agents(agents)
    return _startup_reports(receiver)


def test_a_whole_node_before_init_process_group_is_named_by_every_node(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Global ranks 2 and 3 (all of node 1) never reach ``init_process_group``; ranks 0 and 1
    wait inside it. Before, nothing was said until the group's timeout (30 min)."""

    def by(waiting: list[int]) -> list[dict]:
        return [
            r
            for r in _startup_reports(grpc_receiver)
            if r["attributes"].get(A.STALLED_RANKS) == [2, 3]
            and r["attributes"].get(A.STALLED_WAITING, []) == waiting
        ]

    def twice() -> bool:  # each node names them, then again an interval later
        return len(by([0, 1])) >= 2 and len(by([])) >= 2

    reports = _run(grpc_receiver, tmp_path, "2,3", "init", twice)
    theirs, ours = by([0, 1])[0], by([])[0]  # node 0 waits; node 1 has the late ranks
    for node in (by([0, 1]), by([])):
        times = sorted(r["time_ns"] / 1e9 for r in node)
        # the interval (STALL_AFTER), a poll either side, a second for a loaded machine
        assert times[1] - times[0] <= STALL_AFTER_S + 2 * poll_period(STALL_AFTER_S) + 1.0, times
    assert theirs["attributes"][A.STALLED_COLLECTIVE] == "init_process_group"
    assert A.STALLED_PROCESS_GROUP not in theirs["attributes"]
    assert theirs["attributes"][A.STALLED_REMOTE_HOST], theirs
    assert theirs["body"].startswith("stalled "), theirs["body"]
    assert (
        " s in start-up: global ranks 0,1 wait in init_process_group; waiting for global rank"
        " 2,3 on " in theirs["body"]
    ), theirs["body"]
    assert f"(in {FRAME}), which has not reached it" in theirs["body"], theirs["body"]
    assert ours["attributes"][A.STACK_FRAME] == FRAME, ours
    assert (
        " s in start-up: ranks on other nodes wait in init_process_group; waiting for"
        f" global rank 2,3 (in {FRAME}), which has not reached it" in ours["body"]
    ), ours["body"]
    for report in reports:
        assert "other nodes (or" not in report["body"], report["body"]


def test_a_whole_node_stuck_before_the_first_collective_is_named_by_every_node(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Global ranks 2 and 3 (all of node 1) stop after ``init_process_group``, before the
    job's first collective (DDP's first broadcast): ranks 0 and 1 wait in collective #1 of the
    default group. Node 1 has no rank in training to compare with; it reads what node 0 waits
    in from the round's store and names its own ranks, and node 0 names them through it.
    Before, node 0 said "waiting for ranks on other nodes" and nothing named them."""

    def by(waiting: list[int]) -> list[dict]:
        return [
            r
            for r in grpc_receiver.logs()
            if r["event_name"] == "torchelastic.stalled"
            and r["attributes"].get(A.STALLED_RANKS) == [2, 3]
            and r["attributes"].get(A.STALLED_WAITING, []) == waiting
        ]

    def at_the_hang() -> list[dict]:  # stacks taken once the ranks are in their load
        return [r for r in by([]) if r["attributes"].get(A.STACK_FRAME) == FRAME]

    # Under load node 1 may name its ranks while they are still on their way out of
    # init_process_group (their frame then is torch's); its next reports show the load.
    _run(grpc_receiver, tmp_path, "2,3", "first", lambda: by([0, 1]) and at_the_hang())
    theirs, ours = by([0, 1])[0], at_the_hang()[0]
    for report in (theirs, ours):
        attrs = report["attributes"]
        assert attrs[A.STALLED_COLLECTIVE_NUMBER] == 1 and attrs[A.STALLED_PROCESS_GROUP] == "0"
        assert "), which never entered it" in report["body"], report["body"]
    assert f"(in {FRAME}), which never entered it" in ours["body"], ours["body"]
    assert theirs["attributes"][A.STALLED_REMOTE_HOST], theirs
    assert "global ranks 0,1 wait in " in theirs["body"], theirs["body"]
    assert ours["attributes"][A.STALLED_PHASE] == "startup", ours
    assert " s in start-up: ranks on other nodes wait in " in ours["body"], ours["body"]


def test_one_rank_before_init_process_group_is_named_by_every_node(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Global rank 3 alone never reaches ``init_process_group`` (issue 42's case: before, the
    other three waited inside it with no stall record at all). Its neighbour on node 1 waits
    inside it too, so node 1 names rank 3 from its own ranks; node 0 through the store."""

    def by(waiting: list[int]) -> list[dict]:
        return [
            r
            for r in _startup_reports(grpc_receiver)
            if r["attributes"].get(A.STALLED_RANKS) == [3]
            and r["attributes"].get(A.STALLED_WAITING, []) == waiting
        ]

    _run(grpc_receiver, tmp_path, "3", "init", lambda: by([0, 1]) and by([2]))
    theirs, ours = by([0, 1])[0], by([2])[0]
    for report in (theirs, ours):
        assert report["attributes"][A.STALLED_COLLECTIVE] == "init_process_group", report
        assert f"(in {FRAME}), which has not reached it" in report["body"], report["body"]
    assert (
        "global ranks 2 wait in init_process_group; waiting for global rank 3 (in" in (ours["body"])
    ), ours["body"]
    assert A.STALLED_REMOTE_HOST not in ours["attributes"], ours
    assert (
        "global ranks 0,1 wait in init_process_group; waiting for global rank 3 on "
        in (theirs["body"])
    ), theirs["body"]
    assert theirs["attributes"][A.STALLED_REMOTE_HOST], theirs
