"""A root cause's last words (``torchelastic.last_words`` on its ``FAILED`` record, issue 29)
under the root cause in ``elastic-otel timeline``'s text and on its worker's row of the page.

The input is the two-node job of :mod:`test_timeline_root_cause`, written by the project's
emitter and OTLP/JSON file exporter, with the root cause's record carrying its last words.
"""

from __future__ import annotations

import html
from pathlib import Path

from test_timeline_root_cause import ROOT, load, two_node_job, written

from elastic_otel.cli.timeline.build import render_text
from elastic_otel.cli.timeline.html import render_html, timeline_data
from elastic_otel.names import attributes as A

WORDS = "loading shard 7\nRuntimeError: <bad> shard 7\nFatal Python error: Aborted"


def _job_with_last_words(tmp_path: Path) -> Path:
    job = two_node_job()
    root = job.workers[1]
    job.log("a", "FAILED", 5000, root, state="FAILED", **{A.LAST_WORDS: WORDS})
    return written(tmp_path, job)


def test_text_shows_the_last_words_under_the_root_cause(tmp_path: Path) -> None:
    timeline = load(_job_with_last_words(tmp_path))
    [failure] = timeline.runs[0].failures
    assert failure.root is not None and failure.root.last_words == WORDS
    assert [w.last_words for w in failure.consequences] == ["", "", ""]
    lines = render_text(timeline).splitlines()
    at = lines.index(f"  ROOT CAUSE at +5.000s: {ROOT}")
    assert lines[at + 1 : at + 5] == [
        "    last words (stderr):",
        "      | loading shard 7",
        "      | RuntimeError: <bad> shard 7",
        "      | Fatal Python error: Aborted",
    ]
    assert "rank 0 on node-a STOPPED" in lines[at + 5]


def test_html_shows_them_in_the_summary_and_on_the_worker_row(tmp_path: Path) -> None:
    timeline = load(_job_with_last_words(tmp_path))
    page = render_html(timeline)
    summary = page[page.index('<section id="run-summary">') : page.index("</section>")]
    assert f'<pre class="stack">{html.escape(WORDS)}</pre>' in summary
    round0, round1 = timeline_data(timeline)["rounds"]
    words = {w["rank"]: w["last_words"] for n in round0["nodes"] for w in n["workers"]}
    assert words == {1: WORDS, 0: "", 2: "", 3: ""}
    assert not any(w["last_words"] for n in round1["nodes"] for w in n["workers"])


def test_without_last_words_nothing_changes(tmp_path: Path) -> None:
    timeline = load(written(tmp_path, two_node_job()))
    assert "last words" not in render_text(timeline)
    assert "last-words" not in render_html(timeline).split("</section>")[0]
