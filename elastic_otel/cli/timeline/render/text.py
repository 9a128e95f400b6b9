"""The timeline in the terminal: the run summaries and goodput, then per round an aligned table
of its nodes and their workers (times relative to the job's start), below it the round's
stalls, stragglers, slowdowns and slow links, root cause and lost progress, and last the error
log records. Colour only on a terminal without ``NO_COLOR``."""

from __future__ import annotations

import datetime as dt
import os
import sys
from typing import Any

from elastic_otel.cli.timeline.analysis.failures import Failure
from elastic_otel.cli.timeline.analysis.slowdowns import LinkFinding, Slowdown
from elastic_otel.cli.timeline.analysis.stalls import Stall
from elastic_otel.cli.timeline.analysis.stragglers import StragglerSpell
from elastic_otel.cli.timeline.analysis.timeline import LOST, NodeRow, Timeline
from elastic_otel.cli.timeline.render.goodput import goodput_lines
from elastic_otel.cli.timeline.render.phrases import (
    consequence_text,
    error_where,
    lost_progress_text,
    outcome_text,
    restart_note,
    root_cause_line,
    seconds,
    stalled_line,
)
from elastic_otel.cli.timeline.render.slowdown_phrases import (
    link_line,
    link_when,
    slowdown_line,
    slowdown_when,
)
from elastic_otel.cli.timeline.render.summary import render_summary
from elastic_otel.cli.timeline.render.wait_phrases import stall_line, straggler_line, straggler_when
from elastic_otel.names import attributes as A

# (header, right-aligned); the unnamed column marks failures (x) and restarted workers (~).
_COLUMNS = (
    ("NODE", False),
    ("RANK", True),
    ("JOIN AT", True),
    ("WAIT", True),
    ("", False),
    ("WORKER", False),
    ("STATE", False),
    ("START", True),
    ("END", True),
    ("EXIT", True),
    ("DETAIL", False),
)
_RED, _YELLOW, _GREEN, _BOLD, _RESET = "\033[31m", "\033[33m", "\033[32m", "\033[1m", "\033[0m"


