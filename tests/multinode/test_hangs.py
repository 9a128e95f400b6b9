"""Hangs named while they hang (issue 20), on real two-node torchrun jobs (c10d, gloo, two
workers per node): global rank 1 stops before an ``all_reduce`` while ranks 0, 2 and 3 wait
inside it. Within ``ELASTIC_OTEL_STALL_AFTER`` plus one interval, rank 1's node reports a
training stall that names rank 1, with rank 1's stack (the sleeping frame, its source line under
it) and the waiting ranks' stacks (in ``all_reduce``). The script (tests/scripts/hanging_train.py)
marks its steps; a script with no ``elastic_otel`` call hangs in
tests/multinode/test_hangs_ddp.py. A slow one-node job of the same script is no stall.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from tests.support.jobs import SCRIPTS, job_env, start_agent, stop_agents
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "hanging_train.py"
HANG_LINE = next(
    n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# HANG LINE" in line
)
HANG_SOURCE = SCRIPT.read_text().splitlines()[HANG_LINE - 1].strip()  # time.sleep(...)
STALL_AFTER_S = 3.0
INTERVAL_S = min(max(STALL_AFTER_S / 4, 0.5), 5.0)  # the training watch's poll period
STALLED = "torchelastic.stalled"


def _is_training_stall(record: dict) -> bool:
    attrs = record["attributes"]
    return record["event_name"] == STALLED and attrs.get(A.STALLED_IN) == "training"


def _stacks(receiver: OtlpReceiver, rank: int, reason: str) -> list[dict]:
    return [
        r
        for r in receiver.logs()
        if r["attributes"].get(A.STACKS_REASON) == reason
        and r["attributes"].get(A.GLOBAL_RANK) == rank
    ]


def _run_hung_job(receiver: OtlpReceiver, tmp_path: Path, **extra: str) -> list[dict]:
    """Start the hung job, wait for its stall report and stacks, end it (SIGTERM, as an
    operator or a scheduler does); the worker spans."""
    env = job_env(receiver, tmp_path, HANG_RANK="1", **extra)
    env["ELASTIC_OTEL_STALL_AFTER"] = str(STALL_AFTER_S)
    port, run_id = free_port(), f"hang-{uuid.uuid4().hex[:6]}"
    agents = [start_agent(env, port, run_id, nproc=2, script=SCRIPT) for _ in range(2)]
    try:
        (stall,) = receiver.wait_for_logs(
            1,
            timeout=90,
            # the ranks as an int array, as a query can use them; node 0's report (node 1's
            # names rank 1 too, from the round's store, and may come first)
            where=lambda r: (
                _is_training_stall(r)
                and r["attributes"].get(A.STALLED_RANKS) == [1]
                and A.STALLED_REMOTE_HOST not in r["attributes"]
            ),
        )[:1]
        attrs = stall["attributes"]
        assert attrs[A.STALLED_SECONDS] <= STALL_AFTER_S + INTERVAL_S + 3.0, attrs
        assert attrs[A.STALLED_COLLECTIVE] == "all_reduce"
        assert attrs[A.STALLED_WAITING] == [0]  # rank 1's neighbour on its node
        assert attrs[A.STACK_FRAME] == f"hang at hanging_train.py:{HANG_LINE}"
        assert "waiting for global rank 1 (in hang at hanging_train.py" in stall["body"]
        assert stall["severity_text"] == "WARN"

        # rank 1's stack shows where it is stuck; a waiting rank's, the collective (on a loaded
        # machine a slow start can be reported first, with rank 1 still in a collective)
        hung = f'hanging_train.py", line {HANG_LINE} in hang\n'
        (sleeper,) = receiver.wait_until(
            lambda: [r for r in _stacks(receiver, 1, "training") if hung in r["body"]], 20
        )[:1]
        # the frame, and under it its line of source, as a traceback shows it
        body = sleeper["body"]
        assert f'hanging_train.py", line {HANG_LINE} in hang\n    {HANG_SOURCE}\n' in body, body
        assert sleeper["attributes"][A.STACK_FRAME] == f"hang at hanging_train.py:{HANG_LINE}"
        waiter = receiver.wait_until(lambda: _stacks(receiver, 0, "training"), 20)[0]
        assert "in all_reduce" in waiter["body"], waiter["body"]
        # the other node reports its own ranks waiting in the same collective
        receiver.wait_until(
            lambda: [
                r
                for r in receiver.logs()
                if _is_training_stall(r)
                and r["attributes"].get(A.STALLED_WAITING) == [2, 3]
                # the rank waited for is not here: unnamed, or named by the node that has it
                and (
                    A.STALLED_RANKS not in r["attributes"]
                    or A.STALLED_REMOTE_HOST in r["attributes"]
                )
            ],
            20,
        )
        assert all(
            w["span_id"] and w["trace_id"] for w in (sleeper, waiter)
        )  # on the workers' spans
    finally:
        stop_agents(agents)
    receiver.wait_for_spans(4, timeout=30, where=lambda s: s["name"] == A.SPAN_WORKER)
    return [s for s in receiver.spans() if s["name"] == A.SPAN_WORKER]


def test_a_hang_names_the_rank_the_others_wait_for(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    workers = _run_hung_job(grpc_receiver, tmp_path, MARK_STEP="1")
    # ended by the operator's signal: the victims' last stacks are kept, and nobody is ERROR
    assert {w["attributes"][A.GLOBAL_RANK] for w in workers} == {0, 1, 2, 3}
    assert all(w["status_code"] != "ERROR" for w in workers), [w["attributes"] for w in workers]
    assert _stacks(grpc_receiver, 0, "before_stop") or _stacks(grpc_receiver, 2, "before_stop")


def test_a_slow_job_is_not_a_stall(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    """One node: a stall report is each node's own reading of its ranks (a second node would
    only wait on the same steps)."""
    # steps of 1.5 s, 7.5 s in all, then 4 s more after destroy_process_group (left training)
    env = job_env(
        grpc_receiver, tmp_path, STEP_SECONDS="1.5", STEPS="5", MARK_STEP="1", EXIT_SECONDS="4"
    )
    env["ELASTIC_OTEL_STALL_AFTER"] = str(STALL_AFTER_S)
    agent = start_agent(
        env, free_port(), f"slow-{uuid.uuid4().hex[:6]}", nnodes="1", nproc=2, script=SCRIPT
    )
    rc, out = agent.wait(120)
    assert rc == 0, out[-2000:]
    grpc_receiver.wait_for_spans(2, timeout=30, where=lambda s: s["name"] == A.SPAN_WORKER)
    stalls = [r for r in grpc_receiver.logs() if _is_training_stall(r)]
    assert not stalls, [(r["body"], r["attributes"]) for r in stalls]
