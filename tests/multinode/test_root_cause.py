"""Root cause, not victims (issue 18), on a real two-node torchrun job (c10d, gloo, two workers
per node): in each of its first four attempts global rank 1 dies at step 3 while every other
rank waits for it in an ``all_reduce``, by SIGKILL, SIGSEGV, SIGABRT or an exception; the fifth
succeeds. In each failed attempt exactly that rank's span is ERROR, with the right
``error.type`` and exit code; every other worker of the attempt died of it (its collective lost
the peer) or was stopped by its agent, and says so without ERROR. One job for the four cases:
each attempt is a round of its own (its own trace), and one job costs less than four. The
restarts themselves are visible too: each round in its trace, the last one succeeding.
The training script (tests/scripts/failing_train.py) is not changed for the bridge: no ``@record``.

The job exports exceptions as the semantic conventions now record them
(``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN=logs``): each root cause's exception is its log record,
named ``exception``, in its span's context, and no span carries an ``exception`` event; the
timeline reads them from there.

A job of its own, one node: rank 1 runs out of data (leaves its loop, destroys its process group
and exits with code 0, which torch counts as a success) while rank 0 waits for it; rank 0 fails
in its collective, and rank 1 is the root cause.
"""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.model.worker_outcomes import EARLY_EXIT
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import STATUS_PREFIX
from tests.support.jobs import (
    SCRIPTS,
    ExportedJob,
    job_env,
    run_exported_job,
    span_attr,
    start_agent,
)
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "failing_train.py"
FAULT_LINE = next(
    n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# FAULT LINE" in line
)

CASES = {
    # how: (error.type, process.exit.code)
    "kill": ("SIGKILL", -9),
    "segv": ("SIGSEGV", -11),
    "abort": ("SIGABRT", -6),
    "raise": ("RuntimeError", 1),
}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> ExportedJob:
    """One job whose first four attempts fail, one way each (:data:`CASES`, in order)."""
    return run_exported_job(
        tmp_path_factory.mktemp("root_cause"),
        SCRIPT,
        (f"--max-restarts={len(CASES)}",),
        lambda receiver: receiver.wait_for_spans(
            4 * (len(CASES) + 1), timeout=30, where=lambda s: s["name"] == A.SPAN_WORKER
        ),
        FAIL_RANK="1",
        FAIL_HOW=",".join(CASES),
        OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN="logs",
    )


def test_worker_failure_and_restart_are_visible(job: ExportedJob) -> None:
    """Each failure restarts the job: every attempt is a round of its own, one trace each, with
    its four workers; the last succeeds, its workers counting the restarts their agents made."""
    joins = [s for s in job.spans if s["name"] == A.SPAN_RDZV_JOIN]
    rounds: dict[int, set[str]] = defaultdict(set)
    for s in joins:
        rounds[span_attr(s, A.ROUND)].add(s["trace_id"])
    assert sorted(rounds) == list(range(len(CASES) + 1)), job.timeline
    assert all(len(v) == 1 for v in rounds.values()), rounds
    workers = [s for s in job.spans if s["name"] == A.SPAN_WORKER]
    attempts = [[w for w in workers if w["trace_id"] in rounds[r]] for r in sorted(rounds)]
    assert [len(a) for a in attempts] == [4] * (len(CASES) + 1) and len(workers) == 4 * len(rounds)
    last = attempts[-1]
    assert sorted(span_attr(w, A.GLOBAL_RANK) for w in last) == [0, 1, 2, 3]
    assert {span_attr(w, A.STATE) for w in last} == {"SUCCEEDED"}
    assert {w["status_code"] for w in last} == {"OK"}
    # rank 1's agent used every restart; the other one restarted as often (its workers died of
    # the failure) or re-joined the new round without using one (its workers were stopped)
    restarts = {span_attr(w, A.GLOBAL_RANK): span_attr(w, A.AGENT_RESTARTS) for w in last}
    assert restarts[0] == restarts[1] == len(CASES), restarts
    assert restarts[2] == restarts[3] and 0 <= restarts[2] <= len(CASES), restarts
    agents = [s for s in job.spans if s["name"] == A.SPAN_AGENT_RUN]
    assert len(agents) == 2 and {a["status_code"] for a in agents} == {"OK"}


@pytest.mark.parametrize("how", list(CASES))
def test_only_the_rank_that_failed_first_is_an_error(how: str, job: ExportedJob) -> None:
    spans = [s for s in job.spans if s["name"] == A.SPAN_WORKER]
    culprits = sorted(
        (w for w in spans if span_attr(w, A.STATE) == "FAILED"), key=lambda w: w["start_ns"]
    )
    assert len(culprits) == len(CASES), job.timeline
    culprit = culprits[list(CASES).index(how)]  # the attempt that failed this way
    # the failed round's workers (one trace per round)
    workers = {
        span_attr(w, A.GLOBAL_RANK): w for w in spans if w["trace_id"] == culprit["trace_id"]
    }
    assert sorted(workers) == [0, 1, 2, 3]

    error_type, exit_code = CASES[how]
    assert span_attr(culprit, A.GLOBAL_RANK) == 1
    assert culprit["status_code"] == "ERROR"
    assert span_attr(culprit, A.STATE) == "FAILED"
    assert span_attr(culprit, A.FAILURE_KIND) == A.KIND_ROOT_CAUSE
    assert span_attr(culprit, A.ERROR_TYPE) == error_type
    assert span_attr(culprit, A.PROCESS_EXIT_CODE) == exit_code
    if how == "kill":
        assert culprit["status_message"].startswith("killed by SIGKILL")
        assert span_attr(culprit, A.OOM_KILL) is None  # not the OOM killer: never guessed
    elif how == "raise":
        assert "the loss is NaN" in culprit["status_message"]
    else:
        assert error_type in culprit["status_message"]

    victims = {rank: w for rank, w in workers.items() if rank != 1}
    for rank, victim in victims.items():
        assert victim["status_code"] != "ERROR", (rank, victim["attributes"])
        assert span_attr(victim, A.ERROR_TYPE) is None
        kind = span_attr(victim, A.FAILURE_KIND)
        state = span_attr(victim, A.STATE)
        # a victim either failed in its collective or was stopped by its own agent; a worker
        # still running when its agent stopped the group ends in the agent's stop phase
        assert (kind, state) in (
            (A.KIND_PEER_FAILURE, "PEER_FAILED"),
            (A.KIND_STOPPED, "STOPPED"),
            (None, "STOPPED"),
        ), (rank, victim["attributes"])
    # rank 0 shares rank 1's node: whatever it died of, it links to rank 1's span
    assert [lk["span_id"] for lk in victims[0]["links"]] == [culprit["span_id"]]

    lines = [line for line in job.timeline.splitlines() if "root cause" in line.lower()]
    assert any(re.search(rf"rank 1\b.*{error_type}", line) for line in lines), job.timeline


