"""Traced rendezvous for every backend: ``torchrun --rdzv-backend otel-<backend>``.

Real torchrun agents (c10d, static, etcd against a real etcd server) and real rendezvous
handlers export to a real OTLP receiver; the assertions are on what arrives there. The jobs'
workers train nothing (tests/scripts/light_worker.py): the agents' rendezvous is what is tested.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from tests.support.helpers import attr
from tests.support.jobs import LIGHT, job_env, run_job, run_script, start_agent
from tests.support.otlp_receiver import OtlpReceiver, free_port

JOINED = "torchelastic.rendezvous.joined"


def named(receiver: OtlpReceiver, name: str) -> list[dict]:
    return [s for s in receiver.spans() if s["name"] == name]


def assert_round(receiver: OtlpReceiver, run_id: str, world: int, round_: int) -> list[dict]:
    """One join and one member span per node, in the round's one trace, with rank and size."""
    receiver.wait_for_spans(world, where=lambda s: s["name"] == A.SPAN_RDZV_MEMBER)
    joins, members = named(receiver, A.SPAN_RDZV_JOIN), named(receiver, A.SPAN_RDZV_MEMBER)
    assert len(joins) == world, "one rendezvous.join per node: no duplicates"
    assert len(members) == world, "one rendezvous.member per node: no duplicates"
    assert sorted(attr(s, A.RANK) for s in joins) == list(range(world))
    assert {attr(s, A.WORLD_SIZE) for s in joins + members} == {world}
    assert {attr(s, A.ROUND) for s in joins + members} == {round_}
    assert {attr(s, A.RUN_ID) for s in joins + members} == {run_id}
    assert len({s["trace_id"] for s in joins + members}) == 1, "the round's shared trace"
    assert all(s["status_code"] == "OK" and s["end_ns"] > s["start_ns"] for s in joins)
    assert {m["parent_span_id"] for m in members} == {j["span_id"] for j in joins}
    # the agent's steps and its workers hang under the member spans
    member_ids = {m["span_id"] for m in members}
    steps = named(receiver, A.SPAN_AGENT_RENDEZVOUS)
    assert len(steps) == world and {s["parent_span_id"] for s in steps} == member_ids
    workers = named(receiver, A.SPAN_WORKER)
    assert {w["parent_span_id"] for w in workers} == member_ids
    assert {w["trace_id"] for w in workers} == {joins[0]["trace_id"]}
    return joins


def assert_synthetic_logs(receiver: OtlpReceiver, joins: list[dict], backend: str) -> None:
    """The wrapper's rendezvous events: logs correlated with the join spans they built."""
    joined = [r for r in receiver.logs() if r["event_name"] == JOINED]
    assert len(joined) == len(joins)
    assert {attr(r, A.EVENT_NAME) for r in joined} == {"TracedRendezvousHandler.next_rendezvous"}
    assert {attr(r, A.RDZV_BACKEND) for r in joined} == {backend}
    assert {(r["trace_id"], r["span_id"]) for r in joined} == {
        (j["trace_id"], j["span_id"]) for j in joins
    }


def rdzv_durations(receiver: OtlpReceiver, n: int) -> list[dict]:
    return receiver.wait_for_metrics(
        n, where=lambda m: m["name"] == "torchelastic.rendezvous.duration"
    )


def check(results: list[tuple[int, str]]) -> None:
    assert [rc for rc, _ in results] == [0] * len(results), "\n".join(o[-3000:] for _, o in results)


# --- torchrun, c10d and static -----------------------------------------------------------------


