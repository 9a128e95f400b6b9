"""What the page's chart draws, as the JSON its script reads: times in seconds from the first
event, per round its nodes, their bars (join wait, time in the round, agent steps, recoveries
and their phases, workers), each worker's role in the round's failure, and where the stalls,
stragglers and lost progress are marked; the round's slowdowns and slow links in its head."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from elastic_otel.cli.timeline.analysis.failures import INDEPENDENT, ROOT
from elastic_otel.cli.timeline.analysis.runs import NodeRecovery
from elastic_otel.cli.timeline.analysis.timeline import Bar, NodeRow, Round, Timeline, WorkerRow
from elastic_otel.cli.timeline.render.phrases import (
    cause_text,
    delay,
    error_where,
    lost_progress_text,
    outcome_text,
    recovery_text,
    restart_note,
    stalled_text,
)
from elastic_otel.cli.timeline.render.slowdown_phrases import (
    link_text,
    slowdown_line,
    slowdown_text,
)
from elastic_otel.cli.timeline.render.wait_phrases import stall_line, stall_text, straggler_line
from elastic_otel.model.stalls import TRAINING

Sec = Callable[[int], Any]
Marks = dict[Any, list[dict[str, Any]]]


def timeline_data(timeline: Timeline) -> dict[str, Any]:
    """The JSON the page draws: times in seconds from the first event."""
    t0 = timeline.t0_ns

    def sec(ns: int | None) -> float | None:
        return None if ns is None else round((ns - t0) / 1e9, 6)

    def recovery(r: NodeRecovery) -> dict[str, Any]:
        return {
            "start": sec(r.start_ns),
            "end": sec(r.end_ns),
            "cause": r.cause,
            "text": recovery_text(r),
            "phases": [
                {"name": name, "start": sec(start), "end": sec(end)}
                for name, start, end in r.phase_times
            ],
        }

    def bar(b: Bar | None) -> dict[str, Any] | None:
        if b is None:
            return None
        return {
            "name": b.name,
            "start": sec(b.start_ns),
            "end": sec(b.end_ns),
            "status": b.status,
            "detail": b.detail,
        }

    def worker(
        w: WorkerRow, roles: dict[str, tuple[str, str]], stalls: Any, slow: Any, rnd: Round
    ) -> dict[str, Any]:
        role, note = roles.get(w.span_id, ("", ""))
        root = rnd.failure.root if rnd.failure is not None else None
        return {
            "rank": w.global_rank,
            "local_rank": w.local_rank,
            "state": w.state,
            "start": sec(w.start_ns),
            "end": sec(w.end_ns),
            "exit": w.exit_code,
            "message": w.message,
            "failed": w.failed,
            "restarts": w.restarts,
            "pid": w.pid,
            "role": role,
            "note": note,
            "last_words": root.last_words if root and root.span_id == w.span_id else "",
            "stalls": stalls,
            "stragglers": slow,
        }

    def node(n: NodeRow, rnd: Round) -> dict[str, Any]:
        roles = _roles(rnd)
        marks, node_marks = _stall_marks(rnd, sec)
        slow = _straggler_marks(rnd, sec)
        return {
            "label": n.label,
            "rank": n.rank,
            "world_size": n.world_size,
            "join": bar(n.join),
            "member": bar(n.member),
            "steps": [bar(s) for s in n.steps],
            "workers": [
                worker(
                    w,
                    roles,
                    marks.get((n.label, w.global_rank), []),
                    slow.get((n.label, w.global_rank), []) if w.global_rank is not None else [],
                    rnd,
                )
                for w in n.workers
            ],
            "stalls": node_marks.get(n.label, []),
            "slowdowns": _slowdown_marks(rnd, sec).get(n.label, []),
            "lost_progress": [
                {"start": sec(x.start_ns), "end": sec(x.end_ns), "text": lost_progress_text(x)}
                for x in rnd.lost
                if x.node == n.label
            ],
            "recoveries": [recovery(r) for r in n.recoveries],
            "agent": (
                {"state": n.agent_state, "end": sec(n.agent_end_ns), "message": n.agent_message}
                if n.agent_state
                else None
            ),
            "lost": sec(n.lost_ns),
        }

    return {
        "runs": timeline.run_ids,
        "t0_ms": t0 // 1_000_000,
        "duration": sec(timeline.t1_ns) or 0.0,
        "rounds": [
            {
                "label": r.label,
                "run_id": r.run_id,
                "world_size": r.world_size,
                "note": restart_note(r),
                "outcome": outcome_text(r),
                "failed": r.failed,
                "start": sec(r.start_ns),
                "root_cause": _root_cause(r),
                "stalls": [stall_text(s) for s in r.stalls],
                "stragglers": [
                    f"global rank {s.rank} (score {s.latest.score:.2f})" for s in r.stragglers
                ],
                "slowdowns": [slowdown_text(s) for s in r.slowdowns],
                "links": [link_text(f) for f in r.links if not f.local],
                "nodes": [node(n, r) for n in r.nodes],
            }
            for r in timeline.rounds
        ],
        "errors": [
            {"time": sec(e.time_ns), "where": error_where(e), "message": e.message}
            for e in timeline.errors
        ],
    }


def _root_cause(rnd: Round) -> str | None:
    """The round's root cause in a few words: a failed worker, else the rank it stalled on."""
    failure = rnd.failure
    if failure is not None and failure.root is not None:
        return cause_text(failure.root)
    if failure is not None and failure.stalled is not None:
        return stalled_text(failure.stalled)
    return None


