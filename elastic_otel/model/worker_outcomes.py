"""The instrumented agent's decisions about its workers' ends, from facts it gathered.

When each failed worker died and whether its agent had begun to stop it, which error it is
reported with, what its outcome record says, and what a restart says about the recovery: the
agent instrumentation (:mod:`elastic_otel.integration.agent_instrumentation`) gathers the facts
from torch's agent, :mod:`elastic_otel.integration.agent_events` sends what is decided here.
Root cause or victim is :mod:`elastic_otel.model.failures`. No torch, no OpenTelemetry. Design:
docs/trace-model.md (worker failures).
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from elastic_otel.model.failures import WorkerEnd, classify, root_cause
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import WorkerState
from elastic_otel.parsing.records import AttrValue, ErrorInfo, error_from_message
from elastic_otel.parsing.worker_reports import MAX_REPORT_BYTES, WorkerReport, with_source_lines

OBSERVED_BY_MONITOR = "monitor_workers"
"""The value of ``torchelastic.observed_by`` on the outcomes the instrumentation reports."""

KIND_STATES = {
    A.KIND_ROOT_CAUSE: WorkerState.FAILED,
    A.KIND_PEER_FAILURE: WorkerState.PEER_FAILED,
    A.KIND_STOPPED: WorkerState.STOPPED,
}
"""The state a worker's outcome record is reported in, per kind of end."""
RESTART_CAUSES: dict[str, str] = {
    WorkerState.FAILED: A.CAUSE_WORKER_FAILURE,
    WorkerState.UNHEALTHY: A.CAUSE_WORKER_FAILURE,
    WorkerState.HEALTHY: A.CAUSE_MEMBERSHIP_CHANGE,
}
"""A restart's cause, by the worker group's state when the agent began it."""


@dataclass(frozen=True, slots=True)
class Closing:
    """When torch first began to close a process context, and the local ranks that had
    failed by then (``None``: this context does not say)."""

    time_ns: int
    ended: frozenset[int] | None


@dataclass(frozen=True, slots=True)
class FailedWorker:
    """One failed worker as torch's ``ProcessFailure`` describes it, with its own report."""

    global_rank: int
    local_rank: int
    exit_code: int | None
    report: WorkerReport | None


Ended = dict[int, tuple[WorkerEnd, "WorkerReport | None"]]
"""Global rank → what the agent knows of the worker's end, and the worker's report."""


def worker_ends(failed: Iterable[FailedWorker], closing: Closing | None, now_ns: int) -> Ended:
    """Each failed worker's end. A worker still running when torch began to close its context
    (``closing``) was stopped by its agent. The moment of death: the worker's own report (an
    exception, a fault stack), else when the agent saw it: at the close for one that ended on
    its own, else now (torch's failure time has whole seconds, rounded down)."""
    ended: Ended = {}
    for worker in failed:
        report = worker.report
        ended_before = closing.ended if closing is not None else None
        stopped = ended_before is not None and worker.local_rank not in ended_before
        seen_ns = closing.time_ns if closing is not None and not stopped else now_ns
        end = WorkerEnd(
            global_rank=worker.global_rank,
            exit_code=worker.exit_code,
            stopped_by_agent=stopped,
            exception_type=report.exception_type if report is not None else None,
            message=report.message if report is not None else None,
            time_ns=(report.time_ns if report is not None else None) or seen_ns,
        )
        ended[worker.global_rank] = (end, report)
    return dated_by_victims(ended)


EARLY_EXIT = (
    "left the job while its peers were still training (a rank with fewer batches than its peers?)"
)
"""The status of a worker that left the job first: torch counts its exit as a success."""


@dataclass(frozen=True, slots=True)
class ExitedWorker:
    """A worker of a failed group that torch did not count as failed: its exit code (``None``:
    still running, as while it exits) and when its progress record says it left training
    (``None``: it did not)."""

    global_rank: int
    exit_code: int | None
    left_ns: int | None


def early_exits(workers: Iterable[ExitedWorker], failed_ns: int | None) -> list[WorkerEnd]:
    """The root cause of a failure whose failed workers are all victims: the workers that left
    training before the first of them died and did not fail (exited with code 0, or still
    exiting). On gloo a peer's exit closes its connections and the ranks still in training
    fail in their next collective (uneven inputs: one rank ran out of data first); torch
    counts the exit as a success."""
    if failed_ns is None:
        return []
    return [
        WorkerEnd(
            global_rank=w.global_rank,
            exit_code=w.exit_code,
            message=EARLY_EXIT,
            time_ns=w.left_ns,
            left_training=True,
            kind=A.KIND_ROOT_CAUSE,
        )
        for w in workers
        if w.exit_code in (0, None) and w.left_ns is not None and w.left_ns < failed_ns
    ]


