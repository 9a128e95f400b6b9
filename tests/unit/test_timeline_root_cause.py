"""The root cause of a failed round across nodes, and one job restart for all nodes' recoveries.

The input is what the bridges of a two-node job write: real span records through the
project's emitter and OTLP/JSON file exporter, one process (resource) per node, read back as
``elastic-otel timeline`` reads them. Round 0: global rank 1 on node-a is SIGKILLed (the root
cause), its agent stops rank 0, ranks 2 and 3 on node-b die of the broken collective; both
agents recover into round 1, where training resumes.
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
from elastic_otel.model.spans import STATUS_ERROR, SpanEvent, SpanLink
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import STATUS_PREFIX
from tests.support.chromium import ARTIFACTS, chromium, needs_chromium, probe
from tests.support.recorded_jobs import BASE, MS, RecordedJob, timeline_cli

RUN = "job-7"
T0, T1 = 0x0A0A << 64 | 1, 0x0B0B << 64 | 2  # the traces of rounds 0 and 1
PEER_DIED = "its collective failed after a peer died: Connection closed by peer"


def two_node_job(kinds: bool = True, final_failure: bool = False) -> RecordedJob:
    """The job of the module docstring (times in ms). ``kinds=False``: as a bridge from before
    ``torchelastic.failure.kind`` wrote it. ``final_failure``: rank 3 fails on its own too
    (0.3 s after rank 1, out of memory) and nobody restarts: the job fails."""
    job = RecordedJob(RUN, T0)
    members = {}
    for node, rank, join_at in (("a", 0, 0), ("b", 1, 500)):
        rdzv = {A.ROUND: 0, A.RANK: rank, A.WORLD_SIZE: 2}
        join = job.add(node, A.SPAN_RDZV_JOIN, join_at, 1000, T0, attrs=rdzv)
        members[node] = job.add(
            node, A.SPAN_RDZV_MEMBER, 1000, 5600, T0, parent_span_id=join.span_id, attrs=rdzv
        )
    # (rank, node, end, state, kind, attributes, status message)
    ends: list[tuple[int, str, int, str, str, dict[str, Any], str]] = [
        (1, "a", 5000, "FAILED", A.KIND_ROOT_CAUSE,
         {A.ERROR_TYPE: "SIGKILL", A.PROCESS_EXIT_CODE: -9, A.EXIT_CODE: -9, A.OOM_KILL: True},
         "killed by SIGKILL (the kernel's OOM killer)"),
        (0, "a", 5200, "STOPPED", A.KIND_STOPPED,
         {A.PROCESS_EXIT_CODE: -15, A.EXIT_CODE: -15,
          A.END_REASON: "stopped by the agent after global rank 1 failed"}, ""),
        (2, "b", 5800, "PEER_FAILED", A.KIND_PEER_FAILURE,
         {A.PROCESS_EXIT_CODE: 1, A.EXIT_CODE: 1, A.END_REASON: PEER_DIED}, ""),
        (3, "b", 5900, "PEER_FAILED", A.KIND_PEER_FAILURE,
         {A.PROCESS_EXIT_CODE: 1, A.EXIT_CODE: 1, A.END_REASON: PEER_DIED}, ""),
    ]  # fmt: skip
    if final_failure:
        ends[3] = (3, "b", 5300, "FAILED", A.KIND_ROOT_CAUSE,
                   {A.ERROR_TYPE: "RuntimeError", A.PROCESS_EXIT_CODE: 1, A.EXIT_CODE: 1,
                    A.OOM_KILL: True}, "RuntimeError")  # fmt: skip
    for rank, node, end, state, kind, extra, message in ends:
        attrs = {A.GLOBAL_RANK: rank, A.LOCAL_RANK: rank % 2, A.STATE: state, **extra}
        attrs[A.AGENT_RESTARTS] = 0
        if kinds:
            attrs[A.FAILURE_KIND] = kind
        worker = job.add(node, A.SPAN_WORKER, 1500, end, T0, attrs=attrs,
                         parent_span_id=members[node].span_id)  # fmt: skip
        if kind == A.KIND_ROOT_CAUSE:
            worker.status, worker.status_message = STATUS_ERROR, message
        if rank == 3 and final_failure:
            exception = {
                A.EXCEPTION_TYPE: "RuntimeError",
                A.EXCEPTION_MESSAGE: "CUDA out of memory",
            }
            worker.events.append(SpanEvent("exception", worker.end_ns, exception))
        job.workers[rank] = worker
    if final_failure:
        for node, start in (("a", 0), ("b", 500)):
            job.add(node, A.SPAN_AGENT_RUN, start, 6000, T0, attrs={A.STATE: "FAILED"})
        return job

    # Both agents recover into round 1: node-a noticed at 5.5 s, node-b at 6.2 s; each links to
    # the failed worker it saw (node-b's own victim); the phases are the recovery's children.
    stop, rdzv, assign, start = (
        A.SPAN_AGENT_STOP_WORKERS,
        A.SPAN_AGENT_RENDEZVOUS,
        A.SPAN_AGENT_ASSIGN_RANKS,
        A.SPAN_AGENT_START_WORKERS,
    )
    phases = {
        "a": (5500, ((stop, 5500, 5700), (rdzv, 5700, 8500), (assign, 8500, 8600),
                     (start, 8600, 9000))),
        "b": (6200, ((stop, 6200, 6300), (rdzv, 6300, 8500), (assign, 8500, 8550),
                     (start, 8550, 9200))),
    }  # fmt: skip
    for node, (begin, steps) in phases.items():
        failed = job.workers[1 if node == "a" else 2]
        link = SpanLink(failed.trace_id, failed.span_id, {A.STATE: "FAILED"})
        recovery = job.add(node, A.SPAN_AGENT_RECOVERY, begin, steps[-1][2], T1, links=[link],
                           attrs={A.RECOVERY_CAUSE: A.CAUSE_WORKER_FAILURE,
                                  A.RECOVERY_DETECTION_MS: 500.0, A.AGENT_RESTARTS: 1})  # fmt: skip
        for name, a, b in steps:
            job.add(node, name, a, b, T1, parent_span_id=recovery.span_id)
    for node, rank, join_at, first_rank in (("a", 0, 5700, 0), ("b", 1, 6300, 2)):
        rdzv = {A.ROUND: 1, A.RANK: rank, A.WORLD_SIZE: 2}
        join = job.add(node, A.SPAN_RDZV_JOIN, join_at, 8500, T1, attrs=rdzv)
        member = job.add(node, A.SPAN_RDZV_MEMBER, 8500, 20000, T1,
                         parent_span_id=join.span_id, attrs=rdzv)  # fmt: skip
        for global_rank in (first_rank, first_rank + 1):
            attrs = {A.GLOBAL_RANK: global_rank, A.LOCAL_RANK: global_rank % 2,
                     A.STATE: "SUCCEEDED", A.AGENT_RESTARTS: 1}  # fmt: skip
            worker = job.add(node, A.SPAN_WORKER, 9200, 19500, T1, attrs=attrs,
                             parent_span_id=member.span_id)  # fmt: skip
            # training resumed: the last first step of round 1 ends at 11.4 s (node-b)
            step_end = 11000 if node == "a" else 11400
            job.add(node, A.SPAN_WORKER_FIRST_STEP, 9200, step_end, T1,
                    parent_span_id=worker.span_id, attrs={})  # fmt: skip
        job.add(node, A.SPAN_AGENT_RUN, 0, 20000, T1, attrs={A.STATE: "SUCCEEDED"})
    return job


def written(tmp_path: Path, job: RecordedJob) -> Path:
    return job.write(tmp_path / "job.jsonl")


def load(path: Path) -> Timeline:
    return build_timeline(*read_otlp_json(path))


def failure_block(text: str, round_number: int) -> list[str]:
    """The lines after a round's table: its root cause and what followed."""
    block = text.split(f"\nROUND {round_number} ")[1].split("\n\nROUND ")[0]
    _, _, after = block.partition("\n\n")
    return after.splitlines()


