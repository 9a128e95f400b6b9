"""A GPU node's shape on the CPU: two torchrun agents of eight DDP ranks each (c10d, gloo,
``tests/scripts/ddp_train.py``), a real OTLP receiver; two jobs, each read by several tests.

- **A hang**: global rank 5 stops before its ``backward()`` at step 5, the 15 others wait in
  DDP's all-reduce. Both nodes name it: its own (seven ranks waiting) from its Flight Recorder
  reading, the other (eight ranks waiting) through the round's store.
- **A straggler, then a failure**: global rank 5 sleeps 0.3 s more than its peers before each
  ``backward()`` until its node names it a straggler, with its score (short straggler windows,
  as in ``tests/e2e/test_straggler_jobs.py``); then it prints a line on stderr and raises. It is
  the root cause, the 15 others its victims; its stderr lines are log records on its worker
  span. One job for both: the failure ends the run the straggler slowed, and what each test
  reads (the straggler record while it runs, the outcomes and output once it ended) is apart.
"""

from __future__ import annotations

import re
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.model.stragglers import STRAGGLER_EVENT_NAME, WINDOWS
from elastic_otel.names import attributes as A
from tests.support.jobs import (
    SCRIPTS,
    Agent,
    job_env,
    outputs_after_stopping,
    span_attr,
    start_agent,
    stop_agents,
)
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "ddp_train.py"
NPROC = 8
LATE = 5  # global rank: on the node of ranks 0 to 7
NODE_OF_LATE = [r for r in range(NPROC) if r != LATE]
OTHER_NODE = list(range(NPROC, 2 * NPROC))
STALL_AFTER_S = 3.0
POLL_S = min(max(STALL_AFTER_S / 4, 0.5), 5.0)
WINDOW_S = 2.0  # the straggler window
HANG_FRAME = "stuck_data_loader at ddp_train.py:" + str(
    next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# HANG LINE" in line)
)
RAISE_LINE = next(
    n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# RAISE LINE" in line
)


def _start(receiver: OtlpReceiver, tmp_path: Path, name: str, **extra: str) -> list[Agent]:
    """Two agents of eight workers each, one job."""
    env = job_env(receiver, tmp_path, **extra)
    port, run_id = free_port(), f"{name}-{uuid.uuid4().hex[:6]}"
    args = ("--max-restarts=0",)
    return [
        start_agent(env, port, run_id, nproc=NPROC, script=SCRIPT, extra_args=args)
        for _ in range(2)
    ]


def _agent_of(agents: list[Agent], rank: int) -> int:
    """The pid of the agent whose worker has global rank ``rank``, from the workers' own
    environments (``RANK``, as torchrun sets it), not from anything the bridge says."""
    pids = {a.proc.pid for a in agents}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        if parent in pids and f"RANK={rank}".encode() in environ:
            return parent
    raise AssertionError(f"no worker of global rank {rank} under the agents {pids}")


# --- the hang -------------------------------------------------------------------------------


@dataclass
class Hang:
    reports: list[dict]
    late_agent: int  # the pid of the agent of rank 5's node


def _stalls(receiver: OtlpReceiver) -> list[dict]:
    found = [
        r
        for r in receiver.logs()
        if r["event_name"] == "torchelastic.stalled"
        and r["attributes"].get(A.STALLED_IN) == "training"
    ]
    return sorted(found, key=lambda r: r["time_ns"])


def _naming(reports: list[dict], waiting: list[int]) -> list[dict]:
    return [
        r
        for r in reports
        if r["attributes"].get(A.STALLED_RANKS) == [LATE]
        and r["attributes"].get(A.STALLED_WAITING) == waiting
    ]


@pytest.fixture(scope="module")
def hang(tmp_path_factory: pytest.TempPathFactory) -> Hang:
    tmp_path = tmp_path_factory.mktemp("hang")
    with OtlpReceiver("grpc") as receiver:
        agents = _start(
            receiver,
            tmp_path,
            "hang8",
            HANG_RANK=str(LATE),
            HANG_STEP="5",
            ELASTIC_OTEL_STALL_AFTER=str(STALL_AFTER_S),
        )
        try:
            receiver.wait_until(
                lambda: (
                    _naming(_stalls(receiver), NODE_OF_LATE)
                    and _naming(_stalls(receiver), OTHER_NODE)
                ),
                240,
            )
            late_agent = _agent_of(agents, LATE)
        except TimeoutError as timeout:
            said = "\n".join(r["body"] for r in _stalls(receiver))
            raise AssertionError(f"{timeout}\n{said}\n{outputs_after_stopping(agents)}") from None
        finally:
            stop_agents(agents)
        return Hang(_stalls(receiver), late_agent)


