"""The timeline's per-run summary end to end: spans → ``build_timeline`` → text and HTML."""

from __future__ import annotations

import itertools
from typing import Any

from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.render.html import render_html
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.names import attributes as A

MS = 1_000_000
S = 1000 * MS
BASE = 1_763_884_800 * S  # an epoch time: the renderers print the start as a date
_ids = itertools.count(1)

NODE_A = {A.HOST_NAME: "gpu-a", A.PROCESS_PID: 100}
NODE_B = {A.HOST_NAME: "gpu-b", A.PROCESS_PID: 200}


def item(
    name: str,
    start_ms: int,
    end_ms: int,
    trace: str = "t0",
    parent: str = "",
    instance: str = "",
    status: str = "UNSET",
    resource: dict[str, Any] | None = None,
    **attrs: Any,
) -> dict[str, Any]:
    """One span as ``read_otlp_json`` returns it; times in ms from ``BASE``."""
    return {
        "trace_id": trace,
        "span_id": f"s{next(_ids)}",
        "parent_span_id": parent,
        "name": name,
        "kind": 1,
        "start_ns": BASE + start_ms * MS,
        "end_ns": BASE + end_ms * MS,
        "attributes": attrs,
        "events": [],
        "links": [],
        "status_code": status,
        "status_message": "",
        "resource": {"service.instance.id": instance, **(resource or {})},
        "scope": "elastic_otel",
    }


def agent(name: str, start: int, end: int, node: dict[str, Any], inst: str, **kw: Any) -> dict:
    return item(name, start, end, instance=inst, **{A.RUN_ID: "job", **node}, **kw)


def two_node_run() -> list[dict[str, Any]]:
    """Round 0: gpu-a joins at 0 s, gpu-b 3 s later; gpu-b's worker fails at 9 s; both agents
    recover (gpu-b notices 0.5 s later) into round 1, where training resumes at 15 and 16 s."""
    spans: list[dict[str, Any]] = []
    rows = []  # per round, per node: (member span, worker start, worker end, worker state)
    for rnd, trace, joins in ((0, "t0", (0, 3000)), (1, "t1", (10400, 10000))):
        for (node, inst), join_at in zip(((NODE_A, "a"), (NODE_B, "b")), joins, strict=True):
            end = 3200 if rnd == 0 else 12000
            rdzv = {A.ROUND: rnd, A.RANK: 0 if inst == "a" else 1, A.WORLD_SIZE: 2}
            spans.append(agent(A.SPAN_RDZV_JOIN, join_at, end, node, inst, trace=trace, **rdzv))
            member = agent(A.SPAN_RDZV_MEMBER, end, 10000 if rnd == 0 else 30000, node, inst,
                           trace=trace, **rdzv)  # fmt: skip
            spans.append(member)
            rows.append((member, rnd, inst, trace))
    workers = {  # (round, node) → start, end, state, status, first step end
        (0, "a"): (4000, 10000, "REPLACED", "UNSET", 5000),
        (0, "b"): (4000, 9000, "FAILED", "ERROR", 5500),
        (1, "a"): (12300, 30000, "SUCCEEDED", "UNSET", 15000),
        (1, "b"): (12500, 30000, "SUCCEEDED", "UNSET", 16000),
    }
    for member, rnd, inst, trace in rows:
        start, end, state, status, step = workers[(rnd, inst)]
        worker = item(A.SPAN_WORKER, start, end, trace, member["span_id"], inst, status,
                      **{A.RUN_ID: "job", A.GLOBAL_RANK: 0 if inst == "a" else 1,
                         A.STATE: state, A.AGENT_RESTARTS: rnd})  # fmt: skip
        # the training script's span: no run id of its own, its worker is its parent
        spans += [worker, item(A.SPAN_WORKER_FIRST_STEP, start, step, trace, worker["span_id"])]
    recoveries = (  # node, start, cause, detection, phases (name, start, end)
        (NODE_B, "b", 9500, "worker_failure", 500.0,
         ((A.SPAN_AGENT_STOP_WORKERS, 9500, 10000), (A.SPAN_AGENT_RENDEZVOUS, 10000, 12000),
          (A.SPAN_AGENT_ASSIGN_RANKS, 12000, 12100), (A.SPAN_AGENT_START_WORKERS, 12100, 12500))),
        (NODE_A, "a", 10000, "membership_change", None,
         ((A.SPAN_AGENT_STOP_WORKERS, 10000, 10400), (A.SPAN_AGENT_RENDEZVOUS, 10400, 12000),
          (A.SPAN_AGENT_ASSIGN_RANKS, 12000, 12050), (A.SPAN_AGENT_START_WORKERS, 12050, 12300))),
    )  # fmt: skip
    for node, inst, start, cause, detection, phases in recoveries:
        attrs = {A.RUN_ID: "job", A.RECOVERY_CAUSE: cause, A.AGENT_RESTARTS: 1}
        if detection is not None:
            attrs[A.RECOVERY_DETECTION_MS] = detection
        # host and pid on the resource here, as attributes elsewhere: both are read
        rec = item(A.SPAN_AGENT_RECOVERY, start, phases[-1][2], "t1", "", inst, resource=node,
                   **attrs)  # fmt: skip
        spans.append(rec)
        for name, a, b in phases:
            spans.append(item(name, a, b, "t1", rec["span_id"], inst, **{A.RUN_ID: "job"}))
    for node, inst, start in ((NODE_A, "a", 0), (NODE_B, "b", 3000)):
        spans.append(agent(A.SPAN_AGENT_RUN, start, 30500, node, inst, **{A.STATE: "SUCCEEDED"}))
    return spans