ROOT = "global rank 1 SIGKILL on node-a (exit code -9): killed by SIGKILL (the kernel's OOM killer)"
CONSEQUENCES = [
    "    +0.200s rank 0 on node-a STOPPED: stopped by the agent after global rank 1 failed",
    f"    +0.800s rank 2 on node-b PEER_FAILED: {PEER_DIED}",
    f"    +0.900s rank 3 on node-b PEER_FAILED: {PEER_DIED}",
]


@pytest.mark.parametrize("kinds", [True, False], ids=["failure kinds", "older export"])
def test_text_names_the_root_cause_across_nodes_and_one_restart(
    tmp_path: Path, kinds: bool
) -> None:
    timeline = load(written(tmp_path, two_node_job(kinds=kinds)))
    [run] = timeline.runs
    [failure] = run.failures
    assert failure.root is not None and failure.root.global_rank == 1
    assert [(w.global_rank, w.kind) for w in failure.consequences] == [
        (0, A.KIND_STOPPED),
        (2, A.KIND_PEER_FAILURE),
        (3, A.KIND_PEER_FAILURE),
    ]
    # One job restart for the two nodes' recoveries: from the failure at 5 s (before either
    # node noticed) to training resumed at 11.4 s.
    [restart] = run.restarts
    assert len(restart.recoveries) == 2 and restart.failure is failure and restart.round == 1
    assert (restart.start_ns - BASE, restart.cost_ns) == (5000 * MS, 6400 * MS)
    assert run.lost_ns == 6400 * MS

    text = render_text(timeline)
    lines = text.splitlines()
    assert lines[2].endswith(" · 1 restart cost 6.400s")
    assert lines[3] == (
        "  at +5.000s in round 0 · 1 failure: global rank 1 SIGKILL on node-a → restart,"
        " cost 6.400s"
    )
    assert lines[4].startswith("    recovery on node-a pid 100 at +5.500s: worker_failure, 3.500s")
    assert lines[5].startswith("    recovery on node-b pid 200 at +6.200s: worker_failure, 3.000s")
    assert sum("recovery on" in line for line in lines) == 2
    assert failure_block(text, 0) == [f"  ROOT CAUSE at +5.000s: {ROOT}", *CONSEQUENCES]
    assert "ROOT CAUSE" not in text.split("\nROUND 1 ")[1]  # round 1 succeeded
    header = next(line for line in lines if line.startswith("ROUND 0 "))
    assert header.endswith("worker failure")
    # PEER_FAILED workers are failures in the table (x), not the root cause
    peers = [line for line in lines if " PEER_FAILED " in line and "  x  rank " in line]
    assert len(peers) == 2


