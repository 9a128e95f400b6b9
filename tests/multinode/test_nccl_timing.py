"""NCCL timing by default (issue 41): a GPU held busy is named, from every node, with nothing set.

Real torchrun jobs of DDP (``tests/scripts/ddp_train.py``, its all-reduces from DDP's C++
reducer) whose torch answers as a CUDA build in a NCCL job does (``tests/support/nccl_standin``:
torch's real record behind NCCL's dump functions, with NCCL's states with and without timing
events, ``torch.cuda._sleep`` holding the rank). One rank holds its GPU before ``backward()``
once the workers decided on timing, as the GPU test's script does on a device.

- With nothing set (``ELASTIC_OTEL_NCCL_TIMING=auto``), each worker measures its collective rate
  and, this job's being far within the budget, turns timing on at run time: each worker's span
  says so, and both nodes name the held rank as the one "whose GPU has not reached" the
  all-reduce its peers are inside.
- With timing off and every member of the group on one node, the report says that none of the
  node's GPUs finished it and that the record cannot tell which one stopped: never "other
  nodes".
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import NCCL_TIMING_EVENT
from tests.support.jobs import (
    NCCL_STANDIN,
    SCRIPTS,
    job_env,
    outputs_after_stopping,
    start_agent,
    stop_agents,
)
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "ddp_train.py"
HOLD_LINE = next(
    n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# GPU HOLD LINE" in line
)
STALL_AFTER_S = 3.0
HOLD_AFTER_S = 15.0  # well after the workers decided: 5 s of rate from their first collective


def _reports(receiver: OtlpReceiver) -> list[dict]:
    return [
        r
        for r in receiver.logs()
        if r["event_name"] == "torchelastic.stalled"
        and r["attributes"].get(A.STALLED_IN) == "training"
    ]


def _decisions(receiver: OtlpReceiver) -> list[dict]:
    return [r for r in receiver.logs() if r["event_name"] == NCCL_TIMING_EVENT]


def _job(receiver: OtlpReceiver, tmp_path: Path, nodes: int, **extra: str) -> list:
    settings = {
        "PYTHONPATH": NCCL_STANDIN,
        "ELASTIC_OTEL_STALL_AFTER": str(STALL_AFTER_S),
        "GPU_HOLD_AFTER_S": str(HOLD_AFTER_S),
        "STEP_SECONDS": "0.02",
        **extra,
    }
    env = job_env(receiver, tmp_path, **settings)
    port, run_id = free_port(), f"timing-{uuid.uuid4().hex[:6]}"
    return [
        start_agent(env, port, run_id, nnodes=str(nodes), nproc=2, script=SCRIPT)
        for _ in range(nodes)
    ]


def test_a_held_gpu_is_named_by_every_node_with_nothing_set(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    agents = _job(grpc_receiver, tmp_path, nodes=2, GPU_HOLD_RANK="3")

    def named(waiting: list[int]) -> list[dict]:
        return [
            r
            for r in _reports(grpc_receiver)
            if r["attributes"].get(A.STALLED_WAITING) == waiting
            and r["attributes"].get(A.STALLED_RANKS) == [3]
            and r["attributes"].get(A.STALLED_NOT_REACHED) == [3]
        ]

    try:
        grpc_receiver.wait_until(lambda: named([2]) and named([0, 1]), 150)
    except TimeoutError as timeout:
        said = [r["body"] for r in _reports(grpc_receiver) + _decisions(grpc_receiver)]
        raise AssertionError(f"{timeout}\n{said}\n{outputs_after_stopping(agents)}") from None
    finally:
        stop_agents(agents)
    ours, theirs = named([2])[0], named([0, 1])[0]
    number = ours["attributes"][A.STALLED_COLLECTIVE_NUMBER]
    assert theirs["attributes"][A.STALLED_COLLECTIVE_NUMBER] == number
    frame = "hold at sitecustomize.py"
    for report in (ours, theirs):
        attrs, body = report["attributes"], report["body"]
        assert attrs[A.STALLED_BACKEND] == "nccl" and attrs[A.STALLED_STATE_KNOWN] is True, attrs
        assert attrs[A.NCCL_TIMING] == "on", attrs
        assert attrs[A.NCCL_TIMING_REASON] == "within_budget", attrs
        assert attrs[A.NCCL_TIMING_COST] <= attrs[A.NCCL_TIMING_BUDGET], attrs
        assert "other nodes" not in body, body
        assert "whose GPU has not reached" in body, body
        assert frame in str(attrs.get(A.STACK_FRAME)), attrs
    assert f"global ranks 2 wait in all_reduce #{number} of process group 0 (nccl)" in ours["body"]
    assert "waiting for global rank 3 (in hold at " in ours["body"], ours["body"]
    assert "global ranks 0,1 wait in all_reduce" in theirs["body"], theirs["body"]
    assert theirs["attributes"][A.STALLED_REMOTE_HOST], theirs
    assert not theirs["attributes"].get(A.STALLED_LOCAL_GROUP), theirs

    # Each worker's decision, on its own worker span, said once.
    decisions = _decisions(grpc_receiver)
    assert sorted(r["attributes"][A.GLOBAL_RANK] for r in decisions) == [0, 1, 2, 3], decisions
    for decision in decisions:
        attrs = decision["attributes"]
        assert (attrs[A.NCCL_TIMING], attrs[A.NCCL_TIMING_REASON]) == ("on", "within_budget")
        assert attrs[A.NCCL_TIMING_RATE] > 0 and decision["span_id"], decision
        assert decision["body"].startswith("NCCL timing on: "), decision["body"]
        assert "collectives/s x 9.0 µs" in decision["body"], decision["body"]
    spans = {s["span_id"]: s for s in grpc_receiver.spans() if s["name"] == A.SPAN_WORKER}
    for decision in decisions:
        span = spans.get(decision["span_id"])
        assert (
            span is not None
            and span["attributes"][A.GLOBAL_RANK] == (decision["attributes"][A.GLOBAL_RANK])
        )


def test_without_timing_a_one_node_report_never_points_at_other_nodes(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    agents = _job(
        grpc_receiver,
        tmp_path,
        nodes=1,
        GPU_HOLD_RANK="1",
        ELASTIC_OTEL_NCCL_TIMING="false",
        GPU_HOLD_AFTER_S="2",
    )
    try:
        found = grpc_receiver.wait_until(
            lambda: [
                r for r in _reports(grpc_receiver) if r["attributes"].get(A.STALLED_COLLECTIVE)
            ],
            120,
        )
    except TimeoutError as timeout:
        raise AssertionError(f"{timeout}\n{outputs_after_stopping(agents)}") from None
    finally:
        stop_agents(agents)
    for report in _reports(grpc_receiver):
        assert "other nodes" not in report["body"], report["body"]
    attrs, body = found[0]["attributes"], found[0]["body"]
    assert attrs[A.STALLED_LOCAL_GROUP] is True and attrs[A.STALLED_STATE_KNOWN] is False, attrs
    assert attrs[A.STALLED_WAITING] == [0, 1] and A.STALLED_RANKS not in attrs, attrs
    assert (attrs[A.NCCL_TIMING], attrs[A.NCCL_TIMING_REASON]) == ("off", "forced"), attrs
    assert "global ranks 0,1 have all_reduce #" in body, body
    assert (
        "; every member of the group is on this node and none of their GPUs has finished it:"
        " without NCCL timing the record cannot tell which GPU stopped"
    ) in body, body
    assert body.endswith("(NCCL timing off: ELASTIC_OTEL_NCCL_TIMING=false)"), body
    decisions = _decisions(grpc_receiver)
    assert sorted(r["attributes"][A.GLOBAL_RANK] for r in decisions) == [0, 1], decisions
    assert {r["body"] for r in decisions} == {"NCCL timing off: ELASTIC_OTEL_NCCL_TIMING=false"}
