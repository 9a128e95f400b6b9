"""SIGTERM to an agent blocked in torch's C++ code: its open spans are exported before SIGKILL.

Agent A's workers succeed while node B is gone (SIGKILLed; its worker, in a session of its
own, runs on and finishes), so A waits in torch's exit barrier: a TCPStore wait in C++, where
torch's Python SIGTERM handler cannot run (for 300 s here). A scheduler then sends SIGTERM and,
after a grace period, SIGKILL. The bridge's signal watcher must end A's open spans as
terminated and export them in between; torch's handling of the signal and torchrun's exit code
must stay what they are without the bridge.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from tests.support.jobs import ROOT, TORCHRUN, job_env, listening, run_script
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

GRACE_S = 15.0  # the scheduler's grace between SIGTERM and SIGKILL (ELASTIC_OTEL_EXIT_TIMEOUT: 2)
BARRIER_WAIT = "Waiting 300 seconds for other agents to finish"

# Each worker writes its pid (so the test can always kill it), waits until the test says go,
# then succeeds. What is tested is its agent, blocked after it: the worker imports no torch.
WORKER = """\
import os, pathlib, sys, time

here = pathlib.Path(os.environ["SIGTEST_DIR"])
(here / f"worker{os.environ['RANK']}.pid").write_text(str(os.getpid()))
deadline = time.monotonic() + 90
while not (here / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
sys.stdout.flush()
os._exit(0)
"""

# torchrun with a shorter exit barrier (torchrun has no option for it): for the control runs,
# in which the agent must get out of the barrier by itself.
SHORT_BARRIER_TORCHRUN = """\
import os, sys
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

_init = LocalElasticAgent.__init__


def _init_short_barrier(self, *args, **kwargs):
    kwargs.setdefault("exit_barrier_timeout", float(os.environ["SIGTEST_EXIT_BARRIER_TIMEOUT"]))
    _init(self, *args, **kwargs)


LocalElasticAgent.__init__ = _init_short_barrier
from torch.distributed.run import main

sys.exit(main())
"""


@dataclass
class Job:
    """Two agents of one job (A hosts the rendezvous store) and their workers' pid files."""

    dir: Path
    env: dict[str, str]
    launcher: tuple[str, ...]
    handler: str
    port: int = field(default_factory=free_port)
    run_id: str = field(default_factory=lambda: f"blocked-{uuid.uuid4().hex[:6]}")
    agents: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, is_host: bool) -> subprocess.Popen:
        cmd = [
            *self.launcher,
            "--nnodes=2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            f"--rdzv-conf=is_host={str(is_host).lower()}",
            f"--rdzv-id={self.run_id}",
            "--monitor-interval=0.5",
            "--event-log-handler",
            self.handler,
            str(self.dir / "worker.py"),
        ]
        with open(self.log(name), "w") as out:
            proc = subprocess.Popen(
                cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT)
            )
        self.agents[name] = proc
        return proc

    def log(self, name: str) -> Path:
        return self.dir / f"agent-{name}.log"

    def output(self, name: str) -> str:
        return self.log(name).read_text(errors="replace")

    def worker_pids(self) -> list[int]:
        return [int(p.read_text()) for p in self.dir.glob("worker*.pid") if p.read_text()]

    def kill_all(self) -> None:
        for proc in self.agents.values():
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for pid in self.worker_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def wait_for(what: str, check: Callable[[], object], timeout: float, job: Job) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            logs = {name: job.output(name)[-3000:] for name in job.agents}
            raise AssertionError(f"timed out after {timeout}s waiting for {what}: {logs}")
        time.sleep(0.1)


@contextlib.contextmanager
def blocked_in_exit_barrier(
    tmp_path: Path, env: dict[str, str], handler: str, launcher: tuple[str, ...]
) -> Iterator[Job]:
    """Start the job and return once agent A waits in the exit barrier for the lost node B."""
    (tmp_path / "worker.py").write_text(WORKER)
    job = Job(tmp_path, {**env, "SIGTEST_DIR": str(tmp_path)}, launcher, handler)
    try:
        a = job.start("a", is_host=True)
        wait_for("A to host the store", lambda: listening(job.port), 60, job)
        b = job.start("b", is_host=False)
        wait_for("both workers to start", lambda: len(job.worker_pids()) == 2, 120, job)
        b.kill()  # node B is lost; its worker (own session) runs on
        b.wait(10)
        (tmp_path / "go").touch()
        wait_for(
            "A's exit barrier", lambda: "for other agents to finish" in job.output("a"), 60, job
        )
        time.sleep(1.0)  # from the log line into the store wait
        assert a.poll() is None, job.output("a")[-3000:]
        yield job
    finally:
        job.kill_all()


