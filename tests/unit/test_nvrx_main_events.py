"""NVIDIA resiliency-ext 0.5 on (its main branch; wheels need glibc 2.39, not run here): the events
its ``ft_launcher`` records, built with torch's own ``RdzvEvent`` / ``Event`` classes exactly as
its source builds them (``fault_tolerance/ft_rendezvous_barrier.py``, ``c10d_monkey_patch.py``,
``launcher.py``; docs/launchers.md, NVIDIA resiliency-ext's ``ft_launcher``), parse as what they
say: the barrier's join names its rank and world size but no round; its close is a close; the
watchdog's event keeps what it says of the expired worker.
"""

from __future__ import annotations

import json
import os

from torch.distributed.elastic.events import Event, EventSource, NodeState, RdzvEvent

from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import EventKind, RdzvAction, parse_event

RUN_ID = "nvrx-job"
NODE = "node-3.example"
PID = 4242
BARRIER = "ft_rendezvous_barrier.py:FtRendezvousBarrierHandler"


def barrier(
    method: str, message: str, state: NodeState = NodeState.RUNNING, **kw: object
) -> RdzvEvent:
    """As ``FtRendezvousBarrierHandler._record`` builds it through torch's
    ``construct_and_record_rdzv_event``: ``name`` is the file and the handler's method, the host
    the node's address, no master endpoint."""
    return RdzvEvent(
        f"{BARRIER}.{method}",
        RUN_ID,
        message,
        NODE,
        PID,
        state,
        master_endpoint="",
        local_id=0,
        **kw,  # type: ignore[arg-type]
    )


def test_the_barriers_join_attempt_and_join() -> None:
    node = f"{NODE}_{PID}_0"
    attempt = parse_event(
        barrier(
            "next_rendezvous",
            f"The node '{node}' attempts to join the next round of the rendezvous '{RUN_ID}'.",
        ),
        1,
    )
    assert attempt.kind is EventKind.RENDEZVOUS and attempt.action is RdzvAction.JOIN_ATTEMPT
    joined = parse_event(
        barrier(
            "next_rendezvous",
            f"The node '{node}' has joined the rendezvous '{RUN_ID}' as rank 2 in a world of "
            "size 4.",
            rank=2,
        ),
        2,
    )
    assert joined.action is RdzvAction.JOINED
    assert (joined.rank, joined.world_size, joined.round) == (2, 4, None)  # no round named
    assert joined.attributes[A.EVENT_NAME] == f"{BARRIER}.next_rendezvous"
    assert joined.attributes[A.HOST_NAME] == NODE and joined.attributes[A.PROCESS_PID] == PID


def test_the_barriers_close_health_check_and_failure() -> None:
    node = f"{NODE}_{PID}_0"
    closed = parse_event(
        barrier(
            "_close",
            f"The node '{node}' has permanently closed the rendezvous '{RUN_ID}'.",
            NodeState.SUCCEEDED,
        ),
        1,
    )
    assert closed.action is RdzvAction.CLOSED
    health = parse_event(barrier("ensure_node_is_healthy", f"Checking health status of {node}."), 1)
    assert health.action is RdzvAction.OTHER and health.kind is EventKind.RENDEZVOUS
    failed = parse_event(
        barrier(
            "next_rendezvous",
            "RendezvousClosedError: the rendezvous is closed",
            NodeState.FAILED,
            error_trace="Traceback (most recent call last):\n  ...\n",
        ),
        1,
    )
    assert failed.action is RdzvAction.FAILED
    assert failed.attributes[A.EXCEPTION_TYPE] == "RendezvousClosedError"


def test_the_store_hosts_event_has_no_node() -> None:
    """``c10d_monkey_patch._patched_create_tcp_store``: recorded before any join, with no
    ``local_id``: a record, not a node."""
    event = parse_event(
        RdzvEvent(
            "c10d_monkey_patch.py:_patched_create_tcp_store",
            RUN_ID,
            f"Process {PID} hosts the TCP store for the C10d rendezvous backend.",
            NODE,
            PID,
            NodeState.INIT,
        ),
        1,
    )
    assert event.kind is EventKind.RENDEZVOUS and event.local_id is None
    assert event.node_state == "INIT"


def test_the_launchers_watchdog_event() -> None:
    """``LocalElasticAgent._log_watchdog_event`` (torch's file timer server calls it, here for
    "kill worker process"): an event named after the timer's, not a worker status; its nested
    metadata (the expired worker's pid, the signal) as attributes."""
    metadata = {
        "run_id": RUN_ID,
        "global_rank": None,
        "group_rank": 0,
        "worker_id": None,
        "role": "default",
        "hostname": NODE,
        "state": "RUNNING",
        "total_run_time": 0,
        "rdzv_backend": "c10d",
        "raw_error": None,
        "metadata": json.dumps(
            {
                "watchdog_event": "kill worker process",
                "worker_pid": str(os.getpid()),
                "scope_id": "train_step",
                "expiration_time": "1700000000.0",
                "signal": "9",
            }
        ),
        "agent_restarts": 0,
    }
    event = parse_event(Event("kill worker process", EventSource.AGENT, 0, metadata), 1)  # type: ignore[arg-type]
    assert event.kind is EventKind.GENERIC and event.state == "RUNNING"  # not a worker status
    assert event.run_id == RUN_ID
    attrs = event.attributes
    assert attrs["torchelastic.watchdog_event"] == "kill worker process"
    assert attrs["torchelastic.worker_pid"] == os.getpid() and attrs["torchelastic.signal"] == "9"
