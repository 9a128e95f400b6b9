"""The words for a job's failures, restarts, recoveries, rounds and runs, shared by the text
and the HTML page so that both say the same thing the same way."""

from __future__ import annotations

from collections.abc import Callable

from elastic_otel.cli.timeline.analysis.failures import (
    FailedAttemptWorker,
    Failure,
    StalledRank,
)
from elastic_otel.cli.timeline.analysis.runs import NodeRecovery, Restart, RunSummary
from elastic_otel.cli.timeline.analysis.timeline import (
    AFTER_FAILURE,
    ErrorNote,
    LostProgress,
    Round,
)
from elastic_otel.model.goodput import describe
from elastic_otel.names import attributes as A

Rel = Callable[[int], str]
"""Formats a time relative to the timeline's start: ``+1.249s``."""


def seconds(ns: int) -> str:
    return f"{ns / 1e9:.3f}s"


def delay(ns: int) -> str:
    """A delay after the root cause, signed: error files date a failure to the second."""
    return f"{'-' if ns < 0 else '+'}{abs(ns) / 1e9:.3f}s"


def cause_text(worker: FailedAttemptWorker) -> str:
    """``global rank 1 SIGKILL on node-a``."""
    what = f" {worker.error_type}" if worker.error_type else ""
    return f"global rank {worker.rank}{what} on {worker.host}"


def cause_facts(worker: FailedAttemptWorker) -> list[str]:
    """What else is known of a root cause: ``exit code -9``, the OOM killer."""
    facts = [] if worker.exit_code is None else [f"exit code {worker.exit_code}"]
    if worker.oom and "oom" not in worker.message.lower():  # the bridge's message may say so
        facts.append("OOM kill")
    return facts


def root_cause_line(worker: FailedAttemptWorker) -> str:
    """``global rank 1 SIGKILL on node-a (exit code -9): killed by SIGKILL``."""
    facts = cause_facts(worker)
    text = cause_text(worker) + (f" ({', '.join(facts)})" if facts else "")
    return f"{text}: {worker.message}" if worker.message else text


def stalled_text(stalled: StalledRank) -> str:
    """``global rank 1 on node-a pid 100 stalled 34 s``."""
    return f"global rank {stalled.rank} on {stalled.node} stalled {stalled.seconds:.0f} s"


def stalled_line(stalled: StalledRank) -> str:
    """A stalled rank as a root cause: ``global rank 1 on node-a pid 100 stalled 34 s at hang
    at train.py:18; global ranks 0 (node-a pid 100), 2, 3 (node-b pid 200) waited for it in
    all_reduce #4``."""
    text = stalled_text(stalled)
    if stalled.frame:
        text += f" at {stalled.frame}"
    if stalled.waiting:
        n = len(stalled.waiting)
        text += f"; {global_ranks(n)} {ranks_text(stalled.waiting)} waited for it"
    else:
        text += "; every other rank waited for it"
    return text + (f" in {stalled.collective}" if stalled.collective else "")


def consequence_text(failure: Failure, worker: FailedAttemptWorker) -> str:
    """``+0.800s rank 2 on node-b PEER_FAILED: Connection closed by peer``; another root cause
    (an independent failure) says so."""
    when = delay(failure.delay_ns(worker)) if failure.cause_rank is not None else ""
    if worker.kind == A.KIND_ROOT_CAUSE:
        text = f"also failed on its own: {root_cause_line(worker)}"
    else:
        text = f"rank {worker.rank} on {worker.host} {worker.state}"
        text += f": {worker.message}" if worker.message else ""
    return f"{when} {text}".strip()


def failure_text(failure: Failure) -> str:
    """``1 failure: global rank 1 SIGKILL on node-a``; several root causes are all named."""
    if failure.root is None and failure.stalled is not None:
        return f"no worker failed, {stalled_text(failure.stalled)}"
    if failure.root is None:
        n = len(failure.consequences)
        return f"no root cause seen, {n} worker{'s' if n > 1 else ''} ended after a peer's failure"
    n = len(failure.roots)
    names = [cause_text(failure.roots[0])]
    names += [f"{cause_text(w)} ({delay(failure.delay_ns(w))})" for w in failure.roots[1:]]
    return f"{n} failure{'s' if n > 1 else ''}: {', '.join(names)}"


