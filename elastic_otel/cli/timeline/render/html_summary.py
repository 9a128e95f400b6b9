"""The per-run summary above the page's chart, as tables that wrap to the page's width: the
run's totals; each stall, with the rank waited for, its innermost frame and its whole stacks
(a ``<details>`` element), the ranks waiting, and the innermost frame of every rank; each
straggler; each slowdown, and the links node 0 named with every node's own evidence; each
failure with its root cause across nodes, the workers that failed after it with their delays,
the job restart it led to and its cost, and each node's recovery phase by phase; the nodes that
held a round up."""

from __future__ import annotations

import html

from elastic_otel.cli.timeline.analysis.failures import Failure
from elastic_otel.cli.timeline.analysis.runs import NodeRecovery, Restart, RunSummary
from elastic_otel.cli.timeline.analysis.slowdowns import LinkFinding, Slowdown
from elastic_otel.cli.timeline.analysis.stalls import Stall
from elastic_otel.cli.timeline.analysis.stragglers import StragglerSpell
from elastic_otel.cli.timeline.render.phrases import (
    Rel,
    cause_facts,
    cause_text,
    consequence_text,
    ending_text,
    failure_text,
    ranks_text,
    recovery_text,
    restart_reason,
    seconds,
    stalled_line,
    stalled_text,
)
from elastic_otel.cli.timeline.render.slowdown_phrases import (
    alike_text,
    inside_text,
    interval_text,
    link_head,
    link_stats,
)
from elastic_otel.cli.timeline.render.wait_phrases import phase_text, stall_text
from elastic_otel.model.stalls import STARTUP, TRAINING


def summary_html(runs: list[RunSummary], rel: Rel) -> str:
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
        out += slowdown_tables(run, rel)
        rows = [_happening_row(run, f, r, rel) for f, r in run.happenings()]
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
    """``1 in training, longest 62 s · 1 in start-up, longest 21 s · 1 agent wait``."""
    others = len(run.agent_waits)
    parts = []
    for phase, word in ((TRAINING, "training"), (STARTUP, "start-up")):
        found = [s for s in run.training_stalls if s.phase == phase]
        if found:
            parts.append(f"{len(found)} in {word}, longest {max(s.seconds for s in found):.0f} s")
    if others:
        parts.append(f"{others} agent wait{'s' if others > 1 else ''}")
    return " · ".join(parts)


