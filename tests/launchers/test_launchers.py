"""The bridge under the launchers that end in torch's elastic agent (issue 43): the same two-rank
DDP job (gloo, tests/scripts/launcher_train.py: global rank 1 raises at step 3 while rank 0 waits
in DDP's all-reduce) started by ``torchrun --event-log-handler otel`` and by each launcher, with
the one setting docs/launchers.md gives for it, must export the same traces and name the same
root cause: the round's trace with one worker span per rank, rank 1 the root cause with the same
``error.type`` and exit code, the agent's run failed with the same status, and the same root-cause
line in ``elastic-otel timeline``.

Each job runs once (module fixtures) and exports to a receiver of its own. Two settings that once
needed a workaround are checked with the handler alone: TorchX, whose component sets
``LOGLEVEL=WARNING``, and ``elastic_launch``, whose handler only its ``LaunchConfig`` names. NVIDIA
resiliency-ext's ``ft_launcher`` (0.4.1, its own copy of torch 2.3's agent) is one of the
launchers with ``PET_EVENT_LOG_HANDLER=otel``; beside it, a job that succeeds with
``ELASTIC_OTEL_ENABLED=true``, a hung rank named, and a job without either setting that exports
nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.model.stalls import STALL_EVENT_NAME
from elastic_otel.names import attributes as A
from tests.support.jobs import LIGHT, SCRIPTS, TORCHRUN, job_env, span_attr
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
SCRIPT = str(SCRIPTS / "launcher_train.py")
ACCELERATE_CONFIG = str(HERE / "accelerate_config.yaml")
BIN = Path(sys.executable).parent  # the venv's launchers: accelerate, torchx, ft_launcher
NODE_ARGS = ("--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d", "--monitor-interval=0.5")
JOB_TIMEOUT_S = 150
LAUNCHER_MODULES = ("accelerate", "torchx", "nvidia_resiliency_ext", "lightning_fabric")

# How a job's command is made from its rendezvous endpoint and run id.
Command = Callable[[str, str], list[str]]


@dataclass
class LaunchedJob:
    """What one launcher's job left: its exit status and output, and what it exported."""

    command: list[str]
    returncode: int
    output: str
    spans: list[dict]
    logs: list[dict]

    def named(self, name: str) -> list[dict]:
        return [s for s in self.spans if s["name"] == name]

    def root_cause_line(self) -> str:
        """``elastic-otel timeline``'s root-cause line, without its time."""
        text = render_text(build_timeline(self.spans, self.logs))
        lines = [line.strip() for line in text.splitlines() if "ROOT CAUSE at" in line]
        assert len(lines) == 1, text
        return re.sub(r"^ROOT CAUSE at \S+: ", "", lines[0])

    def __str__(self) -> str:  # what a failed assertion prints
        names = sorted({s["name"] for s in self.spans})
        return (
            f"{' '.join(self.command)}\nrc {self.returncode}, spans {names}\n{self.output[-3000:]}"
        )


def launcher_env(receiver: OtlpReceiver, tmp_path: Path, **env: str) -> dict[str, str]:
    """The tests' job environment with ``env``, the venv's launchers first on ``PATH``."""
    environ = job_env(receiver, tmp_path, **env)
    environ.pop("LOGLEVEL", None)  # torch's event loggers take their level from it
    environ["PATH"] = os.pathsep.join((str(BIN), environ.get("PATH", "")))
    return environ


def launch(
    tmp_path: Path, command: Command, wait_for_workers: bool = True, **env: str
) -> LaunchedJob:
    """Run one job (``FAIL_RANK=1``, ``FAIL_HOW=raise``) to its end, exporting to a receiver of
    its own; ``env`` on top of the tests' job environment (no ``OTEL_*``, ``PET_*`` or
    ``ELASTIC_OTEL_*`` from this process)."""
    with OtlpReceiver("grpc") as receiver:
        environ = launcher_env(receiver, tmp_path, **{"FAIL_RANK": "1", "FAIL_HOW": "raise", **env})
        cmd = command(f"127.0.0.1:{free_port()}", f"launch-{uuid.uuid4().hex[:6]}")
        out = tmp_path / "output.txt"
        with out.open("w") as sink:  # a file: workers in sessions of their own keep no pipe open
            done = subprocess.run(
                cmd, env=environ, stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path,
                timeout=JOB_TIMEOUT_S,
            )  # fmt: skip
        output = out.read_text(errors="replace")
        if wait_for_workers:  # exported before the launcher exits; the wait is a safety margin
            receiver.wait_for_spans(2, 15, lambda s: s["name"] == A.SPAN_WORKER)
        return LaunchedJob(cmd, done.returncode, output, receiver.spans(), receiver.logs())


