"""The Slurm end-to-end suite: real ``munged``, ``slurmctld`` and two ``slurmd`` on this machine
(``tests/support/slurm_cluster.py``), real ``sbatch`` jobs of ``examples/slurm/``, a real OTLP
receiver. Collected only with ``ELASTIC_OTEL_SLURM_TESTS=1`` (its own CI step, ``.ci/run``):
it needs root and ``.ci/install-slurm.sh``, and takes its two cores for a few minutes, so the
README's test command leaves this folder alone."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.jobs import ROOT, SCRIPTS
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.slurm_cluster import CONTROLLER_ADDR, SlurmCluster, missing_binaries

ENABLED = os.environ.get("ELASTIC_OTEL_SLURM_TESTS") == "1"
if not ENABLED:
    collect_ignore_glob = ["test_*.py"]

SBATCH = ROOT / "examples" / "slurm" / "torchrun-otel.sbatch"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
GOODPUT_TRAIN = SCRIPTS / "goodput_train.py"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    if missing:
        pytest.fail(f"ELASTIC_OTEL_SLURM_TESTS=1 but {missing} missing: bash .ci/install-slurm.sh")
    if os.geteuid() != 0:
        pytest.fail("the Slurm suite needs root (network namespaces, a bridge, slurmd)")
    with SlurmCluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_receiver(slurm_cluster: SlurmCluster) -> Iterator[OtlpReceiver]:
    """An OTLP/gRPC receiver on the bridge's address, which both nodes reach."""
    with OtlpReceiver("grpc", host=CONTROLLER_ADDR) as receiver:
        yield receiver


@dataclass
class SlurmJobs:
    """Submit the example's sbatch script; read what one job exported."""

    cluster: SlurmCluster
    receiver: OtlpReceiver
    tmp_path: Path

    def submit(self, *sbatch_args: str, **env: str) -> str:
        environ = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("OTEL_", "ELASTIC_OTEL_", "PET_", "SLURM_", "SBATCH_"))
        }
        environ.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=self.receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_BSP_SCHEDULE_DELAY="200",
            OTEL_BLRP_SCHEDULE_DELAY="200",
            OTEL_METRIC_EXPORT_INTERVAL="1000",
            ELASTIC_OTEL_OPEN_SPAN_INTERVAL="2",
            TORCHRUN=TORCHRUN,
            TRAIN=str(GOODPUT_TRAIN),
            NPROC_PER_NODE="1",
            MAX_RESTARTS="0",
            RDZV_PORT="29400",
            TORCHRUN_ARGS="--monitor-interval=0.5",
            PYTHONUNBUFFERED="1",
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
            # goodput_train.py: a checkpoint every 5 steps, resumed by a requeued attempt
            STEPS="10",
            STEP_SECONDS="0.1",
            CHECKPOINT_EVERY="5",
            FAIL_STEP="-1",
            CKPT_DIR=str(self.tmp_path),
        )
        environ.update(env)
        args = (f"--output={self.tmp_path}/slurm-%j.out", f"--chdir={ROOT}", *sbatch_args)
        return self.cluster.sbatch(SBATCH, *args, env=environ)

    def output(self, job_id: str) -> str:
        path = self.tmp_path / f"slurm-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def spans(self, job_id: str) -> list[dict]:
        return [s for s in self.receiver.spans() if s["resource"].get("slurm.job.id") == job_id]

    def logs(self, job_id: str) -> list[dict]:
        return [r for r in self.receiver.logs() if r["resource"].get("slurm.job.id") == job_id]

    def wait_for(self, what: Callable[[], object], timeout: float, why: str) -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = what()
            if found:
                return found
            time.sleep(0.5)
        raise AssertionError(f"{why} not exported within {timeout}s")


@pytest.fixture
def slurm_jobs(
    slurm_cluster: SlurmCluster, slurm_receiver: OtlpReceiver, tmp_path: Path
) -> Iterator[SlurmJobs]:
    slurm_receiver.clear()
    slurm_cluster.wait_nodes_idle(120)  # the last test's job is gone; a lost node is back
    yield SlurmJobs(slurm_cluster, slurm_receiver, tmp_path)
    slurm_cluster.command("scancel", "--user=root", check=False)
    slurm_cluster.restart_lost_nodes()


def new_id() -> str:
    return uuid.uuid4().hex[:6]
