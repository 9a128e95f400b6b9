"""The timeline as one self-contained HTML page: a Gantt chart, inline CSS and JS, no network.

Above the chart, the per-run summary as tables that wrap to the page's width (a 1400-pixel
window shows all of it): the run's totals; each failure with its root cause across nodes, the
workers that failed after it with their delays, the job restart it led to and its cost, and
each node's recovery phase by phase; the nodes that held a round up; each stall, joined across
nodes: what the ranks wait in, the rank they wait for with its innermost frame and its whole
stacks (a ``<details>`` element), the ranks waiting, and the innermost frame of every rank;
each straggler: its rank and node, score, lateness per collective, the share of the time its
peers wait, the process group, when it was reported, and the round's nodes that named none.

Rows are nodes in join order, grouped by round, each followed by its recoveries into the round
and its workers. Bars are the join wait, the time in the round, the agent's rendezvous steps,
each recovery with its phases as labelled segments (stop workers, rendezvous, assign ranks,
start workers), and each worker run; failures are red (a peer's failure hatched), the root cause
is named on its round and its worker, restarts are marked on the time axis, a stall is marked
at its start on the row of the rank waited for (the ranks waiting in it are underlined for its
length; an agent's wait on its node's row), a straggler is flagged and underlined on its worker's
row from its first report to its last, and hovering a bar shows its details. The chart's
data is embedded as JSON and drawn by the script; script errors are written into the page
(``#js-errors``) so that they are visible, also to a headless browser's ``--dump-dom``.
"""

from __future__ import annotations

import html
import json
from typing import Any

from elastic_otel.cli.timeline.build import Bar, NodeRow, Round, Timeline, WorkerRow
from elastic_otel.cli.timeline.goodput import goodput_html
from elastic_otel.cli.timeline.summary import (
    Failure,
    Recovery,
    Restart,
    RunSummary,
    Stall,
    Straggler,
    cause_facts,
    cause_text,
    consequence_text,
    delay,
    ending_text,
    failure_text,
    frame_lines,
    happenings,
    ranks_text,
    recovery_text,
    restart_reason,
    seconds,
    stall_line,
    stall_text,
    straggler_line,
)
from elastic_otel.model.stalls import TRAINING
from elastic_otel.names import attributes as A


def render_html(timeline: Timeline, title: str = "elastic-otel timeline") -> str:
    data = timeline_data(timeline)
    payload = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    t0 = timeline.t0_ns
    runs = summary_html(timeline.runs, lambda ns: f"+{(ns - t0) / 1e9:.3f}s")
    if timeline.goodput:
        runs += "\n" + goodput_html(timeline.goodput)
    return (
        _PAGE.replace("__TITLE__", html.escape(title))
        .replace("__RUNS__", runs)
        .replace("__CSS__", _CSS)
        .replace("__DATA__", payload)
        .replace("__JS__", _JS)
    )


def summary_html(runs: list[RunSummary], rel: Any) -> str:
    """The per-run summary as tables; ``rel`` formats a time relative to the timeline's start."""
    if not runs:
        return ""
    e = html.escape
    out = [
        "<h2>Summary</h2>",
        '<table class="totals"><thead><tr><th>Run</th><th>Wall</th><th>In rendezvous</th>'
        "<th>Workers ran</th><th>Job restarts</th><th>Restarts cost</th></tr></thead><tbody>",
    ]
    for run in runs:
        out.append(
            f"<tr><td>{e(run.run_id)}</td><td>{seconds(run.wall_ns)}</td>"
            f"<td>{seconds(run.rendezvous_ns)}</td><td>{seconds(run.workers_ns)}</td>"
            f"<td>{len(run.restarts)}</td><td>{seconds(run.lost_ns)}</td></tr>"
        )
    out.append("</tbody></table>")
    for run in runs:
        if run.stalls:
            out += [
                f'<table class="stalls"><caption>Stalls · run {e(run.run_id)} · '
                f"{_stall_count(run)}</caption>"
                '<colgroup><col class="c-at"><col class="c-round"><col class="c-stalled">'
                '<col class="c-waited"><col class="c-waiting"><col class="c-frames"></colgroup>'
                "<thead><tr><th>From</th><th>Round</th><th>Stalled</th><th>Waiting for</th>"
                "<th>Waiting in it</th><th>Innermost frame per rank</th></tr></thead><tbody>",
                *(_stall_row(stall, rel) for stall in run.stalls),
                "</tbody></table>",
            ]
        if run.stragglers:
            out += [
                f'<table class="stragglers"><caption>Stragglers · run {e(run.run_id)} · '
                f"{_straggler_count(run)}</caption>"
                '<colgroup><col class="c-at"><col class="c-round"><col class="c-rank">'
                '<col class="c-score"><col class="c-late"><col class="c-wait"><col class="c-group">'
                "</colgroup><thead><tr><th>Reported</th><th>Round</th><th>Straggler</th>"
                "<th>Score</th><th>Late per collective</th><th>Its peers wait</th>"
                "<th>Process group</th></tr></thead><tbody>",
                *(_straggler_row(s, rel) for s in run.stragglers),
                "</tbody></table>",
            ]
        rows = [_happening_row(run, f, r, rel) for f, r in happenings(run)]
        if rows:
            out += [
                f'<table class="failures"><caption>Failures and restarts · run {e(run.run_id)}'
                '</caption><colgroup><col class="c-at"><col class="c-round"><col class="c-cause">'
                '<col class="c-then"><col class="c-outcome"><col class="c-recovery"></colgroup>'
                "<thead><tr><th>At</th><th>Round</th><th>Root cause</th><th>Then</th>"
                "<th>Outcome</th><th>Recovery per node</th></tr></thead><tbody>",
                *rows,
                "</tbody></table>",
            ]
        if run.hold_ups:
            out.append(
                f'<table class="hold-ups"><caption>Who held a round up · run {e(run.run_id)}'
                "</caption><thead><tr><th>Round</th><th>Last to join</th>"
                "<th>After the node before</th></tr></thead><tbody>"
            )
            for h in run.hold_ups:
                number = "?" if h.round is None else str(h.round)
                out.append(
                    f"<tr><td>{number}</td><td>{e(h.node)}</td><td>{seconds(h.held_ns)}</td></tr>"
                )
            out.append("</tbody></table>")
    return "\n".join(out)


