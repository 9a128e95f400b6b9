"""The node that went quiet (issue 42): a held GPU named by every node, and again at every interval.

Two nodes x two DDP ranks under the NCCL stand-in (``tests/support/nccl_standin``), nothing set:
rank 3's GPU is held before an all-reduce its three peers' GPUs started. Once, in 1 run of 3, the
node without the held rank reported once and then said nothing for 45 s while the other node kept
naming rank 3 (a GPU's start of a collective counted as progress and restarted its clock). Here
each node must name rank 3 within ``ELASTIC_OTEL_STALL_AFTER`` plus one report interval of its
ranks starting to wait, and report again at each interval while the stall lasts.

``ELASTIC_OTEL_QUIET_NODE_RUNS`` repeats the job (CI: once; the soak in ``BENCHMARKS.md``: 20),
``ELASTIC_OTEL_QUIET_NODE_STALL_AFTER`` sets the stall bound (CI: 4 s; the issue's: 15 s) and
``ELASTIC_OTEL_QUIET_NODE_FIGURES=<file>`` appends each run's figures to the file
(``benchmarks/recorded/quiet-node-<date>.txt``).
"""

from __future__ import annotations

import os
import uuid
from itertools import pairwise
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import NCCL_TIMING_EVENT
from elastic_otel.parsing.collectives import poll_period
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

RUNS = int(os.environ.get("ELASTIC_OTEL_QUIET_NODE_RUNS", "1"))
STALL_AFTER_S = float(os.environ.get("ELASTIC_OTEL_QUIET_NODE_STALL_AFTER", "4"))
FIGURES = os.environ.get("ELASTIC_OTEL_QUIET_NODE_FIGURES")  # read before fixtures clear it
POLL_S = poll_period(STALL_AFTER_S)
REPORTS = 3  # the first naming report and two at the interval after it
NODES = {"node 0": [0, 1], "node 1": [2]}  # each node by the local ranks that wait
S = 1e9


def _reports(receiver: OtlpReceiver, waiting: list[int]) -> list[dict]:
    found = [
        r
        for r in receiver.logs()
        if r["event_name"] == "torchelastic.stalled"
        and r["attributes"].get(A.STALLED_IN) == "training"
        and r["attributes"].get(A.STALLED_WAITING) == waiting
    ]
    return sorted(found, key=lambda r: r["time_ns"])


def _named(reports: list[dict]) -> list[dict]:
    """The reports from the first one naming rank 3 on."""
    for i, report in enumerate(reports):
        if report["attributes"].get(A.STALLED_RANKS) == [3]:
            return reports[i:]
    return []


@pytest.mark.parametrize("run", range(RUNS))
def test_every_node_names_the_held_gpu_and_keeps_naming_it(
    grpc_receiver: OtlpReceiver, tmp_path: Path, run: int
) -> None:
    env = job_env(
        grpc_receiver,
        tmp_path,
        PYTHONPATH=NCCL_STANDIN,
        ELASTIC_OTEL_STALL_AFTER=str(STALL_AFTER_S),
        GPU_HOLD_RANK="3",
        GPU_HOLD_AFTER_S="12",  # after the first step: past the timing decision (5 s of rate)
        STEP_SECONDS="0.02",
    )
    port, run_id = free_port(), f"quiet-{run}-{uuid.uuid4().hex[:6]}"
    script = SCRIPTS / "ddp_train.py"
    agents = [start_agent(env, port, run_id, nproc=2, script=script) for _ in range(2)]

    def every_node_named_it_enough() -> bool:
        return all(len(_named(_reports(grpc_receiver, w))) >= REPORTS for w in NODES.values())

    try:
        grpc_receiver.wait_until(every_node_named_it_enough, 120 + REPORTS * STALL_AFTER_S * 2)
    except TimeoutError as timeout:
        said = {
            node: [
                (r["attributes"].get(A.STALLED_SECONDS), r["body"][:160])
                for r in _reports(grpc_receiver, waiting)
            ]
            for node, waiting in NODES.items()
        }
        said["timing"] = [
            r["body"] for r in grpc_receiver.logs() if r["event_name"] == NCCL_TIMING_EVENT
        ]
        raise AssertionError(f"{timeout}\n{said}\n{outputs_after_stopping(agents)}") from None
    finally:
        stop_agents(agents)

    # The bound: STALL_AFTER and one interval (the report interval is STALL_AFTER itself).
    # The gaps: the interval and a poll on each side, and a second for a loaded machine.
    gap_bound = STALL_AFTER_S + 2 * POLL_S + 1.0
    figures = []
    for node, waiting in NODES.items():
        reports = _reports(grpc_receiver, waiting)
        named = _named(reports)
        first = named[0]["attributes"]
        assert first[A.STALLED_SECONDS] <= 2 * STALL_AFTER_S, (node, first)
        assert first[A.STALLED_NOT_REACHED] == [3], (node, first)
        assert all(r["attributes"].get(A.STALLED_RANKS) == [3] for r in named), (node, named)
        times = [r["time_ns"] / S for r in reports]
        gaps = [later - earlier for earlier, later in pairwise(times)]
        assert max(gaps) <= gap_bound, (node, gaps)
        figures.append(
            f"{node} named rank 3 {first[A.STALLED_SECONDS]:.1f} s into the stall"
            f" (report {len(reports) - len(named) + 1}), {len(reports)} reports,"
            f" {min(gaps):.1f} to {max(gaps):.1f} s apart"
        )
    _record(run, figures)


def _record(run: int, figures: list[str]) -> None:
    if not FIGURES:
        return
    with open(FIGURES, "a") as out:
        if out.tell() == 0:
            out.write(
                f"# ELASTIC_OTEL_QUIET_NODE_RUNS={RUNS} ELASTIC_OTEL_QUIET_NODE_STALL_AFTER="
                f"{STALL_AFTER_S:g} (a poll every {POLL_S:g} s), 2 nodes x 2 DDP ranks, the NCCL"
                f" stand-in, rank 3's GPU held; load average {os.getloadavg()[0]:.1f} at run 1\n"
            )
        out.write(f"run {run + 1}: {'; '.join(figures)}\n")