def torchrun_command(endpoint: str, run_id: str) -> list[str]:
    return [
        TORCHRUN, *NODE_ARGS, f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
        "--event-log-handler", "otel", SCRIPT,
    ]  # fmt: skip


def module_run_command(endpoint: str, run_id: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", *NODE_ARGS,
        f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", SCRIPT,
    ]  # fmt: skip


def accelerate_command(endpoint: str, run_id: str) -> list[str]:
    # --main_process_port: accelerate checks that port is free (else it switches to torchrun's
    # --standalone); the c10d store listens on the endpoint that PET_RDZV_ENDPOINT names.
    return [
        str(BIN / "accelerate"), "launch", "--config_file", ACCELERATE_CONFIG,
        "--rdzv_backend", "c10d", "--main_process_port", str(free_port()), SCRIPT,
    ]  # fmt: skip


def torchx_command(env: str) -> Command:
    def command(endpoint: str, run_id: str) -> list[str]:
        # dist.ddp builds `torchrun --rdzv_endpoint localhost:0 --rdzv_id <app id> ...` itself
        return [
            str(BIN / "torchx"), "run", "-s", "local_cwd", "dist.ddp", "-j", "1x2",
            "--env", env, "--script", SCRIPT,
        ]  # fmt: skip

    return command


ELASTIC_LAUNCH = """
    import sys
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=2, run_id={run_id!r}, rdzv_backend="c10d",
        rdzv_endpoint={endpoint!r}, max_restarts=0, monitor_interval=0.5,
        event_log_handler="otel",
    )
    elastic_launch(config, sys.executable)(sys.argv[1])
"""


def elastic_launch_command(endpoint: str, run_id: str) -> list[str]:
    source = textwrap.dedent(ELASTIC_LAUNCH.format(run_id=run_id, endpoint=endpoint))
    return [sys.executable, "-c", source, SCRIPT]


def ft_launcher_command(endpoint: str, run_id: str) -> list[str]:
    return [
        str(BIN / "ft_launcher"), *NODE_ARGS, f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}", SCRIPT,
    ]  # fmt: skip


def fabric_command(endpoint: str, run_id: str) -> list[str]:
    # Fabric picks torch's static rendezvous on its --main-port; the endpoint is not used
    return [
        str(BIN / "fabric"), "run", "--accelerator=cpu", "--devices=2",
        f"--main-port={free_port()}", SCRIPT,
    ]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _launchers_installed() -> None:
    missing = [m for m in LAUNCHER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(
            f"ELASTIC_OTEL_LAUNCHER_TESTS=1 but {missing} not installed: "
            "pip install torch==2.13.0 -e '.[torch,test,launchers,frameworks]'"
        )


# --- the jobs, each run once ------------------------------------------------------------------


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory: pytest.TempPathFactory) -> LaunchedJob:
    """The baseline: ``torchrun --event-log-handler otel``."""
    return launch(tmp_path_factory.mktemp("torchrun"), torchrun_command)


@pytest.fixture(scope="module")
def module_run_job(tmp_path_factory: pytest.TempPathFactory) -> LaunchedJob:
    """``python -m torch.distributed.run``, the handler from ``PET_EVENT_LOG_HANDLER``."""
    return launch(
        tmp_path_factory.mktemp("module_run"), module_run_command, PET_EVENT_LOG_HANDLER="otel"
    )


@pytest.fixture(scope="module")
def accelerate_job(tmp_path_factory: pytest.TempPathFactory) -> LaunchedJob:
    """``accelerate launch``: torch's parser, run inside accelerate's process, reads
    ``PET_EVENT_LOG_HANDLER`` (accelerate copies only its own options over torchrun's)."""
    tmp = tmp_path_factory.mktemp("accelerate")
    return launch(
        tmp,
        accelerate_command,
        PET_EVENT_LOG_HANDLER="otel",
        # this test's free port and run id; alone on a machine, torchrun's defaults would do
        PET_RDZV_ENDPOINT=f"127.0.0.1:{free_port()}",
        PET_RDZV_ID=f"accelerate-{uuid.uuid4().hex[:6]}",
    )


@pytest.fixture(scope="module")
def torchx_job(tmp_path_factory: pytest.TempPathFactory) -> LaunchedJob:
    """``torchx run -s local_cwd dist.ddp``, the handler alone through the component's
    ``--env``: the component sets ``LOGLEVEL=WARNING`` (``launch`` leaves ``LOGLEVEL`` unset)."""
    command = torchx_command("PET_EVENT_LOG_HANDLER=otel")
    return launch(tmp_path_factory.mktemp("torchx"), command)


