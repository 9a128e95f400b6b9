"""Hangs named for the training users run (issue 28): DDP, whose gradient all-reduces come from
its C++ reducer, and functional collectives, neither of which passes through the Python
collectives. Real two-node torchrun jobs (c10d, gloo, two workers per node), a training
script with no ``elastic_otel`` call (tests/scripts/ddp_train.py): global rank 1 stops before its
``backward()`` (at step 5, or before the job's first collective) while ranks 0, 2 and 3 wait
inside theirs; both nodes name it (node 1 through the round's store). The collective, its
process group and sequence number come from torch's Flight Recorder, read by each worker's
collectives thread; its dumps are left where ``torchfrtrace`` reads them.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import read_collectives
from tests.support.jobs import (
    NCCL_STANDIN,
    SCRIPTS,
    Agent,
    hosting_the_store,
    job_env,
    outputs_after_stopping,
    start_agent,
    stop_agents,
    workers_left,
)
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


def _hang(
    receiver: OtlpReceiver,
    tmp_path: Path,
    waits_in: str,
    first: bool = False,
    nccl: bool = False,
    **extra: str,
) -> list[dict]:
    """Run the hung job until both nodes named the late rank, end it as an operator would
    (SIGTERM); the worker spans. ``waits_in``: a frame of a waiting rank's stack; ``first``:
    rank 1 stops before the job's first collective (``HANG_STEP=0``); ``nccl``: the workers'
    torch keeps its record where a NCCL job's does (the stand-in), so that it is read as
    NCCL's, without timing events: enqueued, not completed, no device state claimed."""
    if nccl:
        extra["PYTHONPATH"] = NCCL_STANDIN
    env = job_env(receiver, tmp_path, HANG_RANK="1", HANG_STEP="0" if first else "5", **extra)
    backend = "nccl" if nccl else "gloo"
    never = "which never issued it" if nccl else "which never entered it"

    def inside(ranks: str, number: int) -> str:
        which = f"all_reduce #{number} of process group 0 ({backend})"
        if nccl:
            return f"global ranks {ranks} have {which} enqueued, not completed"
        return f"global ranks {ranks} wait in {which}"

    env["ELASTIC_OTEL_STALL_AFTER"] = str(STALL_AFTER_S)
    port, run_id = free_port(), f"ddp-{uuid.uuid4().hex[:6]}"
    logs = [tmp_path / f"node{n}" for n in range(2)]
    agents = [
        start_agent(env, port, run_id, nproc=2, script=SCRIPT, extra_args=(f"--log-dir={d}",))
        for d in logs
    ]
    frame = f"stuck_data_loader at ddp_train.py:{HANG_LINE}"

    def named(waiting: list[int], op: str | None = None) -> list[dict]:
        return [
            r
            for r in _training_stalls(receiver)
            if r["attributes"].get(A.STALLED_RANKS) == [1]
            and r["attributes"].get(A.STALLED_WAITING) == waiting
            and op in (None, r["attributes"].get(A.STALLED_COLLECTIVE))
        ]

    try:
        # Every node names rank 1: node 0 (ranks 0 and 1) from its own ranks, node 1 (ranks 2
        # and 3, all waiting) from what node 0 left in the round's store, within a poll of
        # both node 0's naming and node 1's own first report (its stall may begin later).
        try:
            receiver.wait_until(lambda: named([0]) and named([2, 3]), 120)
        except TimeoutError as timeout:
            said = workers_left(logs)
            raise AssertionError(f"{timeout}\n{said}\n{outputs_after_stopping(agents)}") from None
        ours, theirs_first = named([0])[0], named([2, 3])[0]
        node1_first = next(
            r
            for r in _training_stalls(receiver)
            if r["attributes"].get(A.STALLED_WAITING) == [2, 3]
        )
        late_s = (theirs_first["time_ns"] - max(ours["time_ns"], node1_first["time_ns"])) / 1e9
        reports = [
            f"{(r['time_ns'] - ours['time_ns']) / 1e9:+.3f} s {r['body']}"
            for r in _training_stalls(receiver)
        ]
        assert late_s <= INTERVAL_S + 0.5, "\n".join(reports)
        number = ours["attributes"][A.STALLED_COLLECTIVE_NUMBER]
        assert theirs_first["attributes"][A.STALLED_COLLECTIVE_NUMBER] == number
        assert number == 1 if first else isinstance(number, int) and number > 1, number
        assert "waiting for ranks on other nodes" not in ours["body"], ours["body"]
        # The op is named once the worker read its whole record (a first report may say
        # "collective"); the reports after it say all_reduce.
        receiver.wait_until(lambda: named([0], "all_reduce") and named([2, 3], "all_reduce"), 30)
        stall, other = named([0], "all_reduce")[0], named([2, 3], "all_reduce")[0]
        attrs = stall["attributes"]
        assert stall["severity_text"] == "WARN"
        assert attrs[A.STALLED_SECONDS] <= STALL_AFTER_S + INTERVAL_S + 3.0, attrs
        assert attrs[A.STALLED_COLLECTIVE] == "all_reduce", attrs
        assert attrs[A.STALLED_PROCESS_GROUP] == "0"
        assert attrs[A.STALLED_COLLECTIVE_NUMBER] == number
        assert attrs[A.STACK_FRAME] == frame, attrs
        assert A.STALLED_REMOTE_HOST not in attrs
        assert attrs[A.STALLED_BACKEND] == backend and attrs[A.STALLED_STATE_KNOWN] is False
        assert "no rank is in a collective" not in stall["body"]
        assert "waiting for ranks on other nodes" not in stall["body"], stall["body"]
        assert inside("0", number) in stall["body"], stall["body"]
        assert f"; waiting for global rank 1 (in {frame}), {never}" in stall["body"], stall["body"]

        # The other node names the same rank and line, and the node that has it.
        theirs = other["attributes"]
        assert theirs[A.STALLED_COLLECTIVE_NUMBER] == number
        assert theirs[A.STACK_FRAME] == frame, theirs
        # node 0's agent: the one whose log directory has ranks 0 and 1's dumps
        dumps = Path(attrs[A.FLIGHT_RECORDER_DUMP])
        node0 = next(
            a.proc.pid for a, d in zip(agents, logs, strict=True) if dumps.is_relative_to(d)
        )
        assert theirs[A.STALLED_REMOTE_PIDS] == [node0], (theirs, node0)
        host = theirs[A.STALLED_REMOTE_HOST]
        assert host == socket.gethostname(), theirs
        assert "waiting for ranks on other nodes" not in other["body"], other["body"]
        assert inside("2,3", number) in other["body"], other["body"]
        assert (
            f"; waiting for global rank 1 on {host} pid {node0} (in {frame}), {never}"
            in other["body"]
        ), other["body"]

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
    _ended_by_the_signal_during_the_stall(receiver, agents, frame, node0)
    return [s for s in receiver.spans() if s["name"] == A.SPAN_WORKER]


