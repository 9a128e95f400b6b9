"""The slow-link suite (issue 46): two hosts of their own (network namespaces with veth links to a
bridge, ``tests/support/netns.py``), one torchrun agent of two DDP ranks (gloo,
``tests/scripts/link_train.py``) on each, and a real OTLP receiver on the bridge; a test slows
one host's link (``tc tbf`` on both ends of its veth pair) or every rank's compute for a while in
the middle of training, and reads what the bridge made of it. Collected only with
``ELASTIC_OTEL_LINK_TESTS=1``: the hosts need root, and each job takes both cores for about a
minute, so the README's test command leaves this folder alone.

:func:`run_link_job` runs one job through its phases, on the clock of rank 0's progress lines
(training has begun once the first is printed): :data:`BASELINE_S` (the slowdown watch's
warm-up and the measurements its baseline is set from, one straggler window each, and one
spare), the fault for :data:`FAULT_S`, then :data:`AFTER_S` (the windows an end takes, and one
spare), then up to :data:`ENDING_S` more while a node that reported a slowdown has not said it
ended. The job is then ended (SIGTERM to its agents, as an operator ends one) and what the
receiver got is kept, with the times the fault began and ended and rank 0's step times.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from elastic_otel.model.slowdowns import BASELINE, LASTING, WARMUP
from elastic_otel.names import attributes as A
from tests.support.jobs import ROOT, SCRIPTS, TORCHRUN, job_env
from tests.support.netns import HostNetwork, missing_binaries
from tests.support.otlp_receiver import OtlpReceiver

ENABLED = os.environ.get("ELASTIC_OTEL_LINK_TESTS") == "1"
if not ENABLED:
    collect_ignore_glob = ["test_*.py"]

HOSTS = ("eo-l1", "eo-l2")
"""The two hosts' names (and namespaces'); the rendezvous store is on the first."""
BRIDGE = "eolinks0"
SUBNET = "10.79.0"  # not the Slurm cluster's (10.77.0) nor the scale suite's (10.78.0)
LOCK_FILE = Path(tempfile.gettempdir()) / "elastic-otel-links-network.lock"
SCRIPT = SCRIPTS / "link_train.py"

WINDOW_S = 2.0
"""``ELASTIC_OTEL_STRAGGLER_WINDOW`` of every job: the slowdown watch's cadence."""
STEP_S = 0.1
"""Every rank's per-step sleep (``STEP_SECONDS``: a data loader's time)."""
PRINT_EVERY = 5
"""Rank 0 prints its mean step time every this many steps."""
BASELINE_S = (WARMUP + BASELINE + 1) * WINDOW_S
"""From training's beginning to the fault (16 s)."""
FAULT_S = 8 * WINDOW_S
AFTER_S = (LASTING + 1) * WINDOW_S
ENDING_S = 4 * WINDOW_S
"""At most this much more after :data:`AFTER_S` while a slowdown is reported and not ended."""
START_TIMEOUT_S = 180
"""From starting the agents to rank 0's first progress line (four workers import torch)."""
RATE = "400mbit"
"""A slow link's rate (``tc tbf``, both directions): steps 2.7x to 3x slower (test module)."""
SLOW_ALL_S = 0.2
"""A compute slowdown's sleep, added to every rank's step: steps 2.4x to 2.7x slower."""

RUNS: list[LinkRun] = []
"""Every job run so far, for the summary at the end of the run."""


@pytest.fixture(scope="session")
def host_network() -> Iterator[HostNetwork]:
    missing = missing_binaries() + [b for b in ("tc",) if shutil.which(b) is None]
    if missing:
        pytest.fail(f"ELASTIC_OTEL_LINK_TESTS=1 but {missing} missing")
    if os.geteuid() != 0:
        pytest.fail("the slow-link jobs need root (network namespaces, a bridge, tc)")
    with HostNetwork(BRIDGE, SUBNET, HOSTS, LOCK_FILE) as network:
        yield network


@pytest.fixture(scope="session")
def link_receiver(host_network: HostNetwork) -> Iterator[OtlpReceiver]:
    """An OTLP/gRPC receiver on the bridge's address, which both hosts reach over their links."""
    with OtlpReceiver("grpc", host=host_network.gateway) as receiver:
        yield receiver