def test_html_names_the_root_cause_and_the_restart(tmp_path: Path) -> None:
    timeline = load(written(tmp_path, two_node_job()))
    page = render_html(timeline)
    summary = page[page.index('<section id="run-summary">') : page.index("</section>")]
    assert "<pre" not in summary  # a table, not preformatted text wider than the window
    assert '<b class="root-cause">global rank 1 SIGKILL on node-a</b>' in summary
    assert '<div class="facts">exit code -9</div>' in summary
    assert "killed by SIGKILL (the kernel&#x27;s OOM killer)" in summary
    for line in CONSEQUENCES:
        assert f">{html.escape(line.strip())}</li>" in summary
    assert 'restart, cost <b class="cost">6.400s</b>' in summary
    assert summary.count("<b>node-a pid 100</b> at +5.500s: worker_failure") == 1
    assert summary.count("<b>node-b pid 200</b> at +6.200s: worker_failure") == 1
    assert "<td>1</td><td>6.400s</td></tr>" in summary  # one job restart and its cost

    data = timeline_data(timeline)
    round0, round1 = data["rounds"]
    assert round0["root_cause"] == "global rank 1 SIGKILL on node-a" and not round1["root_cause"]
    roles = {w["rank"]: (w["role"], w["note"]) for n in round0["nodes"] for w in n["workers"]}
    assert roles == {
        1: ("root", "root cause of round 0"),
        0: ("consequence", "ended +0.200s after the root cause, global rank 1"),
        2: ("consequence", "ended +0.800s after the root cause, global rank 1"),
        3: ("consequence", "ended +0.900s after the root cause, global rank 1"),
    }
    # each node's recovery is on its row in round 1, with its phases in order
    recoveries = {n["label"]: n["recoveries"] for n in round1["nodes"]}
    assert [len(r) for r in recoveries.values()] == [1, 1]
    [a] = recoveries["node-a pid 100"]
    assert (a["start"], a["end"], a["cause"]) == (5.5, 9.0, A.CAUSE_WORKER_FAILURE)
    assert [(p["name"], p["start"], p["end"]) for p in a["phases"]] == [
        ("stop_workers", 5.5, 5.7),
        ("rendezvous", 5.7, 8.5),
        ("assign_worker_ranks", 8.5, 8.6),
        ("start_workers", 8.6, 9.0),
    ]
    assert not [r for n in round0["nodes"] for r in n["recoveries"]]


