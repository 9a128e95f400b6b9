"""A hung job in the timeline: the training stall reports of a round, joined across nodes.

The input is what the bridges of a two-node job write when global rank 1 hangs at step 3 while
every other rank waits for it in the job's 4th ``all_reduce`` (``tests/scripts/hanging_train.py``):
real span and log records through the project's emitter and OTLP/JSON file exporters, one process
(resource) per node, read back as ``elastic-otel timeline`` reads them. Each node's agent sees
only its own ranks: node-a (ranks 0, 1) reports that rank 0 waits for rank 1, in ``hang at
train.py:18``; node-b (ranks 2, 3) only that its ranks wait. Both report every 30 s, with the
workers' stacks; the timeline names rank 1 once, with the ranks waiting for it on both nodes.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest

from elastic_otel.cli.otlp_json_reader import read_otlp_json
from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.analysis.timeline import Timeline
from elastic_otel.cli.timeline.render.chart import timeline_data
from elastic_otel.cli.timeline.render.html import render_html
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.model.stalls import STALL_EVENT_NAME, STALL_STATE, TRAINING
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import WORKER_STACKS_EVENT
from tests.support.chromium import ARTIFACTS, chromium, needs_chromium, probe
from tests.support.recorded_jobs import BASE, MS, RecordedJob, timeline_cli

RUN = "job-20"
T0 = 0x0C0C << 64 | 3  # the trace of round 0
RANKS = {"a": (0, 1), "b": (2, 3)}
HANG = "hang at train.py:18"
IN_ALL_REDUCE = "all_reduce at distributed_c10d.py:3252"
RANK_1_STACKS = (
    "Current thread 0x00007f43bac99b80 (most recent call first):\n"
    '  File "/job/train.py", line 18 in hang\n'
    '  File "/job/train.py", line 34 in main\n'
    '  File "/job/train.py", line 42 in <module>\n'
)


class Job(RecordedJob):
    """The hung job's records, with its stall reports and stack records."""

    def __init__(self) -> None:
        super().__init__(RUN, T0)

    def stall(self, node: str, at_ms: int, seconds: float, **kw: Any) -> None:
        """One training stall report on the node's ``rendezvous.member`` span (a fact given as
        ``None``: left out)."""
        facts = {
            A.STALLED_IN: TRAINING,
            A.STALLED_SECONDS: seconds,
            A.STALLED_COLLECTIVE: "all_reduce",
            A.STALLED_COLLECTIVE_NUMBER: 4,
            "state": STALL_STATE,
            **kw,
        }
        facts = {k: v for k, v in facts.items() if v is not None}
        self.log(node, STALL_EVENT_NAME, at_ms, self.members[node], **facts)

    def stacks(self, node: str, at_ms: int, reason: str, frames: dict[int, str]) -> None:
        """The stack records of the node's workers (the agent takes them all at once)."""
        for rank, frame in frames.items():
            body = RANK_1_STACKS if frame == HANG else f"  File ... in {frame}\n"
            self.log(
                node, WORKER_STACKS_EVENT, at_ms, self.workers[rank], body=body, state="STACKS",
                **{A.GLOBAL_RANK: rank, A.STACK_FRAME: frame, A.STACKS_REASON: reason},
            )  # fmt: skip


