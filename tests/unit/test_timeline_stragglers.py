"""A slow rank in the timeline: the straggler reports of a round, joined across nodes.

The input is what the bridges of a two-node job write when global rank 1 issues each collective
0.3 s after its local peer (``tests/multinode/test_straggler_jobs.py`` runs it for real): each
report is the torch ``Event`` the agent's straggler hook builds, through the bridge's parser,
emitter and OTLP/JSON file exporter, one process (resource) per node, read back as
``elastic-otel timeline`` reads them. Only node-a (ranks 0, 1) names a straggler: each node
compares its own ranks, and node-b's arrive together. node-a reports rank 1 after 3 windows,
then every 10.
"""

from __future__ import annotations

from pathlib import Path

from elastic_otel.cli.otlp_json_reader import read_otlp_json
from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.analysis.timeline import Timeline
from elastic_otel.cli.timeline.render.chart import timeline_data
from elastic_otel.cli.timeline.render.html import render_html
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.model.stragglers import (
    INSIDE,
    ISSUED,
    STRAGGLER_EVENT_NAME,
    STRAGGLER_STATE,
    RankScore,
    Straggler,
    straggler_attributes,
)
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import parse_event
from tests.support.chromium import needs_chromium, probe
from tests.support.recorded_jobs import BASE, MS, NODES, RecordedJob, timeline_cli

RUN = "job-28"
T0 = 0x0C0C << 64 | 28  # the trace of round 0
RANKS = {"a": (0, 1), "b": (2, 3)}