def _stall_count(run: RunSummary) -> str:
    """``1 in training, longest 62 s · 1 agent wait``."""
    training = [s for s in run.stalls if s.kind == TRAINING]
    parts = []
    if training:
        parts.append(
            f"{len(training)} in training, longest {max(s.seconds for s in training):.0f} s"
        )
    others = len(run.stalls) - len(training)
    if others:
        parts.append(f"{others} agent wait{'s' if others > 1 else ''}")
    return " · ".join(parts)


def _stall_row(stall: Stall, rel: Any) -> str:
    """A stall: what, whom the ranks wait for (frame and whole stacks), who waits, frames."""
    e = html.escape
    number = "" if stall.round is None else str(stall.round)
    what = (
        f'<b class="stalled">{e(stall_text(stall))}</b>'
        f'<div class="facts">{e(stall.kind)} · last reported at {e(rel(stall.end_ns))}</div>'
    )
    waited, waiting, frames = "", "", ""
    if stall.kind == TRAINING:
        items = []
        for rank, node in stall.waited_for:
            item = f'<b class="waited">global rank {rank} on {e(node)}</b>'
            frame = stall.frame(rank)
            if frame:
                item += f'<div class="frame">in {e(frame)}</div>'
            stack = stall.stacks.get(rank)
            if stack is not None and stack.stacks:
                item += (
                    f"<details><summary>stacks of global rank {rank} ({e(stack.reason)}, "
                    f'{e(rel(stack.time_ns))})</summary><pre class="stack">{e(stack.stacks)}'
                    "</pre></details>"
                )
            items.append(item)
        if not items and stall.suspects:
            items.append(
                f'<b class="waited">a rank on {e(", ".join(stall.suspects))}</b>'
                '<div class="frame">no rank of it waits in the collective</div>'
            )
        waited = "".join(f"<div>{item}</div>" for item in items)
        waiting = e(ranks_text(stall.waiting)) if stall.waiting else "<i>no rank</i>"
        frames = "".join(
            f'<li class="{"waited" if named else ""}">global rank {rank} on {e(node)}: '
            f"{e(frame)}</li>"
            for rank, node, frame, named in frame_lines(stall)
        )
        frames = f"<ul>{frames}</ul>" if frames else ""
    else:
        waiting = e(", ".join(f"{r.node} {r.seconds:.0f} s" for r in stall.reports))
    return (
        f'<tr class="stall"><td>{e(rel(stall.start_ns))}</td><td>{e(number)}</td>'
        f"<td>{what}</td><td>{waited}</td><td>{waiting}</td><td>{frames}</td></tr>"
    )


def _straggler_count(run: RunSummary) -> str:
    """``1 rank, lowest score 0.02``."""
    ranks = {(s.node, s.rank) for s in run.stragglers}
    lowest = min(s.lowest for s in run.stragglers)
    return f"{len(ranks)} rank{'s' if len(ranks) > 1 else ''}, lowest score {lowest:.2f}"


def _straggler_row(straggler: Straggler, rel: Any) -> str:
    """A straggler: who, its score, its lateness, who waits for it and how much, where."""
    e = html.escape
    r = straggler.latest
    number = "" if straggler.round is None else str(straggler.round)
    when = e(rel(straggler.start_ns))
    if len(straggler.reports) > 1:
        when += f" → {e(rel(straggler.end_ns))}"
    who = f'<b class="straggler">global rank {straggler.rank} on {e(straggler.node)}</b>'
    if straggler.quiet:
        who += f'<div class="facts">no straggler named by {e(", ".join(straggler.quiet))}</div>'
    score = f"{r.score:.2f}"
    if straggler.lowest < r.score:
        score += f' <span class="facts">(lowest {straggler.lowest:.2f})</span>'
    if r.windows is not None:
        score += f'<div class="facts">over {r.windows} windows</div>'
    late = "" if r.lateness_s is None else f"{r.lateness_s:.3f} s"
    if r.interval_s is not None:
        late += f'<div class="facts">one collective every {r.interval_s:.3f} s</div>'
    wait = "" if r.waited_share is None else f'<b class="cost">{r.waited_share * 100:.0f} %</b>'
    if straggler.waiting:
        wait += f'<div class="facts">{e(ranks_text(straggler.waiting))}</div>'
    return (
        f'<tr class="straggler"><td>{when}</td><td>{e(number)}</td><td>{who}</td>'
        f"<td>{score}</td><td>{late}</td><td>{wait}</td><td>{e(r.group)}</td></tr>"
    )


