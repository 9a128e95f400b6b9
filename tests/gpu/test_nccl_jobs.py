"""The bridge on a GPU, over NCCL (issue 35): a DDP job under torchrun on this machine's GPU
(tests/scripts/gpu_ddp_train.py), one rank, since NCCL refuses two ranks on one device; what
needs several ranks is tested on the CPU with the stand-in (tests/e2e/test_hangs_ddp.py). Skipped
where torch has no CUDA device. What the bridge costs a GPU step is a benchmark
(``benchmarks/gpu_step.py``), not a timed assertion here.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from tests.support.jobs import SCRIPTS, job_env, start_agent, stop_agents
from tests.support.otlp_receiver import OtlpReceiver, free_port

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]

SCRIPT = SCRIPTS / "gpu_ddp_train.py"
HOLD_LINE = next(
    n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# GPU HOLD LINE" in line
)
STALL_AFTER_S = 10.0
INTERVAL_S = min(max(STALL_AFTER_S / 4, 0.5), 5.0)


def _one_rank_job(receiver: OtlpReceiver, tmp_path: Path, **extra: str):  # type: ignore[no-untyped-def]
    env = job_env(receiver, tmp_path, **extra)
    env["ELASTIC_OTEL_STALL_AFTER"] = str(STALL_AFTER_S)
    # The device machines run torch 2.11, outside TESTED_TORCH: the wrappers on, as a user would.
    env["ELASTIC_OTEL_AGENT_INSTRUMENTATION"] = "true"
    run_id = f"gpu-{uuid.uuid4().hex[:6]}"
    return start_agent(env, free_port(), run_id, nnodes="1", nproc=1, script=SCRIPT)


@pytest.mark.parametrize("timing", ["true", "false"])
def test_a_rank_behind_its_own_gpu_is_named_with_the_collectives_state(
    grpc_receiver: OtlpReceiver, tmp_path: Path, timing: str
) -> None:
    """The GPU held busy before DDP's all-reduce: with timing events the all-reduce is
    ``scheduled`` (the GPU has not reached it) and the rank is named as its own hold-up; without
    them the report says the all-reduce is enqueued and claims no state."""
    agent = _one_rank_job(
        grpc_receiver, tmp_path, GPU_HANG_STEP="20", ELASTIC_OTEL_NCCL_TIMING=timing
    )
    try:
        records = grpc_receiver.wait_for_logs(
            1,
            timeout=STALL_AFTER_S + 120,
            where=lambda r: (
                r["event_name"] == "torchelastic.stalled"
                and r["attributes"].get(A.STALLED_IN) == "training"
            ),
        )
        attrs, body = records[0]["attributes"], records[0]["body"]
        print(body)  # what an operator reads; quoted in docs/hangs.md from a GPU run (-rA)
        assert attrs[A.STALLED_SECONDS] <= STALL_AFTER_S + INTERVAL_S + 3.0, attrs
        assert "no rank is in a collective" not in body, body
        assert attrs[A.STALLED_BACKEND] == "nccl", attrs
        assert attrs[A.STALLED_COLLECTIVE] == "all_reduce", attrs
        if timing == "true":
            assert attrs[A.STALLED_STATE_KNOWN] is True
            assert attrs[A.STALLED_NOT_REACHED] == [0] and attrs[A.STALLED_RANKS] == [0]
            assert "whose GPU has not reached all_reduce #" in body, body
            assert "(nccl) (scheduled" in body, body
        else:
            assert attrs[A.STALLED_STATE_KNOWN] is False
            assert "enqueued, not completed" in body, body
    finally:
        stop_agents([agent])


def test_a_cuda_out_of_memory_error_is_the_root_cause(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    agent = _one_rank_job(grpc_receiver, tmp_path, GPU_OOM_STEP="5", STEPS="50")
    code, output = agent.wait()
    assert code != 0, output[-3000:]
    spans = grpc_receiver.wait_for_spans(
        1, timeout=60, where=lambda s: s["name"] == A.SPAN_WORKER and s["status_code"] == "ERROR"
    )
    worker = spans[0]
    print(worker["status_message"])
    assert worker["attributes"][A.FAILURE_KIND] == A.KIND_ROOT_CAUSE
    assert "OutOfMemoryError" in str(worker["attributes"].get(A.ERROR_TYPE)), worker
    assert "out of memory" in worker["status_message"].lower(), worker["status_message"]
