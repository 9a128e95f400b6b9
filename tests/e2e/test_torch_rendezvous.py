"""torch's own rendezvous code paths, with and without the bridge routing their events.

Every scenario drives real ``DynamicRendezvousHandler`` instances through their public API
(``next_rendezvous``, keep-alive heartbeats, ``is_closed``, ``num_nodes_waiting``,
``set_closed``, ``shutdown``), over a real in-memory ``RendezvousBackend``
(``rdzv_memory_backend.py``), twice: first with torch's default ``NullHandler`` on the
``dynamic_rendezvous`` destination (torch then builds no events at all), then with
``elastic_otel.register()`` active and exporting to a real OTLP receiver. The tests assert
that torch behaves identically both times (ranks, world sizes, rounds, return values, closed
state, exceptions) and that the receiver got the spans and logs a user would look for.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import HashStore
from torch.distributed.elastic import events as torch_events
from torch.distributed.elastic.events import NodeState, construct_and_record_rdzv_event
from torch.distributed.elastic.events import handlers as torch_handlers
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)

import elastic_otel
from elastic_otel.bridge.handler import OtelHandler
from elastic_otel.bridge.process import bridge_process
from elastic_otel.integration import registration
from elastic_otel.names import attributes as A
from tests.support.helpers import attr
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.rdzv_memory_backend import CONNECTION_LOST, InMemoryRendezvousBackend

RDZV = "dynamic_rendezvous"
TORCH_LOGGER = f"torchelastic-events-{RDZV}"
ADDR = "127.0.0.1"
KEEP_ALIVE_S = 0.2
Outcome = dict[str, Any]


# --- isolation ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _isolated_torch_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give every test torch's pristine event routing, and put it back afterwards.

    torch keeps three pieces of process-wide state that would leak the bridge from one test
    into the next: the destination registry ``handlers._log_handlers`` (register() puts the
    bridge there), the logger cache ``events._events_loggers`` and the ``logging.Logger``
    objects behind it. ``_get_or_create_logger`` attaches the destination's handler only
    when it first creates a destination's logger and caches that logger forever, so a logger
    created while test A's handler was registered would still feed A's (shut down) handler
    in test B, and a logger created with no handler would swallow B's events. Hence: a copy
    of the registry, an empty logger cache, a handler-less ``torchelastic-events-
    dynamic_rendezvous`` logger and fresh registration bookkeeping per test, all restored
    by monkeypatch however the test ends. The logger is also made to propagate again (torch
    turns that off when it creates it): pytest's log capture adds its own handler to every
    non-propagating logger at the start of each test phase, and a handler that production
    never has would change what register() sees on that logger.
    """
    monkeypatch.setattr(torch_handlers, "_log_handlers", dict(torch_handlers._log_handlers))
    monkeypatch.setattr(torch_events, "_events_loggers", {})
    torch_logger = logging.getLogger(TORCH_LOGGER)
    monkeypatch.setattr(torch_logger, "handlers", [])
    monkeypatch.setattr(torch_logger, "propagate", True)
    monkeypatch.setattr(registration, "_registration", None)
    monkeypatch.setattr(bridge_process(), "handler", None)
    assert type(torch_handlers.get_logging_handler(RDZV)) is logging.NullHandler


