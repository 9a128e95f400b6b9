"""The trace model's seams: the agent model against a bare ``RoundView``, recovery holding on
its own, and worker states that export as plain text."""

from __future__ import annotations

import json

from torch.distributed.elastic.events import Event, EventSource

from elastic_otel.model.agent import AgentModel
from elastic_otel.model.recovery import RecoveryHold
from elastic_otel.model.spans import LogOut, Output, SpanAttributes, SpanRecord, SpanRef
from elastic_otel.model.trace_ids import TraceIds
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import NodeState, WorkerState
from elastic_otel.parsing.torch_events import ElasticEvent, EventKind, parse_event
from tests.support.helpers import RUN, Node, by_name, feed, worker


class FixedRound:
    """A ``RoundView`` that is not the rendezvous model: one node, in one round."""

    def __init__(self, member: SpanRef | None, rnd: int | None) -> None:
        self.member, self.rnd = member, rnd

    def member_context(self, run_id: str) -> SpanRef | None:
        return self.member

    def joined_round(self, run_id: str) -> int | None:
        return self.rnd

    def node_known(self, run_id: str) -> SpanAttributes:
        return {A.ROUND: self.rnd} if self.rnd is not None else {}


def _event(created: float, payload: object) -> ElasticEvent:
    return parse_event(payload, int(created * 1e9))


def _step(t: float, state: str, phase: str) -> tuple[float, Event]:
    md = {"run_id": RUN, "group_rank": 0, "state": state, "phase": phase}
    return t, Event(f"elastic_otel.agent.{state.lower()}", EventSource.AGENT, 0, md)


def test_agent_model_needs_only_a_round_view() -> None:
    member = SpanRef(trace_id=77, span_id=88)
    model = AgentModel(TraceIds("s"), FixedRound(member, 3))
    launch = model.reserve_workers(RUN, [0])
    assert launch.trace_id == 77
    out = Output()
    t, start = worker(10.0, "START", 0, 0)
    start.metadata["local_rank"] = 0
    model.process(_event(t, start), out)
    model.process(_event(*_step(11.0, "EXIT_BARRIER", "start")), out)
    ((wait),) = list(model.waits())
    assert wait.kind == "exit_barrier" and wait.context[A.ROUND] == 3
    model.process(_event(*worker(12.0, "SUCCEEDED", 0, 0)), out)
    (span,) = by_name(out.spans, A.SPAN_WORKER)
    assert (span.trace_id, span.parent_span_id) == (77, 88)
    assert span.span_id == launch.span_ids[0]  # the id the worker was told (TRACEPARENT)


def test_agent_model_without_a_round_uses_the_restart_count() -> None:
    model = AgentModel(TraceIds("s"), FixedRound(None, None))
    out = Output()
    model.process(_event(*worker(10.0, "START", 0, 2)), out)
    (log,) = out.logs
    assert log.trace_id == TraceIds("s")(RUN, "restart-2") and log.span_id


def test_recovery_hold_keeps_its_phases_and_logs_until_it_ends() -> None:
    hold = RecoveryHold()
    out = Output()
    root = SpanRecord(A.SPAN_AGENT_RECOVERY, 1, {}, trace_id=5)
    start = ElasticEvent(EventKind.AGENT, "start", "start", 1, {A.RECOVERY_CAUSE: "x"})
    hold.start(root, start, failure=None, left=SpanRef(5, 6))
    hold.log(start, root, out)
    phase = SpanRecord(A.SPAN_AGENT_STOP_WORKERS, 2, {}, trace_id=5, parent_span_id=root.span_id)
    hold.finish(phase.end(3), out)
    other = SpanRecord(A.SPAN_WORKER, 2, {}, trace_id=5)
    hold.finish(other.end(3), out)
    assert out.spans == [other] and out.logs == []  # only what is not the recovery's passed
    assert hold.cause == "x" and hold.parent(SpanRef(1, 2)) == root.ref
    end = ElasticEvent(EventKind.AGENT, "end", "end", 4, {})
    hold.end(end, trace=9, out=out)
    assert not hold.active and hold.parent(SpanRef(1, 2)) == SpanRef(1, 2)
    assert out.spans == [other, phase, root]
    assert (root.trace_id, root.parent_span_id, phase.trace_id) == (9, 0, 9)
    assert [(log.event, log.trace_id) for log in out.logs] == [(start, 9), (end, 9)]
    assert root.links[0].span_id == 6


def test_worker_states_export_as_plain_text() -> None:
    n = Node(5)
    model = TraceModel()
    rows = [
        n.attempt(),
        n.joined(0, 0, 1),
        worker(1010, "START", 0, 0),
        worker(1011, "START", 1, 0),
        worker(1012, "FAILED", 1, 0),
        _step(1013, "STOP_WORKERS", "start"),
        _step(1014, "STOP_WORKERS", "end"),
        worker(1020, "START", 0, 1),
        n.attempt(),
        n.joined(1, 0, 1),
        worker(1030, "START", 0, 1),
    ]
    spans, _ = feed(model, rows)
    spans += model.close_all(2_000_000_000_000_000_000, "process exit").spans
    workers = by_name(spans, A.SPAN_WORKER)
    states = [w.attributes[A.STATE] for w in workers]
    assert states == ["FAILED", "STOPPED", "RESTARTED", "UNKNOWN"]
    values = states + [link.attributes[A.STATE] for w in workers for link in w.links]
    assert values and all(type(v) is str for v in values)
    assert json.dumps(values) == json.dumps(["FAILED", "STOPPED", "RESTARTED", "UNKNOWN", "FAILED"])


def test_states_compare_as_the_text_torch_writes() -> None:
    assert WorkerState.FAILED == "FAILED" and "FAILED" in {WorkerState.FAILED}
    assert f"{WorkerState.REPLACED}" == str(WorkerState.REPLACED) == "REPLACED"
    assert NodeState.FAILED == "FAILED" and str(NodeState.RUNNING) == "RUNNING"
    assert all(member.name == member.value for member in WorkerState)


def test_log_out_is_still_a_triple() -> None:
    ev = ElasticEvent(EventKind.GENERIC, "x", "x", 1, {})
    event, trace_id, span_id = LogOut(ev, 2, 3)
    assert (event, trace_id, span_id) == (ev, 2, 3) == LogOut(ev, 2, 3)
