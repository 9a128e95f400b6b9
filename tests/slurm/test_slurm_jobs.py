"""torchrun jobs under a real Slurm cluster (two nodes, each a network namespace with its own host
name), submitted with the example's sbatch script; what the OTLP receiver got, per job."""

from __future__ import annotations

import datetime
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from elastic_otel.cli.otlp_json_reader import decode_line
from elastic_otel.model.trace_ids import job_salt, trace_id_for
from elastic_otel.names import attributes as A
from tests.slurm.conftest import SlurmJobs
from tests.support.jobs import ROOT
from tests.support.slurm_cluster import KILL_WAIT_S, NODES

pytestmark = pytest.mark.e2e

RDZV_SPANS = (A.SPAN_RDZV_JOIN, A.SPAN_RDZV_MEMBER)


def _agent_runs(jobs: SlurmJobs, job_id: str, count: int, timeout: float = 60) -> list[dict]:
    def runs() -> list[dict] | None:
        found = [s for s in jobs.spans(job_id) if s["name"] == A.SPAN_AGENT_RUN]
        return found if len(found) >= count else None

    return jobs.wait_for(runs, timeout, f"{count} agent.run spans of job {job_id}")  # type: ignore[return-value]


def test_a_two_node_job(slurm_jobs: SlurmJobs) -> None:
    jobs = slurm_jobs
    job_id = jobs.submit()
    job = jobs.cluster.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 180)
    assert job["JobState"] == "COMPLETED", (job, jobs.output(job_id))
    runs = _agent_runs(jobs, job_id, 2)
    spans, logs = jobs.spans(job_id), jobs.logs(job_id)
    # every record the receiver got in this test is this job's, and says so
    everything = jobs.receiver.spans() + jobs.receiver.logs() + jobs.receiver.metrics()
    assert everything
    assert {r["resource"].get("slurm.job.id") for r in everything} == {job_id}
    assert {r["resource"].get("slurm.job.restart_count") for r in everything} == {0}
    assert {r["resource"].get("slurm.cluster.name") for r in everything} == {"eotest"}
    # both nodes, by their own host names, with Slurm's node name beside it
    assert {s["resource"]["host.name"] for s in runs} == set(NODES)
    assert all(s["resource"]["slurm.node.name"] == s["resource"]["host.name"] for s in spans)
    assert {s["status_code"] for s in runs} == {"OK"}, runs
    # one trace per rendezvous round, the trace id salted by the Slurm job id
    traces: dict[object, set[str]] = defaultdict(set)
    hosts: dict[object, set[str]] = defaultdict(set)
    for span in spans:
        if span["name"] in RDZV_SPANS:
            traces[span["attributes"][A.ROUND]].add(span["trace_id"])
            hosts[span["attributes"][A.ROUND]].add(span["resource"]["host.name"])
    assert list(traces) == [0] and hosts[0] == set(NODES), (traces, hosts)
    expected = trace_id_for(job_salt({"SLURM_JOB_ID": job_id}), job_id, 0)
    assert traces[0] == {f"{expected:032x}"}
    workers = [s for s in spans if s["name"] == A.SPAN_WORKER]
    assert len(workers) == 2 and {w["trace_id"] for w in workers} == traces[0]
    assert logs and all(r["resource"]["slurm.job.id"] == job_id for r in logs)


# --- how a job ends: requeue, time limit, scancel, a lost node -----------------------------------


def _training(jobs: SlurmJobs, job_id: str) -> None:
    """Wait until the job trains on both nodes: its first checkpoint is written."""
    jobs.wait_for(lambda: (jobs.tmp_path / "checkpoint").exists(), 120, f"job {job_id} training")


def _snapshot_exported(jobs: SlurmJobs, job_id: str) -> None:
    """Wait for an open-span snapshot of the job (``_assert_ended_by_sigterm`` checks that the
    spans it showed open were exported ended): on a loaded machine the first checkpoint can
    come before the first snapshot."""
    snapshot = lambda: any(r["attributes"].get(A.PARTIAL_EVENT) for r in jobs.logs(job_id))  # noqa: E731
    jobs.wait_for(snapshot, 60, f"job {job_id}: an open-span snapshot")


def _attempt(record: dict) -> object:
    return record["resource"].get("slurm.job.restart_count")