def test_several_root_causes_and_a_final_failure(tmp_path: Path) -> None:
    timeline = load(written(tmp_path, two_node_job(final_failure=True)))
    [run] = timeline.runs
    assert run.restarts == [] and run.job_failed
    [failure] = run.failures
    assert [w.global_rank for w in failure.roots] == [1, 3]  # the earliest is the root cause
    text = render_text(timeline)
    assert (
        "  at +5.000s in round 0 · 2 failures: global rank 1 SIGKILL on node-a, global rank 3"
        " RuntimeError on node-b (+0.300s) → job failed\n" in text
    )
    assert failure_block(text, 0) == [
        f"  ROOT CAUSE at +5.000s: {ROOT}",
        "    +0.200s rank 0 on node-a STOPPED: stopped by the agent after global rank 1 failed",
        "    +0.300s also failed on its own: global rank 3 RuntimeError on node-b (exit code 1,"
        " OOM kill): CUDA out of memory",
        f"    +0.800s rank 2 on node-b PEER_FAILED: {PEER_DIED}",
    ]
    page = render_html(timeline)
    assert "also failed on its own: global rank 3 RuntimeError on node-b" in page
    assert ">job failed</td>" in page
    roles = {
        w["rank"]: w["role"]
        for n in timeline_data(timeline)["rounds"][0]["nodes"]
        for w in n["workers"]
    }
    assert roles == {0: "consequence", 1: "root", 2: "consequence", 3: "independent"}


def test_victims_without_a_root_cause(tmp_path: Path) -> None:
    """Rank 1's span never arrived (its node's export was lost): no root cause is invented;
    the others are listed at their times, and the restart still counts once, from the first."""
    job = two_node_job()
    job.spans["a"].remove(job.workers[1])
    timeline = load(written(tmp_path, job))
    [run] = timeline.runs
    [restart] = run.restarts  # the recoveries link to rank 1 and to rank 2: rank 2's failure
    assert restart.failure is not None and restart.failure.root is None
    assert (restart.start_ns - BASE, restart.cost_ns) == (5200 * MS, 6200 * MS)
    text = render_text(timeline)
    assert (
        "  at +5.200s in round 0 · no root cause seen, 3 workers ended after a peer's failure"
        " → restart, cost 6.200s\n" in text
    )
    assert failure_block(text, 0) == [
        "  ROOT CAUSE not seen: no worker failed on its own; these ended after",
        "    at +5.200s rank 0 on node-a STOPPED: stopped by the agent after global rank 1 failed",
        f"    at +5.800s rank 2 on node-b PEER_FAILED: {PEER_DIED}",
        f"    at +5.900s rank 3 on node-b PEER_FAILED: {PEER_DIED}",
    ]
    assert "<i>not seen: no worker failed on its own</i>" in render_html(timeline)


def test_an_error_record_with_a_traceback_body_is_one_line(tmp_path: Path) -> None:
    """The bridge puts a failed worker's whole traceback in its log record's body; the
    timeline's ERRORS list says it in one line, with the exception."""
    spans, _ = read_otlp_json(written(tmp_path, two_node_job()))
    worker = next(s for s in spans if s["attributes"].get(A.STATE) == "FAILED")
    record = {
        "time_ns": worker["end_ns"],
        "severity_number": 17,
        "body": "Traceback (most recent call last):\n  File ...\nRuntimeError: boom\n",
        "event_name": STATUS_PREFIX + "FAILED",
        "attributes": {
            A.EVENT_SOURCE: A.SOURCE_WORKER,
            A.GLOBAL_RANK: 1,
            A.EXCEPTION_TYPE: "RuntimeError",
            A.EXCEPTION_MESSAGE: "boom",
        },
        "span_id": worker["span_id"],
        "resource": {},
    }
    text = render_text(build_timeline(spans, [record]))
    assert text.endswith(
        "\nERRORS\n  +5.000s  node-a pid 100 worker rank 1: FAILED: RuntimeError: boom\n"
    )


def test_cli_prints_the_root_cause(tmp_path: Path) -> None:
    path = written(tmp_path, two_node_job())
    page = tmp_path / "t.html"
    done = timeline_cli(path, page)
    assert f"  ROOT CAUSE at +5.000s: {ROOT}\n" in done.stdout
    assert "1 failure: global rank 1 SIGKILL on node-a → restart, cost 6.400s" in done.stdout
    assert "root cause" in page.read_text()


# --- the page in a real browser ---------------------------------------------------------------


