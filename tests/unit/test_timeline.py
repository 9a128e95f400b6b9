"""The per-round, per-node timeline: its analysis, the terminal tables, the CLI, and the HTML
page in Chromium."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from elastic_otel.cli.otlp_json_reader import read_otlp_json as read
from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.analysis.timeline import AFTER_FAILURE, RoundOutcome
from elastic_otel.cli.timeline.render.html import render_html
from elastic_otel.cli.timeline.render.phrases import outcome_text, restart_note
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.emit.emitter import Emitter
from elastic_otel.emit.otlp_json import OtlpJsonFileLogExporter, OtlpJsonFileSpanExporter
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.parsing.torch_events import EventKind, parse_event
from tests.support.chromium import ARTIFACTS, chromium, console_errors, needs_chromium, probe
from tests.support.fixtures import captured_events

ROOT = Path(__file__).resolve().parents[2]
NODE_FILES = ("restart_node0.tsv", "restart_node1.tsv")
CLI = [sys.executable, "-m", "elastic_otel.cli"]


def record_run(
    path: Path,
    drop_rendezvous: bool = False,
    edit: Callable[[str], str] = lambda payload: payload,
    files: tuple[str, ...] = NODE_FILES,
) -> None:
    """The recorded two-agent job as each agent's bridge would have written it to ``path``."""
    for name in files:
        resource = Resource.create({"service.instance.id": name})  # one process per agent
        provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        provider.add_log_record_processor(SimpleLogRecordProcessor(OtlpJsonFileLogExporter(path)))
        emitter = Emitter(
            provider.get_logger("elastic_otel"),
            SimpleSpanProcessor(OtlpJsonFileSpanExporter(path)),
            resource,
        )
        model = TraceModel(salt="timeline-test")
        last = 0
        for created, payload in captured_events(name):
            event = parse_event(edit(payload), int(created * 1e9))
            if drop_rendezvous and event.kind is EventKind.RENDEZVOUS:
                continue
            last = event.time_ns
            out = model.process(event)
            for span in out.spans:
                emitter.emit_span(span)
            for ev, trace_id, span_id in out.logs:
                emitter.emit_log(ev, trace_id, span_id)
        for span in model.close_all(last, "end of capture").spans:
            emitter.emit_span(span)


def rdzv_facts(name: str) -> dict[int, dict]:
    """Per round: the node's pid, join start/end, rank, world size, from the raw capture."""
    facts: dict[int, dict] = {}
    start = 0.0
    for created, payload in captured_events(name):
        data = json.loads(payload)
        message = data.get("message", "")
        if "attempts to join" in message:
            start = created
        m = re.search(r"joined round (\d+) .* as rank (\d+) in a world of size (\d+)", message)
        if m:
            facts[int(m[1])] = {
                "pid": data["pid"],
                "wait": created - start,
                "start": start,
                "rank": int(m[2]),
                "world": int(m[3]),
            }
    return facts


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    path = tmp_path / "recorded.jsonl"
    record_run(path)
    return path


RIGHT_ALIGNED = {"RANK", "JOIN AT", "WAIT", "START", "END", "EXIT"}


def sections(text: str) -> dict[str, list[dict[str, str]]]:
    """Rendered rounds → rows as {column: cell}. Every cell must line up with its header:
    left-aligned cells start where the header starts, numbers end where it ends."""
    out: dict[str, list[dict[str, str]]] = {}
    for block in text.split("\n\n"):
        lines = block.splitlines()
        if not lines or not lines[0].startswith("ROUND"):
            continue
        header = lines[1]
        columns = []
        for m in re.finditer(r"\S+(?: \S+)?", header):
            right = m.group() in RIGHT_ALIGNED
            columns.append((m.group(), m.end() if right else m.start(), right))
        mark_at = header.index("WORKER") - 3  # the unnamed marker column
        rows = []
        for line in lines[2:]:
            row = dict.fromkeys([name for name, _, _ in columns] + ["MARK"], "")
            for m in re.finditer(r"\S+(?: \S+)*", line):
                if m.start() == mark_at and m.group() in ("x", "~"):
                    row["MARK"] = m.group()
                    continue
                name = next(
                    (n for n, at, right in columns if at == (m.end() if right else m.start())),
                    None,
                )
                assert name is not None, f"{m.group()!r} lines up with no column in {line!r}"
                row[name] = m.group()
            rows.append(row)
        out[lines[0].split(" · ")[0]] = rows
    return out