@pytest.fixture(scope="module")
def elastic_launch_job(tmp_path_factory: pytest.TempPathFactory) -> LaunchedJob:
    """torch's ``elastic_launch`` from Python, ``LaunchConfig(event_log_handler="otel")`` alone:
    nothing on the command line or in the environment asks for the bridge."""
    return launch(tmp_path_factory.mktemp("elastic_launch"), elastic_launch_command)


@pytest.fixture(scope="module")
def ft_launcher_job(tmp_path_factory: pytest.TempPathFactory) -> LaunchedJob:
    """NVRx's ``ft_launcher`` with the handler from ``PET_EVENT_LOG_HANDLER`` (it has no
    ``--event-log-handler`` option: it rejects one)."""
    tmp = tmp_path_factory.mktemp("ft_launcher")
    return launch(tmp, ft_launcher_command, PET_EVENT_LOG_HANDLER="otel")


@pytest.fixture(scope="module")
def fabric_job(tmp_path_factory: pytest.TempPathFactory) -> LaunchedJob:
    """Lightning's ``fabric run``, the handler from ``PET_EVENT_LOG_HANDLER``."""
    return launch(tmp_path_factory.mktemp("fabric"), fabric_command, PET_EVENT_LOG_HANDLER="otel")


LAUNCHERS = {
    "torchrun": "torchrun_job",
    "python -m torch.distributed.run": "module_run_job",
    "accelerate launch": "accelerate_job",
    "torchx dist.ddp": "torchx_job",
    "elastic_launch": "elastic_launch_job",
    "ft_launcher": "ft_launcher_job",
}


@pytest.fixture(params=list(LAUNCHERS))
def job(request: pytest.FixtureRequest) -> LaunchedJob:
    return request.getfixturevalue(LAUNCHERS[request.param])


# --- what a user reads --------------------------------------------------------------------------


def root_cause(job: LaunchedJob) -> dict[str, object]:
    """The one ERROR worker span: who failed first, and how."""
    errors = [w for w in job.named(A.SPAN_WORKER) if w["status_code"] == "ERROR"]
    assert len(errors) == 1, job
    (culprit,) = errors
    return {
        "rank": span_attr(culprit, A.GLOBAL_RANK),
        "status": culprit["status_message"],
        "state": span_attr(culprit, A.STATE),
        "kind": span_attr(culprit, A.FAILURE_KIND),
        A.ERROR_TYPE: span_attr(culprit, A.ERROR_TYPE),
        A.PROCESS_EXIT_CODE: span_attr(culprit, A.PROCESS_EXIT_CODE),
    }


def agent_outcome(job: LaunchedJob) -> dict[str, object]:
    runs = job.named(A.SPAN_AGENT_RUN)
    assert len(runs) == 1, job
    (run,) = runs
    return {
        "status": (run["status_code"], run["status_message"]),
        A.ERROR_TYPE: span_attr(run, A.ERROR_TYPE),
        A.PROCESS_EXIT_CODE: span_attr(run, A.PROCESS_EXIT_CODE),
    }


def round_trace(job: LaunchedJob) -> str:
    """The trace id of round 0, the job's only round."""
    joins = job.named(A.SPAN_RDZV_JOIN)
    assert [span_attr(j, A.ROUND) for j in joins] == [0], job
    return str(joins[0]["trace_id"])


# --- the same as torchrun -----------------------------------------------------------------------


def test_the_launcher_fails_as_torchrun_does(job: LaunchedJob, torchrun_job: LaunchedJob) -> None:
    """The launcher ran the workers and failed with the job: rank 1's exception in its output,
    torchrun's exit status (1)."""
    assert "injected failure: the loss is NaN" in job.output, job
    assert job.returncode == torchrun_job.returncode == 1, job


def test_the_same_root_cause_as_torchrun(job: LaunchedJob, torchrun_job: LaunchedJob) -> None:
    baseline = root_cause(torchrun_job)
    assert baseline["rank"] == 1 and baseline["kind"] == A.KIND_ROOT_CAUSE, baseline
    assert baseline[A.ERROR_TYPE] == "RuntimeError" and baseline[A.PROCESS_EXIT_CODE] == 1
    assert root_cause(job) == baseline, job
    assert agent_outcome(job) == agent_outcome(torchrun_job), job
    assert job.root_cause_line() == torchrun_job.root_cause_line()


