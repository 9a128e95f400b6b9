"""The goodput of each run as the terminal and the page show it: a headline for the job so far,
then a table of shares of wall time per attempt and in total."""

from __future__ import annotations

import html

from elastic_otel.cli.timeline.analysis.goodput import AttemptGoodput, by_run
from elastic_otel.model.goodput import CATEGORIES, Breakdown, describe


def _share(seconds: float, wall: float) -> str:
    return f"{100 * seconds / wall:.1f} %" if wall > 0 else "-"


_HEAD = ("ATTEMPT", "WALL", "GOODPUT", *(c.upper() for c in CATEGORIES), "LOST STEPS")


def _cells(name: str, b: Breakdown, ratio: float) -> tuple[str, ...]:
    lost = ""
    if b.lost_steps is not None:
        first, last = b.lost_steps
        lost = f"{first}-{last}" if last > first else str(first)
    return (
        name,
        f"{b.wall_s:.3f}s",
        f"{100 * ratio:.1f} %",
        *(_share(b.badput_s[c], b.wall_s) for c in CATEGORIES),
        lost,
    )


def goodput_headlines(items: list[AttemptGoodput]) -> list[tuple[str, str]]:
    """Per run: its id and ``goodput 62.1 % of 13.0 s; badput: …`` (the job so far)."""
    return [(run_id, describe(attempts[-1].job)) for run_id, attempts in by_run(items).items()]


def goodput_lines(items: list[AttemptGoodput]) -> list[str]:
    """Per run: ``GOODPUT · run R · goodput 81.0 % of 62.3 s; badput: …``, then a table of
    shares of wall time per attempt and in total."""
    lines: list[str] = []
    for run_id, attempts in by_run(items).items():
        last = attempts[-1]
        job = last.job
        ended = "" if last.final else " (the job had not ended)"
        total = describe(job).replace(f"goodput {100 * job.ratio:.1f} %", "", 1)
        lines += [
            "",
            f"GOODPUT · run {run_id} · goodput {100 * last.job_ratio:.1f} %{total}{ended}",
        ]
        rows = [_HEAD]
        rows += [_cells(str(a.attempt), a.breakdown, a.breakdown.ratio) for a in attempts]
        rows.append(_cells("total", job, last.job_ratio))
        widths = [max(len(r[i]) for r in rows) for i in range(len(_HEAD))]
        for row in rows:
            lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        for a in attempts:
            if a.breakdown.lost_steps is not None:
                lines.append(f"  attempt {a.attempt}: {describe(a.breakdown)}")
    return lines


def goodput_html(items: list[AttemptGoodput]) -> str:
    """The same as tables."""
    e = html.escape
    out: list[str] = []
    for run_id, attempts in by_run(items).items():
        last = attempts[-1]
        out.append(
            f'<table class="goodput"><caption>Goodput · run {e(run_id)} · '
            f"{e(describe(last.job))}</caption><thead><tr>"
            + "".join(f"<th>{e(h.capitalize())}</th>" for h in _HEAD)
            + "</tr></thead><tbody>"
        )
        rows = [_cells(str(a.attempt), a.breakdown, a.breakdown.ratio) for a in attempts]
        rows.append(_cells("total", last.job, last.job_ratio))
        out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows]
        out.append("</tbody></table>")
    return "\n".join(out)