def _assert_ended_by_sigterm(
    jobs: SlurmJobs, job_id: str, attempt: int, before_ns: int
) -> list[dict]:
    """Both nodes' final records of ``attempt`` arrived, ended by Slurm's SIGTERM before its
    SIGKILL (``before_ns``), with the workers TERMINATED, not ERROR; every span a snapshot showed
    open was exported ended. The attempt's ``agent.run`` spans."""
    runs = [s for s in _agent_runs(jobs, job_id, 2 * (attempt + 1)) if _attempt(s) == attempt]
    assert {s["resource"]["host.name"] for s in runs} == set(NODES), runs
    for run in runs:
        assert run["status_code"] == "ERROR", run
        assert "got signal: 15" in run["status_message"], run["status_message"]
        assert run["end_ns"] < before_ns, (run["end_ns"], before_ns)
    spans = [s for s in jobs.spans(job_id) if _attempt(s) == attempt]
    workers = [s for s in spans if s["name"] == A.SPAN_WORKER]
    assert {w["resource"]["host.name"] for w in workers} == set(NODES), workers
    for worker in workers:
        assert worker["attributes"][A.STATE] == "TERMINATED", worker
        assert worker["status_code"] != "ERROR", worker
        assert "SIGTERM" in worker["attributes"][A.END_REASON], worker
        assert worker["end_ns"] < before_ns
    ended = {s["span_id"] for s in spans}
    snapshotted = set()
    for record in jobs.logs(job_id):
        if _attempt(record) == attempt and record["attributes"].get(A.PARTIAL_EVENT):
            snapshotted |= {s["span_id"] for s in decode_line(record["body"])[0]}
    assert snapshotted, "no open-span snapshot: the job ended before one was taken"
    assert snapshotted <= ended, f"spans left open: {snapshotted - ended}"
    return runs


def _slurm_time_ns(value: str) -> int:
    """A time ``scontrol`` prints (the controller's local time, here UTC) in ns."""
    parsed = datetime.datetime.fromisoformat(value).replace(tzinfo=datetime.timezone.utc)
    return int(parsed.timestamp() * 1e9)


def test_a_requeued_job(slurm_jobs: SlurmJobs) -> None:
    jobs = slurm_jobs
    job_id = jobs.submit(STEPS="200", STEP_SECONDS="0.1")  # 20 s: the snapshot comes first
    _training(jobs, job_id)
    _snapshot_exported(jobs, job_id)
    requeued_ns = time.time_ns()
    jobs.cluster.command("scontrol", "requeue", job_id)
    job = jobs.cluster.wait_job(job_id, {"COMPLETED", "FAILED"}, 240)
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "1", (job, jobs.output(job_id))
    runs = _agent_runs(jobs, job_id, 4)
    # the first attempt: ended by the requeue's SIGTERM, before the SIGKILL
    _assert_ended_by_sigterm(jobs, job_id, 0, requeued_ns + KILL_WAIT_S * 10**9)
    # the second: traces of its own, salted by SLURM_RESTART_COUNT, and it succeeded
    spans = jobs.spans(job_id)
    traces = {a: {s["trace_id"] for s in spans if _attempt(s) == a} for a in (0, 1)}
    assert traces[0] and traces[1] and not traces[0] & traces[1], traces
    salt = job_salt({"SLURM_JOB_ID": job_id, "SLURM_RESTART_COUNT": "1"})
    assert f"{trace_id_for(salt, job_id, 0):032x}" in traces[1]
    second = [r for r in runs if _attempt(r) == 1]
    assert {r["status_code"] for r in second} == {"OK"}, second
    assert {r["resource"]["host.name"] for r in second} == set(NODES)
    assert min(s["start_ns"] for s in spans if _attempt(s) == 1) > requeued_ns
    # goodput: each attempt is accounted by its own agents, told apart by the requeue count
    gauges = [
        m for m in jobs.receiver.metrics()
        if m["name"] == "torchelastic.goodput" and m["resource"].get("slurm.job.id") == job_id
    ]  # fmt: skip
    assert {_attempt(m) for m in gauges} == {0, 1}, gauges
    summaries = [r for r in jobs.logs(job_id) if r["event_name"] == "torchelastic.goodput"]
    final = [r for r in summaries if r["attributes"].get("torchelastic.goodput.final")]
    # one summary per attempt: the requeue's SIGTERM ended the first (accounted then)
    assert sorted(_attempt(r) for r in final) == [0, 1], summaries
    first, second = sorted(final, key=_attempt)
    assert first["time_ns"] < requeued_ns + (KILL_WAIT_S + 1) * 10**9, first
    # the second accounts for its own agents alone, which started after the requeue
    wall = second["attributes"]["torchelastic.goodput.job.wall_seconds"]
    assert 0 < wall * 1e9 < second["time_ns"] - requeued_ns, (wall, requeued_ns)


def test_a_time_limit_mid_training(slurm_jobs: SlurmJobs) -> None:
    jobs = slurm_jobs
    job_id = jobs.submit("--time=1", STEPS="100000", STEP_SECONDS="0.1")
    _training(jobs, job_id)
    job = jobs.cluster.wait_job(job_id, {"TIMEOUT", "COMPLETED", "FAILED", "CANCELLED"}, 180)
    output = jobs.output(job_id)
    assert job["JobState"] == "TIMEOUT", (job, output)
    assert "DUE TO TIME LIMIT" in output  # Slurm's word: in its state and the job's output
    killed_ns = _slurm_time_ns(job["EndTime"]) + (KILL_WAIT_S + 1) * 10**9
    runs = _assert_ended_by_sigterm(jobs, job_id, 0, killed_ns)
    # what the bridge can know: a SIGTERM. Slurm 22.05 gives a job step no end time
    # (SLURM_JOB_END_TIME is 23.02's) and sends the same signals as scancel (docs/slurm.md).
    assert all("time limit" not in str(r["status_message"]).lower() for r in runs)


