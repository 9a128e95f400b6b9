"""Stragglers named while the job runs (issues 28, 35): two real torchrun jobs side by side (c10d,
gloo, two workers per node) train tests/scripts/ddp_train.py, a DDP model whose gradient all-reduces
DDP's C++ reducer issues, with no ``elastic_otel`` call. In a two-node job global rank 1 sleeps
0.3 s more than its peers before each ``backward()``: its node reports it as a straggler with a
score below 0.75 and the score gauge says so, while the other node (ranks 2 and 3, equal, both
waiting for rank 1) names nobody. That job's workers run under the NCCL stand-in
(``tests/support/nccl_standin``): torch keeps its record only where a NCCL job's does, and gloo's
functions return an empty one; the record has no device times (gloo's), so this is the arrival
score read from NCCL's record (the device-time score: ``tests/unit/test_stragglers.py``). In a
one-node job the ranks are equal and nobody is named
(one node: the scores compare local ranks, and one node's start-up costs the shared cores
half as much). Arrivals come from torch's Flight Recorder, read by each worker's collectives
thread once per (short) straggler window.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from elastic_otel.model.stragglers import STRAGGLER_EVENT_NAME, WINDOWS
from elastic_otel.names import attributes as A
from elastic_otel.names.environment_variables import WORKER_COLLECTIVES_FILE
from elastic_otel.parsing.collectives import read_collectives
from tests.support.jobs import NCCL_STANDIN, SCRIPTS, Agent, job_env, start_agent, stop_agents
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "ddp_train.py"
WINDOW_S = 2.0


def _job(
    receiver: OtlpReceiver, tmp_path: Path, name: str, nodes: int, **extra: str
) -> list[Agent]:
    env = job_env(receiver, tmp_path, STEP_SECONDS="0.05", STEPS="2000", **extra)
    env["ELASTIC_OTEL_STRAGGLER_WINDOW"] = str(WINDOW_S)
    port, run_id = free_port(), f"{name}-{uuid.uuid4().hex[:6]}"
    return [
        start_agent(
            env,
            port,
            run_id,
            nnodes=str(nodes),
            nproc=2,
            script=SCRIPT,
            extra_args=(f"--log-dir={tmp_path / 'logs' / str(node)}",),
        )
        for node in range(nodes)
    ]


def _stragglers(receiver: OtlpReceiver) -> list[dict]:
    return [r for r in receiver.logs() if r["event_name"] == STRAGGLER_EVENT_NAME]


def _scores(receiver: OtlpReceiver) -> list[dict]:
    return [m for m in receiver.metrics() if m["name"] == A.METRIC_STRAGGLER_SCORE]


def test_a_slow_rank_is_named_and_equal_ranks_are_not(
    grpc_receiver: OtlpReceiver, http_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    slow = _job(
        grpc_receiver,
        tmp_path / "slow",
        "slow",
        2,
        SLOW_RANK="1",
        SLOW_SECONDS="0.3",
        PYTHONPATH=NCCL_STANDIN,
    )
    equal = _job(http_receiver, tmp_path / "equal", "equal", 1)
    try:
        (record,) = grpc_receiver.wait_for_logs(
            1, timeout=90, where=lambda r: r["event_name"] == STRAGGLER_EVENT_NAME
        )[:1]
        attrs = record["attributes"]
        assert record["severity_text"] == "WARN"
        assert attrs[A.STRAGGLER_RANK] == 1, attrs
        assert attrs[A.STRAGGLER_SCORE] < 0.75, attrs
        assert attrs[A.STRAGGLER_WAITING] == [0]
        assert attrs[A.STRAGGLER_PROCESS_GROUP] == "0"
        assert attrs[A.STRAGGLER_BASIS] == "issued"  # the stand-in's record has no device times
        assert attrs[A.STRAGGLER_WINDOWS] == WINDOWS
        assert 0.2 < attrs[A.STRAGGLER_LATENESS] < 0.6, attrs
        assert attrs[A.STRAGGLER_WAITED_SHARE] > 0.25, attrs
        assert record["body"].startswith("global rank 1 is a straggler: score "), record["body"]
        assert "global ranks 0 spend" in record["body"]
        # read from NCCL's record: the stand-in left gloo's empty
        files = list((tmp_path / "slow" / "logs").rglob(WORKER_COLLECTIVES_FILE))
        readings = [read_collectives(str(f.parent)) for f in files]
        assert len(readings) == 4, files
        # (gloo's lists the default group issued nothing, as placed before torch's status has it)
        groups = [g for r in readings if r is not None for g in r.groups]
        assert {g.backend for g in groups if g.issued} == {"nccl"}
        # only the node that runs rank 1 sees it: ranks 2 and 3 arrive together
        assert {r["attributes"][A.STRAGGLER_RANK] for r in _stragglers(grpc_receiver)} == {1}

        low = grpc_receiver.wait_until(
            lambda: [
                m
                for m in _scores(grpc_receiver)
                if m["attributes"].get(A.GLOBAL_RANK) == 1 and m["value"] < 0.75
            ],
            15,
        )
        assert low[0]["unit"] == "1"
        assert any(
            m["name"] == A.METRIC_STRAGGLER_LATENESS and m["attributes"].get(A.GLOBAL_RANK) == 1
            for m in grpc_receiver.metrics()
        )

        # The equal job: scored for more windows than a report needs, and nobody named.
        def scored_long_enough() -> bool:
            times = [m["time_ns"] for m in _scores(http_receiver)]
            return bool(times) and max(times) - min(times) >= WINDOWS * WINDOW_S * 1e9

        http_receiver.wait_until(scored_long_enough, 60)
        assert {m["attributes"].get(A.GLOBAL_RANK) for m in _scores(http_receiver)} == {0, 1}
        assert _stragglers(http_receiver) == [], _stragglers(http_receiver)
    finally:
        stop_agents(slow + equal)