def _ended_by_the_signal_during_the_stall(
    receiver: OtlpReceiver, agents: list[Agent], frame: str, node0: int
) -> None:
    """Issue 36: SIGTERM ended both agents while rank 1 held the others up. Each agent's run
    is ERROR with torchrun's exit code; a signalled one names rank 1 at its line, then the
    signal (an agent whose workers died of the other node's stop first ends ChildFailedError);
    ``elastic-otel timeline`` gives rank 1 as the root cause and says the job failed."""
    runs = receiver.wait_for_spans(2, timeout=30, where=lambda s: s["name"] == A.SPAN_AGENT_RUN)
    codes = {a.proc.returncode for a in agents}
    # torch's own ends: 1 from its SignalException, at times SIGABRT as the store the first
    # agent hosts is torn down at exit (tests/e2e/test_sigterm_blocked.py)
    assert codes <= {1, -signal.SIGABRT}, codes
    signalled = 0
    for run in runs:
        attrs = run["attributes"]
        assert run["status_code"] == "ERROR", run
        assert attrs[A.STATE] == "FAILED" and attrs[A.PROCESS_EXIT_CODE] == 1, attrs
        if str(attrs[A.ERROR_TYPE]).endswith("ChildFailedError"):
            continue  # its workers died of the other node's stop before its own signal came
        signalled += 1
        assert str(attrs[A.ERROR_TYPE]).endswith("SignalException"), attrs
        assert attrs[A.STALLED_RANKS] == [1] and attrs[A.STACK_FRAME] == frame, attrs
        message = run["status_message"]
        assert message.startswith(f"stalled: global rank 1 at {frame} for "), message
        assert "every other rank waiting for it; then " in message and "signal" in message
    assert signalled >= 1, runs
    text = render_text(build_timeline(receiver.spans(), receiver.logs()))
    assert "ROOT CAUSE not seen" not in text, text
    root = next(line for line in text.splitlines() if line.startswith("  ROOT CAUSE at "))
    # rank 1's node: node 0's agent (named by its rendezvous host), also in node 1's report
    assert re.search(
        rf": global rank 1 on \S+ pid {node0} stalled \d+ s at {re.escape(frame)}; ", root
    ), root
    assert " → job failed" in text, text


def test_a_ddp_hang_in_nccls_record_names_the_late_rank(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Issue 35: DDP whose torch keeps its record only where a NCCL job's torch does (gloo's
    dump functions empty): the late rank is named, with the collective, by both nodes."""
    workers = _hang(grpc_receiver, tmp_path, "in backward", nccl=True)
    # Ended by the operator's signal: nobody is ERROR; the waiting ranks are victims.
    assert {w["attributes"][A.GLOBAL_RANK] for w in workers} == {0, 1, 2, 3}
    assert all(w["status_code"] != "ERROR" for w in workers), [w["attributes"] for w in workers]


def test_a_rank_before_the_first_collective_is_named_by_every_node(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Issue 35, items 5 and 6: FSDP2-like training (functional collectives, nothing issued
    before the first backward), rank 1 stuck before it. Node 0 names rank 1 in collective #1
    (it issued none of the group's: it is waited for); node 1, all of whose ranks wait, names
    it too, with its node and line, from the round's store."""
    _hang(grpc_receiver, tmp_path, "_functional_collectives.py", first=True, FUNCTIONAL="1")


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
        hosting_the_store(host, port)
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
        (silent,) = attrs[A.STALLED_SILENT_GROUP_RANKS]  # the frozen node's, by pid
        # torch ranks the nodes by (host, pid, n), not by their start: once the pids wrap
        # (pid_max 32768 here) the frozen agent's pid can be the lower, and the host rank 1
        assert attrs[A.STALLED_WAITING] == [1 - silent] and A.STALLED_RANKS not in attrs
        assert attrs[A.STALLED_SILENT_SELF] is False
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