@contextmanager
def bridge(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> Iterator[OtelHandler]:
    """``elastic_otel.register()`` active, exporting to ``receiver``; undone on exit.

    The process-wide handler (``elastic_otel.get_handler()``) builds its SDK pipeline once per
    process, from the environment of that moment, and this test needs one per receiver. So a
    fresh ``OtelHandler`` is built here (after the exporter environment is set) and installed
    as the process-wide handler (restored by monkeypatch); the real ``register()`` and
    ``unregister()`` then do the routing exactly as in a job.
    """
    for name, value in receiver.exporter_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OTEL_BLRP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("ELASTIC_OTEL_JOB_ID", "test-torch-rendezvous")
    handler = OtelHandler()
    monkeypatch.setattr(bridge_process(), "handler", handler)
    assert elastic_otel.register() is handler
    assert torch_handlers.get_logging_handler(RDZV) is handler
    try:
        yield handler
    finally:
        elastic_otel.unregister()
        handler.shutdown()
    assert type(torch_handlers.get_logging_handler(RDZV)) is logging.NullHandler


def make_handler(
    backend: InMemoryRendezvousBackend,
    run_id: str,
    min_nodes: int = 1,
    max_nodes: int = 1,
    store: HashStore | None = None,
    join_s: float = 60.0,  # a bound, not a measurement: loaded CI machines are slow
    last_call_s: float = 30.0,
) -> DynamicRendezvousHandler:
    return DynamicRendezvousHandler.from_backend(
        run_id,
        store=store if store is not None else shared_store(),
        backend=backend,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        local_addr=ADDR,
        timeout=RendezvousTimeout(
            join=timedelta(seconds=join_s), last_call=timedelta(seconds=last_call_s)
        ),
        keep_alive_interval=KEEP_ALIVE_S,  # type: ignore[arg-type]  # a timedelta's seconds
        # Nodes of these tests wait up to 1 s between syncs (torch's poll delay): never let a
        # waiting node look dead to the others.
        keep_alive_max_attempt=100,
    )


def failure(call: Callable[[], Any]) -> Any:
    """The call's result, or the type and text of what it raised."""
    try:
        return call()
    except Exception as e:
        return (type(e).__name__, str(e))


# --- scenarios: each returns what torch did, nothing the bridge could have added ------------


def single_node(run_id: str) -> Outcome:
    """Join alone, keep alive, close, shut down."""
    backend = InMemoryRendezvousBackend()
    handler = make_handler(backend, run_id)
    out: Outcome = {}
    try:
        info = handler.next_rendezvous()
        backend.wait_for_writes(backend.writes + 3)  # three keep-alive heartbeats written
        out |= {
            "rank": info.rank,
            "world_size": info.world_size,
            "round": backend.decoded_state().round,
            "closed_before": handler.is_closed(),
            "waiting": handler.num_nodes_waiting(),
        }
        handler.set_closed()
        out["closed_after"] = handler.is_closed()
        out["backend_closed"] = backend.decoded_state().closed
    finally:
        out["shutdown"] = handler.shutdown()
    return out


def shared_store() -> HashStore:
    """The store several handlers share, as agents share the rendezvous TCP store."""
    store = HashStore()
    store.set_timeout(timedelta(seconds=30))  # a lost peer fails the test, never hangs it
    return store


def two_nodes(run_id: str) -> Outcome:
    """Two handlers (two agents) rendezvous through one backend and one store."""
    backend, store = InMemoryRendezvousBackend(), shared_store()
    handlers = [make_handler(backend, run_id, 2, 2, store) for _ in range(2)]
    out: Outcome = {}
    try:
        with ThreadPoolExecutor(2) as pool:
            infos = list(pool.map(lambda h: h.next_rendezvous(), handlers))
        state = backend.decoded_state()
        out |= {
            "ranks": [i.rank for i in infos],
            "world_sizes": [i.world_size for i in infos],
            "round": state.round,
            "participants": len(state.participants),
            "waiting": [h.num_nodes_waiting() for h in handlers],
            "closed": [h.is_closed() for h in handlers],
        }
    finally:
        out["shutdown"] = [h.shutdown() for h in handlers]
    out["closed_after"] = [h.is_closed() for h in handlers]
    return out


def join_timeout(run_id: str) -> Outcome:
    """min_nodes=2 and only one node: the join times out."""
    backend = InMemoryRendezvousBackend()
    handler = make_handler(backend, run_id, 2, 2, join_s=1.0)
    out: Outcome = {}
    try:
        out["join"] = failure(handler.next_rendezvous)
        state = backend.decoded_state()
        out["participants_after"] = len(state.participants)
        out["closed"] = handler.is_closed()
        out["waiting"] = handler.num_nodes_waiting()
    finally:
        out["shutdown"] = handler.shutdown()
    return out


def backend_failure(run_id: str) -> Outcome:
    """The backend loses its connection: writes raise RendezvousConnectionError."""
    backend = InMemoryRendezvousBackend()
    backend.fail_writes = True
    handler = make_handler(backend, run_id)
    return {
        "join": failure(handler.next_rendezvous),
        "is_closed": failure(handler.is_closed),
        "waiting": failure(handler.num_nodes_waiting),
        "shutdown": failure(handler.shutdown),
    }


def membership_change(run_id: str) -> Outcome:
    """Round 0 completes with one node; a second waits, the first re-joins: round 1 of two.

    Run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with the shared TCP store, torch's rank
    0 publishes the master address only in its first round, so a node that is rank 1 of a
    later round (with the same rank 0) would wait for it forever.
    """
    backend, store = InMemoryRendezvousBackend(), shared_store()
    first = make_handler(backend, run_id, 1, 2, store, last_call_s=0.3)
    second = make_handler(backend, run_id, 1, 2, store, last_call_s=0.3)
    out: Outcome = {}
    try:
        info0 = first.next_rendezvous()
        out["round0"] = (info0.rank, info0.world_size, backend.decoded_state().round)
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(second.next_rendezvous)
            deadline = time.monotonic() + 20
            while first.num_nodes_waiting() == 0 and time.monotonic() < deadline:
                time.sleep(0.05)  # what torch's agent polls in its monitor loop
            out["waiting"] = first.num_nodes_waiting()
            info1 = first.next_rendezvous()  # the agent's re-rendezvous
            info2 = late.result(timeout=30)
        out["round1"] = [(i.rank, i.world_size) for i in (info1, info2)]
        out["round"] = backend.decoded_state().round
    finally:
        out["shutdown"] = [first.shutdown(), second.shutdown()]
    return out


def run_both(
    scenario: Callable[[str], Outcome],
    receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[str, OtelHandler]:
    """Run ``scenario`` without, then with the bridge; torch must not notice the difference."""
    name = scenario.__name__.replace("_", "-")
    plain = scenario(f"{name}-plain-{uuid.uuid4().hex[:6]}")
    assert receiver.logs() == [] and receiver.spans() == []
    run_id = f"{name}-{uuid.uuid4().hex[:6]}"
    with bridge(receiver, monkeypatch) as handler:
        bridged = scenario(run_id)
    assert bridged == plain, "torch behaved differently with the bridge active"
    stats = handler.all_stats()
    assert stats["received"] > 0
    assert stats["internal_errors"] == 0 and stats["unparsed"] == 0, stats
    assert stats["processed"] == stats["received"], stats
    return run_id, handler


# --- receiver helpers -----------------------------------------------------------------------


def spans_of(receiver: OtlpReceiver, run_id: str, name: str) -> list[dict]:
    return [s for s in receiver.spans() if s["name"] == name and attr(s, A.RUN_ID) == run_id]


def logs_of(receiver: OtlpReceiver, run_id: str, action: str | None = None) -> list[dict]:
    return [
        r
        for r in receiver.logs()
        if attr(r, A.RUN_ID) == run_id and (action is None or attr(r, A.RDZV_ACTION) == action)
    ]


def all_logs_arrived(receiver: OtlpReceiver, handler: OtelHandler, run_id: str) -> list[dict]:
    """Every event torch recorded became exactly one log record at the receiver."""
    received = handler.all_stats()["received"]
    logs = receiver.wait_for_logs(received, where=lambda r: attr(r, A.RUN_ID) == run_id)
    assert len(logs) == received
    return logs


# --- tests ----------------------------------------------------------------------------------


def test_single_node_join_keep_alive_close_shutdown(
    grpc_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, handler = run_both(single_node, grpc_receiver, monkeypatch)
    all_logs_arrived(grpc_receiver, handler, run_id)

    (join,) = spans_of(grpc_receiver, run_id, A.SPAN_RDZV_JOIN)
    assert join["status_code"] == "OK"
    assert (attr(join, A.RANK), attr(join, A.WORLD_SIZE), attr(join, A.ROUND)) == (0, 1, 0)
    assert attr(join, A.HOST_NAME) == ADDR

    (member,) = spans_of(grpc_receiver, run_id, A.SPAN_RDZV_MEMBER)
    assert member["parent_span_id"] == join["span_id"]
    assert member["trace_id"] == join["trace_id"]
    assert (attr(member, A.RANK), attr(member, A.WORLD_SIZE)) == (0, 1)
    # keep-alives are aggregated on the member span: one count per heartbeat sent while it
    # was open, never one span event each
    during = [
        r for r in logs_of(grpc_receiver, run_id, "keep_alive") if r["span_id"] == member["span_id"]
    ]
    assert attr(member, A.KEEP_ALIVE_COUNT) == len(during) >= 3
    assert not any(e["name"] == "keep_alive" for e in member["events"])
    # set_closed(): the member span ends OK with the close, the closed event is logged
    assert member["status_code"] == "OK"
    assert attr(member, A.END_REASON) == "rendezvous closed"
    assert "closed" in [e["name"] for e in member["events"]]
    marked = logs_of(grpc_receiver, run_id, "marked_closed")
    assert len(marked) == 1 and marked[0]["trace_id"] == member["trace_id"]
    closed = logs_of(grpc_receiver, run_id, "closed")
    assert len(closed) == 2  # set_closed() and shutdown() each report it
    assert {r["event_name"] for r in closed} == {"torchelastic.rendezvous.closed"}
    assert all(r["trace_id"] == member["trace_id"] for r in closed)
    (joined,) = logs_of(grpc_receiver, run_id, "joined")
    assert (joined["trace_id"], joined["span_id"]) == (join["trace_id"], join["span_id"])
    assert attr(joined, A.RANK) == 0 and attr(joined, A.WORLD_SIZE) == 1


def test_two_nodes_join_in_one_trace(
    grpc_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, handler = run_both(two_nodes, grpc_receiver, monkeypatch)
    all_logs_arrived(grpc_receiver, handler, run_id)
    joins = spans_of(grpc_receiver, run_id, A.SPAN_RDZV_JOIN)
    members = spans_of(grpc_receiver, run_id, A.SPAN_RDZV_MEMBER)
    assert len(joins) == 2 and len(members) == 2
    assert sorted(attr(s, A.RANK) for s in joins) == [0, 1]
    assert {attr(s, A.WORLD_SIZE) for s in joins + members} == {2}
    assert {attr(s, A.ROUND) for s in joins + members} == {0}
    assert len({s["trace_id"] for s in joins + members}) == 1, "one trace per round"
    assert len({attr(s, A.LOCAL_ID) for s in joins}) == 2, "one join span per node"
    assert all(s["status_code"] == "OK" for s in joins + members)
    assert {m["parent_span_id"] for m in members} == {j["span_id"] for j in joins}
    # the node that completed the round marked it complete, on its join span (once, unless a
    # concurrent heartbeat made its write stale and it had to mark it again)
    marking = [j for j in joins if any(e["name"] == "marked_complete" for e in j["events"])]
    assert len(marking) == 1


def test_join_timeout_is_an_error_span(
    grpc_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, handler = run_both(join_timeout, grpc_receiver, monkeypatch)
    all_logs_arrived(grpc_receiver, handler, run_id)
    (join,) = spans_of(grpc_receiver, run_id, A.SPAN_RDZV_JOIN)
    assert join["status_code"] == "ERROR"
    assert join["status_message"] == "RendezvousTimeoutError"
    assert attr(join, A.ROUND) == 0
    (exc,) = [e for e in join["events"] if e["name"] == "exception"]
    assert attr(exc, A.EXCEPTION_TYPE) == "RendezvousTimeoutError"
    (failed,) = logs_of(grpc_receiver, run_id, "failed")
    assert failed["severity_text"] == "ERROR"
    assert attr(failed, A.EXCEPTION_TYPE) == "RendezvousTimeoutError"
    assert "Traceback" in attr(failed, A.EXCEPTION_STACKTRACE)
    assert (failed["trace_id"], failed["span_id"]) == (join["trace_id"], join["span_id"])
    # the node gave its place back before timing out
    assert logs_of(grpc_receiver, run_id, "removed_from_participants")
    assert spans_of(grpc_receiver, run_id, A.SPAN_RDZV_MEMBER) == []


def test_backend_connection_failure(
    grpc_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, handler = run_both(backend_failure, grpc_receiver, monkeypatch)
    logs = all_logs_arrived(grpc_receiver, handler, run_id)
    (join,) = spans_of(grpc_receiver, run_id, A.SPAN_RDZV_JOIN)
    assert join["status_code"] == "ERROR"
    assert join["status_message"] == "RendezvousConnectionError"
    (exc,) = [e for e in join["events"] if e["name"] == "exception"]
    assert attr(exc, A.EXCEPTION_MESSAGE) == CONNECTION_LOST
    errors = [r for r in logs if r["severity_text"] == "ERROR"]
    # next_rendezvous, is_closed, num_nodes_waiting and shutdown each reported the failure
    assert len(errors) == 4
    assert [attr(r, A.EXCEPTION_TYPE) for r in errors[:3]] == ["RendezvousConnectionError"] * 3
    (shutdown_failed,) = logs_of(grpc_receiver, run_id, "shutdown_failed")
    assert shutdown_failed["severity_number"] == 17
    assert "RendezvousConnectionError" in shutdown_failed["body"]


def test_membership_change_wait_list_and_next_round(
    grpc_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    run_id, handler = run_both(membership_change, grpc_receiver, monkeypatch)
    all_logs_arrived(grpc_receiver, handler, run_id)
    joins = spans_of(grpc_receiver, run_id, A.SPAN_RDZV_JOIN)
    by_round: dict[int, list[dict]] = {}
    for s in joins:
        by_round.setdefault(attr(s, A.ROUND), []).append(s)
    assert sorted(by_round) == [0, 1]
    assert [(attr(s, A.RANK), attr(s, A.WORLD_SIZE)) for s in by_round[0]] == [(0, 1)]
    assert sorted((attr(s, A.RANK), attr(s, A.WORLD_SIZE)) for s in by_round[1]) == [
        (0, 2),
        (1, 2),
    ]
    assert by_round[0][0]["trace_id"] != by_round[1][0]["trace_id"], "one trace per round"
    assert len({s["trace_id"] for s in by_round[1]}) == 1
    assert all(s["status_code"] == "OK" for s in joins)
    # the late node's join waited on the wait list of round 1, in round 1's trace
    (late,) = [
        s for s in by_round[1] if any(e["name"] == "added_to_wait_list" for e in s["events"])
    ]
    assert attr(late, A.RANK) == 1
    # the first node's round-0 membership ended with the re-rendezvous and is linked from round 1
    members = spans_of(grpc_receiver, run_id, A.SPAN_RDZV_MEMBER)
    (member0,) = [m for m in members if attr(m, A.ROUND) == 0]
    assert attr(member0, A.END_REASON) == "re-rendezvous"
    rejoin = next(s for s in by_round[1] if s is not late)
    assert [lk["span_id"] for lk in rejoin["links"]] == [member0["span_id"]]
    waiting = logs_of(grpc_receiver, run_id, "added_to_wait_list")
    # torch records it again when its state write lost a race and the action ran once more
    assert waiting and all(w["trace_id"] == late["trace_id"] for w in waiting)


def test_register_again_after_unregister_still_receives_rendezvous_events(
    grpc_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """register() → unregister() → register(): torch's cached logger must reach the bridge."""
    run_id = f"reregister-{uuid.uuid4().hex[:6]}"

    def record(n: int) -> None:
        construct_and_record_rdzv_event(
            run_id, f"event {n}", NodeState.RUNNING, hostname=ADDR, pid=1, local_id=0
        )

    with bridge(grpc_receiver, monkeypatch) as handler:
        record(1)  # torch creates and caches its dynamic_rendezvous logger now
        elastic_otel.unregister()
        record(2)  # torch's NullHandler is back: not built, not delivered
        assert elastic_otel.register() is handler
        record(3)
        assert handler.flush(5)
        bodies = sorted(r["body"] for r in logs_of(grpc_receiver, run_id))
        received = handler.all_stats()["received"]
    assert bodies == ["event 1", "event 3"], "events recorded after re-registering were lost"
    assert received == 2