@pytest.mark.parametrize("how", list(CASES))
def test_a_root_causes_exception_is_a_log_record_in_its_span(how: str, job: ExportedJob) -> None:
    """Under ``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN=logs``: no span carries an ``exception``
    event; the culprit's exception is its FAILED record, named ``exception``, in its span."""
    spans = [s for s in job.spans if s["name"] == A.SPAN_WORKER]
    assert not [e for w in spans for e in w["events"] if e["name"] == A.EXCEPTION_EVENT]
    culprits = sorted(
        (w for w in spans if span_attr(w, A.STATE) == "FAILED"), key=lambda w: w["start_ns"]
    )
    culprit = culprits[list(CASES).index(how)]
    records = [r for r in job.logs if r["span_id"] == culprit["span_id"]]
    exceptions = [r for r in records if r["event_name"] == A.EXCEPTION_EVENT]
    if how == "kill":  # a SIGKILL is no exception: its record keeps torch's event name
        assert exceptions == [], exceptions
        assert STATUS_PREFIX + "FAILED" in {r["event_name"] for r in records}
        return
    (record,) = exceptions
    assert record["trace_id"] == culprit["trace_id"]
    assert record["severity_text"] == "ERROR"
    exception = record["attributes"]
    assert exception[A.EVENT_NAME] == STATUS_PREFIX + "FAILED"  # torch's name, kept
    assert exception.get(A.EXCEPTION_TYPE) or exception.get(A.EXCEPTION_MESSAGE), exception
    stack = exception[A.EXCEPTION_STACKTRACE]
    if how == "raise":
        assert exception[A.EXCEPTION_TYPE] == "RuntimeError"
        assert "the loss is NaN" in exception[A.EXCEPTION_MESSAGE]
        assert "failing_train.py" in stack
    elif how == "segv":  # the Python stack of the crash, with no change to the script
        assert f'failing_train.py", line {FAULT_LINE} in fail' in stack, stack
        assert f"line {FAULT_LINE} in fail" in record["body"]
    else:
        assert re.search(r'failing_train.py", line \d+ in fail', stack), stack


def test_a_rank_that_left_the_job_first_is_the_root_cause(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Uneven inputs on gloo: rank 1's exit (code 0, a success to torch) closes its
    connections and rank 0 fails in its all_reduce. Rank 1 is the root cause, ERROR with
    ``error.type`` ``left_training`` and no exception; rank 0 is its victim; the agent's run
    and the timeline say so."""
    env = job_env(grpc_receiver, tmp_path, FAIL_RANK="1", FAIL_HOW="exit")
    agent = start_agent(
        env, free_port(), f"left-{uuid.uuid4().hex[:6]}", nnodes="1", nproc=2, script=SCRIPT
    )
    rc, out = agent.wait()
    assert rc == 1, out[-3000:]  # torchrun's failure: rank 0 failed, no restart left
    workers = {
        span_attr(w, A.GLOBAL_RANK): w
        for w in grpc_receiver.wait_for_spans(2, 30, lambda s: s["name"] == A.SPAN_WORKER)
    }
    left, victim = workers[1], workers[0]
    assert left["status_code"] == "ERROR" and left["status_message"] == EARLY_EXIT, left
    assert span_attr(left, A.STATE) == "FAILED"
    assert span_attr(left, A.FAILURE_KIND) == A.KIND_ROOT_CAUSE
    assert span_attr(left, A.ERROR_TYPE) == A.ERROR_TYPE_LEFT_TRAINING
    assert span_attr(left, A.LEFT_TRAINING) is True
    assert span_attr(left, A.PROCESS_EXIT_CODE) in (0, None)  # None: stopped as it exited
    records = [r for r in grpc_receiver.logs() if r["span_id"] == left["span_id"]]
    assert not [r for r in records if r["event_name"] == A.EXCEPTION_EVENT]
    assert victim["status_code"] != "ERROR"
    assert span_attr(victim, A.FAILURE_KIND) == A.KIND_PEER_FAILURE
    assert [link["span_id"] for link in victim["links"]] == [left["span_id"]]
    (run,) = grpc_receiver.wait_for_spans(1, 30, lambda s: s["name"] == A.SPAN_AGENT_RUN)
    assert run["status_code"] == "ERROR" and "global rank 1" in run["status_message"], run
    text = render_text(build_timeline(grpc_receiver.spans(), grpc_receiver.logs()))
    root = next(line for line in text.splitlines() if line.startswith("  ROOT CAUSE at "))
    assert "global rank 1 left_training" in root and EARLY_EXIT in root, text
