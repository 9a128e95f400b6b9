"""The instrumented agent's decisions about its workers' ends (``model/worker_outcomes.py``),
from facts as the agent gathers them: no torch, no agent, no process."""

from __future__ import annotations

import signal
import subprocess
import sys

from elastic_otel.model.failures import WorkerEnd, classify
from elastic_otel.model.worker_outcomes import (
    EARLY_EXIT,
    Closing,
    ExitedWorker,
    FailedWorker,
    dated_by_victims,
    early_exits,
    failure_time_ns,
    fatal_error,
    oom_kills_rose,
    outcome_attributes,
    recovery_attributes,
    unexplained_sigkill,
    worker_ends,
    worker_error,
)
from elastic_otel.names import attributes as A
from elastic_otel.parsing.records import ErrorInfo
from elastic_otel.parsing.worker_reports import WorkerReport

S = 1_000_000_000
PEER_ERROR = "RuntimeError", "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:1"
FAULT = (
    "Fatal Python error: Segmentation fault\n\n"
    "Current thread 0x00007f (most recent call first):\n"
    '  File "/job/train.py", line 27 in fail\n'
    '  File "/job/train.py", line 40 in main\n'
)


def _failed(rank: int, exit_code: int, report: WorkerReport | None = None) -> FailedWorker:
    return FailedWorker(global_rank=rank, local_rank=rank, exit_code=exit_code, report=report)


def test_the_module_imports_without_torch() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import elastic_otel.model.worker_outcomes\n"
        "assert 'opentelemetry.sdk' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_worker_still_running_at_the_close_was_stopped() -> None:
    """Rank 0 had failed when torch began to close the context; rank 1 had not: its agent
    stopped it. Both undated deaths are dated when the agent saw them: rank 0 at the close,
    rank 1 now."""
    closing = Closing(time_ns=10 * S, ended=frozenset({0}))
    ended = worker_ends([_failed(0, 1), _failed(1, -15)], closing, now_ns=12 * S)
    assert not ended[0][0].stopped_by_agent and ended[0][0].time_ns == 10 * S
    assert ended[1][0].stopped_by_agent and ended[1][0].time_ns == 12 * S


def test_a_context_that_does_not_say_stops_nobody() -> None:
    ended = worker_ends([_failed(0, -15)], Closing(10 * S, None), now_ns=12 * S)
    assert not ended[0][0].stopped_by_agent and ended[0][0].time_ns == 10 * S
    ended = worker_ends([_failed(0, -15)], None, now_ns=12 * S)
    assert not ended[0][0].stopped_by_agent and ended[0][0].time_ns == 12 * S


def test_a_report_dates_the_death_and_names_the_exception() -> None:
    report = WorkerReport(exception_type="ValueError", message="bad", time_ns=5 * S)
    end, kept = worker_ends([_failed(3, 1, report)], None, now_ns=12 * S)[3]
    assert (end.time_ns, end.exception_type, end.message, kept) == (
        5 * S,
        "ValueError",
        "bad",
        report,
    )


def test_a_sigkill_no_report_dates_died_no_later_than_its_victims() -> None:
    """Rank 0 was SIGKILLed (no report: seen late, at 12 s); rank 1's collective failed at 5 s
    because of it: rank 0 died no later than 5 s."""
    victim = WorkerReport(exception_type=PEER_ERROR[0], message=PEER_ERROR[1], time_ns=5 * S)
    ended = worker_ends([_failed(0, -9), _failed(1, 1, victim)], None, now_ns=12 * S)
    assert ended[0][0].time_ns == 5 * S
    assert failure_time_ns([e for e, _ in ended.values()]) == 5 * S


def test_a_dated_root_cause_leaves_the_others_as_seen() -> None:
    cause = WorkerReport(exception_type="ValueError", message="bad", time_ns=5 * S)
    ended = {
        0: (WorkerEnd(0, -9, time_ns=12 * S), None),
        1: (WorkerEnd(1, 1, exception_type="ValueError", message="bad", time_ns=5 * S), cause),
    }
    assert dated_by_victims(dict(ended)) == ended


def test_failure_time_is_the_root_causes_else_the_first() -> None:
    victim = WorkerEnd(1, 1, exception_type=PEER_ERROR[0], message=PEER_ERROR[1], time_ns=3 * S)
    cause = WorkerEnd(0, 1, exception_type="ValueError", time_ns=7 * S)
    assert failure_time_ns([victim, cause]) == 7 * S
    assert failure_time_ns([victim]) == 3 * S
    assert failure_time_ns([]) is None