def test_terminal_timeline_of_the_recorded_restart(recorded: Path) -> None:
    text = render_text(build_timeline(*read(recorded)))
    rounds = sections(text)
    assert list(rounds) == ["ROUND 0", "ROUND 1"]
    first = min(created for n in NODE_FILES for created, _ in captured_events(n))

    for name in NODE_FILES:
        for number, fact in rdzv_facts(name).items():
            rows = rounds[f"ROUND {number}"]
            node = next(r for r in rows if r["NODE"] == f"localhost pid {fact['pid']}")
            assert node["RANK"] == str(fact["rank"])
            assert node["WAIT"] == f"{fact['wait']:.3f}s"
            assert node["JOIN AT"] == f"+{fact['start'] - first:.3f}s"

    header0, header1 = (line for line in text.splitlines() if line.startswith("ROUND"))
    assert "world size 2" in header0 and "worker failure" in header0
    assert "RESTART after a failure (agent restarts: 1)" in header1
    assert "job succeeded" in header1

    def workers(rnd: str, pid: int) -> dict[str, str]:
        rows = rounds[rnd]
        i = next(i for i, r in enumerate(rows) if r["NODE"] == f"localhost pid {pid}")
        found = {}
        for row in rows[i + 1 :]:
            if row["NODE"]:
                break
            found[row["WORKER"].split()[-1]] = row["STATE"]
        return found

    # Node 6429 ran global ranks 0 and 1; rank 1 failed, so its group was replaced. Node 6430
    # (ranks 2, 3) restarted its workers when the other node came back to the rendezvous.
    assert workers("ROUND 0", 6429) == {"0": "REPLACED", "1": "REPLACED"}
    assert workers("ROUND 0", 6430) == {"2": "RESTARTED", "3": "RESTARTED"}
    assert workers("ROUND 1", 6429) == {"0": "SUCCEEDED", "1": "SUCCEEDED"}
    assert workers("ROUND 1", 6430) == {"2": "SUCCEEDED", "3": "SUCCEEDED"}
    for rows in rounds.values():
        for row in rows:
            if row["STATE"] == "REPLACED":
                assert row["MARK"] == "x"  # marked as a failure
                assert row["DETAIL"] == "worker group restarted after a failure (restart 1)"
            elif row["STATE"] == "RESTARTED":
                assert row["MARK"] == "~"
            else:
                assert row["MARK"] == ""
    # Rows are in join order within each round.
    for rows in rounds.values():
        starts = [float(r["JOIN AT"].strip("+s")) for r in rows if r["NODE"]]
        assert starts == sorted(starts)


ERROR_FILE = json.dumps(
    {
        "message": {
            "message": "RuntimeError: out of patience on rank 1",
            "extraInfo": {
                "py_callstack": "Traceback (most recent call last): ...",
                "timestamp": "1",
            },
        }
    }
)


def fail_rank_1_for_good(payload: str) -> str:
    """Round 1 ends with rank 1 FAILED (exit code 3) and its agent FAILED, as torch records a
    failure once no restart is left."""
    event = json.loads(payload)
    md = event.get("metadata")
    if not event["name"].endswith(".SUCCEEDED") or not md:
        return payload
    if event["source"] == "WORKER" and md["global_rank"] != 1:
        return payload
    event["name"] = event["name"].replace("SUCCEEDED", "FAILED")
    md["state"] = "FAILED"
    md["raw_error"] = ERROR_FILE
    if event["source"] == "WORKER":
        md["metadata"] = md["metadata"].replace('"exit_code": [null]', '"exit_code": [3]')
    return json.dumps(event)


