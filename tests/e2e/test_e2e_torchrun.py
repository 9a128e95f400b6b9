"""End to end: real torchrun jobs on localhost (c10d, gloo, CPU) exporting to a real OTLP receiver.

The training script (examples/train.py) does not import elastic_otel: the bridge is activated
by ``--event-log-handler otel`` alone (zero-code activation through torchrun's entry points).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from tests.support.jobs import job_env, run_job, span_attr, start_agent
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e


def rdzv_logs(receiver: OtlpReceiver) -> list[dict]:
    return [r for r in receiver.logs() if r["attributes"].get(A.EVENT_SOURCE) == "RENDEZVOUS"]


def assert_two_agent_logs(receiver: OtlpReceiver, run_id: str) -> None:
    logs = receiver.logs()
    assert logs, "no log records arrived"
    agent_logs = [r for r in logs if r["attributes"].get(A.EVENT_SOURCE) in ("AGENT", "WORKER")]
    rdzv = rdzv_logs(receiver)
    assert {r["attributes"][A.RUN_ID] for r in agent_logs + rdzv} == {run_id}
    # agent events of both agents: each node's rank on its RENDEZVOUS/START/SUCCEEDED events
    starts = [r for r in agent_logs if r["body"] == "torchelastic.worker.status.START"]
    assert {r["attributes"][A.GLOBAL_RANK] for r in starts} == {0, 1}
    assert {r["attributes"][A.RANK] for r in starts} == {0, 1}
    succeeded = [r for r in agent_logs if r["body"] == "torchelastic.worker.status.SUCCEEDED"]
    assert {r["attributes"].get(A.RANK) for r in succeeded} == {0, 1}
    # rendezvous events of both agents, with node state and (on the join) the rank
    assert len({(r["attributes"][A.HOST_NAME], r["attributes"][A.PROCESS_PID]) for r in rdzv}) >= 2
    assert {r["attributes"][A.NODE_STATE] for r in rdzv} >= {"RUNNING", "SUCCEEDED"}
    joined = [r for r in rdzv if r["attributes"].get(A.RDZV_ACTION) == "joined"]
    assert sorted(r["attributes"][A.RANK] for r in joined) == [0, 1]
    assert all(r["severity_text"] == "INFO" for r in joined)
    # every log record carries the trace and span id of a span that was exported
    span_ids = {(s["trace_id"], s["span_id"]) for s in receiver.spans()}
    linked = [r for r in rdzv + agent_logs if r["trace_id"]]
    assert len(linked) >= len(rdzv + agent_logs) - 2  # the store set-up precedes any span
    assert all((r["trace_id"], r["span_id"]) in span_ids for r in linked)


def assert_two_agent_trace(receiver: OtlpReceiver) -> None:
    spans = receiver.spans()
    joins = [s for s in spans if s["name"] == A.SPAN_RDZV_JOIN]
    assert len(joins) == 2
    assert len({s["trace_id"] for s in joins}) == 1, "both nodes' joins share one trace"
    assert sorted(span_attr(s, A.RANK) for s in joins) == [0, 1]
    assert all(s["status_code"] == "OK" for s in joins)
    assert all(span_attr(s, A.WORLD_SIZE) == 2 for s in joins)
    workers = [s for s in spans if s["name"] == A.SPAN_WORKER]
    assert sorted(span_attr(s, A.GLOBAL_RANK) for s in workers) == [0, 1]
    assert {span_attr(s, A.STATE) for s in workers} == {"SUCCEEDED"}
    assert {s["trace_id"] for s in workers} == {joins[0]["trace_id"]}
    assert all(s["resource"]["service.name"] == "torchelastic" for s in spans)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_two_agents_export_logs_and_traces(protocol: str, tmp_path: Path) -> None:
    with OtlpReceiver(protocol) as receiver:
        run_id = f"e2e-{protocol}-{uuid.uuid4().hex[:4]}"
        results = run_job(job_env(receiver, tmp_path), run_id=run_id)
        assert [rc for rc, _ in results] == [0, 0], results
        receiver.wait_for_spans(6, timeout=10)
        assert_two_agent_logs(receiver, run_id)
        assert_two_agent_trace(receiver)


def test_worker_failure_and_restart_are_visible(grpc_receiver: OtlpReceiver, tmp_path) -> None:
    env = job_env(grpc_receiver, tmp_path, TRAIN_FAIL_RANK="1")
    results = run_job(env, extra_args=("--max-restarts=1",))
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
    spans = grpc_receiver.wait_for_spans(10, timeout=10)
    joins = [s for s in spans if s["name"] == A.SPAN_RDZV_JOIN]
    rounds: dict[int, set[str]] = defaultdict(set)
    for s in joins:
        rounds[span_attr(s, A.ROUND)].add(s["trace_id"])
    assert sorted(rounds) == [0, 1] and all(len(v) == 1 for v in rounds.values())
    workers = [s for s in spans if s["name"] == A.SPAN_WORKER]
    first = [w for w in workers if w["trace_id"] in rounds[0]]
    second = [w for w in workers if w["trace_id"] in rounds[1]]
    assert len(first) + len(second) == len(workers) == 4
    assert {span_attr(w, A.GLOBAL_RANK) for w in second} == {0, 1}
    assert {span_attr(w, A.STATE) for w in second} == {"SUCCEEDED"}
    # the agent whose worker failed used its one restart; the other either re-joined for the new
    # round (RESTARTED) or, when its worker died on the broken collective first, restarted too
    restarts = {span_attr(w, A.GLOBAL_RANK): span_attr(w, A.AGENT_RESTARTS) for w in second}
    assert restarts[1] == 1 and restarts[0] in (0, 1)
    # the failed rank's span says so when its agent saw it (not REPLACED at the restart)
    (failed,) = [w for w in first if span_attr(w, A.GLOBAL_RANK) == 1]
    assert failed["status_code"] == "ERROR" and span_attr(failed, A.STATE) == "FAILED"
    assert span_attr(failed, A.EXIT_CODE) == 1
    # rank 0 died of it on the broken collective, or was stopped for the new round: a victim
    (healthy,) = [w for w in first if span_attr(w, A.GLOBAL_RANK) == 0]
    assert span_attr(healthy, A.STATE) in ("PEER_FAILED", "STOPPED")
    assert healthy["status_code"] != "ERROR"
    agents = [s for s in spans if s["name"] == "agent.run"]
    assert len(agents) == 2 and {a["status_code"] for a in agents} == {"OK"}


def test_rendezvous_timeout_is_an_error_span(grpc_receiver: OtlpReceiver, tmp_path) -> None:
    env = job_env(grpc_receiver, tmp_path)
    timeout_s = 4
    agent = start_agent(
        env,
        free_port(),
        f"lonely-{uuid.uuid4().hex[:4]}",
        extra_args=(f"--rdzv-conf=join_timeout={timeout_s}",),
    )
    rc, _out = agent.wait()
    assert rc != 0
    (join,) = grpc_receiver.wait_for_spans(
        1, timeout=10, where=lambda s: s["name"] == A.SPAN_RDZV_JOIN
    )
    assert join["status_code"] == "ERROR"
    assert "RendezvousTimeoutError" in join["status_message"]
    exc = [e for e in join["events"] if e["name"] == "exception"]
    assert exc and exc[0]["attributes"][A.EXCEPTION_TYPE] == "RendezvousTimeoutError"
    duration = (join["end_ns"] - join["start_ns"]) / 1e9
    assert timeout_s - 0.5 <= duration <= timeout_s + 3, duration
    failed_logs = [r for r in rdzv_logs(grpc_receiver) if r["severity_text"] == "ERROR"]
    assert failed_logs and failed_logs[0]["attributes"][A.NODE_STATE] == "FAILED"
    assert failed_logs[0]["trace_id"] == join["trace_id"]


def test_scale_up_late_node_joins_later_round(grpc_receiver: OtlpReceiver, tmp_path) -> None:
    env = job_env(grpc_receiver, tmp_path, TRAIN_WAIT_FOR_WORLD="2")
    port, run_id = free_port(), f"scale-{uuid.uuid4().hex[:4]}"
    conf = ("--rdzv-conf=last_call_timeout=1",)
    first = start_agent(env, port, run_id, nnodes="1:2", extra_args=conf)
    grpc_receiver.wait_for_spans(1, timeout=60, where=lambda s: s["name"] == A.SPAN_RDZV_JOIN)
    time.sleep(1.0)
    second = start_agent(env, port, run_id, nnodes="1:2", extra_args=conf)
    (rc1, out1), (rc2, out2) = first.wait(), second.wait()
    assert (rc1, rc2) == (0, 0), out1[-3000:] + out2[-3000:]
    joins = grpc_receiver.wait_for_spans(
        3, timeout=10, where=lambda s: s["name"] == A.SPAN_RDZV_JOIN
    )
    by_round: dict[int, list[dict]] = defaultdict(list)
    for s in joins:
        by_round[span_attr(s, A.ROUND)].append(s)
    first_round = min(by_round)
    assert [span_attr(s, A.WORLD_SIZE) for s in by_round[first_round]] == [1]
    late_round = max(by_round)
    assert late_round > first_round
    assert sorted(span_attr(s, A.WORLD_SIZE) for s in by_round[late_round]) == [2, 2]
    assert len({s["trace_id"] for s in by_round[late_round]}) == 1
    pids = {span_attr(s, A.PROCESS_PID) for s in by_round[late_round]}
    assert len(pids) == 2, "the late node is in the later round"


def _single_node_join_trace(receiver: OtlpReceiver, tmp_path: Path, salt: str) -> str:
    receiver.clear()
    env = job_env(receiver, tmp_path, ELASTIC_OTEL_JOB_ID=salt)
    agent = start_agent(env, free_port(), "none", nnodes="1")
    rc, out = agent.wait()
    assert rc == 0, out[-3000:]
    (join,) = receiver.wait_for_spans(1, where=lambda s: s["name"] == A.SPAN_RDZV_JOIN)
    return join["trace_id"]


def test_jobs_sharing_run_id_none_get_different_traces(grpc_receiver, tmp_path) -> None:
    a = _single_node_join_trace(grpc_receiver, tmp_path, "slurm-1001")
    b = _single_node_join_trace(grpc_receiver, tmp_path, "slurm-1002")
    assert a != b


def test_unreachable_collector_bounds_exit(tmp_path: Path) -> None:
    """A short script that records events to an unreachable collector exits promptly."""
    script = tmp_path / "record.py"
    script.write_text(
        "import elastic_otel\n"
        "from torch.distributed.elastic import events\n"
        "elastic_otel.register()\n"
        "for i in range(200):\n"
        "    events.record(events.Event(f'e{i}', events.EventSource.AGENT), 'otel')\n"
    )

    def timed(extra: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
        env = job_env(
            None, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}", **extra
        )
        t0 = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
        )
        return time.monotonic() - t0, done

    baseline, _ = timed({"OTEL_SDK_DISABLED": "true"})
    elapsed, done = timed({})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    # the documented bound is 2 s (ELASTIC_OTEL_EXIT_TIMEOUT); generous for a noisy machine
    assert elapsed - baseline < 5.0, (elapsed, baseline)