def test_only_a_sigkill_the_agent_did_not_send_asks_for_the_oom_count() -> None:
    assert unexplained_sigkill([WorkerEnd(0, -signal.SIGKILL)])
    assert not unexplained_sigkill([WorkerEnd(0, -signal.SIGKILL, stopped_by_agent=True)])
    assert not unexplained_sigkill([WorkerEnd(0, -signal.SIGSEGV)])
    assert oom_kills_rose(2, 3)
    assert not oom_kills_rose(3, 3)
    assert not oom_kills_rose(None, 3) and not oom_kills_rose(2, None)


def test_a_rank_that_left_before_its_peers_failed_is_the_root_cause() -> None:
    """Uneven inputs on gloo: rank 1 exits with code 0 at 5 s, its peers fail at 6 s. Only an
    exit 0 after leaving training, before the failure, counts; a worker still running, one that
    failed or left later, or one whose record does not say it left, does not."""
    exited = [
        ExitedWorker(1, 0, 5 * S),
        ExitedWorker(6, None, 5 * S),  # still exiting
        ExitedWorker(2, None, None),  # still running
        ExitedWorker(3, 0, 7 * S),  # left after the failure
        ExitedWorker(4, 0, None),  # no record of leaving
        ExitedWorker(5, 1, 4 * S),  # failed: torch's own failure, not this
    ]
    end, exiting = early_exits(exited, 6 * S)
    assert (end.global_rank, end.exit_code, end.time_ns, end.message) == (1, 0, 5 * S, EARLY_EXIT)
    assert (exiting.global_rank, exiting.exit_code) == (6, None)
    assert classify(end) == A.KIND_ROOT_CAUSE and end.left_training
    attrs = outcome_attributes(end, A.KIND_ROOT_CAUSE, 1, None, False)
    assert attrs[A.LEFT_TRAINING] is True and attrs[A.END_REASON] == EARLY_EXIT
    assert early_exits(exited, None) == []


def test_outcome_attributes_per_kind() -> None:
    killed = WorkerEnd(1, -signal.SIGKILL)
    assert outcome_attributes(killed, A.KIND_ROOT_CAUSE, 1, "out of memory?", True) == {
        A.FAILURE_KIND: A.KIND_ROOT_CAUSE,
        A.LAST_WORDS: "out of memory?",
        A.OOM_KILL: True,
    }
    stopped = WorkerEnd(0, -signal.SIGTERM, stopped_by_agent=True)
    assert outcome_attributes(stopped, A.KIND_STOPPED, 1, "words", True) == {
        A.FAILURE_KIND: A.KIND_STOPPED,
        A.STOPPED_AFTER: 1,
    }
    assert outcome_attributes(stopped, A.KIND_STOPPED, None, None, False) == {
        A.FAILURE_KIND: A.KIND_STOPPED
    }
    peer = WorkerEnd(2, 1)
    assert outcome_attributes(peer, A.KIND_PEER_FAILURE, 1, "words", True) == {
        A.FAILURE_KIND: A.KIND_PEER_FAILURE
    }


def test_recovery_attributes() -> None:
    assert recovery_attributes(A.CAUSE_WORKER_FAILURE, 100.0, 100.25) == {
        A.RECOVERY_CAUSE: A.CAUSE_WORKER_FAILURE,
        A.RECOVERY_DETECTION_MS: 250.0,
    }
    assert recovery_attributes(A.CAUSE_WORKER_FAILURE, None, 100.0) == {
        A.RECOVERY_CAUSE: A.CAUSE_WORKER_FAILURE
    }
    assert recovery_attributes(A.CAUSE_MEMBERSHIP_CHANGE, 100.0, 100.25) == {
        A.RECOVERY_CAUSE: A.CAUSE_MEMBERSHIP_CHANGE
    }
    assert recovery_attributes(A.CAUSE_WORKER_FAILURE, 101.0, 100.0)[A.RECOVERY_DETECTION_MS] == 0


def test_worker_error_from_the_report_first() -> None:
    report = WorkerReport(exception_type="ValueError", message="bad", traceback="Traceback...")
    assert worker_error(report, 1, FAULT) == ErrorInfo("ValueError", "bad", "Traceback...")
    faulted = WorkerReport(fault_stack=FAULT)
    assert worker_error(faulted, -11, None) == ErrorInfo(
        "", "Fatal Python error: Segmentation fault, in fail (train.py:27)", FAULT
    )


def test_worker_error_from_stderr_only_for_a_signal() -> None:
    found = worker_error(None, -11, FAULT)
    assert found is not None
    assert found.message == "Fatal Python error: Segmentation fault, in fail (train.py:27)"
    assert found.stacktrace.startswith("Fatal Python error: Segmentation fault")
    assert worker_error(None, 1, FAULT) is None  # an exit: torch's error file says more
    assert worker_error(None, -11, None) is None


def test_fatal_error_names_the_innermost_frame() -> None:
    assert fatal_error(FAULT) == "Fatal Python error: Segmentation fault, in fail (train.py:27)"
    assert fatal_error("Fatal Python error: Aborted\n") == "Fatal Python error: Aborted"