@needs_chromium
def test_page_fits_1400_pixels_and_draws_the_recovery_phases(tmp_path: Path) -> None:
    page_html = render_html(load(written(tmp_path, two_node_job())))
    measured, dom = probe(page_html, tmp_path)
    assert measured["innerWidth"] == 1400
    assert measured["scrollWidth"] <= measured["innerWidth"], measured
    assert measured["summaryRight"] <= measured["innerWidth"]
    # four phases per recovery, two recoveries, each coloured by its phase and labelled
    phases = measured["phases"]
    assert len(phases) == 8
    assert sorted((cls, text) for cls, text, _ in phases) == sorted(
        (f"bar phase {name}", name.replace("_", " "))
        for name in ("stop_workers", "rendezvous", "assign_worker_ranks", "start_workers")
        for _ in range(2)
    )
    assert all(width > 0 for _, _, width in phases)
    assert dom.count('class="bar recovery"') == 2
    assert dom.count(">recovery · worker_failure<") == 2
    assert "root cause: global rank 1 SIGKILL on node-a" in dom  # on round 0's head
    assert 'title="worker rank 1 · FAILED · root cause of round 0"' in dom
    assert 'class="bar FAILED failed root"' in dom and ">ROOT CAUSE</div>" in dom
    assert dom.count('class="bar PEER_FAILED failed consequence"') == 2

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "timeline-root-cause.png"
    shot.unlink(missing_ok=True)
    page = tmp_path / "shot.html"
    page.write_text(page_html)
    done = chromium(page, tmp_path, f"--screenshot={shot}")
    assert done.returncode == 0 and shot.stat().st_size > 10_000


# --- last words (torchelastic.last_words on the root cause's FAILED record) -----------------


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


# --- a hung job that a scheduler then ends (issue 36) ------------------------------------------

HANG_FRAME = "stuck_data_loader at train.py:18"
SIGTERM = "SignalException: Process 77 got signal: 15"


def hung_job(kinds: bool) -> RecordedJob:
    """FSDP2, two nodes of two ranks: global rank 1 on node-a stops at its line at 2 s;
    ranks 0, 2 and 3 wait in all_reduce #4. node-a names rank 1 from its own ranks (at 20 and
    36 s: 18 and 34 s), node-b from node-a's report in the round's store (remote host and
    pid). At 36.5 s the
    scheduler's SIGTERM ends both agents: every worker ends, no worker failed on its own, both
    ``agent.run`` spans FAILED with the stall in their status. ``kinds``: the workers' ends as
    victims of a peer (``peer_failure``), else plain ``TERMINATED`` ends (no failure kind)."""
    job = RecordedJob(RUN, T0)
    for node, rank, join_at in (("a", 0, 0), ("b", 1, 300)):
        rdzv = {A.ROUND: 0, A.RANK: rank, A.WORLD_SIZE: 2}
        join = job.add(node, A.SPAN_RDZV_JOIN, join_at, 1000, attrs=rdzv)
        job.members[node] = job.add(
            node, A.SPAN_RDZV_MEMBER, 1000, 36_800, parent_span_id=join.span_id, attrs=rdzv
        )
        for global_rank in (2 * rank, 2 * rank + 1):
            attrs = {A.GLOBAL_RANK: global_rank, A.LOCAL_RANK: global_rank % 2,
                     A.STATE: "TERMINATED", A.AGENT_RESTARTS: 0, A.EXIT_CODE: -15}  # fmt: skip
            if kinds:
                attrs[A.FAILURE_KIND] = A.KIND_PEER_FAILURE
            job.workers[global_rank] = job.add(
                node, A.SPAN_WORKER, 1500, 36_600 + 100 * global_rank, attrs=attrs,
                parent_span_id=job.members[node].span_id,
            )  # fmt: skip
    remote = {A.STALLED_REMOTE_HOST: "node-a", A.STALLED_REMOTE_PIDS: (100,)}
    for at in (20_000, 36_000):
        seconds = (at - 2000) / 1000
        for node, waiting, extra in (("a", (0,), {}), ("b", (2, 3), remote)):
            facts = {
                A.STALLED_IN: "training", A.STALLED_SECONDS: seconds, A.STALLED_RANKS: (1,),
                A.STALLED_WAITING: waiting, A.STALLED_COLLECTIVE: "all_reduce",
                A.STALLED_COLLECTIVE_NUMBER: 4, A.STACK_FRAME: HANG_FRAME, **extra,
            }  # fmt: skip
            job.log(node, "torchelastic.stalled", at, job.members[node], state="STALLED", **facts)
    for node, start in (("a", 0), ("b", 300)):
        attrs = {A.STATE: "FAILED", A.STALLED_RANKS: (1,), A.STACK_FRAME: HANG_FRAME,
                 A.PROCESS_EXIT_CODE: 1}  # fmt: skip
        run = job.add(node, A.SPAN_AGENT_RUN, start, 36_900, attrs=attrs)
        run.status = STATUS_ERROR
        run.status_message = (
            f"stalled: global rank 1 at {HANG_FRAME} for 34 s, every other rank waiting for it;"
            f" then {SIGTERM}"
        )
    return job


