"""A slow link in the timeline: the slowdown reports of a round, joined across nodes, and the
link node 0 named (issue 46).

The input is what the bridges of a two-node job write when node-b's link is rate-limited from
the 61st second to the 150th (``tests/links/`` runs it for real): each record is the torch
``Event`` the agent's ``_construct_event`` builds with the attributes the agent adds (an
``AgentRecord``), through the bridge's parser, emitter and OTLP/JSON file exporter, one process
(resource) per node, read back as ``elastic-otel timeline`` reads them. Both nodes see process
group 0 slow down (every rank alike, inside the collectives: communication), report it every
10 s and end it at 155 s; node-b's reports carry its own evidence, node-a (node 0) names
node-b's link.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from elastic_otel.cli.otlp_json_reader import read_otlp_json
from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.analysis.timeline import Timeline
from elastic_otel.cli.timeline.render.chart import timeline_data
from elastic_otel.cli.timeline.render.html import render_html
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.names import attributes as A
from elastic_otel.parsing.records import AgentRecord
from elastic_otel.parsing.torch_events import parse_event
from tests.support.chromium import needs_chromium, probe
from tests.support.recorded_jobs import BASE, MS, NODES, RecordedJob, timeline_cli

RUN = "job-46"
T0 = 0x0C0C << 64 | 46  # the trace of round 0
RANKS = {"a": (0, 1), "b": (2, 3)}
S = 1000  # ms


def iso(at_ms: int) -> str:
    """A time of the job as ``torchelastic.slowdown.began`` writes it (ISO 8601, UTC)."""
    import datetime

    moment = datetime.datetime.fromtimestamp((BASE // MS + at_ms) / 1000, datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Job(RecordedJob):
    """The job's records, with its agents' slowdown and link reports."""

    def __init__(self) -> None:
        super().__init__(RUN, T0)
        for node, rank, join_at in (("a", 0, 0), ("b", 1, 400)):
            rdzv = {A.ROUND: 0, A.RANK: rank, A.WORLD_SIZE: 2}
            join = self.add(node, A.SPAN_RDZV_JOIN, join_at, 1000, attrs=rdzv)
            self.members[node] = self.add(
                node, A.SPAN_RDZV_MEMBER, 1000, 200_000, parent_span_id=join.span_id, attrs=rdzv
            )
            for global_rank in RANKS[node]:
                attrs = {A.GLOBAL_RANK: global_rank, A.LOCAL_RANK: global_rank % 2,
                         A.STATE: "SUCCEEDED", A.AGENT_RESTARTS: 0}  # fmt: skip
                self.workers[global_rank] = self.add(
                    node, A.SPAN_WORKER, 1500, 200_000, attrs=attrs,
                    parent_span_id=self.members[node].span_id,
                )  # fmt: skip

    def record(self, node: str, name: str, state: str, at_ms: int, attributes: dict) -> None:
        """A record as the agent sends it: its ``_construct_event`` (a torch ``Event``), named,
        dated, with the attributes beside it, parsed by the bridge, on the node's round."""
        from torch.distributed.elastic.events.api import Event, EventSource

        metadata = {
            "run_id": RUN,
            "role": "default",
            "hostname": NODES[node][0],
            "state": state,
            "global_rank": None,
            "agent_restarts": 0,
        }
        event = Event(name, EventSource.AGENT, BASE // MS + at_ms, metadata)
        parsed = parse_event(AgentRecord(event, attributes), 0)
        self.logs[node].append((parsed, self.members[node]))

    def slowdown(self, node: str, at_ms: int, reports: int, ended: bool = False, **kw: Any) -> None:
        """A slowdown of process group 0 that began at 61 s (node-b dates it 0.2 s later)."""
        began = 61_000 if node == "a" else 61_200
        seconds = (at_ms - began) / 1000
        facts = {
            A.SLOWDOWN_PROCESS_GROUP: "0",
            A.SLOWDOWN_BEGAN: iso(began),
            A.SLOWDOWN_SECONDS: seconds,
            A.SLOWDOWN_INTERVAL_BEFORE: 0.21,
            A.SLOWDOWN_INTERVAL_NOW: 0.41,
            A.SLOWDOWN_RATIO: 1.952,
            A.SLOWDOWN_INSIDE_BEFORE: 0.073,
            A.SLOWDOWN_INSIDE_NOW: 0.3,
            A.SLOWDOWN_INSIDE_RATIO: 4.11,
            A.SLOWDOWN_PART: "communication",
            A.SLOWDOWN_ALIKE: True,
            A.SLOWDOWN_BASIS: "sampled",
            A.SLOWDOWN_LOST: round(seconds * 0.488, 3),
            A.SLOWDOWN_COLLECTIVES: int(seconds / 0.41),
            A.SLOWDOWN_REPORTS: reports,
            **kw,
        }
        state = A.SLOWDOWN_ENDED_STATE if ended else A.SLOWDOWN_STATE
        self.record(node, A.SLOWDOWN_EVENT_NAME, state, at_ms, facts)

    def link(self, node: str, at_ms: int, **kw: Any) -> None:
        self.record(node, A.LINK_EVENT_NAME, A.LINK_STATE, at_ms, kw)


NODE_B = {
    A.LINK_SCOPE: "node",
    A.LINK_TRANSPORT: "tcp",
    A.LINK_NODES: ("node-b",),
    A.LINK_NODE_RANK: (1,),
    A.LINK_ADDRESS: ("10.1.0.12",),
    A.LINK_RTT: 0.42,
    A.LINK_RTT_OTHERS: 0.0001,
    A.LINK_RATE: 60_000.0,
    A.LINK_RATE_OTHERS: 110e6,
    A.LINK_RETRANSMITS: 31.0,
    A.LINK_RETRANSMITS_OTHERS: 0.0,
    A.LINK_EVIDENCE: (
        "node-a → node-b (10.1.0.12): 0.06 MB/s, RTT 420 ms, 31 retransmits/s",
        "node-b → node-a (10.1.0.11): 0.07 MB/s, RTT 410 ms, 29 retransmits/s",
    ),
}
OWN_B = {  # node-b's own evidence, beside its slowdown reports
    A.LINK_SCOPE: "local",
    A.LINK_TRANSPORT: "tcp",
    A.LINK_PEER: "10.1.0.11",
    A.LINK_RTT: 0.41,
    A.LINK_RATE: 70_000.0,
    A.LINK_RETRANSMITS: 29.0,
}


def slow_link_job() -> Job:
    """Both nodes report the slowdown at 70, 80 and 90 s and end it at 155 s; node 0 names
    node-b's link at 70, 80 and 90 s."""
    job = Job()
    for n, at in enumerate((70_000, 80_000, 90_000), 1):
        job.slowdown("a", at, n)
        job.slowdown("b", at + 400, n, **OWN_B)
        job.link("a", at + 50, **NODE_B)
    job.slowdown("a", 155_000, 4, ended=True, **{A.SLOWDOWN_SECONDS: 94.0, A.SLOWDOWN_LOST: 45.9})
    job.slowdown("b", 155_300, 4, ended=True, **{A.SLOWDOWN_SECONDS: 94.1, A.SLOWDOWN_LOST: 45.9})
    return job


def load(tmp_path: Path, job: Job) -> Timeline:
    path = tmp_path / "job.jsonl"
    job.write(path)
    return build_timeline(*read_otlp_json(path))


SLOWDOWN = (
    "SLOWDOWN of process group 0 from 08:01:01 for 94 s: collectives every 0.41 s (2.0x the"
    " 0.21 s before), 0.30 s inside each (4.1x, sampled), every rank alike: communication;"
    " 45.9 s of training lost"
)
LINK = (
    "SLOW LINK node-b (10.1.0.12): its connections to every peer deliver 0.06 MB/s (the others"
    " 110 MB/s), RTT 420 ms (0.1 ms), 31 retransmits/s (0/s)"
)
EVIDENCE = (
    "LINK EVIDENCE from node-b pid 200: its connection to 10.1.0.11 delivers 0.07 MB/s, RTT"
    " 410 ms, 29 retransmits/s"
)


def test_the_written_records_are_what_the_bridge_exports(tmp_path: Path) -> None:
    path = tmp_path / "job.jsonl"
    slow_link_job().write(path)
    _, logs = read_otlp_json(path)
    slowdowns = [r for r in logs if r["event_name"] == A.SLOWDOWN_EVENT_NAME]
    assert len(slowdowns) == 8
    assert [r["severity_text"] for r in slowdowns if r["attributes"][A.STATE] == "SLOWDOWN"] == [
        "WARN"
    ] * 6
    ended = [r for r in slowdowns if r["attributes"][A.STATE] == "SLOWDOWN_ENDED"]
    assert len(ended) == 2 and {r["severity_text"] for r in ended} == {"INFO"}
    [first_link, *_] = [r for r in logs if r["event_name"] == A.LINK_EVENT_NAME]
    attrs = first_link["attributes"]
    assert attrs[A.LINK_NODES] == ["node-b"] and attrs[A.LINK_NODE_RANK] == [1]
    assert attrs[A.LINK_EVIDENCE] == list(NODE_B[A.LINK_EVIDENCE])
    assert first_link["trace_id"] == f"{T0:032x}"  # on the round


def test_one_slowdown_seen_by_every_node_and_the_link_named(tmp_path: Path) -> None:
    timeline = load(tmp_path, slow_link_job())
    [run] = timeline.runs
    [slowdown] = run.slowdowns
    assert (slowdown.group, slowdown.round, slowdown.ended) == ("0", 0, True)
    assert slowdown.seen_by == ["node-a pid 100", "node-b pid 200"] and slowdown.quiet == []
    assert slowdown.reports == 8 and (slowdown.start_ns - BASE) // MS == 61_000
    assert slowdown.latest.lost_s == 45.9 and slowdown.latest.ended
    [named, own] = run.links
    assert (named.scope, named.latest.node, len(named.reports)) == ("node", "node-a pid 100", 3)
    assert (own.scope, own.latest.node, len(own.reports)) == ("local", "node-b pid 200", 3)
    assert timeline.rounds[0].slowdowns == [slowdown]

    text = render_text(timeline)
    assert (
        "\n  1 slowdown: process group 0 from 08:01:01 for 94 s, 2.0x slower, communication,"
        " 45.9 s lost (round 0, from +61.000s)\n"
        "  1 slow link: node-b (10.1.0.12), node, tcp (tcp, from node-a pid 100, round 0,"
        " reported +70.050s to +90.050s)\n"
    ) in text, text
    block = text.split("\nROUND 0 ")[1].split("\n\n")[1].splitlines()
    assert block == [
        f"  {SLOWDOWN} · round 0, from +61.000s, ended at +155.300s; seen by node-a pid 100,"
        " node-b pid 200",
        f"  {LINK} · tcp, from node-a pid 100, round 0, reported +70.050s to +90.050s",
        f"    | {NODE_B[A.LINK_EVIDENCE][0]}",
        f"    | {NODE_B[A.LINK_EVIDENCE][1]}",
        f"  {EVIDENCE} · tcp, round 0, reported +70.400s to +90.400s",
    ], block
    assert "ERRORS" not in text  # warnings, not errors


def test_a_slowdown_still_under_way_says_so_far(tmp_path: Path) -> None:
    """A job that is still slow (or ended before the end record): "so far", last reported."""
    job = Job()
    job.slowdown("a", 70_000, 1)
    job.slowdown("a", 80_000, 2)
    timeline = load(tmp_path, job)
    [slowdown] = timeline.rounds[0].slowdowns
    assert not slowdown.ended and slowdown.quiet == ["node-b pid 200"]
    text = render_text(timeline)
    assert (
        "  SLOWDOWN of process group 0 from 08:01:01 for 19 s so far: collectives every 0.41 s"
        " (2.0x the 0.21 s before), 0.30 s inside each (4.1x, sampled), every rank alike:"
        " communication; 9.3 s of training lost so far · round 0, from +61.000s, last reported"
        " at +80.000s; seen by node-a pid 100\n"
        "    not reported by node-b pid 200\n"
    ) in text, text


def test_each_slowdown_of_a_node_is_its_own(tmp_path: Path) -> None:
    """The group slowed, recovered (the end record) and slowed again: two slowdowns; a compute
    slowdown of another group beside them is a third, worded as compute."""
    job = Job()
    job.slowdown("a", 70_000, 1)
    job.slowdown("a", 80_000, 2, ended=True)
    later = {A.SLOWDOWN_BEGAN: iso(120_000), A.SLOWDOWN_SECONDS: 10.0}
    job.slowdown("a", 130_000, 1, **later)
    compute = {
        A.SLOWDOWN_PROCESS_GROUP: "1",
        A.SLOWDOWN_PART: "compute",
        A.SLOWDOWN_INSIDE_NOW: 0.075,
        A.SLOWDOWN_INSIDE_RATIO: 1.03,
        A.SLOWDOWN_BASIS: "timed",
        A.SLOWDOWN_ALIKE: None,
    }
    job.slowdown("b", 90_000, 1, **compute)
    timeline = load(tmp_path, job)
    found = [(s.group, (s.start_ns - BASE) // MS, s.ended) for s in timeline.runs[0].slowdowns]
    assert found == [("0", 61_000, True), ("1", 61_200, False), ("0", 120_000, False)]
    text = render_text(timeline)
    assert "  3 slowdowns: process group 0 from 08:01:01 for 19 s, 2.0x slower," in text
    assert (
        "SLOWDOWN of process group 1 from 08:01:01 for 29 s so far: collectives every 0.41 s"
        " (2.0x the 0.21 s before), 0.075 s inside each (1.0x): compute;"
    ) in text, text


def test_a_job_without_reports_has_no_section(tmp_path: Path) -> None:
    timeline = load(tmp_path, Job())
    assert timeline.runs[0].slowdowns == [] and timeline.runs[0].links == []
    assert "SLOWDOWN" not in render_text(timeline) and "SLOW LINK" not in render_text(timeline)
    page = render_html(timeline)
    assert "Slowdowns ·" not in page and "Slow links ·" not in page
    data = timeline_data(timeline)["rounds"][0]
    assert (data["slowdowns"], data["links"]) == ([], [])


def test_other_scopes_read_as_what_they_name(tmp_path: Path) -> None:
    """One pair of nodes, the fabric, an RDMA port whose counters moved, a pipeline's slow
    edges, and a node's own evidence of its own (no slowdown report beside it)."""
    job = Job()
    pair = {A.LINK_NODES: ("node-a", "node-b"), A.LINK_ADDRESS: ("10.1.0.11", "10.1.0.12")}
    job.link("a", 70_000, **{**NODE_B, A.LINK_SCOPE: "link", **pair, A.LINK_EVIDENCE: ()})
    fabric = {A.LINK_SCOPE: "fabric", A.LINK_TRANSPORT: "tcp", A.LINK_RTT: 0.05}
    job.link("a", 80_000, **fabric, **{A.LINK_RATE: 2e6, A.LINK_RETRANSMITS: 4.0})
    nic = {
        A.LINK_SCOPE: "nic",
        A.LINK_TRANSPORT: "rdma",
        A.LINK_NODES: ("node-b",),
        A.LINK_DEVICE: "mlx5_0/1",
        A.LINK_RDMA_RATE: "25 Gb/sec (1X EDR)",
        A.LINK_RDMA_STATE: "4: ACTIVE / 5: LinkUp",
        A.LINK_RDMA_COUNTERS: ("symbol_error=1204", "link_downed=2"),
    }
    job.link("a", 90_000, **nic)
    edges = {A.LINK_SCOPE: "link", A.LINK_TRANSPORT: "p2p", A.LINK_RATE: 4.5e8}
    job.link("a", 95_000, **edges, **pair, **{A.LINK_RATE_OTHERS: 1e10})
    job.link("b", 90_500, **{**OWN_B, A.LINK_DEVICE: "mlx5_0/1",
                             A.LINK_RDMA_COUNTERS: ("symbol_error=1204",)})  # fmt: skip
    text = render_text(load(tmp_path, job))
    assert (
        "  SLOW LINK the link between node-a (10.1.0.11) and node-b (10.1.0.12): its connections"
        " deliver 0.06 MB/s (the others 110 MB/s), RTT 420 ms (0.1 ms), 31 retransmits/s (0/s)"
        " · tcp, from node-a pid 100, round 0, reported at +70.000s\n"
    ) in text, text
    assert (
        "  SLOW LINK every link (the fabric, a switch): connections deliver 2.0 MB/s, RTT 50 ms,"
        " 4.0 retransmits/s · tcp, from node-a pid 100, round 0, reported at +80.000s\n"
    ) in text, text
    assert (
        "  SLOW LINK node-b's RDMA port mlx5_0/1: 25 Gb/sec (1X EDR), 4: ACTIVE / 5: LinkUp,"
        " symbol_error=1204 link_downed=2 · rdma, from node-a pid 100, round 0, reported at"
        " +90.000s\n"
    ) in text, text
    assert (
        "  SLOW LINK the link between node-a (10.1.0.11) and node-b (10.1.0.12): its sends and"
        " receives move at best 450 MB/s (the others 10000 MB/s) · p2p, from node-a pid 100,"
        " round 0, reported at +95.000s\n"
    ) in text, text
    assert (
        "  LINK EVIDENCE from node-b pid 200: its connection to 10.1.0.11 delivers 0.07 MB/s,"
        " RTT 410 ms, 29 retransmits/s, RDMA port mlx5_0/1, symbol_error=1204 · tcp, round 0,"
        " reported at +90.500s\n"
    ) in text, text


def test_html_summary_and_the_round_head(tmp_path: Path) -> None:
    timeline = load(tmp_path, slow_link_job())
    page = render_html(timeline)
    summary = page[page.index('<section id="run-summary">') : page.index("</section>")]
    assert "<caption>Slowdowns · run job-46 · 1, 45.9 s of training lost</caption>" in summary, (
        summary
    )
    row = summary[summary.index('<tr class="slowdown">') :].split("</tr>")[0]
    assert "<td>+61.000s → +155.300s</td><td>0</td><td>0</td>" in row, row
    assert '<b class="slowdown">2.0x</b>' in row and "collectives every 0.41 s" in row
    assert "0.30 s inside each (4.1x, sampled)" in row and "every rank alike" in row
    assert "<td>communication</td>" in row and '<b class="cost">45.9 s</b>' in row
    assert "node-a pid 100, node-b pid 200" in row and "ended" in row
    assert "<caption>Slow links · run job-46 · 1 named, evidence from 1 node</caption>" in summary
    links = summary[summary.index('<table class="links">') :].split("</table>")[0]
    assert '<b class="slow-link">node-b (10.1.0.12)</b>' in links
    assert "its connections to every peer deliver 0.06 MB/s (the others 110 MB/s)" in links
    assert f"<li>{NODE_B[A.LINK_EVIDENCE][0]}</li>" in links
    assert "<td>evidence</td>" in links and "its connection to 10.1.0.11 delivers" in links

    [round0] = timeline_data(timeline)["rounds"]
    assert round0["slowdowns"] == [
        "process group 0 from 08:01:01 for 94 s, 2.0x slower, communication, 45.9 s lost"
    ]
    assert round0["links"] == ["node-b (10.1.0.12), node, tcp"]
    marks = {n["label"]: [(m["start"], m["end"], m["ended"]) for m in n["slowdowns"]]
             for n in round0["nodes"]}  # fmt: skip
    assert marks == {
        "node-a pid 100": [(61.0, 155.0, True)],
        "node-b pid 200": [(61.0, 155.3, True)],
    }
    assert round0["nodes"][0]["slowdowns"][0]["text"] == SLOWDOWN


def test_cli_prints_the_slowdown_and_the_link(tmp_path: Path) -> None:
    path = tmp_path / "job.jsonl"
    slow_link_job().write(path)
    page = tmp_path / "t.html"
    done = timeline_cli(path, page)
    assert SLOWDOWN in done.stdout and LINK in done.stdout and EVIDENCE in done.stdout
    assert "Slowdowns · run job-46" in page.read_text()


@needs_chromium
def test_page_shows_the_slowdown_in_the_round_head(tmp_path: Path) -> None:
    measured, dom = probe(render_html(load(tmp_path, slow_link_job())), tmp_path)
    assert measured["scrollWidth"] <= measured["innerWidth"] == 1400, measured
    assert measured["summaryRight"] <= measured["innerWidth"]
    assert "slowdown: process group 0 from 08:01:01 for 94 s" in dom  # the round's head
    assert dom.count('<div class="slowdown-mark"') == 2  # on each node's row
    assert "slow link: node-b (10.1.0.12), node, tcp" in dom