def test_a_rank_stuck_in_training_is_named_by_its_own_node(hang: Hang) -> None:
    (ours,) = _naming(hang.reports, NODE_OF_LATE)[:1]
    attrs = ours["attributes"]
    assert ours["severity_text"] == "WARN"
    assert attrs[A.STACK_FRAME] == HANG_FRAME, attrs
    assert A.STALLED_REMOTE_HOST not in attrs, attrs
    assert attrs[A.STALLED_PROCESS_GROUP] == "0" and attrs[A.STALLED_BACKEND] == "gloo"
    waiting = ",".join(map(str, NODE_OF_LATE))
    assert f"global ranks {waiting} wait in all_reduce #" in ours["body"], ours["body"]
    assert (
        f"; waiting for global rank {LATE} (in {HANG_FRAME}), which never entered it"
        in (ours["body"])
    ), ours["body"]


def test_a_rank_stuck_in_training_is_named_by_the_other_node(hang: Hang) -> None:
    """The eight ranks of the other node all wait: their node learns rank 5, its host and its
    agent from the round's store, in the same collective, within a poll of both its own first
    report and the late node's."""
    ours, theirs = _naming(hang.reports, NODE_OF_LATE)[0], _naming(hang.reports, OTHER_NODE)[0]
    attrs = theirs["attributes"]
    assert attrs[A.STALLED_REMOTE_HOST] == socket.gethostname(), attrs
    assert attrs[A.STALLED_REMOTE_PIDS] == [hang.late_agent], attrs
    assert attrs[A.STACK_FRAME] == HANG_FRAME, attrs
    number = ours["attributes"][A.STALLED_COLLECTIVE_NUMBER]
    assert attrs[A.STALLED_COLLECTIVE_NUMBER] == number and number > 1, (attrs, number)
    waiting = ",".join(map(str, OTHER_NODE))
    assert (
        f"global ranks {waiting} wait in all_reduce #{number} of process group 0 (gloo);"
        f" waiting for global rank {LATE} on {socket.gethostname()} pid"
        f" {hang.late_agent} (in {HANG_FRAME}), which never entered it" in theirs["body"]
    ), theirs["body"]
    own_first = next(
        r for r in hang.reports if r["attributes"].get(A.STALLED_WAITING) == OTHER_NODE
    )
    late_s = (theirs["time_ns"] - max(ours["time_ns"], own_first["time_ns"])) / 1e9
    assert late_s <= POLL_S + 0.5, (late_s, [r["body"] for r in hang.reports])


# --- the straggler, then the failure --------------------------------------------------------


@dataclass
class Failed:
    straggler: dict
    stragglers: list[dict]
    scores: list[dict]
    spans: list[dict]
    logs: list[dict]
    returncodes: list[int]


@pytest.fixture(scope="module")
def slow_then_raises(tmp_path_factory: pytest.TempPathFactory) -> Failed:
    tmp_path = tmp_path_factory.mktemp("slow_then_raises")
    bad_batch = tmp_path / "bad-batch"
    with OtlpReceiver("grpc") as receiver:
        agents = _start(
            receiver,
            tmp_path,
            "slow8",
            SLOW_RANK=str(LATE),
            SLOW_SECONDS="0.3",
            STEP_SECONDS="0.05",
            RAISE_RANK=str(LATE),
            RAISE_WHEN=str(bad_batch),
            ELASTIC_OTEL_STRAGGLER_WINDOW=str(WINDOW_S),
        )
        try:
            try:
                (straggler,) = receiver.wait_for_logs(
                    1, timeout=240, where=lambda r: r["event_name"] == STRAGGLER_EVENT_NAME
                )[:1]
            except TimeoutError as timeout:
                raise AssertionError(f"{timeout}\n{outputs_after_stopping(agents)}") from None
            bad_batch.touch()  # rank 5 raises at its next step
            returncodes = [agent.wait(120)[0] for agent in agents]
        finally:
            stop_agents(agents)  # (none left running but after a failure)
        receiver.wait_for_spans(2 * NPROC, timeout=30, where=lambda s: s["name"] == A.SPAN_WORKER)
        receiver.wait_for_spans(2, timeout=30, where=lambda s: s["name"] == A.SPAN_AGENT_RUN)
        return Failed(
            straggler,
            [r for r in receiver.logs() if r["event_name"] == STRAGGLER_EVENT_NAME],
            [m for m in receiver.metrics() if m["name"] == A.METRIC_STRAGGLER_SCORE],
            receiver.spans(),
            receiver.logs(),
            returncodes,
        )