def test_scancel_mid_training(slurm_jobs: SlurmJobs) -> None:
    jobs = slurm_jobs
    job_id = jobs.submit(STEPS="100000", STEP_SECONDS="0.1")
    _training(jobs, job_id)
    _snapshot_exported(jobs, job_id)
    cancelled_ns = time.time_ns()
    jobs.cluster.command("scancel", job_id)
    job = jobs.cluster.wait_job(job_id, {"CANCELLED", "COMPLETED", "FAILED"}, 120)
    assert job["JobState"] == "CANCELLED", (job, jobs.output(job_id))
    assert "CANCELLED AT" in jobs.output(job_id)
    _assert_ended_by_sigterm(jobs, job_id, 0, cancelled_ns + KILL_WAIT_S * 10**9)


def test_a_lost_node(slurm_jobs: SlurmJobs) -> None:
    """One node's slurmd and everything of the job on it SIGKILLed, as a host is lost. An
    elastic job (``--nnodes=1:2``) whose allocation and step survive a node failure
    (``--no-kill``, to sbatch and srun) goes on alone on the other node."""
    jobs = slurm_jobs
    telemetry = jobs.tmp_path / "job.jsonl"
    job_id = jobs.submit(
        "--no-kill",
        "--no-requeue",
        SRUN_ARGS="--no-kill",
        STEPS="150",
        STEP_SECONDS="0.1",
        NNODES="1:2",
        MAX_RESTARTS="2",
        TORCHRUN_ARGS="--monitor-interval=0.5 --rdzv-conf=last_call_timeout=2",
        ELASTIC_OTEL_OPEN_SPAN_INTERVAL="1",
        OTEL_TRACES_EXPORTER="otlp,elastic_otel_file",
        OTEL_LOGS_EXPORTER="otlp,elastic_otel_file",
        ELASTIC_OTEL_OTLP_JSON_FILE=str(telemetry),
    )
    survivor, lost = NODES  # the first node hosts the rendezvous store: it stays

    def lost_node_running() -> int:
        """When a snapshot of the lost node's open spans first showed its worker (ns)."""
        return min(
            (
                r["time_ns"]
                for r in jobs.logs(job_id)
                if r["attributes"].get(A.PARTIAL_EVENT) == "heartbeat"
                and r["resource"]["host.name"] == lost
                and any(s["name"] == A.SPAN_WORKER for s in decode_line(r["body"])[0])
            ),
            default=0,
        )

    seen_ns = jobs.wait_for(lost_node_running, 90, f"a snapshot of {lost}'s running worker")
    checkpoint = jobs.tmp_path / "checkpoint"
    # and both train: a checkpoint written since then needed the lost node's rank in its
    # all_reduce (killed before gloo connected them, the survivor's worker would wait in
    # init_process_group for gloo's 30 minutes)
    jobs.wait_for(
        lambda: checkpoint.exists() and checkpoint.stat().st_mtime_ns > seen_ns,  # type: ignore[operator]
        60,
        "a checkpoint of both nodes",
    )
    assert jobs.cluster.kill_node(lost)
    job = jobs.cluster.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL"}, 240)
    output = jobs.output(job_id)
    assert job["JobState"] == "COMPLETED", (job, output)
    assert f"Node failure on {lost}" in output  # Slurm declared the node down meanwhile
    # the survivor's outcome: it went on alone and succeeded; the lost node never ended
    runs = _agent_runs(jobs, job_id, 1)
    assert [(r["resource"]["host.name"], r["status_code"]) for r in runs] == [(survivor, "OK")]
    assert runs[0]["attributes"][A.STATE] == "SUCCEEDED"
    # the lost host, named by its host name and Slurm node, in the last records it sent
    last = [r for r in jobs.logs(job_id) if r["resource"]["host.name"] == lost]
    assert last and {r["resource"]["slurm.node.name"] for r in last} == {lost}
    # and in the timeline: LOST in the round it was in; the job's last round succeeded alone
    timeline = subprocess.run(
        [sys.executable, "-m", "elastic_otel.cli", "timeline", str(telemetry)],
        capture_output=True, text=True, timeout=60, cwd=str(ROOT),
    )  # fmt: skip
    assert timeline.returncode == 0, timeline.stderr
    rounds = timeline.stdout.split("\nROUND ")[1:]
    lost_rows = [line.strip() for r in rounds for line in r.splitlines() if "LOST: " in line]
    assert lost_rows, timeline.stdout  # the node rows: "eo-n2 pid N ... LOST: never ended ..."
    assert all(row.startswith(f"{lost} pid") for row in lost_rows), timeline.stdout
    assert "job succeeded" in rounds[-1].splitlines()[0], timeline.stdout
    assert "1 node lost" in timeline.stdout
