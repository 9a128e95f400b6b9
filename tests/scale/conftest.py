"""The scale suite (issue 42): hangs, a straggler, worker output and a root cause at a GPU node's
shape (two nodes of eight DDP ranks) and beyond (sixteen nodes, each a host of its own: a network
namespace with its own address and host name, ``tests/support/netns.py``), with real torchrun
agents, real DDP workers (gloo) and a real OTLP receiver. Collected only with
``ELASTIC_OTEL_SCALE_TESTS=1`` (its own CI step, ``.ci/run``): its jobs take both cores for
minutes, and the sixteen hosts need root, so the README's test command leaves this folder alone.

With ``ELASTIC_OTEL_SCALE_FIGURES=<file>``, the measured times from a stall to the last node
naming it are also written there (``benchmarks/recorded/scale-16-nodes-<date>.txt``); they are
printed at the end of the run in any case.
"""

from __future__ import annotations

import datetime
import os
import platform
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.jobs import ROOT, TORCHRUN
from tests.support.netns import HostNetwork, missing_binaries
from tests.support.otlp_receiver import OtlpReceiver

ENABLED = os.environ.get("ELASTIC_OTEL_SCALE_TESTS") == "1"
if not ENABLED:
    collect_ignore_glob = ["test_*.py"]

FIGURES_FILE = "ELASTIC_OTEL_SCALE_FIGURES"

HOSTS = tuple(f"eo-s{i:02d}" for i in range(1, 17))
"""The sixteen hosts' names (and namespaces'); the rendezvous store is on the first."""
BRIDGE = "eoscale0"
SUBNET = "10.78.0"  # not the Slurm cluster's (10.77.0): both suites may run on one machine
LOCK_FILE = Path(tempfile.gettempdir()) / "elastic-otel-scale-network.lock"
STALL_AFTER_S = 4.0  # ELASTIC_OTEL_STALL_AFTER of the sixteen-host jobs
POLL_S = min(max(STALL_AFTER_S / 4, 0.5), 5.0)  # the training watch's poll period at that


@pytest.fixture(scope="session")
def host_network() -> Iterator[HostNetwork]:
    missing = missing_binaries()
    if missing:
        pytest.fail(f"ELASTIC_OTEL_SCALE_TESTS=1 but {missing} missing")
    if os.geteuid() != 0:
        pytest.fail("the sixteen-host jobs need root (network namespaces, a bridge)")
    with HostNetwork(BRIDGE, SUBNET, HOSTS, LOCK_FILE) as network:
        yield network


@pytest.fixture(scope="module")
def network_receiver(host_network: HostNetwork) -> Iterator[OtlpReceiver]:
    """An OTLP/gRPC receiver on the bridge's address, which every host reaches."""
    with OtlpReceiver("grpc", host=host_network.gateway) as receiver:
        yield receiver


@dataclass
class HostJob:
    """One torchrun agent (``--nproc-per-node=1``) on each host of ``network``, one job; each
    agent's output goes to ``<logs>/<host>.out`` and its workers' logs under ``<logs>/<host>``."""

    network: HostNetwork
    env: dict[str, str]
    logs: Path
    script: Path
    extra_args: tuple[str, ...] = ()
    port: int = 29400
    agents: dict[str, subprocess.Popen] = field(default_factory=dict)
    run_id: str = ""

    def start(self, run_id: str) -> HostJob:
        self.run_id = run_id
        hosts = self.network.hosts
        for host in hosts:
            cmd = [
                TORCHRUN,
                f"--nnodes={len(hosts)}",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={hosts[0]}:{self.port}",  # hosted by the first: its name
                f"--rdzv-id={run_id}",
                "--monitor-interval=0.5",
                "--max-restarts=0",
                f"--log-dir={self.logs / host}",
                "--event-log-handler",
                "otel",
                *self.extra_args,
                str(self.script),
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

    def worker_hosts(self) -> dict[int, str]:
        """Each running worker's global rank → its host, read from the workers' environments
        (``RANK``, which torchrun sets), not from anything the bridge exports."""
        found: dict[int, str] = {}
        for host in self.network.hosts:
            for pid in self.network.pids(host):
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                values = dict(e.split(b"=", 1) for e in environ if b"=" in e)
                if b"RANK" in values and b"TORCHELASTIC_RUN_ID" in values:
                    found[int(values[b"RANK"])] = host
        return found

    def heartbeats(self) -> dict[str, float]:
        """The hosts whose rendezvous keep-alives torch's c10d rendezvous still holds, and the
        age of each one's last (seconds), as its state in the store says: torch drops a node it
        finds silent for ``keep_alive_interval * keep_alive_max_attempt``, and that node sends
        none after (on two loaded cores a healthy agent can be silent that long at start-up).
        Read from the store on the first host, as any agent reads it."""
        import base64
        import pickle

        from torch.distributed import TCPStore

        store = TCPStore(
            self.network.addr(self.network.hosts[0]),
            self.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=10),
        )
        state = pickle.loads(base64.b64decode(store.get(f"torch.rendezvous.{self.run_id}")))
        utc = datetime.timezone.utc
        now = datetime.datetime.now(utc)
        return {
            node.addr: (now - (beat if beat.tzinfo else beat.replace(tzinfo=utc))).total_seconds()
            for node, beat in state.last_heartbeats.items()
        }

    def outputs(self, chars: int = 1500) -> str:
        return "\n".join(
            f"--- {host}:\n{(self.logs / f'{host}.out').read_text(errors='replace')[-chars:]}"
            for host in self.agents
        )

    def stop(self) -> None:
        """SIGTERM to every agent, as an operator ends a hung job; a minute to end, then
        everything on the hosts is killed."""
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
class Figure:
    """What one case measured: when its first stall report came, when the last node named the
    late rank (or node), how many nodes named it, all from the receiver's record times."""

    case: str
    first_report_s: float
    """The first stall report of the case, seconds after the last waiting node began to wait
    (negative: a node reported before the last one began; in start-up, nodes begin apart)."""
    last_named_s: float
    """The last node's first report naming the late rank (node), seconds after the same time."""
    nodes: int
    of: int

    def line(self) -> str:
        return (
            f"{self.case}: {self.nodes} of {self.of} nodes named it; first report"
            f" {self.first_report_s:+.2f} s, last node naming it {self.last_named_s:+.2f} s after"
            f" the last waiting node began to wait: {self.last_named_s - self.first_report_s:.2f}"
            " s from the first report to the last node naming it"
        )


FIGURES: list[Figure] = []


def record_figure(figure: Figure) -> None:
    FIGURES.append(figure)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FIGURES:
        return
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    header = (
        f"{datetime.date.today().isoformat()} {platform.node()} ({_cpu_model()},"
        f" {os.cpu_count()} cores; load average {load} at the end); {len(HOSTS)} hosts of one"
        " rank each (network and UTS namespaces), c10d, gloo,"
        f" ELASTIC_OTEL_STALL_AFTER={STALL_AFTER_S:g} (a poll every {POLL_S:g} s)"
    )
    lines = [header, *(f.line() for f in FIGURES)]
    terminalreporter.write_sep("=", "scale: from a stall to the last node naming it")
    for line in lines:
        terminalreporter.write_line(line)
    path = os.environ.get(FIGURES_FILE)
    if path:
        Path(path).write_text("\n".join(lines) + "\n")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.machine()
