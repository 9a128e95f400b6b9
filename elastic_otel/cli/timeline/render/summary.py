"""The per-run summary ``elastic-otel timeline`` prints first: where the run's time went, each
failure with the restart it led to, its cost and every node's recovery, the stalls, the
stragglers, the slowdowns and slow links, and the nodes that held a round up."""

from __future__ import annotations

from elastic_otel.cli.timeline.analysis.runs import RunSummary
from elastic_otel.cli.timeline.render.phrases import (
    Rel,
    ending_text,
    failure_text,
    recovery_text,
    restart_text,
    run_heading,
    seconds,
)
from elastic_otel.cli.timeline.render.slowdown_phrases import link_text, link_when, slowdown_text
from elastic_otel.cli.timeline.render.wait_phrases import (
    stall_text,
    stall_when,
    straggler_text,
    straggler_when,
)


def render_summary(summaries: list[RunSummary], rel: Rel) -> list[str]:
    """Text lines of the summaries; ``rel`` formats a time relative to the timeline's start."""
    lines: list[str] = []
    for run in summaries:
        lines.append(run_heading(run))
        for failure, restart in run.happenings():
            if failure is not None:
                where = f" in round {failure.round}" if failure.round is not None else ""
                head = f"  at {rel(failure.time_ns)}{where} · "
                if restart is not None:
                    lines.append(head + restart_text(restart))
                else:
                    lines.append(f"{head}{failure_text(failure)} → {ending_text(run, failure)}")
            elif restart is not None:
                lines.append(f"  at {rel(restart.start_ns)} · {restart_text(restart)}")
            for r in restart.recoveries if restart is not None else ():
                lines.append(f"    recovery on {r.node} at {rel(r.start_ns)}: {recovery_text(r)}")
        lines += stall_summary_lines(run, rel)
        lines += straggler_summary_lines(run, rel)
        lines += slowdown_summary_lines(run, rel)
        for h in run.hold_ups:
            label = "round ?" if h.round is None else f"round {h.round}"
            lines.append(
                f"  {label}: last to join {h.node}, {seconds(h.held_ns)} after the node before"
            )
    return lines


def stall_summary_lines(run: RunSummary, rel: Rel) -> list[str]:
    """``1 stall: 62 s in all_reduce #4, waiting for global rank 1 (round 0, from +1.249s)``,
    then the agents' waits."""
    training = run.training_stalls
    lines = []
    if training:
        n = len(training)
        items = "; ".join(f"{stall_text(s)} ({stall_when(s, rel)})" for s in training)
        lines.append(f"  {n} stall{'s' if n > 1 else ''}: {items}")
    for stall in run.agent_waits:
        lines.append(f"  also stalled: {stall_text(stall)} ({stall_when(stall, rel)})")
    return lines


def straggler_summary_lines(run: RunSummary, rel: Rel) -> list[str]:
    """``1 straggler: global rank 1 on node-a, score 0.02, ... (round 0, reported ...)``."""
    if not run.stragglers:
        return []
    n = len(run.stragglers)
    items = "; ".join(f"{straggler_text(s)} ({straggler_when(s, rel)})" for s in run.stragglers)
    return [f"  {n} straggler{'s' if n > 1 else ''}: {items}"]


def slowdown_summary_lines(run: RunSummary, rel: Rel) -> list[str]:
    """``1 slowdown: process group 0 from 12:01:14 for 48 s, 1.9x slower, communication, 19.6 s
    lost (round 0, from +61.000s)``, then node 0's findings: ``1 slow link: host-b ...``."""
    lines = []
    if run.slowdowns:
        n = len(run.slowdowns)
        items = "; ".join(
            f"{slowdown_text(s)} ({_where(s.round)}from {rel(s.start_ns)})" for s in run.slowdowns
        )
        lines.append(f"  {n} slowdown{'s' if n > 1 else ''}: {items}")
    named = [f for f in run.links if not f.local]
    if named:
        n = len(named)
        items = "; ".join(f"{link_text(f)} ({link_when(f, rel)})" for f in named)
        lines.append(f"  {n} slow link{'s' if n > 1 else ''}: {items}")
    return lines


def _where(number: int | None) -> str:
    return f"round {number}, " if number is not None else ""
