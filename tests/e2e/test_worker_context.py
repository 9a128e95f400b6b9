"""The rank's ``worker`` span as the training process's current context (issue 43), on a real
torchrun job: one node, two workers running ``tests/scripts/context_spans.py``, which sets up
its own ``TracerProvider`` and starts spans with a plain OpenTelemetry tracer, no ``elastic_otel``
call and no ``context=``. The spans of its main thread are children of their rank's ``worker``
span, in the round's trace; a plain thread's are a trace of their own, and a thread that runs
in a copy of the main thread's context is inside again (docs/trace-model.md, "The worker span as
the current context"). The same in a worker without torchrun: tests/unit/test_worker_context.py.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from tests.support.jobs import SCRIPTS, job_env, start_agent
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "context_spans.py"
SCRIPT_SPANS = ("script.step", "script.inner", "thread.plain", "thread.copied")
RANKS = (0, 1)


@dataclass
class Job:
    workers: dict[int, dict]  # global rank → its worker span
    spans: dict[tuple[int, str], dict]  # (rank, name) → the script's span


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    tmp_path: Path = tmp_path_factory.mktemp("worker-context")
    with OtlpReceiver("grpc") as receiver:
        env = job_env(receiver, tmp_path)
        run_id = f"context-{uuid.uuid4().hex[:6]}"
        agent = start_agent(env, free_port(), run_id, nnodes="1", nproc=2, script=SCRIPT)
        rc, out = agent.wait()
        assert rc == 0, out[-3000:]
        script = receiver.wait_for_spans(
            len(RANKS) * len(SCRIPT_SPANS), timeout=30, where=lambda s: s["name"] in SCRIPT_SPANS
        )
        workers = receiver.wait_for_spans(
            len(RANKS), timeout=30, where=lambda s: s["name"] == A.SPAN_WORKER
        )
    return Job(
        {s["attributes"][A.GLOBAL_RANK]: s for s in workers},
        {(s["attributes"]["rank"], s["name"]): s for s in script},
    )


@pytest.mark.parametrize("rank", RANKS)
def test_spans_of_the_main_thread_are_children_of_the_ranks_worker_span(
    job: Job, rank: int
) -> None:
    worker, step, inner = (
        job.workers[rank],
        job.spans[rank, "script.step"],
        job.spans[rank, "script.inner"],
    )
    assert step["trace_id"] == worker["trace_id"]  # the round's trace
    assert step["parent_span_id"] == worker["span_id"]
    assert (inner["trace_id"], inner["parent_span_id"]) == (step["trace_id"], step["span_id"])
    assert worker["start_ns"] <= step["start_ns"] <= step["end_ns"] <= worker["end_ns"]


def test_each_rank_is_under_its_own_worker_span(job: Job) -> None:
    parents = {job.spans[rank, "script.step"]["parent_span_id"] for rank in RANKS}
    assert parents == {job.workers[rank]["span_id"] for rank in RANKS}
    assert len(parents) == len(RANKS)


@pytest.mark.parametrize("rank", RANKS)
def test_a_plain_thread_starts_empty_and_a_copied_context_carries_the_span(
    job: Job, rank: int
) -> None:
    worker = job.workers[rank]
    plain, copied = job.spans[rank, "thread.plain"], job.spans[rank, "thread.copied"]
    assert plain["parent_span_id"] == "" and plain["trace_id"] != worker["trace_id"]
    assert (copied["trace_id"], copied["parent_span_id"]) == (
        worker["trace_id"],
        worker["span_id"],
    )