def _stall_row(stall: Stall, rel: Rel) -> str:
    """A stall: what, whom the ranks wait for (frame and whole stacks), who waits, frames."""
    e = html.escape
    number = "" if stall.round is None else str(stall.round)
    what = (
        f'<b class="stalled">{e(stall_text(stall))}</b>'
        f'<div class="facts">{e(phase_text(stall))} · last reported at {e(rel(stall.end_ns))}</div>'
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
            for rank, node, frame, named in stall.frames()
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
    ranks = len(run.straggling_ranks)
    lowest = min(s.lowest for s in run.stragglers)
    return f"{ranks} rank{'s' if ranks > 1 else ''}, lowest score {lowest:.2f}"


def _straggler_row(straggler: StragglerSpell, rel: Rel) -> str:
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


def slowdown_tables(run: RunSummary, rel: Rel) -> list[str]:
    """The run's slowdowns, then the links node 0 named with every node's own evidence."""
    e = html.escape
    out = []
    if run.slowdowns:
        lost = sum(s.latest.lost_s or 0.0 for s in run.slowdowns)
        out += [
            f'<table class="slowdowns"><caption>Slowdowns · run {e(run.run_id)} · '
            f"{len(run.slowdowns)}, {lost:.1f} s of training lost</caption>"
            '<colgroup><col class="c-at"><col class="c-round"><col class="c-group">'
            '<col class="c-slower"><col class="c-inside"><col class="c-part"><col class="c-lost">'
            '<col class="c-seen"></colgroup><thead><tr><th>From</th><th>Round</th>'
            "<th>Process group</th><th>Slower</th><th>Inside the collectives</th><th>Part</th>"
            "<th>Training lost</th><th>Seen by</th></tr></thead><tbody>",
            *(_slowdown_row(s, rel) for s in run.slowdowns),
            "</tbody></table>",
        ]
    if run.links:
        named = sum(not f.local for f in run.links)
        nodes = len({f.latest.node for f in run.links if f.local})
        count = [f"{named} named"] if named else []
        count += [f"evidence from {nodes} node{'s' if nodes > 1 else ''}"] if nodes else []
        out += [
            f'<table class="links"><caption>Slow links · run {e(run.run_id)} · '
            f"{', '.join(count)}</caption>"
            '<colgroup><col class="c-at"><col class="c-round"><col class="c-scope">'
            '<col class="c-named"><col class="c-what"><col class="c-evidence"></colgroup>'
            "<thead><tr><th>Reported</th><th>Round</th><th>Scope</th><th>Named</th>"
            "<th>What it shows</th><th>Each path or port</th></tr></thead><tbody>",
            *(_link_row(f, rel) for f in run.links),
            "</tbody></table>",
        ]
    return out


def _slowdown_row(slowdown: Slowdown, rel: Rel) -> str:
    """A slowdown: when, how much slower, the time inside, the part, its cost, its nodes."""
    e = html.escape
    r = slowdown.latest
    number = "" if slowdown.round is None else str(slowdown.round)
    when = f"{e(rel(slowdown.start_ns))} → {e(rel(slowdown.end_ns))}"
    slower = f'<b class="slowdown">{r.ratio:.1f}x</b>' if r.ratio is not None else ""
    slower += f'<div class="facts">{e(interval_text(r))}</div>' if interval_text(r) else ""
    inside = e(inside_text(r))
    inside += f'<div class="facts">{e(alike_text(r))}</div>' if alike_text(r) else ""
    lost = f'<b class="cost">{r.lost_s:.1f} s</b>' if r.lost_s is not None else ""
    lost += "" if slowdown.ended else '<div class="facts">so far</div>'
    seen = e(", ".join(slowdown.seen_by))
    seen += f'<div class="facts">{"ended" if slowdown.ended else "last reported"} at '
    seen += f"{e(rel(slowdown.end_ns))}</div>"
    if slowdown.quiet:
        seen += f'<div class="facts">not reported by {e(", ".join(slowdown.quiet))}</div>'
    return (
        f'<tr class="slowdown"><td>{when}</td><td>{e(number)}</td><td>{e(slowdown.group)}</td>'
        f"<td>{slower}</td><td>{inside}</td><td>{e(r.part)}</td><td>{lost}</td><td>{seen}</td></tr>"
    )


def _link_row(finding: LinkFinding, rel: Rel) -> str:
    """A finding of node 0 (or a node's own evidence): what it names, what it shows, each path
    or port behind it."""
    e = html.escape
    r = finding.latest
    number = "" if finding.round is None else str(finding.round)
    when = e(rel(finding.start_ns))
    if len(finding.reports) > 1:
        when += f" → {e(rel(finding.end_ns))}"
    if finding.local:
        scope, named = "evidence", f"<b>{e(r.node)}</b>"
    else:
        scope = e(r.scope)
        named = f'<b class="slow-link">{e(link_head(r))}</b>'
        named += f'<div class="facts">from {e(r.node)}</div>'
    what = e(link_stats(r)) + (f'<div class="facts">{e(r.transport)}</div>' if r.transport else "")
    evidence = "".join(f"<li>{e(line)}</li>" for line in r.evidence)
    evidence = f"<ul>{evidence}</ul>" if evidence else ""
    return (
        f'<tr class="link"><td>{when}</td><td>{e(number)}</td><td>{scope}</td><td>{named}</td>'
        f"<td>{what}</td><td>{evidence}</td></tr>"
    )


def _happening_row(
    run: RunSummary, failure: Failure | None, restart: Restart | None, rel: Rel
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
    if root is None and failure.stalled is not None:
        stalled = failure.stalled
        parts = [f'<b class="root-cause">{e(stalled_text(stalled))}</b>']
        if stalled.frame:
            parts.append(f'<div class="facts">at {e(stalled.frame)}</div>')
        parts.append(f'<div class="message">{e(stalled_line(stalled))}</div>')
        return "".join(parts)
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


def _recovery_item(r: NodeRecovery, rel: Rel) -> str:
    e = html.escape
    return f"<b>{e(r.node)}</b> at {e(rel(r.start_ns))}: {e(recovery_text(r))}"