def test_worker_spans_per_rank_under_the_rounds_trace(
    job: LaunchedJob, torchrun_job: LaunchedJob
) -> None:
    """One worker span per rank, in the trace of the round, under this node's member span; the
    victim (rank 0) is no error and links to the root cause; the same span names as torchrun's."""
    trace = round_trace(job)
    members = {s["span_id"] for s in job.named(A.SPAN_RDZV_MEMBER) if s["trace_id"] == trace}
    workers = {span_attr(w, A.GLOBAL_RANK): w for w in job.named(A.SPAN_WORKER)}
    assert sorted(workers) == [0, 1] and len(job.named(A.SPAN_WORKER)) == 2, job
    for worker in workers.values():
        assert worker["trace_id"] == trace, job
        assert worker["parent_span_id"] in members, job
    victim = workers[0]
    assert victim["status_code"] != "ERROR" and span_attr(victim, A.ERROR_TYPE) is None, victim
    # it failed in its collective, or was stopped by its agent (in the stop phase: no kind)
    assert span_attr(victim, A.STATE) in ("PEER_FAILED", "STOPPED"), victim
    assert span_attr(victim, A.FAILURE_KIND) in (A.KIND_PEER_FAILURE, A.KIND_STOPPED, None)
    assert [link["span_id"] for link in victim["links"]] == [workers[1]["span_id"]]
    assert {s["name"] for s in job.spans} == {s["name"] for s in torchrun_job.spans}, job


# --- the settings that once needed a workaround --------------------------------------------------


def test_torchx_with_the_handler_alone_exports_the_rounds_trace(
    torchx_job: LaunchedJob, torchrun_job: LaunchedJob
) -> None:
    """TorchX's ``dist`` components set ``LOGLEVEL=WARNING``, at which torch's event loggers
    would drop torch's events (all at INFO) before any handler: the bridge still gets them (the
    rendezvous and ``agent.run`` spans torchrun's job has), and torch prints no INFO line."""
    job = torchx_job
    assert {s["name"] for s in job.spans} == {s["name"] for s in torchrun_job.spans}, job
    assert {A.SPAN_RDZV_JOIN, A.SPAN_AGENT_RUN} <= {s["name"] for s in job.spans}, job
    assert agent_outcome(job) == agent_outcome(torchrun_job), job
    assert "Starting elastic_operator" not in job.output, job  # torch's launcher INFO line


def test_elastic_launch_with_the_handler_alone_names_the_root_cause(
    elastic_launch_job: LaunchedJob, torchrun_job: LaunchedJob
) -> None:
    """``LaunchConfig(event_log_handler="otel")`` activates the bridge when torch's agent starts
    to run: its instrumentation names the root cause (not both ranks), and the round is traced."""
    job = elastic_launch_job
    assert root_cause(job) == root_cause(torchrun_job), job
    assert job.named(A.SPAN_RDZV_JOIN) and job.named(A.SPAN_AGENT_RUN), job


ACTIVATED_BY = """
    import json, os, sys, uuid
    from torch.distributed.elastic.events import handlers
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    from elastic_otel.integration.agent_instrumentation import AgentInstrumentation

    script, *ports = sys.argv[1:]

    def activated_by(handler):
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=1, run_id=uuid.uuid4().hex,
            rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:" + ports.pop(), max_restarts=0,
            monitor_interval=0.5, event_log_handler=handler,
        )
        elastic_launch(config, sys.executable)(script)
        routed = type(handlers._log_handlers["dynamic_rendezvous"]).__name__ != "NullHandler"
        return routed or AgentInstrumentation.installed() is not None

    activated = {"null": activated_by("null")}
    os.environ["ELASTIC_OTEL_ENABLED"] = "false"
    activated["otel, ELASTIC_OTEL_ENABLED=false"] = activated_by("otel")
    del os.environ["ELASTIC_OTEL_ENABLED"]
    activated["otel"] = activated_by("otel")
    print(json.dumps(activated))
"""


def test_elastic_launch_activates_only_when_its_config_asks(tmp_path: Path) -> None:
    """The rule (docs/architecture.md, How activation works): an agent started through torch's
    launcher API activates the bridge when its config names the ``otel`` handler, unless
    ``ELASTIC_OTEL_ENABLED=false``; with torch's default handler (``null``) the bridge stays
    off. Three agents in one process, in that order (activation is one-way), with one light
    worker each; activated: the rendezvous routed to the bridge or the agent instrumented."""
    environ = job_env(
        None, tmp_path, OTEL_TRACES_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
    )  # fmt: skip
    ports = [str(free_port()) for _ in range(3)]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ACTIVATED_BY), str(LIGHT), *ports], env=environ,
        capture_output=True, text=True, cwd=tmp_path, timeout=JOB_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "null": False,
        "otel, ELASTIC_OTEL_ENABLED=false": False,
        "otel": True,
    }


