"""Worker outcomes when torch's agent sees them, on real torchrun jobs (c10d, gloo, CPU).

torch records a worker's FAILED event only in its final events, and nothing for a failure
followed by a restart; the instrumented agent
(elastic_otel/integration/agent_instrumentation.py) makes the failed rank, its exit code, its
exception and its failure time visible at once, ends the workers it stops as STOPPED with a
link to the failed one, and ends succeeded workers before the exit barrier, which is a span of
its own.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from elastic_otel.integration import agent_instrumentation
from elastic_otel.names import attributes as A
from tests.support.jobs import job_env, run_job, span_attr
from tests.support.otlp_receiver import OtlpReceiver


def _attempt(span: dict) -> int:
    return int(span_attr(span, A.AGENT_RESTARTS) or 0)


@pytest.mark.e2e
def test_failed_worker_before_restart(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    # Rank 1 (agent A, beside rank 0) raises under torch's @record before the process group
    # exists, so its peers wait in init and every run restarts the same way.
    env = job_env(grpc_receiver, tmp_path, TRAIN_FAIL_RANK="1", TRAIN_FAIL_BEFORE_INIT="1")
    results = run_job(env, nproc=2, extra_args=("--max-restarts=1",))
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
    grpc_receiver.wait_for_spans(8, timeout=20, where=lambda s: s["name"] == A.SPAN_WORKER)
    workers = [s for s in grpc_receiver.spans() if s["name"] == A.SPAN_WORKER]
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
    spans = {s["span_id"]: s for s in grpc_receiver.spans()}
    stop_steps = [s for s in spans.values() if s["name"] == A.SPAN_AGENT_STOP_WORKERS]
    assert len(stop_steps) == 2 and all(s["status_code"] == "OK" for s in stop_steps)
    assert all(spans[s["parent_span_id"]]["name"] == A.SPAN_AGENT_RECOVERY for s in stop_steps)

    # the restarted group finished: SUCCEEDED when the agent saw it, before the exit barrier
    last = [w for w in workers if span_attr(w, A.STATE) == "SUCCEEDED"]
    assert len({span_attr(w, A.GLOBAL_RANK) for w in last}) == 4
    barriers = [s for s in grpc_receiver.spans() if s["name"] == A.SPAN_AGENT_EXIT_BARRIER]
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