def test_final_failure_shows_exit_code_and_error(tmp_path: Path) -> None:
    path = tmp_path / "failed.jsonl"
    record_run(path, edit=fail_rank_1_for_good, files=NODE_FILES[:1])
    text = render_text(build_timeline(*read(path)))
    last = sections(text)["ROUND 1"]
    (failed,) = [row for row in last if row["STATE"] == "FAILED"]
    assert failed["WORKER"] == "rank 1" and failed["EXIT"] == "3" and failed["MARK"] == "x"
    assert failed["DETAIL"] == "RuntimeError: out of patience on rank 1"
    (ok,) = [row for row in last if row["WORKER"] == "rank 0"]
    assert ok["STATE"] == "SUCCEEDED" and ok["EXIT"] == ""
    header = next(line for line in text.splitlines() if line.startswith("ROUND 1"))
    assert header.endswith("worker failure: job failed")
    node = next(row for row in last if row["NODE"])
    assert "agent FAILED at +" in node["DETAIL"]
    assert "RuntimeError: out of patience on rank 1" in node["DETAIL"]


def test_without_rendezvous_events_rounds_fall_back_to_restarts(tmp_path: Path) -> None:
    path = tmp_path / "agents-only.jsonl"
    record_run(path, drop_rendezvous=True)
    timeline = build_timeline(*read(path))
    labels = [r.label for r in timeline.rounds]
    assert labels[0] == "restart 0" and "restart 1" in labels
    states = sorted(w.state for r in timeline.rounds for n in r.nodes for w in n.workers)
    assert states.count("SUCCEEDED") == 4 and states.count("REPLACED") == 2
    nodes = {n.label for r in timeline.rounds for n in r.nodes}
    assert len(nodes) == 2  # one per agent process, from the resource


def test_the_analysis_is_data_the_renderers_put_in_words(recorded: Path) -> None:
    """The recorded job analysed, not rendered: round 0 lost its workers to rank 1's failure
    and its group was replaced, round 1 is the restart after it and the job succeeded; the
    words for that are the renderers' alone."""
    timeline = build_timeline(*read(recorded))
    first, second = timeline.rounds
    assert first.began_after == "" and first.failed
    assert first.outcome == RoundOutcome(worker_failure=True, group_restarted=True)
    assert (second.began_after, second.agent_restarts) == (AFTER_FAILURE, 1)
    assert second.outcome == RoundOutcome(job_succeeded=True) and not second.failed
    assert timeline.run_ids == ["job-cap"] and timeline.worker_runs == 8
    assert restart_note(first) == "" and restart_note(second) == (
        "RESTART after a failure (agent restarts: 1)"
    )
    assert outcome_text(first) == "worker failure: worker group restarted"
    assert outcome_text(second) == "job succeeded"


def test_the_analysis_never_imports_the_renderers() -> None:
    """Imports run one way: rendering reads the analysis' results, never the reverse."""
    analysis = ROOT / "elastic_otel/cli/timeline/analysis"
    imported = set()
    for path in analysis.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
    assert "elastic_otel.cli.timeline.analysis.items" in imported  # the walk sees the imports
    assert sorted(m for m in imported if m.startswith("elastic_otel.cli.timeline.render")) == []
    assert "html" not in imported


