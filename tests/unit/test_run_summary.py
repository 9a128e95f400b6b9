"""The timeline's per-run summary: unions of time, each restart's cost, who held a round up."""

from __future__ import annotations

from typing import Any

from elastic_otel.cli.timeline.analysis.items import union_ns
from elastic_otel.cli.timeline.analysis.runs import summarize
from elastic_otel.cli.timeline.render.summary import render_summary
from elastic_otel.names import attributes as A

S = 1_000_000_000


def span(name: str, start: float, end: float, sid: str, parent: str = "", trace: str = "t1",
         instance: str = "", **attrs: Any) -> dict[str, Any]:  # fmt: skip
    return {
        "name": name,
        "start_ns": int(start * S),
        "end_ns": int(end * S),
        "span_id": sid,
        "parent_span_id": parent,
        "trace_id": trace,
        "attributes": {A.RUN_ID: "r", **attrs},
        "resource": {"service.instance.id": instance},
    }


def two_node_run() -> list[dict[str, Any]]:
    node = {"a": {A.HOST_NAME: "h", A.PROCESS_PID: 1}, "b": {A.HOST_NAME: "h", A.PROCESS_PID: 2}}
    spans = [
        span(A.SPAN_RDZV_JOIN, 0, 4, "ja", trace="t0", instance="a", **node["a"], **{A.ROUND: 0}),
        span(A.SPAN_RDZV_JOIN, 3, 4, "jb", trace="t0", instance="b", **node["b"], **{A.ROUND: 0}),
        span(A.SPAN_WORKER, 4, 10, "w0", trace="t0"),
        span(A.SPAN_WORKER, 4, 6, "w1", trace="t0"),  # fails at 6
        span(A.SPAN_RDZV_JOIN, 7, 9, "ka", instance="a", **node["a"], **{A.ROUND: 1}),
        span(A.SPAN_RDZV_JOIN, 7.5, 9, "kb", instance="b", **node["b"], **{A.ROUND: 1}),
        span(
            A.SPAN_AGENT_RECOVERY,
            6.5,
            9.5,
            "rec",
            instance="b",
            **{A.RECOVERY_CAUSE: "worker_failure", A.RECOVERY_DETECTION_MS: 500.0},
        ),
        span(A.SPAN_AGENT_STOP_WORKERS, 6.5, 7, "p1", "rec"),
        span(A.SPAN_AGENT_RENDEZVOUS, 7, 9, "p2", "rec"),
        span(A.SPAN_AGENT_START_WORKERS, 9, 9.5, "p3", "rec"),
        span(A.SPAN_WORKER, 9.5, 20, "w2"),
        span(A.SPAN_WORKER, 9.5, 20, "w3"),
    ]
    first = span(A.SPAN_WORKER_FIRST_STEP, 9.5, 12, "fs", "w2")
    del first["attributes"][A.RUN_ID]  # a training script's span: its run is its worker's
    return [*spans, first]


def test_numbers_a_user_reads() -> None:
    [run] = summarize(two_node_run())
    assert (run.run_id, run.wall_ns) == ("r", 20 * S)
    assert run.rendezvous_ns == 4 * S + 2 * S  # 0-4 and 7-9, not the sum of the four joins
    assert run.workers_ns == 16 * S  # 4-10 and 9.5-20 overlap: 4-20
    [rec] = run.recoveries
    assert (rec.node, rec.cause, rec.duration_ns) == ("h pid 2", "worker_failure", 3 * S)
    assert rec.phases == [
        ("stop_workers", S // 2),
        ("rendezvous", 2 * S),
        ("start_workers", S // 2),
    ]
    assert rec.resumed_ns == int(5.5 * S) and run.lost_ns == int(5.5 * S)
    assert [(h.round, h.node, h.held_ns) for h in run.hold_ups] == [
        (0, "h pid 2", 3 * S),
        (1, "h pid 2", S // 2),
    ]
    text = "\n".join(render_summary([run], lambda ns: f"+{ns / S:.3f}s"))
    assert (
        "wall 20.000s · in rendezvous 6.000s · workers ran 16.000s · 1 restart cost 5.500s" in text
    )
    # a failure restart with no failed worker in sight (these workers have no state)
    assert "  at +6.500s · worker failure → restart, cost 5.500s\n" in text
    assert (
        "    recovery on h pid 2 at +6.500s: worker_failure, 3.000s (noticed 0.5s after the "
        "failure): stop_workers 0.500s, rendezvous 2.000s, start_workers 0.500s; training "
        "resumed after 5.500s" in text
    )
    assert "round 0: last to join h pid 2, 3.000s after the node before" in text


def test_partial_input_does_not_crash() -> None:
    assert summarize([]) == []
    [run] = summarize([span(A.SPAN_AGENT_RECOVERY, 1, 2, "x")])  # no cause, phases, joins
    assert run.recoveries[0].cause == "unknown" and not run.hold_ups
    assert render_summary([run], str)
    assert union_ns([]) == 0