def dated_by_victims(ended: Ended) -> Ended:
    """A death no report dates (a SIGKILL) is dated when its agent saw it, up to a monitor
    interval late; when every dated death of the node is a victim's, it died no later than
    the first of them, which it caused."""
    dated = {r: e for r, (e, report) in ended.items() if report is not None and report.time_ns}
    if not dated or any(classify(e) == A.KIND_ROOT_CAUSE for e in dated.values()):
        return ended
    first = min(e.time_ns for e in dated.values())
    for rank, (end, report) in ended.items():
        if rank not in dated and not end.stopped_by_agent and end.time_ns > first:
            ended[rank] = (dataclasses.replace(end, time_ns=first), report)
    return ended


def failure_time_ns(ends: list[WorkerEnd]) -> int | None:
    """When the node's failure began: its root cause's death, else the first death."""
    if not ends:
        return None
    return (root_cause(ends) or min(ends, key=lambda e: e.time_ns)).time_ns


def unexplained_sigkill(ends: list[WorkerEnd]) -> bool:
    """Whether a worker died of a SIGKILL its agent did not send (the OOM killer's, maybe)."""
    return any(e.exit_code == -signal.SIGKILL and not e.stopped_by_agent for e in ends)


def oom_kills_rose(before: int | None, now: int | None) -> bool:
    """Whether the cgroup's OOM-kill count rose (``None``: not readable, nothing claimed)."""
    return before is not None and now is not None and now > before


def outcome_attributes(
    end: WorkerEnd, kind: str, root_rank: int | None, last_words: str | None, oom: bool
) -> dict[str, AttrValue | None]:
    """What a failed worker's outcome record says beside torch's fields: its kind, a root
    cause's last words, the root cause a stopped worker was stopped after, an OOM kill."""
    attrs: dict[str, AttrValue | None] = {A.FAILURE_KIND: kind}
    if kind == A.KIND_ROOT_CAUSE and last_words:
        attrs[A.LAST_WORDS] = last_words
    if kind == A.KIND_STOPPED and root_rank is not None:
        attrs[A.STOPPED_AFTER] = root_rank
    if oom and kind == A.KIND_ROOT_CAUSE and end.exit_code == -signal.SIGKILL:
        attrs[A.OOM_KILL] = True
    if end.left_training:  # no exception: what it did is the span's status
        attrs[A.LEFT_TRAINING] = True
        attrs[A.END_REASON] = end.message
    return attrs


def recovery_attributes(
    cause: str, failed_at_s: float | None, now_s: float
) -> dict[str, AttrValue]:
    """What the start of a restart says: its cause and, after a failure, the detection delay
    (from the failure to now)."""
    attrs: dict[str, AttrValue] = {A.RECOVERY_CAUSE: cause}
    if cause == A.CAUSE_WORKER_FAILURE and failed_at_s:
        attrs[A.RECOVERY_DETECTION_MS] = max(0.0, now_s - failed_at_s) * 1000.0
    return attrs


def worker_error(
    report: WorkerReport | None, exit_code: int | None, stderr_fault: str | None
) -> ErrorInfo | None:
    """The error a failed worker is reported with: the worker start-up's report (an exception,
    or a fatal signal's Python stack), else the fatal signal's stack ``faulthandler`` wrote on
    the worker's stderr (torch's ``@record`` points it there); ``None``: torch's error file."""
    if report is not None and report.exception_type:
        message = f"{report.exception_type}: {report.message or ''}"
        return error_from_message(message, report.traceback or "")
    if report is not None and report.fault_stack:
        return error_from_message(fatal_error(report.fault_stack), report.fault_stack)
    if stderr_fault and (exit_code or 0) < 0:
        stack = with_source_lines(stderr_fault, MAX_REPORT_BYTES)
        return error_from_message(fatal_error(stack), stack)
    return None


def fatal_error(fault_stack: str) -> str:
    """ "Fatal Python error: Segmentation fault, in fail (train.py:27)": faulthandler's first
    line and the crashing thread's innermost frame (it lists the current thread first)."""
    lines = fault_stack.strip().splitlines()
    frame = next((line.strip() for line in lines if line.startswith('  File "')), "")
    path, _, rest = frame[len('File "') :].partition('", line ')
    line, _, function = rest.partition(" in ")
    where = f", in {function} ({os.path.basename(path)}:{line})" if function else ""
    return lines[0] + where
