"""Run real torchrun agents on localhost for end-to-end tests, and point bridges at a receiver."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.otlp_receiver import OtlpReceiver, free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"  # the torchrun training scripts the jobs run
TRAIN = ROOT / "examples" / "train.py"
LIGHT = SCRIPTS / "light_worker.py"  # no training, no torch: for tests of what agents export
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))

FAST_EXPORT = {"OTEL_BLRP_SCHEDULE_DELAY": "50", "OTEL_BSP_SCHEDULE_DELAY": "50"}

NCCL_STANDIN = str(Path(__file__).resolve().parent / "nccl_standin")
"""A ``PYTHONPATH`` entry whose ``sitecustomize`` makes a CPU worker's torch keep its Flight
Recorder record where a NCCL job's does (see its docstring)."""


def use_receiver(monkeypatch: pytest.MonkeyPatch, receiver: OtlpReceiver, **extra: str) -> None:
    """This process's bridges export to ``receiver``, batches every 50 ms."""
    _use_export_env(monkeypatch, {**receiver.exporter_env(), **extra})


def use_dead_collector(monkeypatch: pytest.MonkeyPatch, **extra: str) -> None:
    """This process's bridges export to a port nothing listens on, batches every 50 ms."""
    _use_export_env(
        monkeypatch, {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}", **extra}
    )


def _use_export_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for key, value in {**FAST_EXPORT, **env}.items():
        monkeypatch.setenv(key, value)


def seqs(receiver: OtlpReceiver) -> Counter:
    """How often each ``seq`` metadata value arrived as a log record."""
    return Counter(
        r["attributes"]["torchelastic.seq"]
        for r in receiver.logs()
        if "torchelastic.seq" in r["attributes"]
    )


@dataclass
class Agent:
    proc: subprocess.Popen
    started: float

    def wait(self, timeout: float = 120) -> tuple[int, str]:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            try:
                out, _ = self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # its workers (own sessions) hold the pipe open
                out = ""
            raise AssertionError(f"torchrun did not finish in {timeout}s:\n{out[-4000:]}") from None
        return self.proc.returncode, out


