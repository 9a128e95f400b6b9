"""Recoveries: what a restart of the worker group cost, phase by phase, and the training code in
the round's trace (agent.recovery spans, worker TRACEPARENT, recovery metrics). The same on a
real restarted job: tests/e2e/test_agent_outcomes.py, whose job it shares."""

from __future__ import annotations

import json
import threading

import pytest
from torch.distributed.elastic.events import Event, EventSource

from elastic_otel.integration.agent_instrumentation import traceparent
from elastic_otel.model.spans import Output
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from elastic_otel.parsing.torch_events import parse_event
from elastic_otel.worker import training
from tests.support.helpers import RUN, Node, by_name

PHASES = {
    A.SPAN_AGENT_STOP_WORKERS,
    A.SPAN_AGENT_RENDEZVOUS,
    A.SPAN_AGENT_ASSIGN_RANKS,
    A.SPAN_AGENT_START_WORKERS,
}


class AgentEvents:
    """Events shaped as torch's ``_construct_event`` and the instrumented agent make them."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.restarts = 0

    def _event(self, name: str, state: str, source: EventSource, **extra: object) -> Event:
        self.node.t += 0.5
        md = {"group_world_size": 2, "entry_point": "python"}
        worker_md = extra.pop("worker_md", None)
        if isinstance(worker_md, dict):
            md.update(worker_md)
        metadata = {
            "run_id": RUN,
            "global_rank": extra.pop("global_rank", None),
            "group_rank": 0,
            "role": "default",
            "hostname": self.node.host,
            "state": state,
            "rdzv_backend": "c10d",
            "metadata": json.dumps(md),
            "agent_restarts": self.restarts,
            **extra,
        }
        return Event(name, source, int(self.node.t * 1000), metadata)

    def torch_step(self, state: str, duration_ms: float) -> tuple[float, Event]:
        e = self._event(f"torchelastic.worker.status.{state}", state, EventSource.AGENT)
        e.metadata["duration_ms"] = duration_ms
        return self.node.t, e

    def step(self, step: str, phase: str, **facts: object) -> tuple[float, Event]:
        e = self._event(f"elastic_otel.agent.{step}", step.upper(), EventSource.AGENT)
        e.metadata.update(phase=phase, **facts)
        return self.node.t, e

    def worker(self, state: str, rank: int, **extra: object) -> tuple[float, Event]:
        md = {"local_rank": [0], "role_rank": [rank], "role_world_size": [2]}
        name = f"torchelastic.worker.status.{state}"
        return self.node.t, self._event(
            name, state, EventSource.WORKER, global_rank=rank, worker_md=md, **extra
        )


def feed(model: TraceModel, item: tuple[float, object]) -> Output:
    created, payload = item
    data = payload.serialize() if hasattr(payload, "serialize") else payload
    return model.process(parse_event(data, int(created * 1e9)))


def run_until_restart(model: TraceModel, node: Node, agent: AgentEvents) -> list[Output]:
    """Round 0 on one node, its worker fails, the agent starts a recovery and stops it."""
    outs = [feed(model, e) for e in (node.attempt(), node.participant(0), node.joined(0, 0, 2))]
    outs.append(feed(model, agent.torch_step("RENDEZVOUS", 400)))
    outs.append(feed(model, agent.torch_step("ASSIGN_WORKER_RANKS", 10)))
    outs.append(feed(model, agent.step("start_workers", "start")))
    model.reserve_workers(RUN, [0])
    outs.append(feed(model, agent.step("start_workers", "end", duration_ms=5.0)))
    outs.append(feed(model, agent.worker("START", 0)))
    failed = agent.worker("FAILED", 0, observed_by="monitor_workers", raw_error='{"message": "x"}')
    outs.append(feed(model, failed))
    agent.restarts = 1
    cause = {"recovery.cause": A.CAUSE_WORKER_FAILURE, "recovery.detection_ms": 300.0}
    outs.append(feed(model, agent.step("restart_workers", "start", **cause)))
    outs.append(feed(model, agent.step("stop_workers", "start")))
    outs.append(feed(model, agent.step("stop_workers", "end", duration_ms=100.0)))
    return outs


def test_recovery_waits_for_its_round_then_holds_its_phases() -> None:
    model, node = TraceModel(salt="s"), Node(1)
    agent = AgentEvents(node)
    early = run_until_restart(model, node, agent)
    first_worker = by_name(early[-4].spans, A.SPAN_WORKER)[0]
    released_early = [s.name for out in early[-3:] for s in out.spans]
    assert A.SPAN_AGENT_STOP_WORKERS not in released_early  # held: its round is not known

    rest = [feed(model, e) for e in (node.attempt(), node.participant(1), node.joined(1, 0, 2))]
    rest.append(feed(model, agent.torch_step("RENDEZVOUS", 600)))
    rest.append(feed(model, agent.torch_step("ASSIGN_WORKER_RANKS", 10)))
    rest.append(feed(model, agent.step("start_workers", "start")))
    launch = model.reserve_workers(RUN, [0])
    rest.append(feed(model, agent.step("start_workers", "end", duration_ms=5.0)))
    rest.append(feed(model, agent.worker("START", 0)))
    assert not any(s.name == A.SPAN_AGENT_RECOVERY for out in rest for s in out.spans)
    end = feed(model, agent.step("restart_workers", "end", duration_ms=3000.0))

    member = next(s for s in model.open_spans() if s.name == A.SPAN_RDZV_MEMBER)
    [recovery] = by_name(end.spans, A.SPAN_AGENT_RECOVERY)
    assert recovery.trace_id == member.trace_id != first_worker.trace_id  # the new round's
    assert recovery.parent_span_id == 0
    assert recovery.attributes[A.RECOVERY_CAUSE] == A.CAUSE_WORKER_FAILURE
    assert recovery.attributes[A.RECOVERY_DETECTION_MS] == 300.0
    assert (first_worker.trace_id, first_worker.span_id) in {
        (link.trace_id, link.span_id) for link in recovery.links
    }
    phases = [s for s in end.spans if s.parent_span_id == recovery.span_id]
    assert sorted(s.name for s in phases) == sorted(PHASES)
    assert all(s.trace_id == recovery.trace_id for s in phases)
    assert all(recovery.start_ns <= s.start_ns <= s.end_ns <= recovery.end_ns for s in phases)
    # the log records of the phases were held too, and carry the round's trace
    phase_ids = {s.span_id for s in phases} | {recovery.span_id}
    held_logs = [(t, sp) for _, t, sp in end.logs if sp in phase_ids]
    assert (
        len(held_logs) == 8
    )  # restart and stop_workers start + end, rendezvous, assign, start_workers start + end
    assert {t for t, _ in held_logs} == {recovery.trace_id}

    # the workers it started have the span ids the agent gave them (TRACEPARENT)
    [started] = [s for s in model.open_spans() if s.name == A.SPAN_WORKER]
    assert launch.trace_id == recovery.trace_id
    assert launch.span_ids == {0: started.span_id}
    assert launch.recovery_cause == A.CAUSE_WORKER_FAILURE
    assert launch.recovery_start_ns == recovery.start_ns


def test_exit_during_a_recovery_ends_it_with_its_phases() -> None:
    model, node = TraceModel(salt="s"), Node(1)
    run_until_restart(model, node, AgentEvents(node))
    out = model.terminate(int(node.t * 1e9) + 1, "process terminated (SIGTERM)")
    [recovery] = by_name(out.spans, A.SPAN_AGENT_RECOVERY)
    assert recovery.status == "ERROR"
    assert recovery.attributes[A.END_REASON] == "process terminated (SIGTERM)"
    assert [s.name for s in out.spans if s.parent_span_id == recovery.span_id] == [
        A.SPAN_AGENT_STOP_WORKERS
    ]
    assert not list(model.open_spans()) or all(
        s.name != A.SPAN_AGENT_RECOVERY for s in model.open_spans()
    )


def test_membership_change_is_not_linked_to_a_failure() -> None:
    model, node = TraceModel(salt="s"), Node(1)
    agent = AgentEvents(node)
    for e in (node.attempt(), node.participant(0), node.joined(0, 0, 2)):
        feed(model, e)
    feed(model, agent.worker("START", 0))
    feed(model, agent.step("restart_workers", "start", **{"recovery.cause": "membership_change"}))
    for e in (node.attempt(), node.participant(1), node.joined(1, 0, 3)):
        feed(model, e)
    feed(model, agent.worker("START", 0))
    end = feed(model, agent.step("restart_workers", "end", duration_ms=1500.0))
    [recovery] = by_name(end.spans, A.SPAN_AGENT_RECOVERY)
    assert recovery.attributes[A.RECOVERY_CAUSE] == A.CAUSE_MEMBERSHIP_CHANGE
    [link] = recovery.links  # to the round it left, not to a worker
    assert link.trace_id != recovery.trace_id and A.STATE not in link.attributes


# --- the training script's side ---------------------------------------------------------------


def test_worker_context_reads_traceparent() -> None:
    from opentelemetry import trace

    value = traceparent(0xABC, 0x123)
    span = trace.get_current_span(training.worker_context({env.TRACEPARENT: value}))
    ctx = span.get_span_context()
    assert (ctx.trace_id, ctx.span_id, ctx.is_remote, ctx.trace_flags.sampled) == (
        0xABC,
        0x123,
        True,
        True,
    )
    for bad in ({}, {env.TRACEPARENT: "00-zz-1-01"}, {env.TRACEPARENT: ""}):
        assert not trace.get_current_span(training.worker_context(bad)).get_span_context().is_valid


@pytest.fixture
def sdk() -> tuple:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    return tracer_provider, MeterProvider(metric_readers=[reader]), spans, reader


def points(reader: object) -> dict[str, list]:
    data = reader.get_metrics_data()  # type: ignore[attr-defined]
    out: dict[str, list] = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def test_first_step_after_a_recovery(sdk: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    tracer_provider, meter_provider, spans, reader = sdk
    monkeypatch.setattr(training, "_first_step", threading.Event())
    monkeypatch.setenv(env.TRACEPARENT, traceparent(0xABC, 0x123))
    monkeypatch.setenv(env.ELASTIC_OTEL_WORKER_START_UNIX_NANO, str(1_000_000_000_000))
    monkeypatch.setenv(env.ELASTIC_OTEL_RECOVERY_CAUSE, A.CAUSE_WORKER_FAILURE)
    monkeypatch.setenv(env.ELASTIC_OTEL_RECOVERY_START_UNIX_NANO, str(999_000_000_000))
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert training.mark_first_step(tracer_provider, meter_provider)
    assert not training.mark_first_step(tracer_provider, meter_provider)  # once per process

    [span] = spans.get_finished_spans()
    assert span.name == A.SPAN_WORKER_FIRST_STEP
    assert (span.context.trace_id, span.parent.span_id) == (0xABC, 0x123)
    assert span.start_time == 1_000_000_000_000
    got = points(reader)
    [total] = got[A.METRIC_RECOVERY_DURATION]
    assert total.attributes == {
        A.RECOVERY_CAUSE: A.CAUSE_WORKER_FAILURE,
        A.RECOVERY_UNTIL: A.UNTIL_FIRST_STEP,
    }
    [phase] = got[A.METRIC_RECOVERY_PHASE_DURATION]
    assert phase.attributes[A.RECOVERY_PHASE] == "first_step"
    assert total.sum - phase.sum == pytest.approx(1.0)  # the recovery began 1 s before it
    [exemplar] = total.exemplars
    assert exemplar.trace_id == 0xABC and exemplar.span_id == span.context.span_id


def test_first_step_without_a_recovery_is_only_a_span(
    sdk: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracer_provider, meter_provider, spans, reader = sdk
    monkeypatch.setattr(training, "_first_step", threading.Event())
    for name in (env.TRACEPARENT, env.ELASTIC_OTEL_RECOVERY_CAUSE):
        monkeypatch.delenv(name, raising=False)
    assert training.mark_first_step(tracer_provider, meter_provider)
    [span] = spans.get_finished_spans()
    assert span.parent is None and A.RECOVERY_CAUSE not in (span.attributes or {})
    assert not points(reader)
