"""The trace model driven directly with event sequences: real captured runs and edge cases."""

from __future__ import annotations

from collections import Counter

from elastic_otel.model.spans import STATUS_ERROR, STATUS_OK
from elastic_otel.model.trace_ids import job_salt, trace_id_for
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import parse_event
from tests.support.fixtures import captured_events
from tests.support.helpers import RUN, Node, by_name, feed, worker


def run_captured(name: str, salt: str = "s"):
    model = TraceModel(salt=salt)
    spans, logs = feed(model, captured_events(name))
    out = model.close_all(2_000_000_000_000_000_000, "process exit")
    return spans + out.spans, logs + out.logs


# --- real runs ----------------------------------------------------------------------------


def test_captured_two_node_run_shares_one_trace_per_round() -> None:
    spans0, _logs0 = run_captured("restart_node0.tsv")
    spans1, _logs1 = run_captured("restart_node1.tsv")
    joins = by_name(spans0 + spans1, A.SPAN_RDZV_JOIN)
    per_round: dict[int, set[int]] = {}
    for s in joins:
        per_round.setdefault(s.attributes[A.ROUND], set()).add(s.trace_id)
    assert sorted(per_round) == [0, 1]
    assert all(len(ids) == 1 for ids in per_round.values()), per_round
    assert per_round[0] != per_round[1]
    assert per_round[0] == {trace_id_for("s", "job-cap", 0)}
    assert {s.attributes[A.RANK] for s in joins} == {0, 1}
    assert {s.attributes[A.WORLD_SIZE] for s in joins} == {2}
    assert all(s.status == STATUS_OK for s in joins)


def test_captured_run_worker_spans_show_failure_restart_and_success() -> None:
    spans0, _ = run_captured("restart_node0.tsv")  # node holding global ranks 0 and 1
    workers = by_name(spans0, A.SPAN_WORKER)
    first = [w for w in workers if w.attributes[A.AGENT_RESTARTS] == 0]
    second = [w for w in workers if w.attributes[A.AGENT_RESTARTS] == 1]
    assert {w.attributes[A.GLOBAL_RANK] for w in first} == {0, 1}
    assert {w.attributes[A.STATE] for w in first} == {"REPLACED"}
    assert all(w.status == STATUS_ERROR for w in first)
    assert {w.attributes[A.STATE] for w in second} == {"SUCCEEDED"}
    assert all(w.status == STATUS_OK for w in second)
    members = {s.span_id: s for s in by_name(spans0, A.SPAN_RDZV_MEMBER)}
    for w in workers:  # each worker hangs under its round's member span, in its trace
        parent = members[w.parent_span_id]
        assert parent.trace_id == w.trace_id
    restart_round = {members[w.parent_span_id].attributes[A.ROUND] for w in second}
    assert restart_round == {1}
    agent = by_name(spans0, "agent.run")
    assert len(agent) == 1 and agent[0].status == STATUS_OK
    assert agent[0].links, "the agent span links to the earlier round"


def test_captured_run_member_spans_link_round_to_round_and_logs_carry_ids() -> None:
    spans, logs = run_captured("restart_node1.tsv")
    members = sorted(by_name(spans, A.SPAN_RDZV_MEMBER), key=lambda s: s.start_ns)
    assert [m.attributes[A.ROUND] for m in members] == [0, 1]
    assert members[1].links[0].span_id == members[0].span_id
    assert members[1].links[0].trace_id == members[0].trace_id
    assert members[-1].attributes[A.END_REASON] == "rendezvous closed"
    assert members[-1].attributes[A.KEEP_ALIVE_COUNT] >= 1
    known = {(s.trace_id, s.span_id) for s in spans}
    rdzv_logs = [(ev, t, s) for ev, t, s in logs if ev.attributes.get(A.NODE_STATE)]
    # every rendezvous log after the store set-up points at a span the model emitted
    linked = [(t, s) for ev, t, s in rdzv_logs if t]
    assert len(linked) >= len(rdzv_logs) - 1
    assert all(pair in known for pair in linked)


def test_each_event_yields_exactly_one_log() -> None:
    rows = captured_events("restart_node0.tsv")
    _, logs = run_captured("restart_node0.tsv")
    assert len(logs) == len(rows)
    assert Counter(ev.body for ev, _, _ in logs) == Counter(parse_event(p, 0).body for _, p in rows)


