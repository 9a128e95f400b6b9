"""Trace layout at scale (issue 21): a large round's traces fit Tempo's and Jaeger's default
limits, lose no span, and reach every span from the round's trace; a small job keeps one
trace per round; the timeline reads both layouts the same.

Each node's events are real torch ``Event`` / ``RdzvEvent`` objects, shaped as torch 2.13 and
the agent instrumentation record them, through a bridge conversion of the node's own (parse →
trace model → emitter → SDK spans, with the node's resource), encoded as OTLP protobuf
(``benchmarks/rounds.py``; ``python -m benchmarks.run`` prints the same sizes).
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from benchmarks.rounds import NPROC, node_events, run_round, serialized
from benchmarks.trace_sizes import JAEGER_MAX_SPANS, RUN_ID, SALT, TEMPO_MAX_BYTES_PER_TRACE
from elastic_otel.cli.otlp_json_reader import read_otlp_json
from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.render.text import render_text
from elastic_otel.emit.otlp_json import OtlpJsonFileSpanExporter
from elastic_otel.model.trace_ids import trace_id_for
from elastic_otel.names import attributes as A
from elastic_otel.names.environment_variables import DEFAULT_ROUND_TRACE_MAX_NODES


def round_trace() -> int:
    return trace_id_for(SALT, RUN_ID, 0)


def test_the_events_are_torchs_own_serialization() -> None:
    for event in node_events(RUN_ID, 7, 4096):
        assert serialized(event) == event.serialize()


def test_a_small_job_is_one_trace_per_round() -> None:
    sized = run_round(2, DEFAULT_ROUND_TRACE_MAX_NODES, failing=(1,))
    assert set(sized.spans) == {round_trace()}
    assert sized.names[A.SPAN_WORKER] == 2 * NPROC
    assert sized.names[A.SPAN_WORKER_FAILURE] == 0  # the failed worker is in the round already
    member_parents = [p for p, _, name in sized.graph.values() if name == A.SPAN_RDZV_MEMBER]
    assert all(member_parents)  # under the join, as before


NODES = 4096
"""The round the claim is about (README: 4,096 nodes x 8 workers)."""
MEASURED = (160, 192, 224)
"""Rounds run in full, in equal steps, all past ``DEFAULT_ROUND_TRACE_MAX_NODES`` (128): a
round of 4,096 nodes costs ~17 CPU-seconds (``python -m benchmarks.run`` measures it)."""


def test_a_4096_node_round_fits_the_backends_and_loses_no_span() -> None:
    """Rounds of 160, 192 and 224 nodes run in full; 4,096 follows from how they grow. A node's
    trace holds that node's spans only: it does not grow with the round. The round's trace
    holds one join per node and the failure: it grows by the same bytes for every node added
    (checked over two steps; a node's join differs from another's only in values of the same
    encoded width, as ranks and pids are from 128 to 16,383), so 4,096 nodes weigh what 224
    do plus 3,872 joins. Measured in full at 4,096: 4,097 spans and 2,728,305 bytes."""
    one, failed = run_round(1, 0).names, run_round(1, 0, failing=(0,)).names
    rounds = [run_round(n, DEFAULT_ROUND_TRACE_MAX_NODES, failing=(150,)) for n in MEASURED]
    node_traces = []
    for nodes, sized in zip(MEASURED, rounds, strict=True):
        for trace, spans in sized.spans.items():
            assert spans <= JAEGER_MAX_SPANS, (hex(trace), spans)
            assert sized.bytes[trace] <= TEMPO_MAX_BYTES_PER_TRACE, (hex(trace), sized.bytes[trace])
        # every span of every node came out: the shape of a node times the nodes
        expected = {name: one[name] * (nodes - 1) + failed[name] for name in one | failed}
        expected[A.SPAN_WORKER_FAILURE] = 1
        assert {name: n for name, n in sized.names.items() if n} == expected
        assert len(sized.graph) == sized.total_spans  # no span id twice
        # the round's trace: one join per node, the failure; everything else one link away
        assert sized.spans[round_trace()] == nodes + 1
        reachable = sized.reachable_from(round_trace())
        assert reachable == set(sized.graph)
        assert len(sized.spans) == nodes + 1  # the round's trace and one per node
        others = [t for t in sized.spans if t != round_trace()]
        node_traces.append(
            (
                sorted(set(sized.spans[t] for t in others)),
                max(sized.bytes[t] for t in others),
            )
        )
    # a node's trace: the same spans whatever the round's size, and bytes within a few varints
    (spans_counts, largest), *rest = node_traces
    assert all(counts == spans_counts for counts, _ in rest), node_traces
    assert all(abs(size - largest) <= 64 for _, size in rest), node_traces
    assert max(spans_counts) <= JAEGER_MAX_SPANS and largest + 64 <= TEMPO_MAX_BYTES_PER_TRACE
    # the round's trace: linear in the nodes, so 4,096 nodes are within both limits too
    sizes = [sized.bytes[round_trace()] for sized in rounds]
    step = MEASURED[1] - MEASURED[0]
    assert MEASURED[2] - MEASURED[1] == step
    per_node = (sizes[1] - sizes[0]) / step
    assert sizes[2] - sizes[1] == sizes[1] - sizes[0], sizes  # the same bytes per node added
    assert NODES + 1 <= JAEGER_MAX_SPANS
    at_4096 = sizes[2] + (NODES - MEASURED[2]) * per_node
    assert 2_700_000 < at_4096 <= TEMPO_MAX_BYTES_PER_TRACE, at_4096


def test_links_go_both_ways_between_the_round_and_a_node() -> None:
    sized = run_round(3, 2, failing=(2,))
    joins = {k: v for k, v in sized.graph.items() if v[2] == A.SPAN_RDZV_JOIN}
    members = {k: v for k, v in sized.graph.items() if v[2] == A.SPAN_RDZV_MEMBER}
    assert {trace for trace, _ in joins} == {round_trace()}
    for key, (parent, links, _) in members.items():
        assert key[0] != round_trace() and parent == 0  # the root of the node's own trace
        (join,) = [link for link in links if link in joins]
        assert key in joins[join][1]  # and the join links to it
    (failure,) = [(k, v) for k, v in sized.graph.items() if v[2] == A.SPAN_WORKER_FAILURE]
    (key, (parent, links, _)) = failure
    assert key[0] == round_trace() and (round_trace(), parent) in joins
    (worker,) = links
    assert sized.graph[worker][2] == A.SPAN_WORKER and worker[0] != round_trace()


def test_the_timeline_shows_both_layouts_alike(tmp_path: Path) -> None:
    nodes, texts = 3, []
    for limit in (0, nodes - 1):  # one trace for the round; a trace per node
        path = tmp_path / f"limit{limit}.jsonl"
        exporter = OtlpJsonFileSpanExporter(path)
        run_round(nodes, limit, failing=(1,), also=SimpleSpanProcessor(exporter))
        exporter.shutdown()
        spans, logs = read_otlp_json(path)
        texts.append(render_text(build_timeline(spans, logs)))
    one, per_node = texts
    assert per_node == one
    assert "ROOT CAUSE" in one and "global rank 8" in one
