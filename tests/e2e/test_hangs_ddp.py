"""Hangs named for the training users run (issue 28): DDP, whose gradient all-reduces come from
its C++ reducer, and functional collectives, neither of which passes through the Python
collectives. Real two-node torchrun jobs (c10d, gloo, two workers per node), a training
script with no ``elastic_otel`` call (tests/scripts/ddp_train.py): global rank 1 stops before its
``backward()`` at step 5 while ranks 0, 2 and 3 wait inside theirs. The collective, its
process group and sequence number come from torch's Flight Recorder, read by each worker's
collectives thread; its dumps are left where ``torchfrtrace`` reads them.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import read_collectives
from tests.support.jobs import SCRIPTS, job_env, start_agent, stop_agents
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "ddp_train.py"
HANG_LINE = next(
    n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# HANG LINE" in line
)
STALL_AFTER_S = 3.0
INTERVAL_S = min(max(STALL_AFTER_S / 4, 0.5), 5.0)  # the training watch's poll period
STALLED = "torchelastic.stalled"


def _training_stalls(receiver: OtlpReceiver) -> list[dict]:
    return [
        r
        for r in receiver.logs()
        if r["event_name"] == STALLED and r["attributes"].get(A.STALLED_IN) == "training"
    ]


def _stacks(receiver: OtlpReceiver, rank: int, reason: str) -> list[dict]:
    return [
        r
        for r in receiver.logs()
        if r["attributes"].get(A.STACKS_REASON) == reason
        and r["attributes"].get(A.GLOBAL_RANK) == rank
    ]


def _hang(receiver: OtlpReceiver, tmp_path: Path, waits_in: str, **extra: str) -> list[dict]:
    """Run the hung job until both nodes reported, end it as an operator would (SIGTERM);
    the worker spans. ``waits_in``: a frame of a waiting rank's stack."""
    env = job_env(receiver, tmp_path, HANG_RANK="1", **extra)
    env["ELASTIC_OTEL_STALL_AFTER"] = str(STALL_AFTER_S)
    port, run_id = free_port(), f"ddp-{uuid.uuid4().hex[:6]}"
    logs = [tmp_path / f"node{n}" for n in range(2)]
    agents = [
        start_agent(env, port, run_id, nproc=2, script=SCRIPT, extra_args=(f"--log-dir={d}",))
        for d in logs
    ]
    try:
        (stall,) = receiver.wait_for_logs(
            1,
            timeout=120,
            where=lambda r: (
                r in _training_stalls(receiver) and r["attributes"].get(A.STALLED_RANKS) == [1]
            ),
        )[:1]
        attrs = stall["attributes"]
        assert stall["severity_text"] == "WARN"
        assert attrs[A.STALLED_SECONDS] <= STALL_AFTER_S + INTERVAL_S + 3.0, attrs
        assert attrs[A.STALLED_COLLECTIVE] == "all_reduce", attrs
        assert attrs[A.STALLED_PROCESS_GROUP] == "0"
        number = attrs[A.STALLED_COLLECTIVE_NUMBER]
        assert isinstance(number, int) and number > 1
        assert attrs[A.STALLED_WAITING] == [0]  # rank 1's neighbour, inside the collective
        assert attrs[A.STACK_FRAME] == f"stuck_data_loader at ddp_train.py:{HANG_LINE}"
        assert "no rank is in a collective" not in stall["body"]
        assert (
            f"global ranks 0 wait in all_reduce #{number} of process group 0; waiting for "
            "global rank 1 (in stuck_data_loader" in stall["body"]
        ), stall["body"]

        # The other node cannot see rank 1: it says which collective its ranks wait in.
        receiver.wait_until(
            lambda: [
                r
                for r in _training_stalls(receiver)
                if r["attributes"].get(A.STALLED_WAITING) == [2, 3]
            ],
            30,
        )
        other = next(
            r
            for r in _training_stalls(receiver)
            if r["attributes"].get(A.STALLED_WAITING) == [2, 3]
        )
        assert other["attributes"][A.STALLED_COLLECTIVE_NUMBER] == number
        assert "waiting for ranks on other nodes" in other["body"]

        # A waiting rank's stack is in the collective; the late rank's shows where it is.
        waiter = receiver.wait_until(lambda: _stacks(receiver, 0, "training"), 20)[0]
        assert waits_in in waiter["body"], waiter["body"]
        hung = f'ddp_train.py", line {HANG_LINE} in stuck_data_loader'
        receiver.wait_until(  # a slow start may be reported first, rank 1 then elsewhere
            lambda: [r for r in _stacks(receiver, 1, "training") if hung in r["body"]], 20
        )

        # The Flight Recorder dumps, one per rank of the node, as torchfrtrace reads them.
        dumps = Path(attrs[A.FLIGHT_RECORDER_DUMP])
        assert dumps.is_relative_to(logs[0]) or dumps.is_relative_to(logs[1]), dumps
        assert sorted(os.listdir(dumps)) == ["rank_0", "rank_1"]
        trace = pickle.loads((dumps / "rank_0").read_bytes())
        seqs = {
            e["collective_seq_id"]
            for e in trace["entries"]
            if e["profiling_name"].endswith("all_reduce")
        }
        assert number in seqs
        # torch's own analyzer reads the directory as it is (here one node's ranks)
        analyzed = subprocess.run(
            [str(Path(sys.executable).with_name("torchfrtrace")), str(dumps), "-j"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert analyzed.returncode == 0, analyzed.stderr[-3000:]
        assert "all_reduce" in analyzed.stdout + analyzed.stderr
    finally:
        stop_agents(agents)
    receiver.wait_for_spans(4, timeout=30, where=lambda s: s["name"] == A.SPAN_WORKER)
    return [s for s in receiver.spans() if s["name"] == A.SPAN_WORKER]


def test_a_ddp_hang_names_the_late_rank(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    workers = _hang(grpc_receiver, tmp_path, "in backward")
    # Ended by the operator's signal: nobody is ERROR; the waiting ranks are victims.
    assert {w["attributes"][A.GLOBAL_RANK] for w in workers} == {0, 1, 2, 3}
    assert all(w["status_code"] != "ERROR" for w in workers), [w["attributes"] for w in workers]


def test_a_functional_collectives_hang_names_the_late_rank(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    _hang(grpc_receiver, tmp_path, "_functional_collectives.py", FUNCTIONAL="1")


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (an agent's workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry))
    return found


def test_a_frozen_node_is_named_by_its_silent_keep_alives(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Every rank of a node waits in the same collective when the late ranks are elsewhere:
    a whole node freezes (its agent and workers stopped, as a host hung in the kernel or cut
    off). The other node's report says its ranks wait for ranks on other nodes and names the
    node whose rendezvous keep-alives stopped, with its group rank. One worker per node: the
    report is the node's, and the suite's time is short."""
    env = job_env(grpc_receiver, tmp_path)
    env["ELASTIC_OTEL_STALL_AFTER"] = str(STALL_AFTER_S)
    port, run_id = free_port(), f"frz-{uuid.uuid4().hex[:6]}"
    conf = ("--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=2",)
    logs = tmp_path / "host"
    host = start_agent(
        env, port, run_id, nproc=1, script=SCRIPT, extra_args=(*conf, f"--log-dir={logs}")
    )
    frozen = None
    try:
        time.sleep(1.0)  # the first agent binds the endpoint: it hosts the store
        frozen = start_agent(env, port, run_id, nproc=1, script=SCRIPT, extra_args=conf)

        def training() -> bool:  # the DDP model's all-reduces run on the host's ranks
            files = logs.rglob("elastic_otel_collectives.json")
            readings = [read_collectives(str(f.parent)) for f in files]
            return any(r is not None and r.groups and r.groups[0].issued > 10 for r in readings)

        grpc_receiver.wait_until(training, 90)
        for pid in [frozen.proc.pid, *_children(frozen.proc.pid)]:
            os.kill(pid, signal.SIGSTOP)

        def named() -> list[dict]:
            return [
                r
                for r in _training_stalls(grpc_receiver)
                if f"_{frozen.proc.pid}_" in str(r["attributes"].get(A.STALLED_SILENT_NODES))
            ]

        (stall,) = grpc_receiver.wait_until(named, 60)[:1]
        attrs = stall["attributes"]
        assert attrs[A.STALLED_WAITING] == [0] and A.STALLED_RANKS not in attrs
        assert attrs[A.STALLED_SILENT_SELF] is False
        assert len(attrs[A.STALLED_SILENT_GROUP_RANKS]) == 1  # the frozen node's, by pid
        assert attrs[A.STALLED_SILENT_SECONDS] >= 2.0
        assert "waiting for ranks on other nodes" in stall["body"]
        assert "sent no rendezvous keep-alive for" in stall["body"], stall["body"]
    finally:
        started = [agent for agent in (frozen, host) if agent is not None]
        for agent in started:
            for pid in [agent.proc.pid, *_children(agent.proc.pid)]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
        stop_agents(started)