# --- edge cases ---------------------------------------------------------------------------


def test_timeout_gives_error_join_span_lasting_the_wait() -> None:
    n = Node(1)
    model = TraceModel()
    rows = [n.attempt(), n.participant(0)]
    rows.append((rows[0][0] + 30.0, n.timeout()[1]))
    spans, _ = feed(model, rows)
    (join,) = spans
    assert join.status == STATUS_ERROR
    assert join.status_message == "RendezvousTimeoutError"
    assert abs((join.end_ns - join.start_ns) / 1e9 - 30.0) < 1e-3
    assert join.events[-1].name == "exception"
    assert join.events[-1].attributes[A.EXCEPTION_TYPE] == "RendezvousTimeoutError"
    assert join.trace_id == trace_id_for("", RUN, 0)


def test_joined_without_attempt_and_duplicates_are_tolerated() -> None:
    n = Node(2)
    model = TraceModel()
    spans, logs = feed(
        model, [n.joined(4, 1, 3), n.joined(4, 1, 3), n.attempt(), n.attempt(), n.joined(5, 0, 2)]
    )
    names = Counter(s.name for s in spans)
    # member of round 4 ended by the re-join; the first of two attempts superseded
    assert names == {A.SPAN_RDZV_MEMBER: 1, A.SPAN_RDZV_JOIN: 2}
    superseded = [
        s for s in spans if s.attributes.get(A.END_REASON) == "superseded by a new attempt"
    ]
    assert len(superseded) == 1
    assert len(logs) == 5
    assert model.current_span(RUN, 0) is not None


def test_keep_alives_are_aggregated_not_span_events() -> None:
    n = Node(3)
    model = TraceModel(event_limit=16)
    rows = [n.attempt(), n.participant(0), n.joined(0, 0, 1)]
    rows += [n.keep_alive() for _ in range(5000)]
    rows.append(n.closed())
    spans, logs = feed(model, rows)
    member = by_name(spans, A.SPAN_RDZV_MEMBER)[0]
    assert member.attributes[A.KEEP_ALIVE_COUNT] == 5000
    assert member.attributes[A.KEEP_ALIVE_LAST_NS] == int(rows[-2][0] * 1e9)
    assert len(member.events) <= 16 + 16
    assert member.events[-1].name == "closed"
    assert len(logs) == len(rows)


def test_different_salts_give_different_traces_and_none_warns_once(caplog) -> None:
    a, b = TraceModel(salt="job-a"), TraceModel(salt="job-b")
    n = Node(4, run_id="none")
    rows = [n.attempt(), n.joined(0, 0, 1)]
    sa, _ = feed(a, rows)
    sb, _ = feed(b, rows)
    assert sa[0].trace_id != sb[0].trace_id
    unsalted = TraceModel(salt="")
    with caplog.at_level("WARNING"):
        feed(unsalted, rows)
        feed(unsalted, [n.attempt(), n.joined(1, 0, 1)])
    assert sum("ELASTIC_OTEL_JOB_ID" in r.message for r in caplog.records) == 1


def test_job_salt_from_environment() -> None:
    assert job_salt({"ELASTIC_OTEL_JOB_ID": "abc", "SLURM_JOB_ID": "9"}) == "abc"
    assert job_salt({"SLURM_JOB_ID": "9"}) == "SLURM_JOB_ID=9"
    assert job_salt({}) == ""


def test_worker_replaced_by_restart_and_membership_change() -> None:
    n = Node(5)
    model = TraceModel()
    rows = [
        n.attempt(),
        n.joined(0, 0, 1),
        worker(1010, "START", 0, 0),
        n.attempt(),
        n.joined(1, 0, 1),
        worker(1020, "START", 0, 1),
        n.attempt(),
        n.joined(2, 0, 2),
        worker(1030, "START", 0, 1),
        worker(1040, "SUCCEEDED", 0, 1),
    ]
    spans, _ = feed(model, rows)
    workers = sorted(by_name(spans, A.SPAN_WORKER), key=lambda s: s.start_ns)
    assert [w.attributes[A.STATE] for w in workers] == ["REPLACED", "RESTARTED", "SUCCEEDED"]
    assert [w.status for w in workers] == [STATUS_ERROR, "UNSET", STATUS_OK]
    members = {m.span_id: m.attributes[A.ROUND] for m in by_name(spans, A.SPAN_RDZV_MEMBER)}
    members[model.current_span(RUN, 0)[1]] = 2
    assert [members[w.parent_span_id] for w in workers] == [0, 1, 2]