def _roles(rnd: Round) -> dict[str, tuple[str, str]]:
    """Worker span id → (role, note) in its round's failure: the root cause, another worker
    that failed on its own, or one that died of it (and how long after)."""
    failure = rnd.failure
    if failure is None:
        return {}
    root = failure.cause_rank
    roles = {}
    stalled = failure.stalled
    if failure.root is None and stalled is not None:  # the stalled rank's worker is the root
        for node in rnd.nodes:
            for row in node.workers:
                if row.global_rank == stalled.global_rank and row.trace_id == failure.trace_id:
                    roles[row.span_id] = (ROOT, f"root cause of {rnd.label}: stalled")
    for span_id, (role, w) in failure.roles().items():
        if span_id in roles:  # the stalled rank, ended with the others
            continue
        if role == ROOT:
            note = f"root cause of {rnd.label}"
        elif root is None:
            note = "ended after a peer's failure; no root cause seen"
        else:
            what = "failed on its own" if role == INDEPENDENT else "ended"
            note = f"{what} {delay(failure.delay_ns(w))} after the root cause, global rank "
            note += root
        roles[span_id] = (role, note)
    return roles


def _slowdown_marks(rnd: Round, sec: Sec) -> Marks:
    """Per node: the round's slowdowns it saw, from their start to its latest report."""
    marks: Marks = {}
    for s in rnd.slowdowns:
        text = slowdown_line(s)
        for seen in s.nodes:
            mark = {"start": sec(s.start_ns), "end": sec(seen.end_ns), "text": text}
            marks.setdefault(seen.node, []).append({**mark, "ended": seen.ended})
    return marks


def _straggler_marks(rnd: Round, sec: Sec) -> Marks:
    """Per (node, global rank) of a worker: the spells it straggled in the round."""
    marks: Marks = {}
    for s in rnd.stragglers:
        mark = {"start": sec(s.start_ns), "end": sec(s.end_ns), "text": straggler_line(s)}
        marks.setdefault((s.node, s.rank), []).append(mark)
    return marks


def _stall_marks(rnd: Round, sec: Sec) -> tuple[Marks, Marks]:
    """What the chart marks of a round's stalls: per (node, global rank) of a worker, the
    stalls it is waited for or waits in; per node, its agent's waits and the stalls that point
    at it (no rank of it waits and no node names one)."""
    workers: Marks = {}
    nodes: Marks = {}
    for stall in rnd.stalls:
        base = {"start": sec(stall.start_ns), "end": sec(stall.end_ns), "text": stall_line(stall)}
        if stall.kind != TRAINING:
            for r in stall.reports:
                mark = {**base, "role": "node", "start": sec(r.start_ns), "end": sec(r.time_ns)}
                nodes.setdefault(r.node, []).append(mark)
            continue
        for rank, node in stall.waited_for:
            mark = {**base, "role": "waited", "frame": stall.frame(rank)}
            workers.setdefault((node, rank), []).append(mark)
        for rank, node in stall.waiting:
            workers.setdefault((node, rank), []).append({**base, "role": "waiting"})
        for node in stall.suspects:
            nodes.setdefault(node, []).append({**base, "role": "node"})
    return workers, nodes