@dataclass
class LinkJob:
    """One torchrun agent of two workers on each host of ``network``, one job; each agent's
    output (rank 0's progress lines among it) goes to ``<logs>/<host>.out``, its workers' logs
    under ``<logs>/<host>``."""

    network: HostNetwork
    env: dict[str, str]
    logs: Path
    port: int = 29500
    agents: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, run_id: str) -> LinkJob:
        hosts = self.network.hosts
        for host in hosts:
            cmd = [
                TORCHRUN,
                f"--nnodes={len(hosts)}",
                "--nproc-per-node=2",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={self.network.addr(hosts[0])}:{self.port}",
                f"--rdzv-id={run_id}",
                "--monitor-interval=0.5",
                "--max-restarts=0",
                f"--log-dir={self.logs / host}",
                "--event-log-handler",
                "otel",
                str(SCRIPT),
            ]
            with open(self.logs / f"{host}.out", "wb") as out:
                self.agents[host] = subprocess.Popen(
                    self.network.command(host, cmd),
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=str(ROOT),
                )
        return self

    def progress(self) -> list[tuple[float, int, float]]:
        """Rank 0's progress lines so far: (unix time, step, mean step seconds since the last)."""
        found = []
        for host in self.agents:
            text = (self.logs / f"{host}.out").read_text(errors="replace")
            for m in re.finditer(r"link_train: step (\d+) at ([\d.]+) mean ([\d.]+)", text):
                found.append((float(m[2]), int(m[1]), float(m[3])))
        return sorted(found)

    def node_ranks(self) -> dict[str, int]:
        """Each host's node rank in the round (``GROUP_RANK``, which torchrun sets in its
        workers' environments), not from anything the bridge exports."""
        found: dict[str, int] = {}
        for host in self.network.hosts:
            for pid in self.network.pids(host):
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                values = dict(e.split(b"=", 1) for e in environ if b"=" in e)
                if b"GROUP_RANK" in values and b"TORCHELASTIC_RUN_ID" in values:
                    found[host] = int(values[b"GROUP_RANK"])
        return found

    def ended(self) -> list[str]:
        return [host for host, agent in self.agents.items() if agent.poll() is not None]

    def outputs(self, chars: int = 2000) -> str:
        return "\n".join(
            f"--- {host}:\n{(self.logs / f'{host}.out').read_text(errors='replace')[-chars:]}"
            for host in self.agents
        )

    def stop(self) -> None:
        """SIGTERM to every agent, as an operator ends a job; a minute to end, then everything
        on the hosts is killed."""
        for agent in self.agents.values():
            if agent.poll() is None:
                agent.terminate()
        for host, agent in self.agents.items():
            try:
                agent.wait(60)
            except subprocess.TimeoutExpired:
                self.network.signal(host, signal.SIGKILL)
                agent.wait(10)


@dataclass
class LinkRun:
    """What one job did and what the receiver got from it."""

    name: str
    logs: list[dict] = field(default_factory=list, repr=False)
    """Every log record the receiver got from the job, the ending's included."""
    node_ranks: dict[str, int] = field(default_factory=dict)
    """Each host's node rank in the round."""
    progress: list[tuple[float, int, float]] = field(default_factory=list, repr=False)
    """Rank 0's progress lines (:meth:`LinkJob.progress`)."""
    trained_ns: int = 0
    """When rank 0 printed its first progress line."""
    fault_began_ns: int = 0
    fault_ended_ns: int = 0
    """When the fault began and ended (wall clock; 0: a job with no fault)."""
    outputs: str = field(default="", repr=False)
    wall_s: float = 0.0
    """From starting the agents to their end."""

    def host(self, node_rank: int) -> str:
        return next(host for host, rank in self.node_ranks.items() if rank == node_rank)

    def step_seconds(self, begin_ns: int, end_ns: int) -> float:
        """Rank 0's median step time over the progress lines printed between two times."""
        means = [mean for at, _, mean in self.progress if begin_ns <= at * 1e9 < end_ns]
        return statistics.median(means) if means else float("nan")

    def step_phases(self) -> tuple[float, float, float]:
        """Rank 0's median step time before, during and after the fault (or over the same
        times), the first window of each phase left out (seconds)."""
        began = self.fault_began_ns or self.trained_ns + int(BASELINE_S * 1e9)
        ended = self.fault_ended_ns or began + int(FAULT_S * 1e9)
        settle = int(WINDOW_S * 1e9)
        return (
            self.step_seconds(self.trained_ns + settle, began),
            self.step_seconds(began + settle, ended),
            self.step_seconds(ended + settle, 2**63),
        )

    def phases(self) -> str:
        before, during, after = self.step_phases()
        return (
            f"before {before * 1e3:.0f} ms, during {during * 1e3:.0f} ms"
            f" ({during / before:.2f}x), after {after * 1e3:.0f} ms"
        )

    def events(self, name: str) -> list[dict]:
        """The records of event ``name`` (``torchelastic.slowdown``, ``torchelastic.link``),
        in time order."""
        return sorted((r for r in self.logs if r["event_name"] == name), key=lambda r: r["time_ns"])

    def said(self) -> str:
        """The job's slowdown and link records and step times, for a failure's message."""
        lines = [f"{self.name}: node ranks {self.node_ranks}; rank 0's steps: {self.phases()}"]
        if self.fault_began_ns:
            lines.append(f"  fault {_iso(self.fault_began_ns)} to {_iso(self.fault_ended_ns)}")
        for r in self.events(A.SLOWDOWN_EVENT_NAME) + self.events(A.LINK_EVENT_NAME):
            lines.append(
                f"  {_iso(r['time_ns'])} {r['resource'].get('host.name')} {r['severity_text']}"
                f" {r['event_name']}: {r['body']}"
            )
        return "\n".join(lines)