def test_fabric_run_names_the_root_cause_as_torchrun(
    fabric_job: LaunchedJob, torchrun_job: LaunchedJob
) -> None:
    """``fabric run`` calls torch's ``torch.distributed.run.main`` in its own process, on
    torch's static rendezvous (which records no event: no ``rendezvous.*`` span): the same
    root cause, agent outcome and root-cause line as torchrun's, a worker span per rank."""
    job = fabric_job
    assert job.returncode == 1, job
    assert root_cause(job) == root_cause(torchrun_job), job
    assert agent_outcome(job) == agent_outcome(torchrun_job), job
    assert job.root_cause_line() == torchrun_job.root_cause_line()
    assert sorted(span_attr(w, A.GLOBAL_RANK) for w in job.named(A.SPAN_WORKER)) == [0, 1], job
    assert not job.named(A.SPAN_RDZV_JOIN), job


# --- ft_launcher beyond the failing job -----------------------------------------------------------


def test_ft_launcher_without_the_setting_exports_nothing(tmp_path: Path) -> None:
    """Neither ``ELASTIC_OTEL_ENABLED`` nor ``PET_EVENT_LOG_HANDLER``: the job runs and fails as
    it does without the bridge installed, and nothing is exported."""
    job = launch(tmp_path, ft_launcher_command, wait_for_workers=False)
    assert job.returncode == 1, job
    assert "injected failure: the loss is NaN" in job.output, job
    assert job.spans == [] and job.logs == [], job


def test_ft_launcher_happy_job_with_elastic_otel_enabled(tmp_path: Path) -> None:
    """``ELASTIC_OTEL_ENABLED=true`` alone, no rank failing: the round, the agent's run
    succeeded, and a worker span per rank that succeeded, under the round's trace."""
    job = launch(tmp_path, ft_launcher_command, FAIL_RANK="-1", ELASTIC_OTEL_ENABLED="true")
    assert job.returncode == 0, job
    trace = round_trace(job)
    (run,) = job.named(A.SPAN_AGENT_RUN)
    assert run["status_code"] != "ERROR" and span_attr(run, A.STATE) == "SUCCEEDED", run
    workers = {span_attr(w, A.GLOBAL_RANK): w for w in job.named(A.SPAN_WORKER)}
    assert sorted(workers) == [0, 1], job
    for worker in workers.values():
        assert span_attr(worker, A.STATE) == "SUCCEEDED" and worker["trace_id"] == trace, worker
    assert {A.SPAN_AGENT_RENDEZVOUS, A.SPAN_AGENT_START_WORKERS} <= {s["name"] for s in job.spans}


def test_ft_launcher_names_the_hung_rank(tmp_path: Path) -> None:
    """Global rank 1 sleeps at step 3 while rank 0 waits for it in DDP's all-reduce: a stall
    report names rank 1 as the one waited for, as under torchrun (an earlier report may name
    none yet, as tests/multinode/test_hangs_ddp.py allows too); then the job is ended as an
    operator would (SIGTERM)."""
    with OtlpReceiver("grpc") as receiver:
        environ = launcher_env(
            receiver, tmp_path, FAIL_RANK="1", FAIL_HOW="hang", PET_EVENT_LOG_HANDLER="otel",
            ELASTIC_OTEL_STALL_AFTER="3",
        )  # fmt: skip
        cmd = ft_launcher_command(f"127.0.0.1:{free_port()}", f"hang-{uuid.uuid4().hex[:6]}")
        with (tmp_path / "output.txt").open("w") as sink:
            proc = subprocess.Popen(
                cmd, env=environ, stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path,
                start_new_session=True,
            )  # fmt: skip
            try:
                # the first report may come before the late rank is named
                receiver.wait_for_logs(
                    1,
                    90,
                    lambda r: (
                        r["event_name"] == STALL_EVENT_NAME
                        and r["attributes"].get(A.STALLED_RANKS) is not None
                    ),
                )
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        stalls = [r for r in receiver.logs() if r["event_name"] == STALL_EVENT_NAME]
    output = (tmp_path / "output.txt").read_text(errors="replace")
    named = [r for r in stalls if r["attributes"].get(A.STALLED_RANKS) is not None]
    assert named, (stalls, output[-3000:])
    attrs = named[0]["attributes"]
    assert attrs[A.STALLED_IN] == "training", named[0]
    assert attrs[A.STALLED_RANKS] == [1] and attrs[A.STALLED_WAITING] == [0], named[0]
    assert attrs[A.STALLED_COLLECTIVE] == "all_reduce", named[0]
    assert "waiting for global rank 1" in named[0]["body"], named[0]["body"]
