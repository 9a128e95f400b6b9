"""End to end: real torchrun jobs on localhost (c10d, gloo, CPU) exporting to a real OTLP receiver.
A worker failure and the restart it causes: tests/multinode/test_root_cause.py, whose job fails four
times over.

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
from tests.support.jobs import LIGHT, job_env, span_attr, start_agent
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e


class Both:
    """What two receivers got, read as one."""

    def __init__(self, *receivers: OtlpReceiver) -> None:
        self.receivers = receivers

    def logs(self) -> list[dict]:
        return [r for receiver in self.receivers for r in receiver.logs()]

    def spans(self) -> list[dict]:
        return [s for receiver in self.receivers for s in receiver.spans()]


def rdzv_logs(receiver: OtlpReceiver | Both) -> list[dict]:
    return [r for r in receiver.logs() if r["attributes"].get(A.EVENT_SOURCE) == "RENDEZVOUS"]


def assert_two_agent_logs(receiver: OtlpReceiver | Both, run_id: str) -> None:
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


def assert_two_agent_trace(receiver: OtlpReceiver | Both) -> None:
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


def test_two_agents_export_logs_and_traces(tmp_path: Path) -> None:
    """One job, one agent exporting over OTLP/gRPC and the other over OTLP/HTTP: each protocol
    carries a whole node's logs and spans, and together they are the job's one trace."""
    with OtlpReceiver("grpc") as grpc, OtlpReceiver("http") as http:
        run_id, port = f"e2e-{uuid.uuid4().hex[:4]}", free_port()
        job_id = f"test-{uuid.uuid4().hex[:8]}"  # one job: the same id on both nodes
        agents = [
            start_agent(job_env(receiver, tmp_path, ELASTIC_OTEL_JOB_ID=job_id), port, run_id)
            for receiver in (grpc, http)
        ]
        results = [agent.wait() for agent in agents]
        assert [rc for rc, _ in results] == [0, 0], results
        for receiver in (grpc, http):
            for name in (A.SPAN_RDZV_JOIN, A.SPAN_WORKER, A.SPAN_AGENT_RUN):
                receiver.wait_for_spans(1, timeout=10, where=lambda s, n=name: s["name"] == n)
        both = Both(grpc, http)
        assert_two_agent_logs(both, run_id)
        assert_two_agent_trace(both)
        for receiver, agent in zip((grpc, http), agents, strict=True):
            # a whole node: its agent's and its worker's, over this protocol only
            records = receiver.logs()
            pids = {r["attributes"].get(A.PROCESS_PID) for r in rdzv_logs(receiver)}
            assert pids == {agent.proc.pid}, (receiver.protocol, pids)
            assert any(r["body"] == "torchelastic.worker.status.SUCCEEDED" for r in records)
            names = {s["name"] for s in receiver.spans()}
            assert {A.SPAN_RDZV_JOIN, A.SPAN_RDZV_MEMBER, A.SPAN_WORKER, A.SPAN_AGENT_RUN} <= names


def test_rendezvous_timeout_is_an_error_span(grpc_receiver: OtlpReceiver, tmp_path) -> None:
    """Under ``LOGLEVEL=WARNING`` (TorchX's default), at which torch's event loggers would drop
    every event (all recorded at INFO): the bridge still gets them (docs/architecture.md, How
    activation works), and torch prints none of its INFO lines."""
    env = job_env(grpc_receiver, tmp_path, LOGLEVEL="WARNING")
    timeout_s = 4
    agent = start_agent(
        env,
        free_port(),
        f"lonely-{uuid.uuid4().hex[:4]}",
        extra_args=(f"--rdzv-conf=join_timeout={timeout_s}",),
    )
    rc, out = agent.wait()
    assert rc != 0
    assert "Starting elastic_operator" not in out, out[-3000:]  # torch's INFO: not printed
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
    assert failed_logs[0]["event_name"] == "torchelastic.rendezvous.failed"
    # docs/outcomes.md, rendezvous_failed: torch's agent FAILED, the run ERROR with the
    # exception's type and torchrun's exit code (issue 36)
    assert rc == 1
    (run,) = grpc_receiver.wait_for_spans(
        1, timeout=10, where=lambda s: s["name"] == A.SPAN_AGENT_RUN
    )
    assert run["status_code"] == "ERROR", run
    attrs = run["attributes"]
    assert attrs[A.STATE] == "FAILED" and attrs[A.PROCESS_EXIT_CODE] == rc, attrs
    assert str(attrs[A.ERROR_TYPE]).endswith("RendezvousTimeoutError"), attrs
    finals = [
        r
        for r in grpc_receiver.logs()
        if r["attributes"].get(A.EVENT_SOURCE) == A.SOURCE_AGENT
        and r["event_name"] == "torchelastic.worker.status.FAILED"
    ]
    assert [r["severity_text"] for r in finals] == ["ERROR"], finals


def test_scale_up_late_node_joins_later_round(grpc_receiver: OtlpReceiver, tmp_path) -> None:
    env = job_env(grpc_receiver, tmp_path, TRAIN_WAIT_FOR_WORLD="2")
    port, run_id = free_port(), f"scale-{uuid.uuid4().hex[:4]}"
    conf = ("--rdzv-conf=last_call_timeout=1",)
    first = start_agent(env, port, run_id, nnodes="1:2", extra_args=conf, script=LIGHT)
    grpc_receiver.wait_for_spans(1, timeout=60, where=lambda s: s["name"] == A.SPAN_RDZV_JOIN)
    time.sleep(1.0)
    second = start_agent(env, port, run_id, nnodes="1:2", extra_args=conf, script=LIGHT)
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
    agent = start_agent(env, free_port(), "none", nnodes="1", script=LIGHT)
    rc, out = agent.wait()
    assert rc == 0, out[-3000:]
    (join,) = receiver.wait_for_spans(1, where=lambda s: s["name"] == A.SPAN_RDZV_JOIN)
    return join["trace_id"]


def test_jobs_sharing_run_id_none_get_different_traces(grpc_receiver, tmp_path) -> None:
    a = _single_node_join_trace(grpc_receiver, tmp_path, "slurm-1001")
    b = _single_node_join_trace(grpc_receiver, tmp_path, "slurm-1002")
    assert a != b


def test_unreachable_collector_bounds_exit(tmp_path: Path) -> None:
    """A short script that records events to an unreachable collector exits promptly. Timed
    from the script's last line to the process's end (one system-wide monotonic clock), so
    that the start-up's import times, which swing with the machine's load, are not in it."""
    script = tmp_path / "record.py"
    script.write_text(
        "import time\n"
        "import elastic_otel\n"
        "from torch.distributed.elastic import events\n"
        "elastic_otel.register()\n"
        "for i in range(200):\n"
        "    events.record(events.Event(f'e{i}', events.EventSource.AGENT), 'otel')\n"
        "print(time.monotonic(), flush=True)\n"
    )

    def exit_seconds(extra: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
        env = job_env(
            None, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}", **extra
        )
        done = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
        )
        ended = time.monotonic()
        return ended - float(done.stdout.split()[-1]), done

    baseline, _ = exit_seconds({"OTEL_SDK_DISABLED": "true"})
    elapsed, done = exit_seconds({})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    # the documented bound is 2 s (ELASTIC_OTEL_EXIT_TIMEOUT); without it the SDK's shutdown
    # waits out its exporters' 10 s timeouts and retries
    assert elapsed - baseline < 5.0, (elapsed, baseline)
