"""Training frameworks under torchrun with the bridge (issue 43), each a real one-node job of two
workers exporting to a real OTLP receiver:

- ``torchtel`` instrumenting a small DDP model (tests/scripts/torchtel_train.py): its spans
  (``train``, ``Tiny.forward``, ``autograd.backward``, ``SGD.step``, ``dataloader.next``) are in
  the rank's ``worker`` span, with no change to the script (docs/trace-model.md, "The worker
  span as the current context");
- Lightning's ``Trainer`` with ``elastic_otel.frameworks.lightning.GoodputCallback`` and
  accelerate's ``Accelerator`` with ``elastic_otel.frameworks.accelerate.mark_goodput``
  (tests/scripts/lightning_train.py, accelerate_train.py): the goodput summary counts the steps
  and checkpoints their own hooks marked (docs/goodput.md, "From the frameworks' own hooks").

Collected only with ``ELASTIC_OTEL_LAUNCHER_TESTS=1``: each worker imports torch and a
framework (~5 CPU-seconds), too much for the main suite's budget. Needs the ``frameworks``
extra (``pip install torch==2.13.0 -e '.[torch,test,frameworks]'``).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

if os.environ.get("ELASTIC_OTEL_LAUNCHER_TESTS") != "1":
    pytest.skip("ELASTIC_OTEL_LAUNCHER_TESTS=1 runs the launcher tests", allow_module_level=True)

from elastic_otel.names import attributes as A
from tests.support.jobs import SCRIPTS, job_env, start_agent
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

RANKS = (0, 1)
STEPS, CHECKPOINT_EVERY = 20, 5
TORCHTEL_SPANS = ("Tiny.forward", "autograd.backward", "SGD.step", "dataloader.next")


def _run(receiver: OtlpReceiver, tmp_path: Path, script: str, **extra: str) -> None:
    """One agent, two workers of ``script``, to its end (it must succeed)."""
    env = job_env(receiver, tmp_path, **extra)
    run_id = f"{Path(script).stem}-{uuid.uuid4().hex[:6]}"
    agent = start_agent(
        env, free_port(), run_id, nnodes="1", nproc=len(RANKS), script=SCRIPTS / script
    )
    rc, out = agent.wait(timeout=240)
    assert rc == 0, out[-4000:]


# --- torchtel's spans in the worker spans ---------------------------------------------------------


@pytest.fixture(scope="module")
def torchtel_spans(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    pytest.importorskip("torchtel", reason="the frameworks extra is not installed")
    # torchtel's set-up exports over OTLP/HTTP only: the bridge does too, to the same receiver.
    with OtlpReceiver("http") as receiver:
        _run(receiver, tmp_path_factory.mktemp("torchtel"), "torchtel_train.py")
        receiver.wait_for_spans(len(RANKS), timeout=30, where=lambda s: s["name"] == A.SPAN_WORKER)
        receiver.wait_for_spans(len(RANKS), timeout=30, where=lambda s: s["name"] == "train")
        return receiver.spans()


@pytest.mark.parametrize("rank", RANKS)
def test_torchtel_spans_are_in_the_ranks_worker_span(torchtel_spans: list[dict], rank: int) -> None:
    [worker] = [
        s
        for s in torchtel_spans
        if s["name"] == A.SPAN_WORKER and s["attributes"][A.GLOBAL_RANK] == rank
    ]
    mine = [s for s in torchtel_spans if s["resource"].get("global_rank") == rank]
    [train] = [s for s in mine if s["name"] == "train"]
    assert (train["trace_id"], train["parent_span_id"]) == (worker["trace_id"], worker["span_id"])
    names = {s["name"] for s in mine}
    assert set(TORCHTEL_SPANS) <= names, names
    assert {s["trace_id"] for s in mine} == {worker["trace_id"]}  # all in the round's trace
    by_id = {s["span_id"]: s for s in mine}
    for span in mine:
        ancestor = span
        while ancestor["parent_span_id"] in by_id:
            ancestor = by_id[ancestor["parent_span_id"]]
        assert ancestor is train, span["name"]  # every one under torchtel's train span


# --- goodput marks from Lightning's and accelerate's hooks ----------------------------------------


def _goodput_summary(tmp_path: Path, script: str, **extra: str) -> dict:
    with OtlpReceiver("grpc") as receiver:
        _run(
            receiver,
            tmp_path,
            script,
            STEPS=str(STEPS),
            CHECKPOINT_EVERY=str(CHECKPOINT_EVERY),
            CKPT_DIR=str(tmp_path / "ckpt"),
            **extra,
        )
        [summary] = receiver.wait_for_logs(
            1, timeout=30, where=lambda r: r["event_name"] == A.GOODPUT_EVENT_NAME
        )
        return summary["attributes"]


@pytest.fixture(scope="module")
def lightning_goodput(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("lightning", reason="the frameworks extra is not installed")
    return _goodput_summary(tmp_path_factory.mktemp("lightning"), "lightning_train.py")


@pytest.fixture(scope="module")
def accelerate_goodput(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("accelerate", reason="the frameworks extra is not installed")
    return _goodput_summary(
        tmp_path_factory.mktemp("accelerate"), "accelerate_train.py", ACCUMULATE="2"
    )


@pytest.mark.parametrize("framework", ["lightning_goodput", "accelerate_goodput"])
def test_the_goodput_summary_counts_the_frameworks_steps_and_checkpoints(
    request: pytest.FixtureRequest, framework: str
) -> None:
    summary = request.getfixturevalue(framework)
    assert summary[A.GOODPUT_FINAL] is True
    assert (summary[A.GOODPUT_FIRST_STEP], summary[A.GOODPUT_LAST_STEP]) == (0, STEPS - 1)
    assert summary[A.GOODPUT_CHECKPOINT_STEP] == STEPS - 1  # the save after the last step
    assert summary[A.GOODPUT_SAVES] == STEPS // CHECKPOINT_EVERY, summary
    assert summary[A.BADPUT_CHECKPOINT_SECONDS] > 0  # the saves' blocking time was measured
    assert 0 < summary[A.GOODPUT_RATIO] < 1