def listening(port: int) -> bool:
    """Whether something accepts connections on localhost ``port``."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def hosting_the_store(agent: Agent, port: int, timeout: float = 90) -> None:
    """Return once ``agent``, started first, listens on the rendezvous endpoint ``port``: it
    hosts the round's store (c10d). A fixed sleep is not enough on a loaded machine, where
    torchrun takes seconds to import torch, and the second agent would host it instead."""
    deadline = time.monotonic() + timeout
    while not listening(port):
        if agent.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the first agent does not host the store on {port}")
        time.sleep(0.1)


def outputs_after_stopping(agents: list[Agent], chars: int = 3000) -> str:
    """Stop ``agents`` (:func:`stop_agents`) and return the end of each one's output: what a
    failed wait on a running job adds to its message."""
    stop_agents(agents)
    tails = []
    for i, agent in enumerate(agents):
        try:
            out, _ = agent.proc.communicate(timeout=10)
        except (subprocess.TimeoutExpired, ValueError):  # workers hold the pipe; read already
            out = ""
        tails.append(
            f"--- agent {i} (pid {agent.proc.pid}, rc {agent.proc.returncode}):\n{out[-chars:]}"
        )
    return "\n".join(tails)


def workers_left(log_dirs: list[Path], chars: int = 1500) -> str:
    """What each worker under ``log_dirs`` left for its agent (its collectives file, the end of
    its stacks file) and its threads' kernel state: read before the agents are stopped, so that
    a failed wait on a hung job says whether a worker or only its reports stood still."""
    from elastic_otel.names.environment_variables import (
        WORKER_COLLECTIVES_FILE,
        WORKER_STACKS_FILE,
    )

    said = []
    for directory in sorted(p for d in log_dirs for p in d.glob("*/attempt_*/[0-9]*")):
        collectives = directory / WORKER_COLLECTIVES_FILE
        stacks = directory / WORKER_STACKS_FILE
        text = collectives.read_text()[:chars] if collectives.exists() else "(no file)"
        said.append(f"--- worker {directory}:\n{text}")
        if stacks.exists():
            said.append(f"stacks, last: {stacks.read_text()[-chars:]}")
        try:
            pid = int(json.loads(text)["pid"])
            for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
                name = (task / "comm").read_text().strip()
                state = (task / "stat").read_text().rpartition(")")[2].split()[0]
                said.append(f"  thread {task.name} {name}: {state} {(task / 'wchan').read_text()}")
        except (OSError, ValueError, KeyError):
            pass
    return "\n".join(said)


def stop_agents(agents: list[Agent]) -> None:
    """End agents as an operator does: SIGTERM to those still running, then wait (a minute
    each) and kill the ones that do not end."""
    for agent in agents:
        if agent.proc.poll() is None:
            agent.proc.send_signal(signal.SIGTERM)
    for agent in agents:
        try:
            agent.proc.wait(60)
        except Exception:
            agent.proc.kill()


def job_env(receiver: OtlpReceiver | None, tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment for a job exporting to ``receiver`` (or nowhere), with a unique job id."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ELASTIC_OTEL_", "PET_"))
    }
    env.update(
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        ELASTIC_OTEL_JOB_ID=f"test-{uuid.uuid4().hex[:8]}",
        OTEL_BSP_SCHEDULE_DELAY="200",
        OTEL_BLRP_SCHEDULE_DELAY="200",
        OTEL_METRIC_EXPORT_INTERVAL="1000",
        TRAIN_STEPS="5",
        TRAIN_FAIL_ONCE_DIR=str(tmp_path),
        PYTHONUNBUFFERED="1",
    )
    if receiver is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = (
            "grpc" if receiver.protocol == "grpc" else "http/protobuf"
        )
    env.update(extra)
    return env


def start_agent(
    env: dict[str, str],
    port: int,
    run_id: str,
    nnodes: str = "2",
    nproc: int = 1,
    extra_args: tuple[str, ...] = (),
    handler: str = "otel",
    backend: str = "c10d",
    script: Path = TRAIN,
    rdzv_args: tuple[str, ...] | None = None,
) -> Agent:
    """One torchrun agent; ``rdzv_args`` replace the default endpoint on localhost ``port``."""
    if rdzv_args is None:
        rdzv_args = (f"--rdzv-endpoint=127.0.0.1:{port}",)
    cmd = [
        TORCHRUN,
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        f"--rdzv-backend={backend}",
        *rdzv_args,
        f"--rdzv-id={run_id}",
        "--monitor-interval=0.5",
        "--event-log-handler",
        handler,
        *extra_args,
        str(script),
    ]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(ROOT),
    )
    return Agent(proc, time.monotonic())


def run_job(env: dict[str, str], agents: int = 2, **kw: object) -> list[tuple[int, str]]:
    """Start ``agents`` agents of one job at once and wait for all of them."""
    port = free_port()
    run_id = str(kw.pop("run_id", f"run-{uuid.uuid4().hex[:6]}"))
    started = [start_agent(env, port, run_id, **kw) for _ in range(agents)]  # type: ignore[arg-type]
    return [a.wait() for a in started]


def run_script(source: str, env: dict[str, str]) -> str:
    """Run Python ``source`` in a fresh interpreter; its stdout, asserting it succeeded."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def span_attr(span: dict, key: str) -> object:
    return span["attributes"].get(key)


@dataclass
class ExportedJob:
    """What a finished job exported, as a user reads it: over OTLP and in the timeline."""

    spans: list[dict]
    logs: list[dict]
    metrics: list[dict]
    timeline: str


def run_exported_job(
    tmp_path: Path,
    script: Path,
    extra_args: tuple[str, ...],
    wait: Callable[[OtlpReceiver], object],
    nproc: int = 2,
    **extra: str,
) -> ExportedJob:
    """Run a two-agent job of ``script`` (``nproc`` workers per node) that must succeed,
    exporting to a gRPC receiver and to an OTLP/JSON file; ``wait(receiver)`` returns once what
    the test reads has arrived. The file is then read by ``elastic-otel timeline``."""
    out = tmp_path / "telemetry.jsonl"
    with OtlpReceiver("grpc") as receiver:
        env = job_env(
            receiver,
            tmp_path,
            OTEL_TRACES_EXPORTER="otlp,elastic_otel_file",
            OTEL_LOGS_EXPORTER="otlp,elastic_otel_file",
            ELASTIC_OTEL_OTLP_JSON_FILE=str(out),
            **extra,
        )
        results = run_job(env, nproc=nproc, script=script, extra_args=extra_args)
        assert [rc for rc, _ in results] == [0, 0], [text[-3000:] for _, text in results]
        wait(receiver)
        spans, logs, metrics = receiver.spans(), receiver.logs(), receiver.metrics()
    timeline = subprocess.run(
        [sys.executable, "-m", "elastic_otel.cli", "timeline", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert timeline.returncode == 0, timeline.stderr
    return ExportedJob(spans, logs, metrics, timeline.stdout)