def test_a_slow_rank_is_named_with_its_score(slow_then_raises: Failed) -> None:
    """Of eight local ranks, rank 5 is named, with a score below 0.75 over ``WINDOWS`` windows;
    its seven local peers wait for it; nobody else is named by either node (the other node's
    eight ranks arrive together: they all wait for it)."""
    record = slow_then_raises.straggler
    attrs = record["attributes"]
    assert record["severity_text"] == "WARN"
    assert attrs[A.STRAGGLER_RANK] == LATE, attrs
    assert attrs[A.STRAGGLER_SCORE] < 0.75, attrs
    assert attrs[A.STRAGGLER_WAITING] == NODE_OF_LATE, attrs
    assert attrs[A.STRAGGLER_WINDOWS] == WINDOWS
    assert attrs[A.STRAGGLER_PROCESS_GROUP] == "0"
    assert attrs[A.STRAGGLER_BASIS] == "issued"  # gloo: no device times
    assert 0.2 < attrs[A.STRAGGLER_LATENESS] < 0.6, attrs
    assert attrs[A.STRAGGLER_WAITED_SHARE] > 0.25, attrs
    assert record["body"].startswith(f"global rank {LATE} is a straggler: score "), record["body"]
    assert {r["attributes"][A.STRAGGLER_RANK] for r in slow_then_raises.stragglers} == {LATE}
    # every rank is scored, and rank 5's gauge says it is slow (a window's gauges are raw: on
    # a loaded machine any rank can score low once; a report needs WINDOWS and a clear worst)
    scored = {m["attributes"].get(A.GLOBAL_RANK) for m in slow_then_raises.scores}
    assert scored == set(range(2 * NPROC)), scored
    assert [
        m
        for m in slow_then_raises.scores
        if m["attributes"][A.GLOBAL_RANK] == LATE and m["value"] < 0.75
    ]


def _workers(failed: Failed) -> dict[int, dict]:
    spans = [s for s in failed.spans if s["name"] == A.SPAN_WORKER]
    assert len(spans) == 2 * NPROC, [s["attributes"] for s in spans]
    return {span_attr(s, A.GLOBAL_RANK): s for s in spans}


def test_the_rank_that_raised_is_the_root_cause_and_the_15_others_victims(
    slow_then_raises: Failed,
) -> None:
    assert slow_then_raises.returncodes == [1, 1], slow_then_raises.returncodes
    workers = _workers(slow_then_raises)
    culprit = workers[LATE]
    assert culprit["status_code"] == "ERROR", culprit
    assert span_attr(culprit, A.STATE) == "FAILED"
    assert span_attr(culprit, A.FAILURE_KIND) == A.KIND_ROOT_CAUSE
    assert span_attr(culprit, A.ERROR_TYPE) == "RuntimeError"
    assert span_attr(culprit, A.PROCESS_EXIT_CODE) == 1
    assert f"rank {LATE}: the loss is NaN at step " in culprit["status_message"], culprit
    for rank, victim in workers.items():
        if rank == LATE:
            continue
        assert victim["status_code"] != "ERROR", (rank, victim["attributes"])
        assert span_attr(victim, A.ERROR_TYPE) is None, (rank, victim["attributes"])
        assert span_attr(victim, A.FAILURE_KIND) != A.KIND_ROOT_CAUSE, (rank, victim)
    runs = [s for s in slow_then_raises.spans if s["name"] == A.SPAN_AGENT_RUN]
    assert {r["status_code"] for r in runs} == {"ERROR"}, runs
    assert any(f"global rank {LATE}" in r["status_message"] for r in runs), runs
    text = render_text(build_timeline(slow_then_raises.spans, slow_then_raises.logs))
    root = next(line for line in text.splitlines() if line.startswith("  ROOT CAUSE at "))
    assert re.search(rf"global rank {LATE}\b.*RuntimeError", root), text


def _stderr(failed: Failed, rank: int) -> list[dict]:
    return [
        r
        for r in failed.logs
        if r["attributes"].get(A.LOG_IOSTREAM) == "stderr"
        and r["attributes"].get(A.GLOBAL_RANK) == rank
    ]


def test_its_stderr_lines_are_log_records_on_its_worker_span(slow_then_raises: Failed) -> None:
    culprit = _workers(slow_then_raises)[LATE]
    records = _stderr(slow_then_raises, LATE)
    assert records, "no stderr record of rank 5"
    assert {(r["trace_id"], r["span_id"]) for r in records} == {
        (culprit["trace_id"], culprit["span_id"])
    }
    bodies = [r["body"] for r in records]
    (line,) = [r for r in records if r["body"].startswith(f"rank {LATE}: a bad batch at step")]
    assert line["severity_text"] == "WARN"
    assert {r["attributes"][A.LOCAL_RANK] for r in records} == {LATE}
    assert any(f"RuntimeError: rank {LATE}: the loss is NaN" in b for b in bodies), bodies
    assert any(f'ddp_train.py", line {RAISE_LINE}, in main' in b for b in bodies), bodies


def test_its_traceback_is_one_error_record(slow_then_raises: Failed) -> None:
    """docs/worker-output.md: a traceback stays one record, ERROR."""
    tracebacks = [
        r
        for r in _stderr(slow_then_raises, LATE)
        if "Traceback (most recent call last):" in r["body"]
    ]
    assert len(tracebacks) == 1, [r["body"] for r in _stderr(slow_then_raises, LATE)]
    (record,) = tracebacks
    assert record["severity_text"] == "ERROR", record
    assert f"RuntimeError: rank {LATE}: the loss is NaN" in record["body"], record["body"]
