"""A real Slurm cluster on this machine for the Slurm end-to-end tests (``tests/slurm/``).

``munged``, ``slurmctld`` and two ``slurmd``, Debian's ``slurm-wlm`` (``.ci/install-slurm.sh``),
configured from scratch in a temporary directory (nothing under ``/etc`` is changed but the
``/etc/netns/<node>/`` files). Each node is a host of its own (``tests/support/netns.py``): a
network namespace on a bridge, with its own address and, through a UTS namespace, its own host
name: its processes see ``socket.gethostname() == "eo-n1"`` and reach the other node, the
controller and the test's OTLP receiver only over that link, as two hosts would. The controller
and the receiver listen on the bridge's address in the root namespace. Root is required
(namespaces, a bridge); everything is removed by ``stop()``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from tests.support.netns import HostNetwork, run

BRIDGE = "eoslurm0"
SUBNET = "10.77.0"
CONTROLLER_ADDR = f"{SUBNET}.1"
CONTROLLER_NAME = "eo-ctl"
NODES = ("eo-n1", "eo-n2")
KILL_WAIT_S = 8  # slurm.conf KillWait: SIGTERM → SIGKILL of a step at a time limit or scancel
SLURMD_TIMEOUT_S = 15  # a node that does not answer this long is DOWN
CRED_EXPIRE_S = 10  # also how long a requeued job waits before it starts again (default 120)
LOCK_FILE = Path(tempfile.gettempdir()) / "elastic-otel-slurm-cluster.lock"
"""Held while a cluster runs: the bridge, namespaces and ports are fixed, so a second session
waits for the first (up to ``LOCK_WAIT_S``) instead of tearing its network down."""
LOCK_WAIT_S = 900
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "ip", "unshare", "nsenter")


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


class SlurmCluster:
    """Start with :meth:`start`, end with :meth:`stop`; ``env`` is what Slurm's client commands
    (``sbatch``, ``scontrol``, ``scancel``) need to reach it."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="eo-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.network = HostNetwork(
            BRIDGE, SUBNET, NODES, LOCK_FILE, LOCK_WAIT_S, {CONTROLLER_NAME: CONTROLLER_ADDR}
        )

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        try:
            self.network.start()
            self._write_config()
            self._start_munge()
            self._start_controller()
            for node in NODES:
                self._start_slurmd(node)
            self.wait_nodes_idle(60)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.network.signal_all(signal.SIGKILL)  # slurmd, job steps, torchrun, workers
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self.network.stop()

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- set-up ---------------------------------------------------------------------------

    def _write_config(self) -> None:
        for sub in ("state", "log", "munge", *(f"spool/{n}" for n in NODES)):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir / "munge", 0o700)
        d = self.dir
        nodes = "\n".join(
            f"NodeName={node} NodeAddr={self.network.addr(node)} NodeHostname={node} CPUs=4 "
            "RealMemory=2000 State=UNKNOWN"
            for node in NODES
        )
        self.conf.write_text(
            f"""\
ClusterName=eotest
SlurmctldHost={CONTROLLER_NAME}({CONTROLLER_ADDR})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE_S}
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/spool/%n/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
KillWait={KILL_WAIT_S}
SlurmdTimeout={SLURMD_TIMEOUT_S}
MinJobAge=600
InactiveLimit=0
JobRequeue=1
{nodes}
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
        )

    def _start_munge(self) -> None:
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        m = self.dir / "munge"
        self.procs["munged"] = subprocess.Popen(
            ["munged", "-F", "-f", f"--socket={self.munge_socket}", f"--key-file={key}",
             f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
             f"--seed-file={m}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self._wait(lambda: self.munge_socket.exists(), 20, "munged's socket")

    def _start_controller(self) -> None:
        # its own UTS namespace: slurmctld runs only where the host name is SlurmctldHost's
        self.procs["slurmctld"] = self._daemon(
            ["unshare", "--uts", "sh", "-c",
             f'hostname {CONTROLLER_NAME} && exec slurmctld -D -i -f "{self.conf}"'],
            "slurmctld",
        )  # fmt: skip
        self._wait(lambda: self._ping(), 30, "slurmctld")

    def _start_slurmd(self, node: str) -> None:
        slurmd = ["slurmd", "-D", "-N", node, "-f", str(self.conf)]
        self.procs[node] = self._daemon(self.network.command(node, slurmd), f"slurmd-{node}")

    def _daemon(self, cmd: list[str], name: str) -> subprocess.Popen:
        out = open(self.dir / "log" / f"{name}.out", "ab")  # noqa: SIM115 - the daemon's
        return subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def _ping(self) -> bool:
        done = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, env=self.env, timeout=30
        )
        return "is UP" in done.stdout

    @staticmethod
    def _wait(ready: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.3)
        raise RuntimeError(f"{what} not ready after {timeout}s")

    # --- commands -------------------------------------------------------------------------

    def command(self, *cmd: str, check: bool = True) -> str:
        return run(*cmd, check=check, env=self.env)

    def node_states(self) -> dict[str, str]:
        out = self.command("sinfo", "-h", "-N", "-o", "%N %t")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_nodes_idle(self, timeout: float) -> None:
        def idle() -> bool:
            states = self.node_states()
            return all(states.get(node, "").startswith("idle") for node in NODES)

        try:
            self._wait(idle, timeout, "both slurmd")
        except RuntimeError:
            raise RuntimeError(f"nodes not idle: {self.node_states()}\n{self.logs()}") from None

    def sbatch(self, script: Path, *args: str, env: dict[str, str] | None = None) -> str:
        """Submit ``script``; its job id. ``env``: the job's environment (sbatch exports it)."""
        out = run("sbatch", "--parsable", *args, str(script), env={**(env or {}), **self.env})
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (``JobState``, ``Reason``, ``Restarts``, ...)."""
        out = self.command("scontrol", "-o", "show", "job", job_id, check=False)
        return dict(re.findall(r"(\w+(?::\w+)?)=(\S*)", out))

    def wait_job(self, job_id: str, states: Iterable[str], timeout: float) -> dict[str, str]:
        wanted = set(states)
        deadline = time.monotonic() + timeout
        job: dict[str, str] = {}
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job.get("JobState") in wanted:
                return job
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not in {wanted} after {timeout}s: {job}")

    def kill_node(self, node: str) -> list[int]:
        """Lose ``node`` as a host is lost: SIGKILL to its slurmd and everything in its network
        namespace (job steps, torchrun, workers) at once. The pids killed."""
        return self.network.signal(node, signal.SIGKILL)

    def restart_lost_nodes(self) -> None:
        """Start again the slurmd of every node :meth:`kill_node` lost; back in service when it
        registers (``ReturnToService=2``)."""
        for node in NODES:
            proc = self.procs.get(node)
            if proc is not None and proc.poll() is not None:
                self._start_slurmd(node)

    def logs(self) -> str:
        parts = []
        for path in sorted((self.dir / "log").glob("*")):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name}\n{text[-3000:]}")
        return "\n".join(parts)