def _straggler_marks(rnd: Round, sec: Any) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Per (node, global rank) of a worker: the spells it straggled in the round."""
    marks: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for s in rnd.stragglers:
        mark = {"start": sec(s.start_ns), "end": sec(s.end_ns), "text": straggler_line(s)}
        marks.setdefault((s.node, s.rank), []).append(mark)
    return marks


def _stall_marks(
    rnd: Round, sec: Any
) -> tuple[dict[tuple[str, int | None], list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """What the chart marks of a round's stalls: per (node, global rank) of a worker, the
    stalls it is waited for or waits in; per node, its agent's waits and the stalls that point
    at it (no rank of it waits and no node names one)."""
    workers: dict[tuple[str, int | None], list[dict[str, Any]]] = {}
    nodes: dict[str, list[dict[str, Any]]] = {}
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


def _happening_row(
    run: RunSummary, failure: Failure | None, restart: Restart | None, rel: Any
) -> str:
    """A failure (its root cause, what followed) and the restart it led to, or a restart."""
    e = html.escape
    cause, then = "", ""
    if failure is not None:
        at = failure.time_ns
        number = "" if failure.round is None else str(failure.round)
        cause = _cause_cell(failure)
        items = failure.after_root() if failure.root is not None else failure.consequences
        then = "".join(
            f'<li class="{e(w.kind)}">{e(consequence_text(failure, w))}</li>' for w in items
        )
        then = f"<ul>{then}</ul>" if then else ""
    elif restart is not None:
        at, number = restart.start_ns, "" if restart.round is None else f"→ {restart.round}"
        cause = e(restart_reason(restart))
    else:
        return ""
    if restart is not None:
        outcome = f'restart, cost <b class="cost">{seconds(restart.cost_ns)}</b>'
        recoveries = "".join(f"<li>{_recovery_item(r, rel)}</li>" for r in restart.recoveries)
        recoveries = f"<ul>{recoveries}</ul>"
    else:
        outcome = e(ending_text(run, failure)) if failure is not None else ""
        recoveries = ""
    return (
        f"<tr><td>{e(rel(at))}</td><td>{e(number)}</td><td>{cause}</td><td>{then}</td>"
        f"<td>{outcome}</td><td>{recoveries}</td></tr>"
    )


def _cause_cell(failure: Failure) -> str:
    e = html.escape
    root = failure.root
    if root is None:
        return "<i>not seen: no worker failed on its own</i>"
    parts = [f'<b class="root-cause">{e(cause_text(root))}</b>']
    facts = cause_facts(root)
    if facts:
        parts.append(f'<div class="facts">{e(" · ".join(facts))}</div>')
    if root.message:
        parts.append(f'<div class="message">{e(root.message)}</div>')
    if root.last_words:
        parts.append(
            '<details class="last-words"><summary>last words (stderr)</summary>'
            f'<pre class="stack">{e(root.last_words)}</pre></details>'
        )
    if len(failure.roots) > 1:  # named in the next column, in order of time
        parts.append(f'<div class="independent">{e(failure_text(failure))}</div>')
    return "".join(parts)


def _recovery_item(r: Recovery, rel: Any) -> str:
    e = html.escape
    return f"<b>{e(r.node)}</b> at {e(rel(r.start_ns))}: {e(recovery_text(r))}"


def _roles(rnd: Round) -> dict[str, tuple[str, str]]:
    """Worker span id → (role, note) in its round's failure: the root cause, another worker
    that failed on its own, or one that died of it (and how long after)."""
    failure = rnd.failure
    if failure is None:
        return {}
    roles = {}
    root = failure.root
    if root is not None:
        roles[root.span_id] = ("root", f"root cause of {rnd.label}")
    for w in failure.roots[1:] + failure.consequences:
        role = "independent" if w.kind == A.KIND_ROOT_CAUSE else "consequence"
        if root is None:
            note = "ended after a peer's failure; no root cause seen"
        else:
            what = "failed on its own" if role == "independent" else "ended"
            note = f"{what} {delay(failure.delay_ns(w))} after the root cause, global rank "
            note += root.rank
        roles[w.span_id] = (role, note)
    return roles


def timeline_data(timeline: Timeline) -> dict[str, Any]:
    """The JSON the page draws: times in seconds from the first event."""
    t0 = timeline.t0_ns

    def sec(ns: int | None) -> float | None:
        return None if ns is None else round((ns - t0) / 1e9, 6)

    def recovery(r: Recovery) -> dict[str, Any]:
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
            "lost_progress": [
                {"start": sec(x.start_ns), "end": sec(x.end_ns), "text": x.text}
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
                "note": r.restart_note,
                "outcome": r.outcome,
                "failed": r.failed,
                "start": sec(r.start_ns),
                "root_cause": (
                    cause_text(r.failure.root) if r.failure and r.failure.root else None
                ),
                "stalls": [stall_text(s) for s in r.stalls],
                "stragglers": [
                    f"global rank {s.rank} (score {s.latest.score:.2f})" for s in r.stragglers
                ],
                "nodes": [node(n, r) for n in r.nodes],
            }
            for r in timeline.rounds
        ],
        "errors": [
            {"time": sec(e.time_ns), "where": e.where, "message": e.message}
            for e in timeline.errors
        ],
    }


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__CSS__</style>
<script>
window.onerror = function (message, source, line) {
  var box = document.getElementById("js-errors");
  if (!box) { return false; }
  var item = document.createElement("div");
  item.className = "js-error";
  item.textContent = "Script error: " + message + " (line " + line + ")";
  box.appendChild(item);
  return false;
};
</script>
</head>
<body>
<header>
  <h1>__TITLE__</h1>
  <div id="summary"></div>
</header>
<div id="js-errors"></div>
<section id="run-summary">__RUNS__</section>
<div id="legend"></div>
<main id="chart"><noscript>This timeline is drawn by JavaScript.</noscript></main>
<section id="errors"></section>
<div id="tooltip" role="tooltip" hidden></div>
<script id="timeline-data" type="application/json">__DATA__</script>
<script>__JS__</script>
</body>
</html>
"""