HUNG_ROOT = (
    f"  ROOT CAUSE at +2.000s: global rank 1 on node-a pid 100 stalled 34 s at {HANG_FRAME};"
    " global ranks 0 (node-a pid 100), 2, 3 (node-b pid 200) waited for it in all_reduce #4"
)


@pytest.mark.parametrize("kinds", [True, False], ids=["peer failures", "terminated"])
def test_a_hung_job_ended_by_a_signal_names_the_stalled_rank_as_its_root_cause(
    tmp_path: Path, kinds: bool
) -> None:
    timeline = load(written(tmp_path, hung_job(kinds)))
    [run] = timeline.runs
    assert run.job_failed and run.restarts == []
    [failure] = run.failures
    assert failure.root is None and failure.stalled is not None
    assert (failure.stalled.global_rank, failure.stalled.node) == (1, "node-a pid 100")
    assert failure.stalled.frame == HANG_FRAME and failure.stalled.seconds == 34.0
    assert failure.time_ns - BASE == 2000 * MS  # when rank 1 stopped making progress

    text = render_text(timeline)
    assert "ROOT CAUSE not seen" not in text
    assert "  at +2.000s in round 0 · no worker failed, global rank 1 on node-a pid 100 stalled" \
        " 34 s → job failed\n" in text  # fmt: skip
    block = failure_block(text, 0)
    at = block.index(HUNG_ROOT)
    assert block[at - 1] == ""  # below the round's stall lines, a block of its own
    ends = block[at + 1 :]
    if kinds:  # the others, after the root cause, by their delay
        node = {0: "a", 1: "a", 2: "b", 3: "b"}
        assert ends == [
            f"    +{34.6 + r / 10:.3f}s rank {r} on node-{node[r]} TERMINATED" for r in range(4)
        ]
    else:
        assert ends == []
    header = next(line for line in text.splitlines() if line.startswith("ROUND 0 "))
    assert header.endswith("job failed")

    page = render_html(timeline)
    summary = page[page.index('<section id="run-summary">') : page.index("</section>")]
    assert "not seen" not in summary
    assert '<b class="root-cause">global rank 1 on node-a pid 100 stalled 34 s</b>' in summary
    assert f'<div class="facts">at {HANG_FRAME}</div>' in summary
    assert ">job failed</td>" in summary
    [round0] = timeline_data(timeline)["rounds"]
    assert round0["root_cause"] == "global rank 1 on node-a pid 100 stalled 34 s"
    roles = {w["rank"]: w["role"] for n in round0["nodes"] for w in n["workers"]}
    assert roles[1] == "root"


def test_the_cli_prints_a_hung_jobs_root_cause(tmp_path: Path) -> None:
    done = timeline_cli(written(tmp_path, hung_job(kinds=True)), tmp_path / "t.html")
    assert HUNG_ROOT + "\n" in done.stdout
    assert "ROOT CAUSE not seen" not in done.stdout


def test_a_stall_that_a_worker_failure_ended_keeps_that_worker_as_root_cause(
    tmp_path: Path,
) -> None:
    """A worker that failed on its own is the root cause, whatever stall came before."""
    job = hung_job(kinds=True)
    rank3 = job.workers[3]
    rank3.attributes.update({A.STATE: "FAILED", A.FAILURE_KIND: A.KIND_ROOT_CAUSE})
    rank3.status, rank3.status_message = STATUS_ERROR, "RuntimeError: boom"
    timeline = load(written(tmp_path, job))
    [failure] = timeline.runs[0].failures
    assert failure.root is not None and failure.root.global_rank == 3
    assert "ROOT CAUSE at +36.900s: global rank 3" in render_text(timeline)


def test_a_stall_in_a_job_still_running_has_no_root_cause(tmp_path: Path) -> None:
    """No agent ended it and no worker failed: a stall, not yet a failure."""
    job = hung_job(kinds=False)
    for node in "ab":
        job.spans[node] = [s for s in job.spans[node] if s.name != A.SPAN_AGENT_RUN]
    timeline = load(written(tmp_path, job))
    assert timeline.runs[0].failures == []
    assert "ROOT CAUSE" not in render_text(timeline)