def _iso(ns: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ns / 1e9)) + f".{ns % 10**9 // 10**6:03d}"


def run_link_job(
    network: HostNetwork,
    receiver: OtlpReceiver,
    tmp_path: Path,
    name: str,
    begin: Callable[[LinkRun], None] | None = None,
    end: Callable[[LinkRun], None] | None = None,
    **env: str,
) -> LinkRun:
    """Run one job through its phases (the module's docstring); ``begin(run)`` starts the fault
    and ``end(run)`` ends it, once the run knows its hosts' node ranks (neither: a job with no
    fault, run over the same times)."""
    started = time.monotonic()
    receiver.clear()
    environ = job_env(
        receiver,
        tmp_path,
        ELASTIC_OTEL_STRAGGLER_WINDOW=str(WINDOW_S),
        ELASTIC_OTEL_STALL_AFTER="60",  # a slow job is no stall
        OTEL_METRIC_EXPORT_INTERVAL="1000",
        STEPS="1000000",  # ended by SIGTERM once its phases are over
        STEP_SECONDS=str(STEP_S),
        PRINT_EVERY=str(PRINT_EVERY),
        **env,
    )
    job = LinkJob(network, environ, tmp_path).start(f"{name}-{uuid.uuid4().hex[:6]}")
    run = LinkRun(name)
    try:
        with contextlib.suppress(TimeoutError):
            receiver.wait_until(lambda: job.progress() or job.ended(), START_TIMEOUT_S)
        if not job.progress():
            raise AssertionError(f"{name}: the job did not train\n{job.outputs()}")
        run.trained_ns = int(job.progress()[0][0] * 1e9)
        run.node_ranks = job.node_ranks()
        _sleep_until(run.trained_ns + BASELINE_S * 1e9)
        if begin is not None:
            run.fault_began_ns = time.time_ns()
            try:
                begin(run)
                _sleep_until(run.fault_began_ns + FAULT_S * 1e9)
            finally:
                if end is not None:
                    end(run)
                run.fault_ended_ns = time.time_ns()
            after_ns = run.fault_ended_ns + AFTER_S * 1e9
        else:
            after_ns = run.trained_ns + (BASELINE_S + FAULT_S + AFTER_S) * 1e9
        _sleep_until(after_ns)
        with contextlib.suppress(TimeoutError):
            receiver.wait_until(lambda: not _unended(receiver.logs()), ENDING_S)
        if job.ended():
            raise AssertionError(f"{name}: agents {job.ended()} ended early\n{job.outputs()}")
    finally:
        job.stop()  # before the next job: the two cores run one job at a time
        run.progress = job.progress()
        run.outputs = job.outputs()
        run.logs = receiver.logs()
        run.wall_s = time.monotonic() - started
        RUNS.append(run)
    print(f"\n{run.said()}")
    return run


def _unended(logs: list[dict]) -> bool:
    """Whether a node reported a slowdown and has not said it ended."""
    slowdowns = [r for r in logs if r["event_name"] == A.SLOWDOWN_EVENT_NAME]
    ended = [r for r in slowdowns if r["attributes"].get(A.STATE) == A.SLOWDOWN_ENDED_STATE]
    host = "host.name"
    return bool(
        {r["resource"].get(host) for r in slowdowns} - {r["resource"].get(host) for r in ended}
    )


def _sleep_until(ns: float) -> None:
    time.sleep(max(0.0, (ns - time.time_ns()) / 1e9))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RUNS:
        return
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    terminalreporter.write_sep("=", "slow links: rank 0's step times, each job's wall time")
    for run in RUNS:
        fault = (
            f"fault {_iso(run.fault_began_ns)} to {_iso(run.fault_ended_ns)}"
            if run.fault_began_ns
            else "no fault"
        )
        terminalreporter.write_line(
            f"{run.name}: {run.phases()}; {fault}; {run.wall_s:.0f} s"
            f" ({len(run.events(A.SLOWDOWN_EVENT_NAME))} slowdown,"
            f" {len(run.events(A.LINK_EVENT_NAME))} link records)"
        )
    terminalreporter.write_line(f"load average at the end: {load}")
