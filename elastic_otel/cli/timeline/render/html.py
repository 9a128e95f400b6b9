"""The timeline as one self-contained HTML page, no network: the run summaries and goodput as
tables (:mod:`.html_summary`), then a Gantt chart its script draws from embedded JSON
(:mod:`.chart`). The template, style and script are package data (``assets/``); script errors
are written into the page (``#js-errors``), visible also to a headless browser's ``--dump-dom``.
"""

from __future__ import annotations

import html
import json
import re
from functools import cache
from importlib import resources

from elastic_otel.cli.timeline.analysis.timeline import Timeline
from elastic_otel.cli.timeline.render.chart import timeline_data
from elastic_otel.cli.timeline.render.goodput import goodput_html
from elastic_otel.cli.timeline.render.html_summary import summary_html

_PACKAGE = "elastic_otel.cli.timeline.render"


@cache
def asset(name: str) -> str:
    """A file of ``assets/``: ``page.html`` (the template), ``timeline.css``, ``timeline.js``."""
    return (resources.files(_PACKAGE) / "assets" / name).read_text(encoding="utf-8")


_SLOT = re.compile(r"__(TITLE|RUNS|CSS|DATA|JS)__")
"""The template's slots, filled in one pass: a run id or message that spells a slot's name is
data, never a place the page's CSS or script goes."""


def render_html(timeline: Timeline, title: str = "elastic-otel timeline") -> str:
    """The page: the template's slots filled with the timeline's summary, data and assets."""
    data = timeline_data(timeline)
    payload = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    t0 = timeline.t0_ns
    runs = summary_html(timeline.runs, lambda ns: f"+{(ns - t0) / 1e9:.3f}s")
    if timeline.goodput:
        runs += "\n" + goodput_html(timeline.goodput)
    slots = {
        "TITLE": html.escape(title),
        "RUNS": runs,
        "CSS": asset("timeline.css"),
        "DATA": payload,
        "JS": asset("timeline.js"),
    }
    return _SLOT.sub(lambda m: slots[m.group(1)], asset("page.html"))
