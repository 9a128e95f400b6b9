"""Worker outcomes when torch's agent sees them, on real torchrun jobs (c10d, gloo, CPU).

torch records a worker's FAILED event only in its final events, and nothing for a failure
followed by a restart; the instrumented agent
(elastic_otel/integration/agent_instrumentation.py) makes the failed rank, its exit code, its
exception and its failure time visible at once, ends the workers it stops as STOPPED with a
link to the failed one, and ends succeeded workers before the exit barrier, which is a span of
its own. The restart's recovery is a span too, phase by phase, in the round its workers run in,
with the training script's spans and the recovery metrics (one job for both:
:func:`restarted`).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import pytest

from elastic_otel.integration import agent_instrumentation
from elastic_otel.names import attributes as A
from tests.support.jobs import job_env, run_job, span_attr
from tests.support.otlp_receiver import OtlpReceiver

PHASES = {
    A.SPAN_AGENT_STOP_WORKERS,
    A.SPAN_AGENT_RENDEZVOUS,
    A.SPAN_AGENT_ASSIGN_RANKS,
    A.SPAN_AGENT_START_WORKERS,
}


def _attempt(span: dict) -> int:
    return int(span_attr(span, A.AGENT_RESTARTS) or 0)


@dataclass
class Restarted:
    """What a restarted job exported: its spans and metric points."""

    spans: list[dict]
    metrics: list[dict]


def _recovery_points(metrics: list[dict]) -> list[dict] | None:
    """The recovery metrics, once both agents measured their recovery and a worker its first
    step."""
    got = [m for m in metrics if m["name"].startswith("torchelastic.recovery")]
    agents = {
        m["resource"]["service.instance.id"]
        for m in got
        if m["attributes"].get(A.RECOVERY_UNTIL) == A.UNTIL_WORKERS_STARTED
    }
    untils = {m["attributes"].get(A.RECOVERY_UNTIL) for m in got}
    return got if len(agents) == 2 and A.UNTIL_FIRST_STEP in untils else None


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> Restarted:
    """Two nodes, two workers each: rank 1 (beside rank 0) raises under torch's ``@record``
    before the process group exists, so that its peers wait in init and every run restarts the
    same way; one restart, then the job succeeds."""
    tmp_path = tmp_path_factory.mktemp("restarted")
    with OtlpReceiver("grpc") as receiver:
        env = job_env(receiver, tmp_path, TRAIN_FAIL_RANK="1", TRAIN_FAIL_BEFORE_INIT="1")
        results = run_job(env, nproc=2, extra_args=("--max-restarts=1",))
        assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
        for name, n in (
            (A.SPAN_WORKER, 8),
            (A.SPAN_AGENT_RECOVERY, 2),
            (A.SPAN_WORKER_FIRST_STEP, 4),
        ):
            receiver.wait_for_spans(n, timeout=20, where=lambda s, name=name: s["name"] == name)
        receiver.wait_until(lambda: _recovery_points(receiver.metrics()), timeout=20)
        return Restarted(receiver.spans(), receiver.metrics())


@pytest.mark.e2e
def test_failed_worker_before_restart(restarted: Restarted) -> None:
    workers = [s for s in restarted.spans if s["name"] == A.SPAN_WORKER]
    # one span per rank and round: torch's later events did not make second ones
    per_round = Counter((span_attr(w, A.GLOBAL_RANK), w["trace_id"]) for w in workers)
    assert all(n == 1 for n in per_round.values()), per_round
    failed_round = next(
        w["trace_id"] for w in workers if span_attr(w, A.GLOBAL_RANK) == 1 and _attempt(w) == 0
    )
    first = {span_attr(w, A.GLOBAL_RANK): w for w in workers if w["trace_id"] == failed_round}
    assert sorted(first) == [0, 1, 2, 3]
    failed = first[1]
    assert span_attr(failed, A.STATE) == "FAILED"
    assert failed["status_code"] == "ERROR"
    assert span_attr(failed, A.EXIT_CODE) == span_attr(failed, A.PROCESS_EXIT_CODE) == 1
    assert span_attr(failed, A.ERROR_TYPE) == "RuntimeError"
    assert span_attr(failed, A.FAILURE_KIND) == "root_cause"
    assert span_attr(failed, A.OBSERVED_BY) == "monitor_workers"
    (exc,) = [e for e in failed["events"] if e["name"] == "exception"]
    assert exc["attributes"][A.EXCEPTION_TYPE] == "RuntimeError"
    assert "injected failure on rank 1" in exc["attributes"][A.EXCEPTION_MESSAGE]
    assert "_fail_once" in exc["attributes"][A.EXCEPTION_STACKTRACE]

    # its neighbour on the same agent was stopped because of it, and links to it
    (stopped,) = [w for w in workers if span_attr(w, A.GLOBAL_RANK) == 0 and _attempt(w) == 0]
    assert span_attr(stopped, A.STATE) == "STOPPED"
    assert "global rank 1 failed" in span_attr(stopped, A.END_REASON)
    assert [lk["span_id"] for lk in stopped["links"]] == [failed["span_id"]]
    assert failed["end_ns"] <= stopped["end_ns"]
    # the other node's workers died of the failure (the peers they waited for were gone) or
    # were stopped for the new round (its agent restarts for a membership change, without
    # using a restart): either way with what their agent saw, never torch's REPLACED guess
    # (which of the two depends on timing: on a loaded machine the agent's restart comes first),
    # and never as an error of their own
    for rank in (2, 3):
        state, observed = span_attr(first[rank], A.STATE), span_attr(first[rank], A.OBSERVED_BY)
        if observed is None:  # ended by its agent's stop phase, not by its monitor
            assert state == "STOPPED"
            assert span_attr(first[rank], A.END_REASON) == "stopped by the agent"
        else:
            assert state in ("PEER_FAILED", "STOPPED") and observed == "monitor_workers"
        assert first[rank]["status_code"] != "ERROR"
    # stopping them is the first phase of each agent's recovery (in the next round's trace)
    spans = {s["span_id"]: s for s in restarted.spans}
    stop_steps = [s for s in spans.values() if s["name"] == A.SPAN_AGENT_STOP_WORKERS]
    assert len(stop_steps) == 2 and all(s["status_code"] == "OK" for s in stop_steps)
    assert all(spans[s["parent_span_id"]]["name"] == A.SPAN_AGENT_RECOVERY for s in stop_steps)

    # the restarted group finished: SUCCEEDED when the agent saw it, before the exit barrier
    last = [w for w in workers if span_attr(w, A.STATE) == "SUCCEEDED"]
    assert len({span_attr(w, A.GLOBAL_RANK) for w in last}) == 4
    barriers = [s for s in restarted.spans if s["name"] == A.SPAN_AGENT_EXIT_BARRIER]
    assert len(barriers) == 2, [b["attributes"] for b in barriers]
    for barrier in barriers:
        mine = [
            w
            for w in last
            if w["trace_id"] == barrier["trace_id"]
            and span_attr(w, A.RANK) == span_attr(barrier, A.RANK)
        ]
        assert mine and all(w["end_ns"] <= barrier["start_ns"] for w in mine)
        assert all(span_attr(w, A.OBSERVED_BY) == "monitor_workers" for w in mine)


def duration(span: dict) -> float:
    return (span["end_ns"] - span["start_ns"]) / 1e9


def latest(points: list[dict]) -> list[dict]:
    """The last export of each cumulative series (per process, name and attributes)."""
    last: dict[tuple, dict] = {}
    for p in points:
        process = p["resource"]["service.instance.id"]
        key = (process, p["name"], tuple(sorted(p["attributes"].items())))
        if key not in last or p["time_ns"] >= last[key]["time_ns"]:
            last[key] = p
    return list(last.values())


@pytest.mark.e2e
def test_restart_recovery_and_training_spans_over_otlp(restarted: Restarted) -> None:
    spans, metrics = restarted.spans, restarted.metrics
    by_id = {s["span_id"]: s for s in spans}
    recoveries = [s for s in spans if s["name"] == A.SPAN_AGENT_RECOVERY]
    assert len(recoveries) == 2, [(s["name"], s["attributes"]) for s in recoveries]
    causes = {span_attr(r, A.RECOVERY_CAUSE) for r in recoveries}
    # the failed rank's node restarts for the failure; the other for the re-join, or for its own
    # workers, which died of the failure
    assert A.CAUSE_WORKER_FAILURE in causes
    assert causes <= {A.CAUSE_WORKER_FAILURE, A.CAUSE_MEMBERSHIP_CHANGE}

    def node(span: dict) -> str:  # the agent process that exported the span
        return span["resource"]["service.instance.id"]

    workers = [s for s in spans if s["name"] == A.SPAN_WORKER]
    assert len({node(r) for r in recoveries}) == 2, "one recovery per node"
    for recovery in recoveries:
        phases = [s for s in spans if s["parent_span_id"] == recovery["span_id"]]
        assert sorted(p["name"] for p in phases) == sorted(PHASES)
        assert {p["trace_id"] for p in phases} == {recovery["trace_id"]}
        total, parts = duration(recovery), sum(duration(p) for p in phases)
        # the phases add up to the recovery, but for the agent's own bookkeeping between them
        assert total - max(0.1, 0.05 * total) <= parts <= total + 0.005, (total, parts)
        # it is in the trace of the round the workers it started run in
        mine = [
            w
            for w in workers
            if node(w) == node(recovery) and w["start_ns"] >= recovery["start_ns"]
        ]
        assert len(mine) == 2 and {w["trace_id"] for w in mine} == {recovery["trace_id"]}
    # the failed rank's node: its recovery links to the failure
    failed = next(
        w for w in workers if span_attr(w, A.STATE) == "FAILED" and span_attr(w, A.GLOBAL_RANK) == 1
    )
    (recovery,) = [r for r in recoveries if node(r) == node(failed)]
    assert span_attr(recovery, A.RECOVERY_CAUSE) == A.CAUSE_WORKER_FAILURE
    linked = {(link["trace_id"], link["span_id"]) for link in recovery["links"]}
    assert (failed["trace_id"], failed["span_id"]) in linked

    # the training script's spans are children of its own rank's worker span
    own = [s for s in spans if s["name"] in ("init_process_group", A.SPAN_WORKER_FIRST_STEP)]
    assert {s["name"] for s in own} == {"init_process_group", A.SPAN_WORKER_FIRST_STEP}
    for span in own:
        parent = by_id[span["parent_span_id"]]
        assert parent["name"] == A.SPAN_WORKER and parent["trace_id"] == span["trace_id"]
        assert span_attr(parent, A.GLOBAL_RANK) == span["resource"][A.GLOBAL_RANK]
    first_steps = [s for s in own if s["name"] == A.SPAN_WORKER_FIRST_STEP]
    ranks = sorted(by_id[s["parent_span_id"]]["attributes"][A.GLOBAL_RANK] for s in first_steps)
    assert ranks == [0, 1, 2, 3]  # each rank of the restarted group, once

    # the metrics, with exemplars pointing at the recoveries' traces
    exported = _recovery_points(metrics)
    assert exported is not None
    got = latest(exported)
    totals = [m for m in got if m["name"] == A.METRIC_RECOVERY_DURATION]
    agent_side = [m for m in totals if m["attributes"][A.RECOVERY_UNTIL] == A.UNTIL_WORKERS_STARTED]
    assert sum(m["count"] for m in agent_side) == 2
    assert {m["attributes"][A.RECOVERY_CAUSE] for m in agent_side} == causes
    assert sum(m["sum"] for m in agent_side) == pytest.approx(
        sum(duration(r) for r in recoveries), rel=0.01
    )
    # (an exemplar is exported once, with the collection after its measurement)
    exemplar_traces = {
        e["trace_id"]
        for m in exported
        if m["attributes"].get(A.RECOVERY_UNTIL) == A.UNTIL_WORKERS_STARTED
        for e in m["exemplars"]
    }
    assert exemplar_traces == {r["trace_id"] for r in recoveries}
    phases = {
        m["attributes"][A.RECOVERY_PHASE]
        for m in got
        if m["name"] == A.METRIC_RECOVERY_PHASE_DURATION
    }
    assert phases == {
        "stop_workers",
        "rendezvous",
        "assign_worker_ranks",
        "start_workers",
        "first_step",
    }


# --- the instrumentation itself, on torch's real agent classes ----------------------------------


def _agent_methods() -> list[object]:
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import PContext

    return [
        LocalElasticAgent.__dict__["_monitor_workers"],
        LocalElasticAgent.__dict__["_stop_workers"],
        LocalElasticAgent.__dict__["_start_workers"],
        LocalElasticAgent.__dict__["_setup_local_watchdog"],
        SimpleElasticAgent.__dict__["_exit_barrier"],
        SimpleElasticAgent.__dict__["_restart_workers"],
        PContext.__dict__["close"],
    ]


def _instrumentation() -> agent_instrumentation.AgentInstrumentation:
    """A new instrumentation, with torch's methods put back first (a registration in this
    process may have wrapped them)."""
    installed = agent_instrumentation.AgentInstrumentation.installed()
    if installed is not None:
        installed.uninstrument()
    return agent_instrumentation.AgentInstrumentation()


def test_instrument_wraps_and_unregister_unwraps() -> None:
    agent = _instrumentation()
    originals = _agent_methods()
    try:
        assert agent.instrument()
        wrapped = _agent_methods()
        assert all(w is not o for w, o in zip(wrapped, originals, strict=True))
        assert [w.__name__ for w in wrapped] == [o.__name__ for o in originals]  # type: ignore[attr-defined]
        assert agent.instrument()  # idempotent: not wrapped twice
        assert _agent_methods() == wrapped
    finally:
        agent.uninstrument()
    assert _agent_methods() == originals


def test_other_torch_internals_fall_back_with_one_debug_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    agent = _instrumentation()
    originals = _agent_methods()[:2]
    monkeypatch.delattr(SimpleElasticAgent, "_exit_barrier")
    with caplog.at_level(logging.DEBUG, logger="elastic_otel"):
        assert not agent.instrument()
    assert [r.getMessage() for r in caplog.records if r.name == "elastic_otel"] == [
        "elastic-otel: agent not instrumented: SimpleElasticAgent._exit_barrier not found"
    ]
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    # nothing half-wrapped: the bridge falls back to torch's own events
    assert LocalElasticAgent.__dict__["_monitor_workers"] is originals[0]
    assert LocalElasticAgent.__dict__["_stop_workers"] is originals[1]
    assert not agent.instrumented


def test_untested_torch_versions_are_left_alone_unless_asked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    agent = _instrumentation()
    originals = _agent_methods()
    monkeypatch.setattr(torch, "__version__", "2.12.0")
    with caplog.at_level(logging.DEBUG, logger="elastic_otel"):
        assert not agent.instrument()
    assert _agent_methods() == originals
    assert "torch 2.12 is not a version it was tested with" in caplog.text
    try:
        assert agent.instrument(force=True)  # ELASTIC_OTEL_AGENT_INSTRUMENTATION
        assert _agent_methods() != originals
    finally:
        agent.uninstrument()


@pytest.mark.e2e
def test_a_job_that_succeeds_after_a_restart_still_succeeded(restarted: Restarted) -> None:
    """Issue 36: the run's outcome is what happened; this one's last attempt succeeded."""
    runs = [s for s in restarted.spans if s["name"] == A.SPAN_AGENT_RUN]
    assert len(runs) == 2, runs
    for run in runs:
        assert run["status_code"] == "OK" and span_attr(run, A.STATE) == "SUCCEEDED", run
        assert span_attr(run, A.PROCESS_EXIT_CODE) == 0
        assert span_attr(run, A.TORCH_STATE) is None