def round_0(one_rank_on_a: bool = False) -> Job:
    """Both nodes join round 0 (times in ms) and start their workers at 1.5 s; SIGTERM ends all
    at 100 s. ``one_rank_on_a``: node-a runs rank 0 only, node-b ranks 1, 2."""
    job = Job()
    ranks = {"a": (0,), "b": (1, 2)} if one_rank_on_a else RANKS
    for node, rank, join_at in (("a", 0, 0), ("b", 1, 400)):
        rdzv = {A.ROUND: 0, A.RANK: rank, A.WORLD_SIZE: 2}
        join = job.add(node, A.SPAN_RDZV_JOIN, join_at, 1000, attrs=rdzv)
        job.members[node] = job.add(
            node, A.SPAN_RDZV_MEMBER, 1000, 100_000, parent_span_id=join.span_id, attrs=rdzv
        )
        for global_rank in ranks[node]:
            attrs = {A.GLOBAL_RANK: global_rank, A.LOCAL_RANK: global_rank % 2,
                     A.STATE: "TERMINATED", A.AGENT_RESTARTS: 0}  # fmt: skip
            job.workers[global_rank] = job.add(
                node, A.SPAN_WORKER, 1500, 100_000, attrs=attrs,
                parent_span_id=job.members[node].span_id,
            )  # fmt: skip
    return job


def ranks(waited_for: tuple[int, ...], waiting: tuple[int, ...], as_text: bool = False) -> dict:
    """A report's ranks as the bridge exports them: int arrays, none waited for left out;
    ``as_text``: as exports from before the arrays wrote them (``"2,3"``, ``""``)."""
    if as_text:
        return {A.STALLED_RANKS: ",".join(map(str, waited_for)),
                A.STALLED_WAITING: ",".join(map(str, waiting))}  # fmt: skip
    return {A.STALLED_WAITING: waiting, **({A.STALLED_RANKS: waited_for} if waited_for else {})}


def hung_job(as_text: bool = False) -> Job:
    """The job of the module docstring. The last progress of both nodes' ranks was at 2 s;
    node-a reports at 32 and 64 s (30 and 62 s), node-b at 31.6 and 63.6 s (its agent looks
    0.4 s before node-a's). node-a's agent takes the stacks once more before it stops the
    workers; node-b's waits 30 s for its workers to stop (a stall of another kind).
    ``as_text``: the ranks as exports from before the int arrays wrote them."""
    job = round_0()
    for at, seconds in ((32_000, 30.0), (64_000, 62.0)):
        job.stacks("a", at, "training", {0: IN_ALL_REDUCE, 1: HANG})
        job.stall("a", at, seconds, **ranks((1,), (0,), as_text), **{A.STACK_FRAME: HANG})
    for at, seconds in ((31_600, 29.6), (63_600, 61.6)):
        job.stacks("b", at, "training", {2: IN_ALL_REDUCE, 3: IN_ALL_REDUCE})
        job.stall("b", at, seconds, **ranks((), (2, 3), as_text))
    job.stacks("a", 99_000, "before_stop", {0: IN_ALL_REDUCE, 1: HANG})
    job.log("b", STALL_EVENT_NAME, 130_000, job.members["b"], state=STALL_STATE,
            **{A.STALLED_IN: "stop_workers", A.STALLED_SECONDS: 30.0})  # fmt: skip
    return job


def load(tmp_path: Path, job: Job) -> Timeline:
    path = tmp_path / "job.jsonl"
    job.write(path)
    return build_timeline(*read_otlp_json(path))


STALLED = (
    "STALLED 62 s in all_reduce #4 (training): waiting for global rank 1 on node-a pid 100 (in "
    "hang at train.py:18); global ranks 0 (node-a pid 100), 2, 3 (node-b pid 200) wait in it"
)
FRAMES = [
    "    global rank 1 on node-a pid 100: hang at train.py:18  (waited for)",
    f"    global rank 0 on node-a pid 100: {IN_ALL_REDUCE}",
    f"    global rank 2 on node-b pid 200: {IN_ALL_REDUCE}",
    f"    global rank 3 on node-b pid 200: {IN_ALL_REDUCE}",
]


