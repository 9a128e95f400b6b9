"""A lost host on a real torchrun job: its open spans reach the backend, the timeline says LOST.

Two agents, c10d, ``--nnodes=1:2``. The second agent (the first one hosts the c10d store, and
its death would end the job for everyone) and its workers are SIGKILLed while the workers of
the round they share wait; the survivor's workers fail on the broken collective, it restarts
and finishes alone.
torch starts workers in sessions of their own, so they are killed by pid, as a lost host's
would die with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from elastic_otel.cli.otlp_json_reader import decode_line
from elastic_otel.names import attributes as A
from tests.support.jobs import ROOT, hosting_the_store, job_env, start_agent
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e


def _children(pid: int) -> list[int]:
    done = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


def test_lost_host_is_shown_lost_with_its_last_heard_time(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    out = tmp_path / "job.jsonl"
    env = job_env(
        grpc_receiver,
        tmp_path,
        ELASTIC_OTEL_OPEN_SPAN_INTERVAL="1",
        OTEL_TRACES_EXPORTER="otlp,elastic_otel_file",
        OTEL_LOGS_EXPORTER="otlp,elastic_otel_file",
        ELASTIC_OTEL_OTLP_JSON_FILE=str(out),
        TRAIN_WAIT_FOR_WORLD="3",  # never reached: the workers idle, then train
        TRAIN_WAIT_SECONDS="8",
    )
    port, run_id = free_port(), f"lost-{uuid.uuid4().hex[:4]}"
    args = ("--nnodes=1:2", "--max-restarts=1", "--rdzv-conf=last_call_timeout=2")
    survivor = start_agent(env, port, run_id, nnodes="1:2", extra_args=args[1:])
    hosting_the_store(survivor, port)
    doomed = start_agent(env, port, run_id, nnodes="1:2", extra_args=args[1:])
    victims: list[int] = []
    try:
        # the doomed node's workers started and its member span has been open long enough
        # to be snapshotted
        grpc_receiver.wait_for_logs(
            2, timeout=60, where=lambda r: r["body"] == "torchelastic.worker.status.START"
        )
        # and both workers are connected to each other (the training script's own span):
        # killed before that, the survivor's worker would wait in init for gloo's 30 min
        grpc_receiver.wait_for_spans(
            2, timeout=60, where=lambda s: s["name"] == "init_process_group"
        )

        def doomed_member_snapshot(record: dict) -> bool:
            if record["attributes"].get(A.PARTIAL_EVENT) != "heartbeat":
                return False
            spans, _ = decode_line(record["body"])
            return any(
                s["name"] == A.SPAN_RDZV_MEMBER
                and s["attributes"].get(A.PROCESS_PID) == doomed.proc.pid
                for s in spans
            )

        grpc_receiver.wait_for_logs(1, timeout=30, where=doomed_member_snapshot)
        victims = [doomed.proc.pid, *_children(doomed.proc.pid)]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        rc, output = survivor.wait(180)
        assert rc == 0, output[-3000:]
    finally:
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        doomed.proc.kill()
        doomed.wait(10)

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "elastic_otel.cli",
            "timeline",
            str(out),
            "--html",
            str(tmp_path / "t.html"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    # The round the lost host was in: round 0, or round 1 when the survivor (slower to be
    # joined on a loaded machine) formed round 0 alone within last_call_timeout.
    rounds = text.split("\nROUND ")[1:]
    (lost,) = [r for r in rounds if "LOST" in r]
    lost_lines = [line for line in lost.splitlines() if "LOST" in line]
    assert any(f"pid {doomed.proc.pid}" in line for line in lost_lines), text
    assert "last heard at +" in lost and "1 node lost" in lost.splitlines()[0]
    assert "job succeeded" in rounds[-1].splitlines()[0] and rounds[-1] != lost, text
    page = (tmp_path / "t.html").read_text()
    assert '"lost":' in page and "never ended its spans" in page