def test_the_summary_says_what_each_restart_cost() -> None:
    timeline = build_timeline(two_node_run())
    [run] = timeline.runs
    assert run.run_id == "job"
    assert run.wall_ns == 30500 * MS  # first span start → last span end
    assert run.rendezvous_ns == 5200 * MS  # 0-3.2 s and 10-12 s: a union, not 3.2+0.2+1.6+2
    assert run.workers_ns == 23700 * MS  # 4-10 s and 12.3-30 s
    b, a = run.recoveries  # in order of start
    assert (b.node, b.cause, b.duration_ns, b.detection_ms) == (
        "gpu-b pid 200",
        "worker_failure",
        3000 * MS,
        500.0,
    )
    assert b.phases == [
        ("stop_workers", 500 * MS),
        ("rendezvous", 2000 * MS),
        ("assign_worker_ranks", 100 * MS),
        ("start_workers", 400 * MS),
    ]
    # the latest first step of round 1 (16 s), not round 0's, which ended before the restart
    assert b.resumed_ns == 6500 * MS
    assert (a.node, a.cause, a.detection_ms, a.duration_ns, a.resumed_ns) == (
        "gpu-a pid 100",
        "membership_change",
        None,
        2300 * MS,
        6000 * MS,
    )
    # The two nodes' recoveries are one job restart: from the failure (9 s, before either
    # node noticed) to training resumed (16 s), not 6.5 s + 6 s.
    [restart] = run.restarts
    assert restart.recoveries == [b, a] and restart.round == 1
    assert restart.failure is not None and restart.failure.root is not None
    assert (restart.failure.root.global_rank, restart.failure.root.host) == (1, "gpu-b pid 200")
    assert (restart.start_ns, restart.cost_ns) == (BASE + 9000 * MS, 7000 * MS)
    assert run.lost_ns == 7000 * MS
    assert [(h.round, h.node, h.held_ns) for h in run.hold_ups] == [
        (0, "gpu-b pid 200", 3000 * MS),
        (1, "gpu-a pid 100", 400 * MS),
    ]
    # the recoveries' phases are summarized, not drawn as round 1's node steps
    assert not [s for r in timeline.rounds for n in r.nodes for s in n.steps]

    text = render_text(timeline)
    recovery_b = (
        "worker_failure, 3.000s (noticed 0.5s after the failure): stop_workers 0.500s,"
        " rendezvous 2.000s, assign_worker_ranks 0.100s, start_workers 0.400s; training resumed"
        " after 6.500s"
    )
    recovery_a = (
        "membership_change, 2.300s: stop_workers 0.400s, rendezvous 1.600s,"
        " assign_worker_ranks 0.050s, start_workers 0.250s; training resumed after 6.000s"
    )
    expected = [
        "SUMMARY · run job · wall 30.500s · in rendezvous 5.200s · workers ran 23.700s"
        " · 1 restart cost 7.000s",
        "  at +9.000s in round 0 · 1 failure: global rank 1 on gpu-b pid 200 → restart,"
        " cost 7.000s",
        f"    recovery on gpu-b pid 200 at +9.500s: {recovery_b}",
        f"    recovery on gpu-a pid 100 at +10.000s: {recovery_a}",
        "  round 0: last to join gpu-b pid 200, 3.000s after the node before",
        "  round 1: last to join gpu-a pid 100, 0.400s after the node before",
    ]
    lines = text.splitlines()
    assert lines[2 : 2 + len(expected)] == expected  # right after the heading, before the rounds
    assert text.index("SUMMARY") < text.index("ROUND 0") < text.index("ROUND 1")
    # an export without failure kinds: the ERROR FAILED worker is the root cause
    assert "\n  ROOT CAUSE at +9.000s: global rank 1 on gpu-b pid 200\n" in text

    page = render_html(timeline)
    summary = page[page.index('<section id="run-summary">') : page.index("</section>")]
    for cell in (
        "<td>job</td><td>30.500s</td><td>5.200s</td><td>23.700s</td><td>1</td><td>7.000s</td>",
        '<b class="root-cause">global rank 1 on gpu-b pid 200</b>',
        'restart, cost <b class="cost">7.000s</b>',
        f"<b>gpu-b pid 200</b> at +9.500s: {recovery_b}",
        f"<b>gpu-a pid 100</b> at +10.000s: {recovery_a}",
        "<tr><td>1</td><td>gpu-a pid 100</td><td>0.400s</td></tr>",
    ):
        assert cell in summary