def test_the_written_records_are_what_the_bridge_exports(tmp_path: Path) -> None:
    """The input is what a real hang exports: the reports' bodies say what each node saw."""
    path = tmp_path / "job.jsonl"
    hung_job().write(path)
    _, logs = read_otlp_json(path)
    reports = [r for r in logs if r["event_name"] == STALL_EVENT_NAME]
    assert len(reports) == 5 and {r["severity_text"] for r in reports} == {"WARN"}
    assert reports[1]["body"] == (
        "stalled 62 s in training: global ranks 0 wait in all_reduce #4; waiting for global "
        "rank 1 (in hang at train.py:18)"
    )
    assert reports[3]["body"].endswith("waiting for ranks on other nodes")
    # the ranks as int arrays; none waited for on node-b: left out
    assert reports[1]["attributes"][A.STALLED_RANKS] == [1]
    assert reports[1]["attributes"][A.STALLED_WAITING] == [0]
    assert reports[3]["attributes"][A.STALLED_WAITING] == [2, 3]
    assert A.STALLED_RANKS not in reports[3]["attributes"]
    stacks = [r for r in logs if r["event_name"] == WORKER_STACKS_EVENT]
    assert len(stacks) == 10 and RANK_1_STACKS in {r["body"] for r in stacks}


def test_text_joins_the_reports_of_both_nodes_into_one_stall(tmp_path: Path) -> None:
    timeline = load(tmp_path, hung_job())
    [run] = timeline.runs
    [training, stopping] = run.stalls
    assert (training.kind, training.round, training.seconds) == (TRAINING, 0, 62.0)
    assert training.start_ns - BASE == 2000 * MS and training.end_ns - BASE == 64_000 * MS
    assert [r.node for r in training.reports] == ["node-a pid 100", "node-b pid 200"]
    assert training.waited_for == [(1, "node-a pid 100")]
    # the stacks taken at the latest report, not those before the stop
    assert {rank: s.reason for rank, s in training.stacks.items()} == dict.fromkeys(
        range(4), "training"
    )
    assert training.stacks[1].stacks == RANK_1_STACKS
    assert stopping.kind == "stop_workers"

    text = render_text(timeline)
    lines = text.splitlines()
    assert lines[3] == (
        "  1 stall: 62 s in all_reduce #4, waiting for global rank 1 (round 0, from +2.000s)"
    )
    assert lines[4] == (
        "  also stalled: 30 s in stop_workers on node-b pid 200 (round 0, from +100.000s)"
    )
    block = text.split("\nROUND 0 ")[1].split("\n\n")[1].splitlines()
    assert block[0] == f"  {STALLED} · from +2.000s, last reported at +64.000s"
    assert block[1:5] == FRAMES
    assert block[5] == (
        "  STALLED in stop_workers: node-b pid 200 30 s · from +100.000s, last reported at"
        " +130.000s"
    )
    assert "ERRORS" not in text  # a stall is a warning, not an error


def test_exports_from_before_the_int_arrays_read_the_same(tmp_path: Path) -> None:
    """Ranks written as text (``"1"``, ``"2,3"``, ``""``) give the same timeline."""
    (tmp_path / "arrays").mkdir()
    (tmp_path / "text").mkdir()
    arrays = load(tmp_path / "arrays", hung_job())
    text = load(tmp_path / "text", hung_job(as_text=True))
    assert render_text(text) == render_text(arrays)
    assert text.runs[0].stalls[0].waited_for == [(1, "node-a pid 100")]