class Job(RecordedJob):
    """The job's records, with its agents' straggler reports."""

    def __init__(self) -> None:
        super().__init__(RUN, T0)
        for node, rank, join_at in (("a", 0, 0), ("b", 1, 400)):
            rdzv = {A.ROUND: 0, A.RANK: rank, A.WORLD_SIZE: 2}
            join = self.add(node, A.SPAN_RDZV_JOIN, join_at, 1000, attrs=rdzv)
            self.members[node] = self.add(
                node, A.SPAN_RDZV_MEMBER, 1000, 100_000, parent_span_id=join.span_id, attrs=rdzv
            )
            for global_rank in RANKS[node]:
                attrs = {A.GLOBAL_RANK: global_rank, A.LOCAL_RANK: global_rank % 2,
                         A.STATE: "SUCCEEDED", A.AGENT_RESTARTS: 0}  # fmt: skip
                self.workers[global_rank] = self.add(
                    node, A.SPAN_WORKER, 1500, 100_000, attrs=attrs,
                    parent_span_id=self.members[node].span_id,
                )  # fmt: skip

    def straggler(
        self,
        node: str,
        at_ms: int,
        rank: int,
        score: float,
        windows: int,
        share: float = 0.98,
        basis: str = ISSUED,
    ) -> None:
        """A report as the agent's hook builds it (a torch ``Event``), parsed by the bridge."""
        from torch.distributed.elastic.events.api import Event, EventSource

        waiting = tuple(r for r in RANKS[node] if r != rank)
        scored = RankScore(rank, score, 0.3, 0.306, share, "nccl:0", 20, basis)
        facts = {
            k.removeprefix(A.NS): v
            for k, v in straggler_attributes(Straggler(scored, waiting, windows)).items()
        }
        facts["straggler.waiting"] = ",".join(map(str, waiting))  # torch's metadata: scalars
        metadata = {
            "run_id": RUN,
            "role": "default",
            "hostname": NODES[node][0],
            "state": STRAGGLER_STATE,
            "global_rank": None,
            "agent_restarts": 0,
            **facts,
        }
        event = Event(STRAGGLER_EVENT_NAME, EventSource.AGENT, BASE // MS + at_ms, metadata)
        self.logs[node].append((parse_event(event, 0), self.members[node]))


def slow_job() -> Job:
    """node-a names rank 1 at 11.5 s (3 windows), 41.5 s (13) and 71.5 s (23)."""
    job = Job()
    for at, score, windows in ((11_500, 0.05, 3), (41_500, 0.03, 13), (71_500, 0.04, 23)):
        job.straggler("a", at, 1, score, windows)
    return job


def load(tmp_path: Path, job: Job) -> Timeline:
    path = tmp_path / "job.jsonl"
    job.write(path)
    return build_timeline(*read_otlp_json(path))


LINE = (
    "STRAGGLER global rank 1 on node-a pid 100: score 0.04 (lowest 0.03) over 23 windows; each "
    "collective of process group 0 0.300 s after its fastest local peer (one every 0.306 s); "
    "global rank 0 (node-a pid 100) waits 98 % of that time for it"
)
SUMMARY = (
    "  1 straggler: global rank 1 on node-a pid 100, score 0.04, 0.300 s late per collective of "
    "process group 0, its peers wait 98 % of the time (round 0, reported +11.500s to +71.500s)"
)


def test_the_written_records_are_what_the_bridge_exports(tmp_path: Path) -> None:
    path = tmp_path / "job.jsonl"
    slow_job().write(path)
    _, logs = read_otlp_json(path)
    reports = [r for r in logs if r["event_name"] == STRAGGLER_EVENT_NAME]
    assert len(reports) == 3 and {r["severity_text"] for r in reports} == {"WARN"}
    assert reports[0]["body"].startswith("global rank 1 is a straggler: score 0.05 over 3 windows")
    attrs = reports[0]["attributes"]
    assert attrs[A.STRAGGLER_WAITING] == [0] and attrs[A.STRAGGLER_PROCESS_GROUP] == "0"


def test_text_names_the_straggler_and_the_node_that_named_none(tmp_path: Path) -> None:
    timeline = load(tmp_path, slow_job())
    [run] = timeline.runs
    [straggler] = run.stragglers
    assert (straggler.rank, straggler.node, straggler.round) == (1, "node-a pid 100", 0)
    assert len(straggler.reports) == 3 and straggler.lowest == 0.03
    assert straggler.waiting == [(0, "node-a pid 100")]
    assert straggler.quiet == ["node-b pid 200"]
    assert [s.rank for s in timeline.rounds[0].stragglers] == [1]

    text = render_text(timeline)
    assert f"\n{SUMMARY}\n" in text
    block = text.split("\nROUND 0 ")[1].split("\n\n")[1].splitlines()
    assert block == [
        f"  {LINE} · round 0, reported +11.500s to +71.500s",
        "    no straggler named by node-b pid 200",
    ]
    assert "ERRORS" not in text  # a straggler is a warning, not an error


def test_a_report_scored_from_device_time_says_so(tmp_path: Path) -> None:
    """A GPU job with timing events: the same report, scored from the device's time inside."""
    job = Job()
    job.straggler("a", 11_500, 1, 0.02, 3, basis=INSIDE)
    timeline = load(tmp_path, job)
    [straggler] = timeline.runs[0].stragglers
    assert straggler.latest.basis == INSIDE and straggler.latest.group == "0"
    assert (
        "STRAGGLER global rank 1 on node-a pid 100: score 0.02 over 3 windows; its device 0.300 s"
        " less inside each collective of process group 0 than its local peer that spends the"
        " most (one every 0.306 s)"
    ) in render_text(timeline)


def test_each_spell_and_each_node_is_its_own(tmp_path: Path) -> None:
    """Rank 1 kept up after its second report and straggled again (its window count starts
    over): two stragglers. node-b's rank 3 straggles too: both nodes' views in one list."""
    job = Job()
    job.straggler("a", 11_500, 1, 0.05, 3)
    job.straggler("a", 41_500, 1, 0.05, 13)
    job.straggler("a", 80_000, 1, 0.2, 3)
    job.straggler("b", 20_000, 3, 0.6, 3, share=0.4)
    timeline = load(tmp_path, job)
    [run] = timeline.runs
    assert [(s.rank, (s.start_ns - BASE) // MS, len(s.reports)) for s in run.stragglers] == [
        (1, 11_500, 2),
        (3, 20_000, 1),
        (1, 80_000, 1),
    ]
    assert all(not s.quiet for s in run.stragglers)  # both nodes named one
    text = render_text(timeline)
    assert "  3 stragglers: global rank 1 on node-a pid 100, score 0.05," in text
    assert "global rank 3 on node-b pid 200, score 0.60, 0.300 s late per collective" in text
    assert "its peers wait 40 % of the time (round 0, reported at +20.000s)" in text
    assert "no straggler named by" not in text


def test_a_job_without_reports_has_no_section(tmp_path: Path) -> None:
    timeline = load(tmp_path, Job())
    assert timeline.runs[0].stragglers == [] and "STRAGGLER" not in render_text(timeline)
    page = render_html(timeline)
    assert "Stragglers ·" not in page and '"stragglers":[]' in page


def test_html_summary_and_the_worker_row(tmp_path: Path) -> None:
    timeline = load(tmp_path, slow_job())
    page = render_html(timeline)
    summary = page[page.index('<section id="run-summary">') : page.index("</section>")]
    assert "<caption>Stragglers · run job-28 · 1 rank, lowest score 0.03</caption>" in summary
    row = summary[summary.index('<tr class="straggler">') :].split("</tr>")[0]
    assert "<td>+11.500s → +71.500s</td><td>0</td>" in row
    assert '<b class="straggler">global rank 1 on node-a pid 100</b>' in row
    assert "no straggler named by node-b pid 200" in row
    assert "0.04 <span" in row and "(lowest 0.03)" in row and "over 23 windows" in row
    assert "0.300 s<div" in row and "one collective every 0.306 s" in row
    assert '<b class="cost">98 %</b><div class="facts">0 (node-a pid 100)</div>' in row
    assert row.endswith("<td>0</td>")

    data = timeline_data(timeline)
    [round0] = data["rounds"]
    assert round0["stragglers"] == ["global rank 1 (score 0.04)"]
    marks = {
        w["rank"]: [(m["start"], m["end"]) for m in w["stragglers"]]
        for n in round0["nodes"]
        for w in n["workers"]
    }
    assert marks == {0: [], 1: [(11.5, 71.5)], 2: [], 3: []}
    rank_1 = round0["nodes"][0]["workers"][1]
    assert rank_1["stragglers"][0]["text"] == LINE


def test_cli_prints_the_straggler(tmp_path: Path) -> None:
    path = tmp_path / "job.jsonl"
    slow_job().write(path)
    page = tmp_path / "t.html"
    done = timeline_cli(path, page)
    assert SUMMARY in done.stdout and LINE in done.stdout
    assert "Stragglers · run job-28" in page.read_text()


@needs_chromium
def test_page_marks_the_straggler_on_its_worker_row(tmp_path: Path) -> None:
    measured, dom = probe(render_html(load(tmp_path, slow_job())), tmp_path)
    assert measured["scrollWidth"] <= measured["innerWidth"] == 1400, measured
    assert measured["summaryRight"] <= measured["innerWidth"]
    assert dom.count('<div class="straggler-mark"') == 1
    row = dom[dom.index('title="worker rank 1 · SUCCEEDED"') :].split('<div class="row')[0]
    assert 'class="straggler-mark"' in row and 'class="straggler-band"' in row
    assert 'class="row worker straggler"' in dom
    assert "straggler: global rank 1 (score 0.04)" in dom  # round 0's head