@pytest.mark.e2e
def test_otel_c10d_two_agents_spans_once(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    """c10d records its own events: the wrapper adds metrics, never a second set of spans."""
    run_id = f"c10d-{uuid.uuid4().hex[:6]}"
    env = job_env(grpc_receiver, tmp_path)
    check(run_job(env, backend="otel-c10d", run_id=run_id, script=LIGHT))
    assert_round(grpc_receiver, run_id, world=2, round_=0)
    names = {attr(r, A.EVENT_NAME) for r in grpc_receiver.logs()}
    assert not any(str(n).startswith("TracedRendezvousHandler") for n in names)
    assert any(str(n).startswith("dynamic_rendezvous.py") for n in names), "torch's own events"
    points = rdzv_durations(grpc_receiver, 2)
    assert {(attr(p, A.RDZV_BACKEND), attr(p, A.RDZV_OUTCOME)) for p in points} == {
        ("otel-c10d", "ok")
    }
    assert all(p["unit"] == "ms" and p["count"] == 1 and p["sum"] > 0 for p in points)


@pytest.mark.e2e
def test_otel_c10d_without_routing_uses_the_wrapper(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Rendezvous events not routed: the wrapper builds the spans, as the node torch knows."""
    run_id = f"c10d-{uuid.uuid4().hex[:6]}"
    env = job_env(grpc_receiver, tmp_path, ELASTIC_OTEL_RDZV_EVENTS="false")
    check(run_job(env, agents=1, nnodes="1", backend="otel-c10d", run_id=run_id, script=LIGHT))
    joins = assert_round(grpc_receiver, run_id, world=1, round_=0)
    assert_synthetic_logs(grpc_receiver, joins, "otel-c10d")
    (joined,) = [r for r in grpc_receiver.logs() if r["event_name"] == JOINED]
    # torch's node descriptor (host_pid_localid) names the node
    node = f"{attr(joined, A.HOST_NAME)}_{attr(joined, A.PROCESS_PID)}_{attr(joined, A.LOCAL_ID)}"
    assert f"The node '{node}' has joined round 0" in joined["body"]


@pytest.mark.e2e
def test_otel_static_two_agents(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    """Static records no events at all; torchrun's static arguments work unchanged."""
    run_id = f"static-{uuid.uuid4().hex[:6]}"
    env = job_env(grpc_receiver, tmp_path, TRAIN_IDLE_SECONDS="2")  # the monitor asks who waits
    port = free_port()
    static = ("--master-addr=127.0.0.1", f"--master-port={port}")
    agents = [
        start_agent(
            env,
            port,
            run_id,
            backend="otel-static",
            rdzv_args=(f"--node-rank={rank}", *static),
            script=LIGHT,
        )
        for rank in (0, 1)
    ]
    check([a.wait() for a in agents])
    joins = assert_round(grpc_receiver, run_id, world=2, round_=0)
    assert_synthetic_logs(grpc_receiver, joins, "otel-static")
    # shutdown closes each member span
    members = named(grpc_receiver, A.SPAN_RDZV_MEMBER)
    assert {attr(m, A.END_REASON) for m in members} == {"rendezvous closed"}
    assert {m["status_code"] for m in members} == {"OK"}
    points = rdzv_durations(grpc_receiver, 2)
    assert {attr(p, A.RDZV_BACKEND) for p in points} == {"otel-static"}
    waiting = grpc_receiver.wait_for_metrics(
        2, where=lambda m: m["name"] == "torchelastic.rendezvous.nodes_waiting"
    )
    assert {m["value"] for m in waiting} == {0}


# --- etcd -------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_otel_etcd_two_agents(
    grpc_receiver: OtlpReceiver, tmp_path: Path, etcd_endpoint: str
) -> None:
    """etcd records no events; its rendezvous version is the round (the first is 1)."""
    run_id = f"etcd-{uuid.uuid4().hex[:6]}"
    env = job_env(grpc_receiver, tmp_path)
    etcd = (f"--rdzv-endpoint={etcd_endpoint}", "--rdzv-conf=last_call_timeout=1")
    agents = [
        start_agent(env, 0, run_id, backend="otel-etcd", rdzv_args=etcd, script=LIGHT)
        for _ in range(2)
    ]
    check([a.wait() for a in agents])
    joins = assert_round(grpc_receiver, run_id, world=2, round_=1)
    assert_synthetic_logs(grpc_receiver, joins, "otel-etcd")


# --- handlers used directly -------------------------------------------------------------------


def test_failed_rendezvous_is_an_error_span(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    """static's store times out: the join ends in ERROR with the exception and its trace."""
    run_id = f"lonely-{uuid.uuid4().hex[:6]}"
    out = run_script(
        f"""
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from elastic_otel.integration.traced_rendezvous import traced_creator

        params = RendezvousParameters(
            "otel-static", "127.0.0.1:{free_port()}", "{run_id}", 2, 2, rank=0, timeout=1
        )
        handler = traced_creator("static")(params)
        try:
            handler.next_rendezvous()
        except Exception as e:
            print("raised", type(e).__name__)
        """,
        job_env(grpc_receiver, tmp_path),
    )
    assert "raised DistStoreError" in out
    (join,) = grpc_receiver.wait_for_spans(1, where=lambda s: s["name"] == A.SPAN_RDZV_JOIN)
    assert join["status_code"] == "ERROR"
    assert "DistStoreError" in join["status_message"]
    (exc,) = [e for e in join["events"] if e["name"] == "exception"]
    assert exc["attributes"][A.EXCEPTION_TYPE] == "DistStoreError"
    assert "Timed out" in exc["attributes"][A.EXCEPTION_MESSAGE]
    assert "next_rendezvous" in exc["attributes"][A.EXCEPTION_STACKTRACE]
    assert (join["end_ns"] - join["start_ns"]) / 1e9 >= 0.9
    assert attr(join, A.RUN_ID) == run_id
    (failed,) = [r for r in grpc_receiver.logs() if r["severity_text"] == "ERROR"]
    assert (failed["trace_id"], failed["span_id"]) == (join["trace_id"], join["span_id"])
    # cumulative: a periodic export and the exit's may both carry the one measurement
    points = rdzv_durations(grpc_receiver, 1)
    assert {(attr(p, A.RDZV_OUTCOME), p["count"]) for p in points} == {("timeout", 1)}
    assert all(p["sum"] >= 900 for p in points)


def test_set_closed_and_closed_rendezvous(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    """A real c10d handler, events not routed: closing and re-joining a closed rendezvous."""
    run_id = f"closing-{uuid.uuid4().hex[:6]}"
    out = run_script(
        f"""
        from torch.distributed.elastic.rendezvous import (
            RendezvousClosedError, RendezvousParameters,
        )
        from elastic_otel.integration.traced_rendezvous import traced_creator

        params = RendezvousParameters("otel-c10d", "127.0.0.1:{free_port()}", "{run_id}", 1, 1)
        handler = traced_creator("c10d")(params)
        info = handler.next_rendezvous()
        print("joined", info.rank, info.world_size, handler.get_backend())
        handler.set_closed()
        try:
            handler.next_rendezvous()
        except RendezvousClosedError:
            print("closed")
        handler.shutdown()
        """,
        job_env(grpc_receiver, tmp_path, ELASTIC_OTEL_RDZV_EVENTS="false"),
    )
    assert "joined 0 1 otel-c10d" in out and "closed" in out
    grpc_receiver.wait_for_spans(3)
    first, second = sorted(named(grpc_receiver, A.SPAN_RDZV_JOIN), key=lambda s: s["start_ns"])
    (member,) = named(grpc_receiver, A.SPAN_RDZV_MEMBER)
    assert first["status_code"] == "OK" and attr(member, A.ROUND) == 0
    assert [e["name"] for e in member["events"]] == ["marked_closed"]
    assert attr(member, A.END_REASON) == "re-rendezvous"
    assert second["status_code"] == "ERROR"
    (exc,) = [e for e in second["events"] if e["name"] == "exception"]
    assert exc["attributes"][A.EXCEPTION_TYPE] == "RendezvousClosedError"
    # the failed attempt was for round 1: its own trace, linked to the round it left
    assert attr(second, A.ROUND) == 1 and second["trace_id"] != first["trace_id"]
    assert [lk["span_id"] for lk in second["links"]] == [member["span_id"]]
    outcomes = {attr(p, A.RDZV_OUTCOME) for p in rdzv_durations(grpc_receiver, 2)}
    assert outcomes == {"ok", "closed"}


def test_torchelastic_02_interface(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    """A handler of torchelastic 0.2's interface: tuples, no get_backend, no rounds."""
    run_id = f"legacy-{uuid.uuid4().hex[:6]}"
    out = run_script(
        f"""
        from torch.distributed import HashStore
        from torchelastic.rendezvous import RendezvousHandler, RendezvousTimeoutException

        from elastic_otel.integration.traced_rendezvous import TracedRendezvousHandler

        class OneNode(RendezvousHandler):
            calls = 0

            def next_rendezvous(self):
                self.calls += 1
                if self.calls == 3:
                    raise RendezvousTimeoutException()
                return HashStore(), 0, 1

            def is_closed(self):
                return False

            def set_closed(self):
                pass

            def num_nodes_waiting(self):
                return 0

            def get_run_id(self):
                return "{run_id}"

        handler = TracedRendezvousHandler(OneNode())
        store, rank, world = handler.next_rendezvous()
        print("tuple", type(store).__name__, rank, world, handler.get_backend())
        handler.next_rendezvous()
        try:
            handler.next_rendezvous()
        except RendezvousTimeoutException:
            print("timeout")
        """,
        job_env(grpc_receiver, tmp_path),
    )
    assert "tuple HashStore 0 1 OneNode" in out and "timeout" in out
    grpc_receiver.wait_for_spans(5)
    joins = sorted(named(grpc_receiver, A.SPAN_RDZV_JOIN), key=lambda s: s["start_ns"])
    assert [attr(s, A.ROUND) for s in joins] == [0, 1, 2], "rounds count the successful joins"
    assert [s["status_code"] for s in joins] == ["OK", "OK", "ERROR"]
    assert len({s["trace_id"] for s in joins}) == 3
    assert all(attr(s, A.RANK) == 0 and attr(s, A.WORLD_SIZE) == 1 for s in joins[:2])
    (exc,) = [e for e in joins[2]["events"] if e["name"] == "exception"]
    assert exc["attributes"][A.EXCEPTION_TYPE] == "RendezvousTimeoutException"
    members = named(grpc_receiver, A.SPAN_RDZV_MEMBER)
    assert sorted(attr(m, A.ROUND) for m in members) == [0, 1]


def test_registry_names_and_wrapped_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's registry demands get_backend() == the requested name; the inner name is kept."""
    monkeypatch.setenv("ELASTIC_OTEL_ENABLED", "false")  # no telemetry pipeline in this process
    from torch.distributed.elastic.rendezvous import (
        RendezvousParameters,
        rendezvous_handler_registry,
    )
    from torch.distributed.elastic.rendezvous.registry import _create_static_handler

    from elastic_otel.integration.entry_points import static_handler
    from elastic_otel.integration.traced_rendezvous import TracedRendezvousHandler

    params = RendezvousParameters("otel-static", "127.0.0.1:1", "r", 1, 1, rank=0)
    handler = rendezvous_handler_registry.create_handler(params)
    assert isinstance(handler, TracedRendezvousHandler)
    assert (handler.get_backend(), handler.wrapped_backend) == ("otel-static", "static")
    assert handler.use_agent_store is True and handler.get_run_id() == "r"
    assert params.backend == "otel-static", "the caller's parameters are left alone"
    inner = _create_static_handler(RendezvousParameters("static", "127.0.0.1:1", "r", 1, 1, rank=0))
    assert TracedRendezvousHandler(inner).get_backend() == "static"
    # the entry point hands torch the same creator every time (torch refuses a different one)
    rendezvous_handler_registry.register("otel-static", static_handler())
    assert os.environ["ELASTIC_OTEL_ENABLED"] == "false"
