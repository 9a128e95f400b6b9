"""torchrun jobs under a real Slurm cluster (two nodes, each a network namespace with its own host
name), submitted with the example's sbatch script; what the OTLP receiver got, per job."""

from __future__ import annotations

from collections import defaultdict

import pytest

from elastic_otel.model.trace_ids import job_salt, trace_id_for
from elastic_otel.names import attributes as A
from tests.slurm.conftest import SlurmJobs
from tests.support.slurm_cluster import NODES

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