_CSS = """
:root { --label: 270px; --row: 22px; --fail: #d64541; --ok: #2e9d4f; --join: #f2b134;
  --member: #cfe0f3; --step: #7e57c2; --run: #9aa5b1; --term: #8d6e63; --ink: #1f2933;
  --grid: #e4e7eb; }
* { box-sizing: border-box; }
body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink);
  margin: 0; padding: 16px 20px 40px; background: #fff; }
header h1 { font-size: 18px; margin: 0 0 4px; }
#summary { color: #52606d; margin-bottom: 10px; }
#js-errors .js-error { background: #fde8e8; color: #9b1c1c; padding: 6px 10px; margin: 4px 0;
  border-radius: 4px; font-family: monospace; }
#legend { display: flex; flex-wrap: wrap; gap: 6px 16px; margin: 6px 0 12px; color: #3e4c59; }
.key { display: inline-flex; align-items: center; gap: 6px; }
.swatch { width: 22px; height: 12px; border-radius: 2px; display: inline-block; }
.chart-box { position: relative; border: 1px solid var(--grid); border-radius: 6px; }
.row { display: flex; align-items: stretch; min-height: var(--row);
  border-top: 1px solid #f1f3f5; }
.row .label { width: var(--label); flex: none; padding: 2px 8px; white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; border-right: 1px solid var(--grid); }
.row .track { position: relative; flex: 1; min-height: var(--row); margin-right: 14px; }
.axis { position: sticky; top: 0; background: #fff; z-index: 3; height: 26px;
  border-bottom: 1px solid var(--grid); }
.axis .label { font-weight: 600; color: #52606d; padding-top: 5px; }
.tick { position: absolute; top: 0; bottom: 0; border-left: 1px solid var(--grid);
  font-size: 11px; color: #7b8794; padding: 5px 0 0 3px; }
.round-head { background: #f5f7fa; font-weight: 600; min-height: 26px; }
.round-head .label { padding-top: 4px; }
.round-head .track { font-weight: 400; color: #52606d; padding: 4px 8px; white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; }
.round-head.failed .label { color: var(--fail); }
.note { color: #b45309; font-weight: 600; }
.outcome-bad { color: var(--fail); font-weight: 600; }
.outcome-good { color: var(--ok); font-weight: 600; }
.node .label { font-weight: 600; }
.worker .label { padding-left: 26px; color: #3e4c59; }
.worker.failed .label { color: var(--fail); font-weight: 600; }
.bar { position: absolute; top: 4px; height: 14px; border-radius: 3px; min-width: 2px;
  cursor: default; }
.bar:hover { outline: 2px solid #1f2933; z-index: 2; }
.bar.join { background: var(--join); }
.bar.join.error { background: var(--fail); }
.bar.member { background: var(--member); border: 1px solid #9fbfe3; }
.bar.step { top: 15px; height: 5px; background: var(--step); }
.bar.SUCCEEDED { background: var(--ok); }
.bar.RUNNING, .bar.UNKNOWN, .bar.STOPPED { background: var(--run); }
.bar.TERMINATED { background: var(--term); }
.bar.RESTARTED { background: repeating-linear-gradient(45deg, #5b7db1 0 4px, #8aa6d1 4px 8px); }
.bar.failed { background: var(--fail); }
.bar.LOST { background: repeating-linear-gradient(90deg, #7c3aed 0 6px, transparent 6px 9px);
  border: 1px dashed #7c3aed; }
.bar.failed.REPLACED { background: repeating-linear-gradient(45deg, #d64541 0 4px,
  #ee8a86 4px 8px); }
.agent-end { position: absolute; top: 5px; width: 12px; height: 12px; margin-left: -6px;
  transform: rotate(45deg); border: 2px solid #fff; z-index: 2; }
.agent-end.SUCCEEDED { background: var(--ok); }
.agent-end.FAILED { background: var(--fail); }
.overlay { position: absolute; top: 0; bottom: 0; left: var(--label); right: 14px;
  pointer-events: none; }
.restart-line { position: absolute; bottom: 0; border-left: 2px dashed #b45309; }
#errors h2 { font-size: 15px; margin: 20px 0 6px; }
#errors li { color: var(--fail); }
#run-summary h2 { font-size: 15px; margin: 4px 0 6px; }
#run-summary table { width: 100%; table-layout: fixed; border-collapse: collapse;
  margin: 0 0 14px; }
#run-summary caption { text-align: left; font-weight: 600; padding: 4px 0; }
#run-summary th, #run-summary td { text-align: left; vertical-align: top; padding: 4px 8px;
  border-bottom: 1px solid var(--grid); overflow-wrap: anywhere; }
#run-summary th { background: #f5f7fa; color: #52606d; font-weight: 600; }
#run-summary ul { margin: 0; padding-left: 16px; }
#run-summary .root-cause, #run-summary .independent, #run-summary li.root_cause {
  color: var(--fail); }
#run-summary .facts, #run-summary .message { color: #52606d; }
#run-summary .cost { color: #b45309; }
.failures .c-at { width: 80px; }
.failures .c-round { width: 64px; }
.failures .c-cause { width: 21%; }
.failures .c-then { width: 27%; }
.failures .c-outcome { width: 130px; }
.axis .track { overflow: hidden; }
.round-head .root { color: var(--fail); font-weight: 600; }
.worker.root .label { color: var(--fail); font-weight: 700; }
.bar.root { box-shadow: 0 0 0 2px #7f1d1d; color: #fff; font-size: 10px; font-weight: 700;
  line-height: 14px; padding-left: 4px; overflow: hidden; white-space: nowrap; }
.bar.failed.PEER_FAILED { background: repeating-linear-gradient(135deg, #d64541 0 3px,
  #f4b4b1 3px 6px); }
.recovery .label { padding-left: 26px; color: #92400e; font-style: italic; }
.bar.recovery { top: 3px; height: 16px; background: #fdf1dc; border: 1px dashed #b45309; }
.bar.phase { top: 5px; height: 12px; color: #fff; font-size: 9px; line-height: 12px;
  padding-left: 2px; overflow: hidden; white-space: nowrap; }
.bar.phase.stop_workers { background: #c2410c; }
.bar.phase.rendezvous { background: #ca8a04; }
.bar.phase.assign_worker_ranks { background: #7e57c2; }
.bar.phase.start_workers { background: #0f766e; }
.bar.phase.other { background: #64748b; }
#run-summary .stalled, #run-summary .waited, #run-summary li.waited { color: #b45309; }
#run-summary details summary { cursor: pointer; color: #52606d; }
#run-summary pre.stack { white-space: pre-wrap; overflow-wrap: anywhere; max-height: 320px;
  overflow: auto; margin: 4px 0 0; padding: 6px 8px; background: #f5f7fa; font-size: 11px; }
.stalls .c-at { width: 96px; }
.stalls .c-round { width: 64px; }
.stalls .c-stalled { width: 18%; }
.stalls .c-waited { width: 30%; }
.stalls .c-waiting { width: 16%; }
.round-head .stall { color: #b45309; font-weight: 600; }
.stall-band { position: absolute; top: 18px; height: 4px; z-index: 1;
  background: repeating-linear-gradient(90deg, #d97706 0 6px, transparent 6px 9px); }
.stall-band.waited { background: #d97706; }
.lost-band { position: absolute; top: 14px; height: 8px; z-index: 1;
  background: repeating-linear-gradient(45deg, #dc2626 0 4px, transparent 4px 8px); }
.lost-mark { position: absolute; top: 1px; height: 12px; z-index: 2; padding: 0 4px;
  font-size: 9px; font-weight: 700; line-height: 12px; color: #fff; background: #dc2626;
  border-radius: 0 3px 3px 0; white-space: nowrap; }
.goodput td { text-align: right; }
.stall-mark { position: absolute; top: 1px; height: 20px; z-index: 2; border-left: 3px solid
  #b45309; padding: 0 4px; font-size: 9px; font-weight: 700; line-height: 12px; color: #fff;
  background: #b45309; border-radius: 0 3px 3px 0; white-space: nowrap; }
#run-summary b.straggler, .round-head .straggler { color: #a16207; font-weight: 600; }
.stragglers .c-at { width: 150px; }
.stragglers .c-round { width: 64px; }
.stragglers .c-rank { width: 22%; }
.stragglers .c-score { width: 12%; }
.stragglers .c-late { width: 19%; }
.stragglers .c-wait { width: 18%; }
.worker.straggler .label { color: #a16207; font-weight: 600; }
.straggler-band { position: absolute; top: 18px; height: 4px; z-index: 1; background: #ca8a04; }
.straggler-mark { position: absolute; top: 1px; height: 12px; z-index: 2; padding: 0 4px;
  font-size: 9px; font-weight: 700; line-height: 12px; color: #fff; background: #ca8a04;
  border-radius: 0 3px 3px 0; white-space: nowrap; }
#tooltip { position: fixed; z-index: 10; max-width: 460px; background: #1f2933; color: #fff;
  padding: 8px 10px; border-radius: 5px; font-size: 12px; pointer-events: none;
  box-shadow: 0 4px 14px rgba(0,0,0,.25); white-space: pre-line; }
#tooltip b { display: block; margin-bottom: 2px; }
"""

