"""Stall reports from the trace model, on events captured from a real torchrun job.

The model needs neither torch nor an SDK: the first four events of the capture are a node
joining round 0 and waiting for the second node (which arrives 1 s later in the real job;
here the clock is moved on instead).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from elastic_otel.model.logs import to_log
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import ElasticEvent, parse_event
from tests.support.fixtures import captured_events
from tests.support.jobs import job_env, start_agent
from tests.support.otlp_receiver import OtlpReceiver, free_port

S = 1_000_000_000


def _events(name: str = "restart_node0.tsv") -> list[ElasticEvent]:
    return [parse_event(payload, int(created * 1e9)) for created, payload in captured_events(name)]


def test_a_join_that_waits_is_reported_at_the_interval_while_it_lasts() -> None:
    events = _events()
    model = TraceModel(salt="job", stall_after_s=60)
    for event in events[:4]:  # attempts to join, added to participants, keep-alive, synced
        model.process(event)
    start = events[0].time_ns
    assert model.tick(start + 59 * S).logs == []
    assert model.stall_watch.current["rendezvous.join"] == 0.0

    (report,) = model.tick(start + 61 * S).logs
    event, trace_id, span_id = report
    log = to_log(event)
    assert log.severity_text == "WARN" and log.event_name == "torchelastic.stalled"
    attrs = log.attributes
    assert attrs[A.STALLED_IN] == "rendezvous.join"
    assert 60.9 <= attrs[A.STALLED_SECONDS] <= 61.1
    assert attrs[A.RUN_ID] == "job-cap" and attrs[A.HOST_NAME] == "localhost"
    assert attrs[A.ROUND] == 0  # the round the node waits for, from torch's message
    # keep-alives and syncs are not "the last message": what the node did last is
    assert "added itself to the participants of round 0" in attrs[A.MESSAGE]
    assert log.body.startswith("stalled in rendezvous.join for 61 s (round 0)")
    # on the join span itself, in the round's trace
    (join,) = [s for s in model.open_spans() if s.name == A.SPAN_RDZV_JOIN]
    assert (trace_id, span_id) == (join.trace_id, join.span_id)
    assert 60.9 <= model.stall_watch.current["rendezvous.join"] <= 61.1

    assert model.tick(start + 90 * S).logs == []  # not again before the interval
    (again,) = model.tick(start + 122 * S).logs
    assert again[0].attributes[A.STALLED_SECONDS] > 121

    model.process(events[4])  # joined: the wait is over
    assert model.tick(start + 200 * S).logs == []
    assert model.stall_watch.current["rendezvous.join"] == 0.0


def test_no_reports_when_turned_off_or_not_waiting() -> None:
    events = _events()
    off = TraceModel(salt="job", stall_after_s=0)
    for event in events[:4]:
        off.process(event)
    assert off.tick(events[0].time_ns + 3600 * S).logs == []
    done = TraceModel(salt="job", stall_after_s=1)
    for event in events:  # the whole job: every wait ended
        done.process(event)
    assert done.tick(events[-1].time_ns + 3600 * S).logs == []


@pytest.mark.e2e
def test_join_waiting_for_a_node_that_never_comes(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """One agent of a two-node job: WARN reports while it waits, a gauge, then the timeout."""
    env = job_env(grpc_receiver, tmp_path, ELASTIC_OTEL_STALL_AFTER="2")
    agent = start_agent(
        env,
        free_port(),
        f"alone-{uuid.uuid4().hex[:4]}",
        extra_args=("--rdzv-conf=join_timeout=9",),
    )
    rc, out = agent.wait(120)
    assert rc != 0, out[-2000:]
    reports = grpc_receiver.wait_for_logs(
        3, timeout=10, where=lambda r: r["event_name"] == "torchelastic.stalled"
    )
    assert all(r["severity_text"] == "WARN" for r in reports)
    assert {r["attributes"][A.STALLED_IN] for r in reports} == {"rendezvous.join"}
    seconds = [r["attributes"][A.STALLED_SECONDS] for r in reports]
    assert seconds == sorted(seconds) and seconds[0] >= 2 and seconds[-1] < 10
    (join,) = grpc_receiver.wait_for_spans(
        1, timeout=10, where=lambda s: s["name"] == A.SPAN_RDZV_JOIN
    )
    assert join["status_code"] == "ERROR"  # then torch's join timeout, as before
    assert {(r["trace_id"], r["span_id"]) for r in reports} == {(join["trace_id"], join["span_id"])}
    assert all(join["start_ns"] < r["time_ns"] < join["end_ns"] for r in reports)
    gauge = grpc_receiver.wait_for_metrics(
        1,
        timeout=10,
        where=lambda p: (
            p["name"] == A.METRIC_STALLED_SECONDS
            and p["attributes"].get(A.STALLED_IN) == "rendezvous.join"
            and p["value"] >= 2
        ),
    )
    assert gauge