def terminated_spans(receiver: OtlpReceiver, pid: int) -> list[dict]:
    """Agent ``pid``'s member spans and their children that a SIGTERM ended."""
    members = {
        s["span_id"]
        for s in receiver.spans()
        if s["name"] == A.SPAN_RDZV_MEMBER and s["attributes"].get(A.PROCESS_PID) == pid
    }
    return [
        s
        for s in receiver.spans()
        if "SIGTERM" in str(s["attributes"].get(A.END_REASON, ""))
        and (s["span_id"] in members or s["parent_span_id"] in members)
    ]


def is_signal_failure(record: dict) -> bool:
    """torch's agent FAILED event with ``SignalException``: its own SIGTERM handler ran."""
    attributes = record["attributes"]
    return attributes.get(A.EVENT_SOURCE) == "AGENT" and "SignalException" in str(
        attributes.get(A.EXCEPTION_TYPE, "")
    )


def test_sigterm_in_the_exit_barrier_exports_open_spans_before_sigkill(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    env = job_env(grpc_receiver, tmp_path, LOGLEVEL="INFO")
    with blocked_in_exit_barrier(tmp_path, env, "otel", (TORCHRUN,)) as job:
        a = job.agents["a"]
        assert BARRIER_WAIT in job.output("a")  # torch's default: blocked for 300 s
        assert not terminated_spans(grpc_receiver, a.pid)
        a.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while not terminated_spans(grpc_receiver, a.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        # what the collector has when the scheduler's SIGKILL comes
        arrived = terminated_spans(grpc_receiver, a.pid)
        torch_handler_ran = [r for r in grpc_receiver.logs() if is_signal_failure(r)]
        still_blocked = a.poll() is None
        a.kill()
        a.wait(10)

    assert still_blocked, "A left the barrier: the test did not exercise a blocked agent"
    assert not torch_handler_ran
    names = {s["name"] for s in arrived}
    assert A.SPAN_RDZV_MEMBER in names, job.output("a")[-3000:]
    assert A.SPAN_AGENT_EXIT_BARRIER in names
    for span in arrived:
        assert span["attributes"][A.END_REASON] == "process terminated (SIGTERM, signal 15)"
        assert span["status_code"] == "ERROR"
    (member,) = [s for s in arrived if s["name"] == A.SPAN_RDZV_MEMBER]
    assert member["attributes"][A.ROUND] == 0


def test_sigterm_in_the_exit_barrier_keeps_torchruns_exit_code(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Without SIGKILL, A leaves the (shortened) barrier and torch's handler runs: the exit
    code is torchrun's own, and torch's FAILED event, recorded after the bridge ended the
    spans, is still exported."""
    script = tmp_path / "short_barrier" / "run.py"  # named like torch's, read as torchrun
    script.parent.mkdir()
    script.write_text(SHORT_BARRIER_TORCHRUN)
    launcher = (sys.executable, str(script))

    def sigterm_in_the_barrier(handler: str) -> tuple[int, int, str]:
        """The job with this event handler: A's exit code, pid and output."""
        run_dir = tmp_path / handler
        run_dir.mkdir()
        env = job_env(grpc_receiver, run_dir, LOGLEVEL="INFO", SIGTEST_EXIT_BARRIER_TIMEOUT="8")
        with blocked_in_exit_barrier(run_dir, env, handler, launcher) as job:
            a = job.agents["a"]
            a.send_signal(signal.SIGTERM)
            try:
                return a.wait(60), a.pid, job.output("a")
            except subprocess.TimeoutExpired:
                raise AssertionError(job.output("a")[-3000:]) from None

    handlers = ("null", "otel")  # two jobs of their own, side by side
    with ThreadPoolExecutor(len(handlers)) as pool:
        ends = dict(zip(handlers, pool.map(sigterm_in_the_barrier, handlers), strict=True))
    exit_codes = {handler: code for handler, (code, _, _) in ends.items()}
    _, pid, output = ends["otel"]
    # torch's own ends vary: 1 from its SignalException, or at times SIGABRT as the store it
    # hosts is torn down at exit (seen without the bridge, the "null" run). Either is torch's.
    torchs_own = {1, -signal.SIGABRT}
    assert {exit_codes["otel"], exit_codes["null"]} <= torchs_own, exit_codes
    assert "Got termination signal" in output  # torch's handler ran, after the barrier
    (member,) = [s for s in terminated_spans(grpc_receiver, pid) if s["name"] == A.SPAN_RDZV_MEMBER]
    failed = grpc_receiver.wait_for_logs(1, where=is_signal_failure)
    assert failed[0]["trace_id"] == member["trace_id"]
    (agent_run,) = [s for s in grpc_receiver.spans() if s["name"] == A.SPAN_AGENT_RUN]
    assert agent_run["status_code"] == "ERROR"
    assert agent_run["trace_id"] == member["trace_id"]
    assert agent_run["start_ns"] < member["end_ns"]  # the agent's start was kept


# --- the signal watcher in plain processes ------------------------------------------------------

# An open rendezvous.member span; then a forked child's SIGTERM, the process's own SIGUSR1
# (with a handler), and its own SIGINT: only the last concerns this process's spans.
FORK_AND_SIGNALS = """\
import os, signal, sys, time
# Python's own SIGINT handling, even when pytest runs as a shell's background job (which
# starts it with SIGINT ignored, inherited here)
signal.signal(signal.SIGINT, signal.default_int_handler)
import elastic_otel
from torch.distributed.elastic import events
from torch.distributed.elastic.events import NodeState, RdzvEvent

elastic_otel.register()
node = f"'h_{os.getpid()}_0'"
for message in (
    f"The node {node} attempts to join the next round of the rendezvous 'sigs'.",
    f"The node {node} has joined round 0 of the rendezvous 'sigs' as rank 0 in a world of size 1.",
):
    events.record_rdzv_event(
        RdzvEvent("dynamic_rendezvous.py:x", "sigs", message, "h", os.getpid(), NodeState.RUNNING,
                  local_id=0)
    )
elastic_otel.flush()
child = os.fork()
if child == 0:
    os.kill(os.getpid(), signal.SIGTERM)  # the inherited handler flushes, then dies of it
    time.sleep(10)
    os._exit(3)
print("child", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)
signal.signal(signal.SIGUSR1, lambda *_: None)
os.kill(os.getpid(), signal.SIGUSR1)
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(10)
except KeyboardInterrupt:
    print("interrupted", flush=True)
sys.stdin.readline()
"""


def test_only_this_process_sigterm_or_sigint_ends_its_spans(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", FORK_AND_SIGNALS],
        env=job_env(grpc_receiver, tmp_path, OTEL_BSP_SCHEDULE_DELAY="50"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().split() == ["child", str(-signal.SIGTERM)]
        assert proc.stdout.readline().strip() == "interrupted"
        (member,) = grpc_receiver.wait_for_spans(
            1, timeout=20, where=lambda s: s["name"] == A.SPAN_RDZV_MEMBER
        )
        assert member["attributes"][A.PROCESS_PID] == proc.pid
        assert member["attributes"][A.END_REASON] == "process terminated (SIGINT, signal 2)"
        assert member["status_code"] == "ERROR"
        proc.stdin.write("\n")
        proc.stdin.close()
        assert proc.wait(20) == 0  # the KeyboardInterrupt was the script's to handle
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert [s["name"] for s in grpc_receiver.spans()].count(A.SPAN_RDZV_MEMBER) == 1


# The application set a wakeup fd of its own (as an event loop does) before the bridge started.
APP_WAKEUP_FD = """\
import os, signal, socket, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as FORK_AND_SIGNALS says why
import elastic_otel
from torch.distributed.elastic import events
from torch.distributed.elastic.events import Event, EventSource

reader, writer = socket.socketpair()
reader.settimeout(5)
writer.setblocking(False)
signal.set_wakeup_fd(writer.fileno())
elastic_otel.register()
events.record(Event("e", EventSource.AGENT, 0, {}), "otel")
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(10)
except KeyboardInterrupt:
    pass
print(list(reader.recv(16)))
print(signal.set_wakeup_fd(-1) == writer.fileno())
"""


def test_an_applications_wakeup_fd_is_left_alone(tmp_path: Path) -> None:
    out = run_script(APP_WAKEUP_FD, job_env(None, tmp_path, OTEL_SDK_DISABLED="true"))
    assert out.split("\n")[:2] == [str([int(signal.SIGINT)]), "True"]