def test_cli_prints_the_timeline_and_writes_html(recorded: Path, tmp_path: Path) -> None:
    page = tmp_path / "t.html"
    done = subprocess.run(
        [*CLI, "timeline", str(recorded), "--html", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "localhost pid 6429" in done.stdout and "localhost pid 6430" in done.stdout
    assert "\033[" not in done.stdout  # no colours when not a terminal
    assert f"wrote {page}" in done.stdout
    html = page.read_text()
    assert "<script src" not in html and "http://" not in html and "https://" not in html


@pytest.mark.parametrize(
    ("content", "code", "message"),
    [
        (None, 2, "No such file"),
        ("not json at all\n", 2, "not JSON"),
        ('{"resourceSpans": []}\n', 1, "no rendezvous, agent or worker spans"),
    ],
)
def test_cli_errors_are_one_line(
    tmp_path: Path, content: str | None, code: int, message: str
) -> None:
    path = tmp_path / "input.jsonl"
    if content is not None:
        path.write_text(content)
    done = subprocess.run([*CLI, "timeline", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == code
    assert done.stderr.count("\n") == 1 and message in done.stderr
    assert done.stderr.startswith("elastic-otel: error: ")


# --- the HTML page in a real browser ----------------------------------------------------------


@needs_chromium
def test_html_renders_every_node_without_errors(recorded: Path, tmp_path: Path) -> None:
    timeline = build_timeline(*read(recorded))
    page = tmp_path / "timeline.html"
    page.write_text(render_html(timeline))

    dom = chromium(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-rendered="true"' in dom.stdout
    assert 'class="js-error"' not in dom.stdout
    assert not console_errors(dom.stderr)
    for label in timeline.nodes:
        assert f">{label} · rank" in dom.stdout  # drawn by the script as row labels
    bars = re.findall(r'<div class="bar ([^"]*)"', dom.stdout)
    spans, _ = read(recorded)
    drawn = [s for s in spans if s["name"] != "agent.run"]
    assert len(bars) == len(drawn)
    assert sorted(b for b in bars if "failed" in b) == ["REPLACED failed"] * 2
    assert bars.count("RESTARTED") == 2 and bars.count("SUCCEEDED") == 4
    assert dom.stdout.count('class="restart-line"') == 1
    assert dom.stdout.count('class="agent-end SUCCEEDED"') == 2
    assert "worker replaced after a failure" in dom.stdout  # the legend

    # The page fits a 1400-pixel window: nothing is cut off at the right (the summary was a
    # preformatted block wider than that).
    measured, _ = probe(page.read_text(), tmp_path)
    assert measured["innerWidth"] == 1400
    assert measured["scrollWidth"] <= measured["innerWidth"], measured

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "timeline.png"
    shot.unlink(missing_ok=True)
    done = chromium(page, tmp_path, f"--screenshot={shot}")
    assert done.returncode == 0 and shot.stat().st_size > 10_000
    assert not console_errors(done.stderr)


@needs_chromium
def test_html_hover_shows_the_failure_details(recorded: Path, tmp_path: Path) -> None:
    page = tmp_path / "hover.html"
    hover = """<script>
      var bar = document.querySelector(".track .bar.failed");
      bar.dispatchEvent(new MouseEvent("mouseenter", {bubbles: true}));
      bar.dispatchEvent(new MouseEvent("mousemove", {bubbles: true, clientX: 300, clientY: 200}));
    </script></body>"""
    page.write_text(render_html(build_timeline(*read(recorded))).replace("</body>", hover))
    dom = chromium(page, tmp_path, "--dump-dom")
    tooltip = re.search(r'<div id="tooltip"[^>]*>(.*?)</div>', dom.stdout, re.S)
    assert tooltip is not None and "hidden" not in tooltip.group(0).split(">")[0]
    assert "worker rank" in tooltip.group(1) and "REPLACED" in tooltip.group(1)
    assert "worker group restarted after a failure (restart 1)" in tooltip.group(1)


@needs_chromium
def test_html_script_errors_show_up_in_the_page(recorded: Path, tmp_path: Path) -> None:
    """The error check of the rendering test is able to fail."""
    page = tmp_path / "broken.html"
    html = render_html(build_timeline(*read(recorded)))
    page.write_text(html.replace("summary();", "summary(); undefinedFunction();", 1))
    dom = chromium(page, tmp_path, "--dump-dom")
    assert 'class="js-error"' in dom.stdout and "undefinedFunction" in dom.stdout
    assert 'data-rendered="true"' not in dom.stdout


def test_text_that_spells_a_template_slot_stays_text(recorded: Path) -> None:
    """A title (or a run id, a message) that reads ``__JS__`` is not where the script goes."""
    from elastic_otel.cli.timeline.render.html import asset

    page = render_html(build_timeline(*read(recorded)), title="job __JS__ __CSS__")
    assert page.count("<title>job __JS__ __CSS__</title>") == 1
    assert page.count(asset("timeline.js")) == 1 and page.count(asset("timeline.css")) == 1