def use_color(stream: Any = None) -> bool:
    """Colour when writing to a terminal and ``NO_COLOR`` is unset."""
    stream = sys.stdout if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def render_text(timeline: Timeline, color: bool = False) -> str:
    """The timeline as aligned plain-text tables, one per round, times relative to the start."""
    if not timeline.rounds:
        return "no rendezvous, agent or worker spans found\n"
    t0 = timeline.t0_ns

    def rel(ns: int | None) -> str:
        return "" if ns is None else f"+{(ns - t0) / 1e9:.3f}s"

    def paint(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if color and text else text

    def count(n: int, what: str) -> str:
        return f"{n} {what}" if n == 1 else f"{n} {what}s"

    runs = ", ".join(timeline.run_ids)
    started = dt.datetime.fromtimestamp(t0 / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    lines = [
        f"elastic-otel timeline: run {runs}: {count(len(timeline.rounds), 'round')}, "
        f"{count(len(timeline.nodes), 'node')}, {count(timeline.worker_runs, 'worker run')}, "
        f"{(timeline.t1_ns - t0) / 1e9:.3f}s from {started[:-3]} UTC",
    ]
    if timeline.runs:
        lines += ["", *render_summary(timeline.runs, rel)]
    if timeline.goodput:
        lines += [
            paint(line, _BOLD) if line.startswith("GOODPUT") else line
            for line in goodput_lines(timeline.goodput)
        ]
    for rnd in timeline.rounds:
        head = [rnd.label.upper(), f"run {rnd.run_id}"]
        if rnd.world_size is not None:
            head.append(f"world size {rnd.world_size}")
        head.append(count(len(rnd.nodes), "node"))
        began, outcome = restart_note(rnd), outcome_text(rnd)
        if began:
            head.append(paint(began, _YELLOW))
        if outcome:
            code = _RED if rnd.failed or rnd.outcome.job_failed else _GREEN
            head.append(paint(outcome, code))
        lines += ["", paint(" · ".join(head[:1]), _BOLD) + " · " + " · ".join(head[1:])]
        rows: list[tuple[tuple[str, ...], str]] = []
        for node in rnd.nodes:
            join = node.join
            wait = seconds(join.duration_ns) if join else ""
            detail = _node_detail(node, rel)
            state = "JOIN FAILED" if node.join_failed else ("joined" if node.member else "")
            if node.lost_ns is not None:
                state = LOST
            rank = "" if node.rank is None else str(node.rank)
            cells = (
                node.label,
                rank,
                rel(join.start_ns) if join else "",
                wait,
                "x" if node.join_failed else "",
                "",
                state,
                "",
                rel(node.left_ns),
                "",
                detail,
            )
            rows.append((cells, _RED if node.join_failed or node.lost_ns is not None else ""))
            for w in node.workers:
                rank_label = "?" if w.global_rank is None else str(w.global_rank)
                cells = (
                    "",
                    "",
                    "",
                    "",
                    "x" if w.failed else ("~" if w.state == "RESTARTED" else ""),
                    f"rank {rank_label}",
                    w.state,
                    rel(w.start_ns),
                    rel(w.end_ns),
                    "" if w.exit_code is None else str(w.exit_code),
                    w.message,
                )
                code = _RED if w.failed else (_YELLOW if w.state == "RESTARTED" else "")
                rows.append((cells, code))
        lines += ["  " + line for line in _table(rows, paint)]
        if rnd.stalls:
            lines += ["", *("  " + line for s in rnd.stalls for line in stall_lines(s, rel, paint))]
        if rnd.stragglers:
            lines += [
                "",
                *("  " + line for s in rnd.stragglers for line in straggler_lines(s, rel, paint)),
            ]
        if rnd.slowdowns or rnd.links:
            slow = [line for s in rnd.slowdowns for line in slowdown_lines(s, rel, paint)]
            slow += [line for f in rnd.links for line in link_lines(f, rel, paint)]
            lines += ["", *("  " + line for line in slow)]
        if rnd.failure is not None:
            lines += ["", *("  " + line for line in failure_lines(rnd.failure, rel, paint))]
        for lost in rnd.lost:
            lines.append(
                f"  LOST PROGRESS {rel(lost.start_ns)} → {rel(lost.end_ns)} on {lost.node}: "
                f"{lost_progress_text(lost)}"
            )
    if timeline.errors:
        lines += ["", paint("ERRORS", _BOLD)]
        for note in timeline.errors:
            lines.append(f"  {rel(note.time_ns)}  {error_where(note)}: {paint(note.message, _RED)}")
    return "\n".join(lines) + "\n"


def failure_lines(failure: Failure, rel: Any, paint: Any = lambda text, code: text) -> list[str]:
    """A failed round's root cause, then what followed it on every node, by delay."""
    root = failure.root
    if root is None and failure.stalled is not None:
        when = rel(failure.stalled.start_ns)
        lines = [paint(f"ROOT CAUSE at {when}: {stalled_line(failure.stalled)}", _RED)]
        rest = failure.after_root()
    elif root is None:
        lines = [paint("ROOT CAUSE not seen: no worker failed on its own; these ended after", _RED)]
        rest = failure.consequences
    else:
        lines = [paint(f"ROOT CAUSE at {rel(root.end_ns)}: {root_cause_line(root)}", _RED)]
        if root.last_words:
            lines.append("  last words (stderr):")
            lines += [f"    | {line}" for line in root.last_words.splitlines()]
        rest = failure.after_root()
    for worker in rest:
        when = "" if failure.cause_rank is not None else f"at {rel(worker.end_ns)} "
        text = f"  {when}{consequence_text(failure, worker)}"
        lines.append(paint(text, _RED) if worker.kind == A.KIND_ROOT_CAUSE else text)
    return lines


def stall_lines(stall: Stall, rel: Any, paint: Any = lambda text, code: text) -> list[str]:
    """A stall, from its start to its latest report, then the innermost frame of each rank."""
    when = f" · from {rel(stall.start_ns)}, last reported at {rel(stall.end_ns)}"
    lines = [paint(stall_line(stall), _YELLOW) + when]
    for rank, node, frame, waited in stall.frames():
        text = f"  global rank {rank} on {node}: {frame}"
        lines.append(paint(text + "  (waited for)", _YELLOW) if waited else text)
    return lines


def straggler_lines(
    straggler: StragglerSpell, rel: Any, paint: Any = lambda text, code: text
) -> list[str]:
    """A straggler with when it was reported, then the round's nodes that named none."""
    lines = [paint(straggler_line(straggler), _YELLOW) + f" · {straggler_when(straggler, rel)}"]
    if straggler.quiet:
        lines.append(f"  no straggler named by {', '.join(straggler.quiet)}")
    return lines


def slowdown_lines(slowdown: Slowdown, rel: Any, paint: Any = lambda text, code: text) -> list[str]:
    """A slowdown with when it lasted and the nodes that saw it, then those that did not."""
    lines = [paint(slowdown_line(slowdown), _YELLOW) + f" · {slowdown_when(slowdown, rel)}"]
    if slowdown.quiet:
        lines.append(f"  not reported by {', '.join(slowdown.quiet)}")
    return lines


def link_lines(finding: LinkFinding, rel: Any, paint: Any = lambda text, code: text) -> list[str]:
    """A slow link (or a node's own evidence) with when it was reported, then each path or
    port behind it."""
    line = link_line(finding)
    lines = [(line if finding.local else paint(line, _YELLOW)) + f" · {link_when(finding, rel)}"]
    return lines + [f"  | {evidence}" for evidence in finding.latest.evidence]


def _node_detail(node: NodeRow, rel: Any) -> str:
    parts = []
    if node.lost_ns is not None:
        parts.append(f"LOST: never ended its spans; last heard at {rel(node.lost_ns)}")
    elif node.join_failed and node.join is not None:
        parts.append(node.join.detail or "rendezvous failed")
    elif node.member is not None and node.member.detail:
        parts.append(f"left the round: {node.member.detail}")
    if node.agent_state:
        text = f"agent {node.agent_state} at {rel(node.agent_end_ns)}"
        if node.agent_message:
            text += f" ({node.agent_message})"
        parts.append(text)
    return "; ".join(parts)


def _table(rows: list[tuple[tuple[str, ...], str]], paint: Any) -> list[str]:
    headers = tuple(name for name, _ in _COLUMNS)
    widths = [len(h) for h in headers]
    for cells, _ in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]

    def fmt(cells: tuple[str, ...]) -> str:
        out = []
        for cell, width, (_, right) in zip(cells, widths, _COLUMNS, strict=True):
            out.append(cell.rjust(width) if right else cell.ljust(width))
        return "  ".join(out).rstrip()

    lines = [fmt(headers)]
    for cells, code in rows:
        line = fmt(cells)
        lines.append(paint(line, code) if code else line)
    return lines
