"""One rendezvous round of a large job through the bridge, and what each of its traces weighs.

Each node of an ``N``-node job (8 workers each by default) records its own events in its own
agent process; here each node's events (real torch ``Event`` / ``RdzvEvent`` objects,
serialized by torch, in the order one agent records them, the agent instrumentation's steps
included) go through a bridge conversion of its own (parse → trace model → emitter → SDK
spans), as in that node's agent, with that node's resource. Every span that ends is encoded as
OTLP protobuf at once and only its ids, links and size are kept, so that 4,096 nodes fit in
memory. ``training_spans`` adds, per worker, the spans a training script makes under its
``worker`` span (``examples/train.py``: ``init_process_group``, ``worker.first_step``, and one
per checkpoint save).

A trace's size is what Tempo counts against ``max_bytes_per_trace``: the encoded spans plus one
resource and scope envelope per node that has spans in it.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

NPROC = 8
TRAINING_SPANS = ("init_process_group", "worker.first_step", "save_checkpoint")


@dataclass
class Sized:
    """What came out of a round: per trace, its spans and bytes; per span, ids and links."""

    spans: dict[int, int] = field(default_factory=Counter)  # trace id → spans
    bytes: dict[int, int] = field(default_factory=Counter)  # trace id → encoded bytes
    names: Counter[str] = field(default_factory=Counter)
    # (trace id, span id) → (parent span id, [(trace id, span id) it links to], name)
    graph: dict[tuple[int, int], tuple[int, list[tuple[int, int]], str]] = field(
        default_factory=dict
    )
    envelopes: set[tuple[int, int]] = field(default_factory=set)  # (trace id, node)

    @property
    def total_spans(self) -> int:
        return sum(self.spans.values())

    def largest(self) -> tuple[int, int]:
        """(spans, bytes) of the largest trace by bytes."""
        trace = max(self.bytes, key=lambda t: self.bytes[t])
        return self.spans[trace], self.bytes[trace]

    def reachable_from(self, trace_id: int) -> set[tuple[int, int]]:
        """Spans a trace viewer reaches from the trace ``trace_id``: every span of a trace it
        opens, and the traces their links point at, or that link to them."""
        linked: dict[int, set[int]] = defaultdict(set)
        members: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for key, (_, links, _) in self.graph.items():
            members[key[0]].append(key)
            for target, _ in links:
                linked[key[0]].add(target)
                linked[target].add(key[0])
        todo, seen = [trace_id], {trace_id}
        while todo:
            for nxt in linked[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return {key for trace in seen for key in members[trace]}


def node_events(run_id: str, rank: int, world: int, nproc: int = NPROC) -> list[Any]:
    """Node ``rank``'s events of round 0, as its agent records them with the instrumentation:
    the join, torch's rendezvous steps, the workers started, keep-alives, the workers' ends
    seen by the agent's monitor, the exit barrier, torch's late outcomes, the close."""
    from benchmarks.events import Node
    from elastic_otel.names.torch_names import AGENT_STEP_PREFIX

    node = Node(run_id, f"node-{rank:05d}", 10_000 + rank, group_rank=rank)

    def step(name: str, phase: str, duration_ms: float | None = None) -> Any:
        event = node.agent(name.upper(), duration_ms=duration_ms)
        event.name = AGENT_STEP_PREFIX + name
        event.metadata["phase"] = phase
        return event

    out = node.join(0, rank, world)
    out.append(node.agent("RENDEZVOUS", duration_ms=1033.1))
    out.append(node.agent("ASSIGN_WORKER_RANKS", duration_ms=6.6))
    out.append(step("start_workers", "start"))
    workers = range(rank * nproc, (rank + 1) * nproc)
    for g in workers:
        out.append(node.agent("START", "WORKER", g, str(20_000 + g), world=world, nproc=nproc))
    out.append(step("start_workers", "end", 4.0))
    out.extend(node.keep_alive())
    for g in workers:
        ended = node.agent("SUCCEEDED", "WORKER", g, str(20_000 + g), world=world, nproc=nproc)
        ended.metadata["observed_by"] = "monitor_workers"
        out.append(ended)
    out.append(step("exit_barrier", "start"))
    out.append(step("exit_barrier", "end", 250.0))
    for g in workers:  # torch's own, after the barrier: log records on the ended spans
        out.append(node.agent("SUCCEEDED", "WORKER", g, str(20_000 + g), world=world, nproc=nproc))
    out.append(node.agent("SUCCEEDED"))
    out.extend(node.close())
    return out


def failing_node_events(run_id: str, rank: int, world: int, nproc: int = NPROC) -> list[Any]:
    """Node ``rank``'s round 0 when its first worker fails on its own (a root cause) and the
    agent stops the others, as the instrumented agent reports it; the job then fails."""
    from benchmarks.events import Node, _error_file

    node = Node(run_id, f"node-{rank:05d}", 10_000 + rank, group_rank=rank)
    out = node.join(0, rank, world)
    out.append(node.agent("RENDEZVOUS", duration_ms=1033.1))
    out.append(node.agent("ASSIGN_WORKER_RANKS", duration_ms=6.6))
    workers = range(rank * nproc, (rank + 1) * nproc)
    for g in workers:
        out.append(node.agent("START", "WORKER", g, str(20_000 + g), world=world, nproc=nproc))
    for i, g in enumerate(workers):
        state = "FAILED" if i == 0 else "STOPPED"
        raw = _error_file(f"RuntimeError: injected failure on rank {g}") if i == 0 else None
        ended = node.agent(state, "WORKER", g, str(20_000 + g), raw_error=raw, world=world,
                           nproc=nproc)  # fmt: skip
        ended.metadata["failure.kind"] = "root_cause" if i == 0 else "stopped"
        ended.metadata["observed_by"] = "monitor_workers"
        out.append(ended)
    out.append(node.agent("FAILED"))
    out.extend(node.close())
    return out


def run_round(
    nodes: int,
    round_trace_max_nodes: int,
    nproc: int = NPROC,
    training_spans: bool = False,
    failing: tuple[int, ...] = (),
    run_id: str = "scale-job",
    also: Any = None,
) -> Sized:
    """Every node of one round through a bridge conversion of its own; see the module.
    ``failing``: nodes whose first worker fails; ``also``: a span processor that gets every
    span too (e.g. the OTLP JSON file exporter's)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

    from elastic_otel.bridge.conversion import Conversion
    from elastic_otel.emit.counters import EventCounters
    from elastic_otel.emit.emitter import Emitter
    from elastic_otel.model.trace_model import TraceModel
    from elastic_otel.names import attributes as A

    sized = Sized()
    current = {"node": 0}
    workers: list[tuple[int, int]] = []  # the node's worker spans

    class Sizer(SpanProcessor):
        """Keeps a node's spans, then encodes them in one request (:meth:`flush`)."""

        def __init__(self) -> None:
            self.pending: list[ReadableSpan] = []

        def on_end(self, span: ReadableSpan) -> None:
            self.pending.append(span)
            if also is not None:
                also.on_end(span)

        def flush(self) -> None:
            by_id = {}
            for span in self.pending:
                context = span.get_span_context()
                assert context is not None
                by_id[context.span_id] = span
            self.pending.clear()
            for resource_spans in encode_spans(list(by_id.values())).resource_spans:
                scopes = resource_spans.scope_spans
                resource_part = resource_spans.ByteSize() - sum(ss.ByteSize() + 3 for ss in scopes)
                for scope_spans in scopes:
                    protos = scope_spans.spans
                    scope_part = scope_spans.ByteSize() - sum(p.ByteSize() + 3 for p in protos)
                    for proto in protos:
                        self._count(proto, by_id, resource_part + scope_part + 3)

        def _count(self, proto: Any, by_id: dict[int, ReadableSpan], envelope_size: int) -> None:
            trace = int.from_bytes(proto.trace_id, "big")
            span_id = int.from_bytes(proto.span_id, "big")
            span = by_id[span_id]
            size = proto.ByteSize() + 3  # + its field tag and length
            envelope = (trace, current["node"])
            if envelope not in sized.envelopes:  # one resource and scope per node and trace
                sized.envelopes.add(envelope)
                size += envelope_size
            sized.spans[trace] += 1
            sized.bytes[trace] += size
            sized.names[span.name] += 1
            parent = span.parent.span_id if span.parent is not None else 0
            links = [(link.context.trace_id, link.context.span_id) for link in span.links]
            sized.graph[(trace, span_id)] = (parent, links, span.name)
            if span.name == A.SPAN_WORKER:
                workers.append((trace, span_id))

    sizer = Sizer()
    # What Resource.create() gives every node (its detectors run on a thread pool: ~10 ms a
    # call, most of a 4,096-node round's time), made once; each node adds its own identity.
    base = Resource.create({"service.name": "torchelastic"})
    for rank in range(nodes):
        current["node"] = rank
        workers.clear()
        resource = base.merge(
            Resource(
                {
                    "host.name": f"node-{rank:05d}",
                    "process.pid": 10_000 + rank,
                    "service.instance.id": f"{rank:032x}",
                }
            )
        )
        conversion = Conversion(
            TraceModel(salt="benchmark", round_trace_max_nodes=round_trace_max_nodes),
            Emitter(None, sizer, resource),
            EventCounters(),
        )
        make = failing_node_events if rank in failing else node_events
        clock = 1_800_000_000.0 + rank * 0.001  # nodes join a millisecond apart
        for i, event in enumerate(make(run_id, rank, nodes, nproc)):
            conversion.process(serialized(event), clock + i * 0.01)
        conversion.close("end of the benchmark", error=False)
        sizer.flush()
        if training_spans:
            _training_spans(workers, resource, sizer)
            sizer.flush()
    return sized


def _training_spans(workers: list[tuple[int, int]], resource: Any, sizer: Any) -> None:
    """The training script's spans of the node's workers, under each ``worker`` span (the
    context ``TRACEPARENT`` gives them), from the script's own SDK provider."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

    provider = TracerProvider(resource=resource)
    provider.add_span_processor(sizer)
    tracer = provider.get_tracer("train")
    for trace, span_id in workers:
        parent = NonRecordingSpan(SpanContext(trace, span_id, True, TraceFlags(1)))
        for name in TRAINING_SPANS:
            with tracer.start_as_current_span(name, context=set_span_in_context(parent)):
                pass
    provider.shutdown()


def serialized(event: Any) -> str:
    """``event.serialize()``'s text (torch's ``json.dumps(asdict(event))``) without its deep
    copy, which costs more than the bridge does per event: every field of these events is a
    plain value (``metadata``'s nested ``metadata`` is already JSON text). The test checks the
    two agree."""
    return json.dumps({f.name: getattr(event, f.name) for f in dataclasses.fields(event)})