_JS = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("timeline-data").textContent);
  var span = Math.max(data.duration, 0.001);
  var tooltip = document.getElementById("tooltip");
  var PHASES = ["stop_workers", "rendezvous", "assign_worker_ranks", "start_workers"];

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = text; }
    return node;
  }
  function pct(t) { return (100 * Math.max(0, t) / span) + "%"; }
  function secs(t) { return (t === null || t === undefined) ? "?" : "+" + t.toFixed(3) + "s"; }
  function dur(a, b) { return (b - a).toFixed(3) + "s"; }
  function count(n, what) { return n + " " + what + (n === 1 ? "" : "s"); }

  function tip(node, heading, lines) {
    node.setAttribute("aria-label", heading + ". " + lines.join(". "));
    node.addEventListener("mouseenter", function () {
      tooltip.textContent = "";
      tooltip.appendChild(el("b", null, heading));
      tooltip.appendChild(document.createTextNode(lines.join("\n")));
      tooltip.hidden = false;
    });
    node.addEventListener("mousemove", function (ev) {
      var x = Math.min(ev.clientX + 14, window.innerWidth - tooltip.offsetWidth - 8);
      var y = ev.clientY + 16;
      if (y + tooltip.offsetHeight > window.innerHeight) {
        y = ev.clientY - tooltip.offsetHeight - 10;
      }
      tooltip.style.left = x + "px";
      tooltip.style.top = y + "px";
    });
    node.addEventListener("mouseleave", function () { tooltip.hidden = true; });
  }

  function bar(track, cls, start, end, heading, lines) {
    var b = el("div", "bar " + cls);
    b.style.left = pct(start);
    b.style.width = "calc(" + pct(end - start) + " + 1px)";
    tip(b, heading, lines);
    track.appendChild(b);
    return b;
  }

  // A stall on a row: underlined for its length, and flagged at its start where the rank
  // waited for (or the node an agent's wait is on) is.
  function stallMarks(track, stalls, heading) {
    (stalls || []).forEach(function (s) {
      var lines = [s.text, secs(s.start) + " \u2192 " + secs(s.end) + " (" +
                   dur(s.start, s.end) + ", the latest report)"];
      if (s.frame) { lines.push("its innermost frame: " + s.frame); }
      var band = el("div", "stall-band " + s.role);
      band.style.left = pct(s.start);
      band.style.width = "calc(" + pct(s.end - s.start) + " + 1px)";
      tip(band, heading, lines);
      track.appendChild(band);
      if (s.role === "waiting") { return; }
      var mark = el("div", "stall-mark", s.role === "waited" ? "STALLED: waited for" : "STALLED");
      mark.style.left = pct(s.start);
      tip(mark, heading, lines);
      track.appendChild(mark);
    });
  }

  // A straggler on its worker's row: flagged at its first report, underlined to its last.
  function stragglerMarks(track, marks, heading) {
    (marks || []).forEach(function (s) {
      var lines = [s.text, "reported " + secs(s.start) + " \u2192 " + secs(s.end)];
      var band = el("div", "straggler-band");
      band.style.left = pct(s.start);
      band.style.width = "calc(" + pct(s.end - s.start) + " + 1px)";
      tip(band, heading, lines);
      track.appendChild(band);
      var mark = el("div", "straggler-mark", "STRAGGLER");
      mark.style.left = pct(s.start);
      tip(mark, heading, lines);
      track.appendChild(mark);
    });
  }

  function row(cls, label) {
    var r = el("div", "row " + cls);
    var l = el("div", "label", label);
    l.title = label;
    var t = el("div", "track");
    r.appendChild(l);
    r.appendChild(t);
    return { row: r, track: t };
  }

  function summary() {
    var nodes = {}, workers = 0;
    data.rounds.forEach(function (r) {
      r.nodes.forEach(function (n) { nodes[n.label] = 1; workers += n.workers.length; });
    });
    var t0 = new Date(data.t0_ms).toISOString().replace("T", " ").replace("Z", " UTC");
    document.getElementById("summary").textContent =
      "run " + data.runs.join(", ") + " \u00b7 " + count(data.rounds.length, "round") +
      " \u00b7 " + count(Object.keys(nodes).length, "node") + " \u00b7 " +
      count(workers, "worker run") + " \u00b7 " +
      data.duration.toFixed(3) + "s from " + t0;
  }

  function legend() {
    var box = document.getElementById("legend");
    [["join", "waiting to join the round"], ["member", "node in the round"],
     ["step", "agent rendezvous / rank assignment"], ["SUCCEEDED", "worker succeeded"],
     ["RUNNING", "worker running / unknown end"],
     ["RESTARTED", "worker restarted (membership change)"],
     ["failed REPLACED", "worker replaced after a failure"], ["failed", "worker failed"],
     ["failed PEER_FAILED", "worker failed because a peer did"],
     ["TERMINATED", "worker terminated"],
     ["LOST", "node or worker lost: never ended, drawn to when last heard"],
     ["recovery", "recovery: its agent restarting the workers"],
     ["phase stop_workers", "stop workers"], ["phase rendezvous", "rendezvous"],
     ["phase assign_worker_ranks", "assign ranks"],
     ["phase start_workers", "start workers"]].forEach(function (k) {
      var key = el("span", "key");
      var sw = el("span", "swatch bar " + k[0]);
      sw.style.position = "static";
      key.appendChild(sw);
      key.appendChild(document.createTextNode(k[1]));
      box.appendChild(key);
    });
    var key = el("span", "key");
    var line = el("span", "swatch");
    line.style.borderLeft = "2px dashed #b45309";
    line.style.width = "10px";
    key.appendChild(line);
    key.appendChild(document.createTextNode("restart / new round"));
    box.appendChild(key);
    key = el("span", "key");
    var flag = el("span", "swatch");
    flag.style.background = "#b45309";
    key.appendChild(flag);
    key.appendChild(document.createTextNode(
      "stall: from its start, on the rank waited for (the waiting ranks underlined)"));
    box.appendChild(key);
    key = el("span", "key");
    flag = el("span", "swatch");
    flag.style.background = "#ca8a04";
    key.appendChild(flag);
    key.appendChild(document.createTextNode(
      "straggler: its peers wait for it at every collective (first to last report)"));
    box.appendChild(key);
  }

  function axis(box) {
    var a = row("axis", "node / worker");
    var step = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600]
      .find(function (s) { return span / s <= 12; }) || Math.ceil(span / 12);
    for (var t = 0; t <= span + 1e-9; t += step) {
      var tick = el("div", "tick", "+" + (step < 1 ? t.toFixed(1) : Math.round(t)) + "s");
      tick.style.left = pct(t);
      a.track.appendChild(tick);
    }
    box.appendChild(a.row);
  }

  function nodeRows(box, n, round) {
    var head = n.label + (n.rank !== null ? " \u00b7 rank " + n.rank : "");
    var r = row("node", head);
    var where = round.label + ", " + n.label;
    if (n.join) {
      var failed = n.join.status === "ERROR";
      bar(r.track, "join" + (failed ? " error" : ""), n.join.start, n.join.end,
          (failed ? "rendezvous join FAILED" : "waiting to join") + " \u00b7 " + n.label,
          ["started " + secs(n.join.start) + ", waited " + dur(n.join.start, n.join.end),
           "rank " + (n.rank === null ? "?" : n.rank) + " of world size " +
             (n.world_size === null ? "?" : n.world_size),
           n.join.detail ? n.join.detail : where]);
    }
    if (n.member) {
      bar(r.track, "member" + (n.lost !== null ? " LOST" : ""), n.member.start, n.member.end,
          (n.lost !== null ? "LOST in " : "in ") + round.label + " \u00b7 " + n.label,
          [secs(n.member.start) + " \u2192 " + secs(n.member.end) + " (" +
             dur(n.member.start, n.member.end) + ")",
           n.lost !== null ? "lost: never ended its spans; last heard at " + secs(n.lost)
                           : "left the round: " + (n.member.detail || "-")]);
    }
    n.steps.forEach(function (s) {
      bar(r.track, "step", s.start, s.end, s.name + " \u00b7 " + n.label,
          [secs(s.start) + " \u2192 " + secs(s.end) + " (" + dur(s.start, s.end) + ")"]);
    });
    if (n.agent) {
      var m = el("div", "agent-end " + n.agent.state);
      m.style.left = pct(n.agent.end);
      tip(m, "agent " + n.agent.state + " \u00b7 " + n.label,
          ["at " + secs(n.agent.end)].concat(n.agent.message ? [n.agent.message] : []));
      r.track.appendChild(m);
    }
    stallMarks(r.track, n.stalls, "stalled \u00b7 " + n.label);
    (n.lost_progress || []).forEach(function (x) {
      var band = el("div", "lost-band");
      band.style.left = pct(x.start);
      band.style.width = "calc(" + pct(x.end - x.start) + " + 1px)";
      var lines = [x.text, secs(x.start) + " \u2192 " + secs(x.end) + " (" +
                   dur(x.start, x.end) + ")"];
      tip(band, "lost progress \u00b7 " + n.label, lines);
      r.track.appendChild(band);
      var mark = el("div", "lost-mark", "LOST PROGRESS");
      mark.style.left = pct(x.start);
      tip(mark, "lost progress \u00b7 " + n.label, lines);
      r.track.appendChild(mark);
    });
    box.appendChild(r.row);
    n.recoveries.forEach(function (rec) {
      var rr = row("recovery", "recovery \u00b7 " + rec.cause);
      bar(rr.track, "recovery", rec.start, rec.end, "recovery \u00b7 " + n.label,
          [secs(rec.start) + " \u2192 " + secs(rec.end) + " (" + dur(rec.start, rec.end) + ")",
           rec.text]);
      rec.phases.forEach(function (p) {
        var known = PHASES.indexOf(p.name) >= 0 ? p.name : "other";
        var seg = bar(rr.track, "phase " + known, p.start, p.end,
                      p.name + " \u00b7 " + n.label,
                      [secs(p.start) + " \u2192 " + secs(p.end) + " (" + dur(p.start, p.end) + ")",
                       "a phase of its recovery (" + rec.cause + ")"]);
        seg.textContent = p.name.replace(/_/g, " ");
      });
      box.appendChild(rr.row);
    });
    n.workers.forEach(function (w) {
      var rank = w.rank === null ? "?" : w.rank;
      var role = w.role ? " " + w.role : "";
      var slow = (w.stragglers || []).length ? " straggler" : "";
      var wr = row("worker" + (w.failed ? " failed" : "") + role + slow,
                   "worker rank " + rank + " \u00b7 " + w.state);
      if (w.note) { wr.row.firstChild.title += " \u00b7 " + w.note; }
      var lines = [secs(w.start) + " \u2192 " + secs(w.end) + " (" + dur(w.start, w.end) + ")",
                   "node " + n.label + ", " + round.label];
      if (w.local_rank !== null) { lines.push("local rank " + w.local_rank); }
      if (w.exit !== null) { lines.push("exit code " + w.exit); }
      if (w.pid !== null) { lines.push("pid " + w.pid); }
      if (w.restarts !== null) { lines.push("agent restarts " + w.restarts); }
      if (w.message) { lines.push(w.message); }
      if (w.note) { lines.push(w.note); }
      if (w.last_words) { lines.push("last words (stderr):\n" + w.last_words); }
      var wb = bar(wr.track, w.state + (w.failed ? " failed" : "") + role, w.start, w.end,
                   "worker rank " + rank + " \u00b7 " + w.state, lines);
      if (w.role === "root") { wb.textContent = "ROOT CAUSE"; }
      stallMarks(wr.track, w.stalls, "stalled \u00b7 worker rank " + rank + " \u00b7 " + n.label);
      stragglerMarks(wr.track, w.stragglers,
                     "straggler \u00b7 worker rank " + rank + " \u00b7 " + n.label);
      box.appendChild(wr.row);
    });
  }

  function chart() {
    var main = document.getElementById("chart");
    var box = el("div", "chart-box");
    var overlay = el("div", "overlay");
    var restarts = [];
    axis(box);
    data.rounds.forEach(function (round) {
      var h = row("round-head" + (round.failed ? " failed" : ""), round.label);
      var bits = ["run " + round.run_id];
      if (round.world_size !== null) { bits.push("world size " + round.world_size); }
      bits.push(count(round.nodes.length, "node"));
      h.track.appendChild(document.createTextNode(bits.join(" \u00b7 ")));
      if (round.note) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        h.track.appendChild(el("span", "note", "\u21bb " + round.note));
      }
      if (round.outcome) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        var cls = round.failed ? "outcome-bad" : "outcome-good";
        h.track.appendChild(el("span", cls, round.outcome));
      }
      if (round.root_cause) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        h.track.appendChild(el("span", "root", "root cause: " + round.root_cause));
      }
      round.stalls.forEach(function (text) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        h.track.appendChild(el("span", "stall", "stalled: " + text));
      });
      (round.stragglers || []).forEach(function (text) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        h.track.appendChild(el("span", "straggler", "straggler: " + text));
      });
      box.appendChild(h.row);
      if (round.note) { restarts.push([round, h.row]); }
      round.nodes.forEach(function (n) { nodeRows(box, n, round); });
    });
    box.appendChild(overlay);
    main.appendChild(box);
    restarts.forEach(function (r) {
      var line = el("div", "restart-line");
      line.style.left = pct(r[0].start);
      line.style.top = (r[1].offsetTop + r[1].offsetHeight) + "px";
      line.title = r[0].note;
      overlay.appendChild(line);
    });
  }

  function errors() {
    if (!data.errors.length) { return; }
    var sec = document.getElementById("errors");
    sec.appendChild(el("h2", null, "Errors"));
    var list = el("ul");
    data.errors.forEach(function (e) {
      list.appendChild(el("li", null, secs(e.time) + "  " + e.where + ": " + e.message));
    });
    sec.appendChild(list);
  }

  summary();
  legend();
  chart();
  errors();
  document.body.setAttribute("data-rendered", "true");
})();
"""