def restart_reason(restart: Restart) -> str:
    """Why the job restarted: its failure (:func:`failure_text`), else its recoveries' cause."""
    if restart.failure is not None:
        return failure_text(restart.failure)
    if restart.cause == A.CAUSE_MEMBERSHIP_CHANGE:
        return "membership change"
    if restart.cause == A.CAUSE_WORKER_FAILURE:
        return "worker failure"  # one its recoveries do not point at, nor any seen before
    return f"cause {restart.cause}"


def restart_text(restart: Restart) -> str:
    """``1 failure: global rank 1 SIGKILL on node-a → restart, cost 4.200s``."""
    return f"{restart_reason(restart)} → restart, cost {seconds(restart.cost_ns)}"


def recovery_text(r: NodeRecovery) -> str:
    """One node's recovery: cause, duration, detection, phases, training resumed."""
    text = f"{r.cause}, {seconds(r.duration_ns)}"
    if r.detection_ms is not None:
        text += f" (noticed {r.detection_ms / 1000:.1f}s after the failure)"
    phases = ", ".join(f"{name} {seconds(ns)}" for name, ns in r.phases)
    if phases:
        text += f": {phases}"
    if r.resumed_ns is not None:
        text += f"; training resumed after {seconds(r.resumed_ns)}"
    return text


def run_heading(run: RunSummary) -> str:
    n = len(run.restarts)
    lost = f" · {n} restart{'s' if n > 1 else ''} cost {seconds(run.lost_ns)}" if n else ""
    return (
        f"SUMMARY · run {run.run_id} · wall {seconds(run.wall_ns)} · in rendezvous "
        f"{seconds(run.rendezvous_ns)} · workers ran {seconds(run.workers_ns)}{lost}"
    )


def ending_text(run: RunSummary, failure: Failure) -> str:
    """What followed a failure no restart recovered from."""
    return "job failed" if run.ended_the_job(failure) else "no restart"


def restart_note(rnd: Round) -> str:
    """Why a round that is not its run's first began."""
    if rnd.began_after == AFTER_FAILURE:
        return f"RESTART after a failure (agent restarts: {rnd.agent_restarts})"
    if rnd.began_after:
        return "RE-RENDEZVOUS: membership changed"
    return ""


def outcome_text(rnd: Round) -> str:
    """``1 node lost: worker failure: worker group restarted: job failed``."""
    o = rnd.outcome
    parts = [f"{o.lost_nodes} node{'s' if o.lost_nodes > 1 else ''} lost"] if o.lost_nodes else []
    parts += [
        text
        for happened, text in (
            (o.rendezvous_failed, "rendezvous failed"),
            (o.worker_failure, "worker failure"),
            (o.group_restarted, "worker group restarted"),
            (o.membership_restart, "workers restarted for a membership change"),
            (o.job_failed, "job failed"),
            (o.job_succeeded, "job succeeded"),
            (o.workers_succeeded, "workers succeeded"),
        )
        if happened
    ]
    return ": ".join(parts)


def lost_progress_text(lost: LostProgress) -> str:
    """``attempt 0: goodput 62.1 % of 9.0 s; badput: …; steps 7-8 lost``."""
    return f"attempt {lost.attempt}: {describe(lost.breakdown)}"


def error_where(note: ErrorNote) -> str:
    """``node-a pid 100 worker rank 1``, ``node-a pid 100 agent``."""
    if note.source == A.SOURCE_WORKER and note.global_rank is not None:
        return f"{note.node} worker rank {note.global_rank}"
    if note.source == A.SOURCE_AGENT:
        return f"{note.node} agent"
    return note.node


def global_ranks(n: int) -> str:
    return "global rank" if n == 1 else "global ranks"


def ranks_text(ranks: list[tuple[int, str]]) -> str:
    """``0 (node-a), 2, 3 (node-b)``: global ranks in order, each node named after its last."""
    parts: list[str] = []
    run: list[str] = []
    for i, (rank, node) in enumerate(ranks):
        run.append(str(rank))
        if i + 1 == len(ranks) or ranks[i + 1][1] != node:
            parts.append(f"{', '.join(run)} ({node})")
            run = []
    return ", ".join(parts)