def test_without_recoveries_or_attributes_nothing_crashes() -> None:
    # one node, one round, no restart: no restart or hold-up lines
    spans = [
        agent(A.SPAN_RDZV_JOIN, 0, 1000, NODE_A, "a", **{A.ROUND: 0}),
        item(A.SPAN_WORKER, 1000, 5000, **{A.RUN_ID: "solo", A.STATE: "SUCCEEDED"}),
    ]
    spans[0]["attributes"][A.RUN_ID] = "solo"
    timeline = build_timeline(spans)
    [run] = timeline.runs
    assert (run.recoveries, run.hold_ups, run.lost_ns) == ([], [], 0)
    assert (run.wall_ns, run.rendezvous_ns, run.workers_ns) == (5 * S, 1 * S, 4 * S)
    text = render_text(timeline)
    assert "SUMMARY · run solo · wall 5.000s · in rendezvous 1.000s · workers ran 4.000s\n" in text
    assert "restart" not in text.lower() and "last to join" not in text
    assert "last to join" not in render_html(timeline)

    # no rendezvous.join: the agents' rendezvous steps count instead
    steps = [item(A.SPAN_AGENT_RENDEZVOUS, a, b, **{A.RUN_ID: "r"}) for a, b in ((0, 2), (1, 3))]
    [run] = build_timeline(steps).runs
    assert run.rendezvous_ns == 3 * MS

    # attributes missing everywhere: no host, pid, round, cause, run id, parent
    bare = [
        item(A.SPAN_AGENT_RECOVERY, 0, 10, **{A.RUN_ID: "x"}),
        item(A.SPAN_RDZV_JOIN, 0, 5, **{A.RUN_ID: "x"}),
        item(A.SPAN_RDZV_JOIN, 1, 5, **{A.RUN_ID: "x"}),
        item(A.SPAN_WORKER, 5, 9),
        item(A.SPAN_WORKER_FIRST_STEP, 5, 8, parent="nowhere"),
        item(A.SPAN_AGENT_STOP_WORKERS, 0, 1, parent="nowhere"),
        item("something.else", 0, 20),
    ]
    timeline = build_timeline(bare)
    [run] = timeline.runs
    [rec] = run.recoveries
    assert (rec.node, rec.cause, rec.phases, rec.resumed_ns) == ("?", "unknown", [], None)
    assert [(h.round, h.node) for h in run.hold_ups] == [(None, "?")]
    text = render_text(timeline)
    assert "  at +0.000s · cause unknown → restart, cost 0.010s\n" in text
    assert "    recovery on ? at +0.000s: unknown, 0.010s\n" in text
    assert "<b>?</b> at +0.000s: unknown, 0.010s" in render_html(timeline)
    assert build_timeline([]).runs == []
    assert "no rendezvous" in render_text(build_timeline([]))
    assert "run-summary" in render_html(build_timeline([]))