def test_each_stall_of_a_node_is_its_own(tmp_path: Path) -> None:
    """Rank 1 hung for 40 s at step 3, went on, and hung again at the 9th all_reduce: progress
    between the reports makes them two stalls, each with its own latest reports."""
    job = round_0()
    for node, facts in (("a", ranks((1,), (0,))), ("b", ranks((), (2, 3)))):
        job.stall(node, 32_000, 30.0, **facts)
        job.stall(node, 42_000, 40.0, **facts)  # still the stall that began at 2 s
        job.stall(node, 80_000, 30.0, **facts, **{A.STALLED_COLLECTIVE_NUMBER: 9})  # from 50 s
    timeline = load(tmp_path, job)
    [run] = timeline.runs
    assert [(s.start_ns - BASE) // MS for s in run.stalls] == [2000, 50_000]
    assert [len(s.reports) for s in run.stalls] == [2, 2]
    assert (
        "  2 stalls: 40 s in all_reduce #4, waiting for global rank 1 (round 0, from +2.000s); "
        "30 s in all_reduce #9, waiting for global rank 1 (round 0, from +50.000s)\n"
    ) in render_text(timeline)


def test_no_node_names_the_rank(tmp_path: Path) -> None:
    """node-a's only rank hangs outside any collective: node-a reports no rank waiting, node-b
    that its ranks wait for ranks elsewhere. The stall points at node-a."""
    job = round_0(one_rank_on_a=True)
    nothing = {A.STALLED_COLLECTIVE: "", A.STALLED_COLLECTIVE_NUMBER: 0}  # in no collective
    job.stall("a", 32_000, 30.0, **ranks((), ()), **nothing)
    job.stall("b", 32_000, 30.0, **ranks((), (1, 2)))
    job.stacks("a", 32_000, "training", {0: HANG})
    timeline = load(tmp_path, job)
    [stall] = timeline.rounds[0].stalls
    assert stall.suspects == ["node-a pid 100"]
    text = render_text(timeline)
    assert (
        "  STALLED 30 s in all_reduce #4 (training): waiting for a rank on node-a pid 100, where"
        " no rank waits in it; global ranks 1, 2 (node-b pid 200) wait in it"
    ) in text
    assert "\n    global rank 0 on node-a pid 100: hang at train.py:18\n" in text
    assert "1 stall: 30 s in all_reduce #4, waiting for a rank on node-a pid 100" in text
    node_a = timeline_data(timeline)["rounds"][0]["nodes"][0]
    assert [m["role"] for m in node_a["stalls"]] == ["node"]


def test_html_summary_and_the_gantt_marker(tmp_path: Path) -> None:
    timeline = load(tmp_path, hung_job())
    page = render_html(timeline)
    summary = page[page.index('<section id="run-summary">') : page.index("</section>")]
    assert "<caption>Stalls · run job-20 · 1 in training, longest 62 s · 1 agent wait" in summary
    row = summary[summary.index('<tr class="stall">') :].split("</tr>")[0]
    assert "<td>+2.000s</td><td>0</td>" in row
    assert "62 s in all_reduce #4, waiting for global rank 1</b>" in row
    assert '<b class="waited">global rank 1 on node-a pid 100</b>' in row
    assert f'<div class="frame">in {HANG}</div>' in row
    # the whole stacks of the rank waited for, folded
    assert "<details><summary>stacks of global rank 1 (training, +64.000s)</summary>" in row
    assert f'<pre class="stack">{html.escape(RANK_1_STACKS)}</pre></details>' in row
    assert "0 (node-a pid 100), 2, 3 (node-b pid 200)" in row
    for line in FRAMES:
        rank_node, _, frame = line.strip().removesuffix("  (waited for)").partition(": ")
        assert f"{rank_node}: {frame}</li>" in row
    assert "30 s in stop_workers on node-b pid 200</b>" in summary

    data = timeline_data(timeline)
    [round0] = data["rounds"]
    assert round0["stalls"] == [
        "62 s in all_reduce #4, waiting for global rank 1",
        "30 s in stop_workers on node-b pid 200",
    ]
    marks = {
        w["rank"]: [(m["role"], m["start"], m["end"]) for m in w["stalls"]]
        for n in round0["nodes"]
        for w in n["workers"]
    }
    assert marks == {
        0: [("waiting", 2.0, 64.0)],
        1: [("waited", 2.0, 64.0)],
        2: [("waiting", 2.0, 64.0)],
        3: [("waiting", 2.0, 64.0)],
    }
    rank_1 = next(w for n in round0["nodes"] for w in n["workers"] if w["rank"] == 1)
    assert rank_1["stalls"][0]["frame"] == HANG and rank_1["stalls"][0]["text"] == STALLED
    node_b = round0["nodes"][1]
    assert [(m["role"], m["start"], m["end"]) for m in node_b["stalls"]] == [("node", 100.0, 130.0)]


def test_cli_prints_the_stall(tmp_path: Path) -> None:
    path = tmp_path / "job.jsonl"
    hung_job().write(path)
    page = tmp_path / "t.html"
    done = timeline_cli(path, page)
    assert f"  {STALLED} · from +2.000s" in done.stdout
    assert "1 stall: 62 s in all_reduce #4, waiting for global rank 1" in done.stdout
    assert "stacks of global rank 1" in page.read_text()


# --- the page in a real browser ---------------------------------------------------------------


@needs_chromium
def test_page_marks_the_stall_on_the_rank_waited_for(tmp_path: Path) -> None:
    page_html = render_html(load(tmp_path, hung_job()))
    measured, dom = probe(page_html, tmp_path)
    assert measured["scrollWidth"] <= measured["innerWidth"] == 1400, measured
    assert measured["summaryRight"] <= measured["innerWidth"]
    # one flag at the start of the stall, on rank 1's row; the waiting ranks underlined
    assert dom.count('<div class="stall-mark"') == 2  # rank 1's, and node-b's agent waiting
    assert dom.count(">STALLED: waited for</div>") == 1
    row = dom[dom.index('title="worker rank 1 · TERMINATED"') :].split('<div class="row')[0]
    assert 'class="stall-mark"' in row and 'class="stall-band waited"' in row
    assert dom.count('class="stall-band waiting"') == 3
    assert "stalled: 62 s in all_reduce #4, waiting for global rank 1" in dom  # round 0's head
    assert "<details>" in dom and "hang at train.py:18" in dom

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "timeline-stall.png"
    shot.unlink(missing_ok=True)
    page = tmp_path / "shot.html"
    page.write_text(page_html)
    done = chromium(page, tmp_path, f"--screenshot={shot}")
    assert done.returncode == 0 and shot.stat().st_size > 10_000


@pytest.mark.parametrize("reason", ["stall", "before_stop"])
def test_stacks_taken_for_another_reason_still_give_the_frames(tmp_path: Path, reason: str) -> None:
    """Stacks taken for a stall of another kind, or only before the stop (an agent that took
    none while it reported), still name the frames."""
    job = round_0()
    job.stall("a", 32_000, 30.0, **ranks((1,), (0,)))
    job.stall("b", 32_000, 30.0, **ranks((), (2, 3)))
    job.stacks("a", 32_000 if reason == "stall" else 40_000, reason, {0: IN_ALL_REDUCE, 1: HANG})
    timeline = load(tmp_path, job)
    [stall] = timeline.runs[0].stalls
    assert stall.stacks[1].reason == reason and stall.frame(1) == HANG
    assert "waiting for global rank 1 on node-a pid 100 (in hang at train.py:18)" in render_text(
        timeline
    )


def test_without_rendezvous_spans_the_processes_name_the_nodes(tmp_path: Path) -> None:
    """An export without rendezvous spans (a replayed log, a lost member span): the reports
    still join, their nodes named after the processes that sent them, as the rows are."""
    job = hung_job()
    for node in "ab":
        job.spans[node] = [s for s in job.spans[node] if s.name == A.SPAN_WORKER]
    timeline = load(tmp_path, job)
    [rnd] = timeline.rounds
    assert [n.label for n in rnd.nodes] == ["node-a agent agent-a", "node-b agent agent-b"]
    [training, _] = rnd.stalls
    assert training.waited_for == [(1, "node-a agent agent-a")] and training.round is None
    assert "waiting for global rank 1 on node-a agent agent-a (in hang at" in render_text(timeline)
    workers = timeline_data(timeline)["rounds"][0]["nodes"][0]["workers"]
    assert [[m["role"] for m in w["stalls"]] for w in workers] == [["waiting"], ["waited"]]


def test_a_frozen_node_named_by_its_silent_keep_alives(tmp_path: Path) -> None:
    """node-b froze (its ranks 2 and 3 report nothing); node-a's ranks both wait in the same
    collective and its report names node-b, whose rendezvous keep-alives stopped. The
    timeline's stall line says so; a node that reached no store says that of itself."""
    job = round_0()
    silent = {
        A.STALLED_SILENT_NODES: "node-b_200_0",
        A.STALLED_SILENT_GROUP_RANKS: (1,),
        A.STALLED_SILENT_SELF: False,
        A.STALLED_SILENT_SECONDS: 15.0,
    }
    job.stall("a", 32_000, 30.0, **ranks((), (0, 1)), **silent)
    text = render_text(load(tmp_path, job))
    assert "wait in it; keep-alives stopped: node-b_200_0 (seen by node-a pid 100)" in text, text
    job = round_0()
    job.stall("b", 32_000, 30.0, **ranks((), (2, 3)), **{**silent, A.STALLED_SILENT_SELF: True})
    (tmp_path / "self").mkdir()
    text = render_text(load(tmp_path / "self", job))
    assert "node-b pid 200 reached no rendezvous store (its link may be cut)" in text, text


def test_a_rank_named_by_another_node_is_on_its_own_node(tmp_path: Path) -> None:
    """node-b, whose ranks all wait, names rank 1 as node-a said through the round's store
    (``remote_host`` / ``remote_pids``): the rank stays node-a's, also when node-a's own
    report is missing from the export."""
    remote = {A.STALLED_REMOTE_HOST: "node-a", A.STALLED_REMOTE_PIDS: [100], A.STACK_FRAME: HANG}
    for with_a in (True, False):
        job = round_0()
        if with_a:
            job.stall("a", 32_000, 30.0, **ranks((1,), (0,)), **{A.STACK_FRAME: HANG})
        job.stall("b", 32_500, 30.5, **ranks((1,), (2, 3)), **remote)
        job.stacks("b", 32_500, "training", {2: IN_ALL_REDUCE, 3: IN_ALL_REDUCE})
        directory = tmp_path / str(with_a)
        directory.mkdir()
        timeline = load(directory, job)
        [stall] = timeline.rounds[0].stalls
        assert stall.waited_for == [(1, "node-a pid 100")]
        assert stall.suspects == []
        assert (1, "node-a pid 100", HANG, True) in stall.frames()
        text = render_text(timeline)
        assert "waiting for global rank 1 on node-a pid 100 (in hang at train.py:18)" in text


# --- start-up, and a job ended by a signal (issue 46) -----------------------------------------

SIGTERM = "torch.distributed.elastic.multiprocessing.api.SignalException"


def startup_job() -> Job:
    """node-b's ranks 2, 3 never reach ``init_process_group`` (a checkpoint load on a hung
    mount); node-a's ranks 0, 1 wait inside it and name them through the round's store, as
    ``tests/multinode/test_startup_hangs.py`` has it. SIGTERM ends both agents at 24 s."""
    job = round_0()
    startup = {A.STALLED_PHASE: "startup", A.STALLED_COLLECTIVE: "init_process_group",
               A.STALLED_COLLECTIVE_NUMBER: None}  # fmt: skip
    frame = {A.STACK_FRAME: "stuck_loading_checkpoint at ddp_train.py:40"}
    for at, seconds in ((8_000, 6.5), (23_000, 21.5)):
        job.stall("a", at, seconds, **ranks((2, 3), (0, 1)), **startup, **frame,
                  **{A.STALLED_REMOTE_HOST: "node-b", A.STALLED_REMOTE_PIDS: [200]})  # fmt: skip
        job.stall("b", at + 100, seconds, **ranks((2, 3), ()), **startup, **frame)
    for node, pid, at in (("a", 100, 24_000), ("b", 200, 24_008)):
        job.log(node, "torchelastic.worker.status.FAILED", at, job.members[node], state="FAILED",
                **{A.EVENT_SOURCE: "AGENT", A.EXCEPTION_TYPE: SIGTERM,
                   A.EXCEPTION_MESSAGE: f"Process {pid} got signal: 15"})  # fmt: skip
    return job


def test_a_stall_in_init_process_group_reads_as_start_up(tmp_path: Path) -> None:
    """It said "(training)": the reports' ``torchelastic.stalled.phase`` says start-up."""
    timeline = load(tmp_path, startup_job())
    [stall] = timeline.rounds[0].stalls
    assert (stall.kind, stall.phase) == (TRAINING, "startup")
    text = render_text(timeline)
    assert (
        "  STALLED 22 s in init_process_group (start-up): waiting for global ranks 2 on node-b pid"
        " 200 (in stuck_loading_checkpoint at ddp_train.py:40), 3 on node-b pid 200; global ranks"
        " 0, 1 (node-a pid 100) wait in it · from +1.500s"
    ) in text, text
    assert "(training)" not in text
    page = render_html(timeline)
    assert "<caption>Stalls · run job-20 · 1 in start-up, longest 22 s</caption>" in page
    assert '<div class="facts">start-up · last reported at +23.100s</div>' in page
    # A stall once training began still says so.
    assert "STALLED 62 s in all_reduce #4 (training)" in render_text(load(tmp_path, hung_job()))
    # Ranks before the job's first collective, in none: in start-up, not "in training".
    job = round_0()
    before = {A.STALLED_PHASE: "startup", A.STALLED_COLLECTIVE: None}
    job.stall("b", 8_000, 6.5, **ranks((), ()), **before, **{A.STALLED_COLLECTIVE_NUMBER: None})
    (tmp_path / "first").mkdir()
    text = render_text(load(tmp_path / "first", job))
    assert "  STALLED in start-up: " not in text and "  STALLED 6 s in start-up: " in text, text


def test_errors_list_a_record_delivered_twice_once(tmp_path: Path) -> None:
    """Delivery is at least once: node-a's FAILED record sent again (its answer lost, or sent
    again by the exit path) is in the export twice, alike in every field. ERRORS listed it
    twice; it is one error. node-b's FAILED, the same words but another process, stays."""
    path = tmp_path / "job.jsonl"
    startup_job().write(path)
    lines = path.read_text().splitlines(keepends=True)
    [again] = [line for line in lines if "Process 100 got signal: 15" in line]
    path.write_text("".join(lines) + again)
    text = render_text(build_timeline(*read_otlp_json(path)))
    errors = text.split("\nERRORS\n")[1].splitlines()
    assert errors == [
        f"  +24.000s  node-a pid 100 agent: FAILED: {SIGTERM}: Process 100 got signal: 15",
        f"  +24.008s  node-b pid 200 agent: FAILED: {SIGTERM}: Process 200 got signal: 15",
    ], errors
    # The stall reports of that export are each read once too.
    [stall] = build_timeline(*read_otlp_json(path)).rounds[0].stalls
    assert [r.node for r in stall.reports] == ["node-a pid 100", "node-b pid 200"]


def test_a_second_error_of_the_same_words_is_listed(tmp_path: Path) -> None:
    """Two records of one process with the same text at two times are two errors."""
    job = startup_job()
    job.log("a", "torchelastic.worker.status.FAILED", 25_000, job.members["a"], state="FAILED",
            **{A.EVENT_SOURCE: "AGENT", A.EXCEPTION_TYPE: SIGTERM,
               A.EXCEPTION_MESSAGE: "Process 100 got signal: 15"})  # fmt: skip
    text = render_text(load(tmp_path, job))
    assert text.count("node-a pid 100 agent: FAILED:") == 2, text