def test_worker_end_without_start_is_still_a_span() -> None:
    spans, logs = feed(TraceModel(), [worker(1.0, "FAILED", 3, 0)])
    (span,) = spans
    assert span.attributes["torchelastic.start_unknown"] is True
    assert span.status == STATUS_ERROR
    assert logs[0][2] == span.span_id


def test_state_is_bounded_and_open_spans_end_at_exit() -> None:
    model = TraceModel(max_tracked=100)
    ended = 0
    for i in range(2000):
        n = Node(10_000 + i, run_id=f"run-{i}")
        spans, _ = feed(
            model, [n.attempt(), n.joined(0, 0, 1), worker(1.0, "START", 0, 0, run_id=f"run-{i}")]
        )
        ended += len(spans)
        assert model.tracked <= 200
    assert model.evicted > 0
    out = model.close_all(10**19, "process terminated (SIGTERM)", error=True)
    assert out.spans
    for span in out.spans:
        assert span.end_ns > 0
        assert span.attributes[A.END_REASON] == "process terminated (SIGTERM)"
    assert any(s.status == STATUS_ERROR for s in out.spans)
    assert model.tracked == 0


def test_heartbeat_logs_off_keeps_them_counted_on_the_span() -> None:
    n = Node(4)
    model = TraceModel(heartbeat_logs=False)
    early = n.keep_alive()  # before any join: no span counts it, so it stays a log record
    rows = [early, n.attempt(), n.participant(0), n.joined(0, 0, 1)]
    rows += [n.keep_alive() for _ in range(300)]
    rows.append(n.closed())
    spans, logs = feed(model, rows)
    member = by_name(spans, A.SPAN_RDZV_MEMBER)[0]
    assert member.attributes[A.KEEP_ALIVE_COUNT] == 300
    assert model.heartbeat_logs_skipped == 300
    assert len(logs) == len(rows) - 300
    assert sum("keep-alive" in str(ev.body) for ev, _, _ in logs) == 1


def test_heartbeat_logs_switch_over_otlp(monkeypatch, grpc_receiver, make_logger) -> None:
    """``ELASTIC_OTEL_HEARTBEAT_LOGS=false`` through the handler: what a collector receives."""
    for key, value in grpc_receiver.exporter_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ELASTIC_OTEL_HEARTBEAT_LOGS", "false")
    logger, handler = make_logger()
    n = Node(5)
    beats = [row for _ in range(50) for row in n.heartbeat_triple()]
    rows = [n.attempt(), n.joined(0, 0, 1), *beats, n.closed()]
    for _, event in rows:
        logger.info(event.serialize())
    handler.shutdown()
    assert handler.all_stats()["heartbeat_logs_skipped"] == 150
    (member,) = grpc_receiver.wait_for_spans(1, where=lambda s: s["name"] == A.SPAN_RDZV_MEMBER)
    assert member["attributes"][A.KEEP_ALIVE_COUNT] == 50
    assert member["attributes"]["torchelastic.sync.count"] == 50
    bodies = [r["body"] for r in grpc_receiver.logs()]
    assert len(bodies) == 3 and not any("keep-alive" in b or "synced" in b for b in bodies)


def test_a_step_longer_than_the_epoch_is_not_back_dated_before_it() -> None:
    """A RENDEZVOUS event dated 1 ms after the epoch that lasted 5 ms (found by hypothesis):
    OTLP times are unsigned, a negative start would fail the whole export batch."""
    payload = (
        '{"name": "torchelastic.worker.status.RENDEZVOUS", "source": "AGENT", "timestamp": 1, '
        '"metadata": {"run_id": "job", "state": "RENDEZVOUS", "duration_ms": 5}}'
    )
    (span,) = TraceModel(salt="s").process(parse_event(payload, 1)).spans
    assert (span.start_ns, span.end_ns) == (0, 1_000_000)
