"""Parsing torch's serialized events into events and log models, without torch.

parsing.py needs no torch, and neither do these tests: they read the events of a real job
(tests/data/restart_node*.tsv, captured from torch 2.13) and the literals below. Each literal is
exactly what torch 2.13's ``Event.serialize()`` / ``RdzvEvent.serialize()`` wrote for a real
object: produced once by serializing the objects in a Python shell with torch 2.13.0, and
checked again on every run by tests/unit/test_torch_event_objects.py, which builds the same objects.
The first test proves the independence.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from elastic_otel.model.logs import to_log
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import ElasticEvent, EventKind, RdzvAction, parse_event
from tests.support.event_json import (
    AGENT_FAILED_JSON,
    RDZV_FAILED_JSON,
    RDZV_JOINED_JSON,
    RDZV_JOINED_RANK_IN_MESSAGE_JSON,
    USER_EVENT_JSON,
    WORKER_FAILED_JSON,
    WORKER_SUCCEEDED_AT_JSON,
    WORKER_TERMINATED_JSON,
)
from tests.support.fixtures import captured_events

CREATED_NS = 1_700_000_000_123_456_789

# --- torch 2.13's JSON (see the module docstring) ---------------------------------------------


def test_parsing_needs_neither_torch_nor_the_sdk() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # any import of torch (or of OpenTelemetry) now fails\n"
        "sys.modules['opentelemetry'] = None\n"
        "from elastic_otel.parsing.torch_events import EventKind, parse_event\n"
        "from elastic_otel.model.logs import to_log\n"
        "from elastic_otel.model.trace_ids import trace_id_for\n"
        "event = parse_event(sys.argv[1], 1)\n"
        "assert event.kind is EventKind.RENDEZVOUS, event.attributes\n"
        "print(to_log(event).event_name, event.round, trace_id_for('', event.run_id, 3) > 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, RDZV_JOINED_JSON], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["torchelastic.rendezvous.joined", "3", "True"]


# --- the events of a real job -------------------------------------------------------------------

CAPTURED = [
    (name, created, payload)
    for name in ("restart_node0.tsv", "restart_node1.tsv")
    for created, payload in captured_events(name)
]
# What each of torch's recording functions reports (the event name is file:Class.method).
TORCH_FUNCTIONS = {
    "DynamicRendezvousHandler.next_rendezvous": {RdzvAction.JOIN_ATTEMPT, RdzvAction.JOINED},
    "DynamicRendezvousHandler._keep_alive": {RdzvAction.KEEP_ALIVE},
    "DynamicRendezvousHandler._close": {RdzvAction.CLOSED},
    "_DistributedRendezvousOpExecutor._keep_alive": {RdzvAction.HEARTBEAT_UPDATED},
    "_DistributedRendezvousOpExecutor._add_to_participants": {RdzvAction.ADDED_TO_PARTICIPANTS},
    "_DistributedRendezvousOpExecutor._add_to_wait_list": {RdzvAction.ADDED_TO_WAIT_LIST},
    "_DistributedRendezvousOpExecutor._remove_from_participants": {
        RdzvAction.REMOVED_FROM_PARTICIPANTS
    },
    "_DistributedRendezvousOpExecutor._mark_rendezvous_complete": {RdzvAction.MARKED_COMPLETE},
    "_DistributedRendezvousOpExecutor._mark_rendezvous_closed": {RdzvAction.MARKED_CLOSED},
    "_DistributedRendezvousOpExecutor.run": {RdzvAction.SYNCED, RdzvAction.STALE_STATE},
    "_create_tcp_store": {RdzvAction.OTHER},  # c10d_rendezvous_backend.py: not a membership change
}


def parse_captured(created: float, payload: str) -> ElasticEvent:
    return parse_event(payload, int(created * 1e9))


def test_every_captured_event_parses_with_nothing_flagged() -> None:
    kinds = []
    for _, created, payload in CAPTURED:
        event = parse_captured(created, payload)
        kinds.append(event.kind)
        assert not any(key.startswith(A.INVALID_PREFIX) for key in event.attributes), payload
        assert event.run_id == "job-cap" and event.hostname == "localhost"
        if event.kind is not EventKind.RENDEZVOUS:
            assert event.time_ns == int(created * 1e9)  # torch's agent events carry timestamp 0
    assert EventKind.UNPARSED not in kinds and EventKind.GENERIC not in kinds
    assert {EventKind.RENDEZVOUS, EventKind.AGENT, EventKind.WORKER} == set(kinds)


def test_captured_rendezvous_events_say_what_torch_did() -> None:
    seen = set()
    for _, created, payload in CAPTURED:
        event = parse_captured(created, payload)
        if event.kind is not EventKind.RENDEZVOUS:
            continue
        function = event.name.partition(":")[2]
        assert event.action in TORCH_FUNCTIONS[function], (function, event.body)
        seen.add(event.action)
        assert event.attributes[A.RDZV_ACTION] == event.action.value
        assert event.pid == event.attributes[A.PROCESS_PID] == json.loads(payload)["pid"]
        local_id = json.loads(payload)["local_id"]  # null for the c10d backend's own event
        assert event.local_id == event.attributes.get(A.LOCAL_ID) == local_id
        numbers = re.search(r"round (\d+)", event.body)
        assert event.round == (int(numbers[1]) if numbers else None), event.body
    assert seen == set().union(*TORCH_FUNCTIONS.values())  # each one recognised at least once


def test_captured_joins_give_round_rank_and_world_size() -> None:
    joins = [
        parse_captured(created, payload)
        for name, created, payload in CAPTURED
        if name == "restart_node1.tsv" and "has joined round" in payload
    ]
    assert [(e.round, e.rank, e.world_size) for e in joins] == [(0, 1, 2), (1, 1, 2)]
    a = joins[1].attributes
    assert (a[A.ROUND], a[A.RANK], a[A.WORLD_SIZE], a[A.NODE_STATE]) == (1, 1, 2, "RUNNING")
    log = to_log(joins[1])
    assert log.event_name == "torchelastic.rendezvous.joined"
    assert log.body.startswith("The node 'localhost_6430_0' has joined round 1")


def test_captured_agent_steps_and_workers() -> None:
    events = [parse_captured(c, p) for name, c, p in CAPTURED if name == "restart_node1.tsv"]
    steps = [e for e in events if e.state in ("RENDEZVOUS", "ASSIGN_WORKER_RANKS")]
    assert [e.kind for e in steps] == [EventKind.AGENT] * 4
    assert all(e.duration_ms and e.attributes[A.DURATION_MS] == e.duration_ms for e in steps)
    assert steps[0].duration_ms == pytest.approx(1060.63748)
    assert steps[2].group_rank == steps[2].attributes[A.RANK] == 1  # known after round 0
    assert steps[0].group_rank is None and A.RANK not in steps[0].attributes

    starts = [e for e in events if e.kind is EventKind.WORKER and e.state == "START"]
    # two workers per node, started in round 0 and again in round 1
    assert [(e.global_rank, e.group_rank, e.role) for e in starts] == [
        (2, 1, "default"),
        (3, 1, "default"),
    ] * 2
    a = starts[1].attributes
    assert (a[A.LOCAL_RANK], a[A.ROLE_RANK], a[A.ROLE_WORLD_SIZE], a[A.WORKER_ID]) == (
        1,
        3,
        4,
        "6499",
    )
    # torch writes [null] for a pid and exit code it does not know yet: absent, not flagged
    assert A.WORKER_PID not in a and A.EXIT_CODE not in a and starts[1].pid is None
    assert to_log(starts[1]).severity_text == "INFO"


# --- torch's JSON for what the captured job did not do ------------------------------------------


@pytest.mark.parametrize("as_dict", [False, True], ids=["json", "dict"])
def test_failed_worker_every_field(as_dict: bool) -> None:
    payload = json.loads(WORKER_FAILED_JSON) if as_dict else WORKER_FAILED_JSON
    parsed = parse_event(payload, CREATED_NS)
    assert parsed.kind is EventKind.WORKER
    assert (parsed.global_rank, parsed.group_rank, parsed.pid) == (3, 1, 4242)
    a = parsed.attributes
    assert a[A.RUN_ID] == "job-7"
    assert a[A.GLOBAL_RANK] == 3
    assert a[A.GROUP_RANK] == 1 and a[A.RANK] == 1
    assert a[A.ROLE] == "trainer"
    assert a[A.WORKER_ID] == "4242"
    assert a[A.STATE] == "FAILED"
    assert a["torchelastic.total_run_time"] == 12
    assert a[A.RDZV_BACKEND] == "c10d"
    assert a[A.AGENT_RESTARTS] == 1
    assert a[A.HOST_NAME] == "node-b.example"
    assert A.DURATION_MS not in a  # null values are not attributes
    # the nested metadata JSON, one-element lists flattened to scalars
    assert (a[A.LOCAL_RANK], a[A.ROLE_RANK], a[A.ROLE_WORLD_SIZE]) == (1, 3, 4)
    assert (a[A.EXIT_CODE], a[A.WORKER_PID]) == (1, 4242)
    assert (a[A.GROUP_WORLD_SIZE], a[A.ENTRY_POINT]) == (2, "python")
    # raw_error: torch's JSON error file
    assert a[A.EXCEPTION_TYPE] == "RuntimeError"
    assert a[A.EXCEPTION_MESSAGE] == "injected failure on rank 1"
    assert a[A.EXCEPTION_STACKTRACE] == (
        'Traceback (most recent call last):\n  File "train.py", line 30, in <module>\n'
        "RuntimeError: injected failure on rank 1\n"
    )
    assert "raw_error" not in "".join(a) and "torchelastic.metadata" not in a
    assert all(v is not None for v in a.values())

    log = to_log(parsed)
    assert log.event_name == "torchelastic.worker.status.FAILED"
    assert log.body == a[A.EXCEPTION_STACKTRACE]  # the whole traceback
    assert (log.severity_number, log.severity_text) == (17, "ERROR")
    assert log.time_ns == CREATED_NS  # torch's agent events carry timestamp 0


def test_a_non_zero_timestamp_wins_over_the_record_time() -> None:
    parsed = parse_event(WORKER_SUCCEEDED_AT_JSON, 5)
    assert parsed.time_ns == 1_650_000_000_250 * 1_000_000
    assert to_log(parsed).severity_text == "INFO"
    assert A.EXCEPTION_TYPE not in parsed.attributes and A.EXIT_CODE not in parsed.attributes


def test_terminated_worker_without_error_file_is_warn_with_category_only() -> None:
    parsed = parse_event(WORKER_TERMINATED_JSON, 1)
    assert to_log(parsed).severity_text == "WARN"
    assert parsed.error is None and A.EXCEPTION_TYPE not in parsed.attributes
    assert parsed.attributes[A.ERROR_CATEGORY] == "system_terminated_error"


def test_agent_traceback_names_the_exception() -> None:
    parsed = parse_event(AGENT_FAILED_JSON, 1)
    assert parsed.kind is EventKind.AGENT and parsed.state == "FAILED"
    a = parsed.attributes
    assert a[A.EXCEPTION_TYPE] == "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"
    assert a[A.EXCEPTION_MESSAGE] == "timed out"
    assert a[A.EXCEPTION_STACKTRACE] == json.loads(AGENT_FAILED_JSON)["metadata"]["raw_error"]
    assert A.RANK not in a and A.GLOBAL_RANK not in a  # null in torch's event
    assert to_log(parsed).severity_text == "ERROR"


def test_generic_user_event() -> None:
    parsed = parse_event(USER_EVENT_JSON, 1)
    assert parsed.kind is EventKind.GENERIC
    assert parsed.attributes["torchelastic.step"] == 10
    assert parsed.attributes["torchelastic.path"] == "/ckpt"
    assert parsed.attributes["torchelastic.ok"] is True
    assert parsed.attributes[A.EVENT_SOURCE] == "WORKER"
    assert to_log(parsed).body == "my.checkpoint"


@pytest.mark.parametrize("as_dict", [False, True], ids=["json", "dict"])
def test_joined_rendezvous_event_every_field(as_dict: bool) -> None:
    payload = json.loads(RDZV_JOINED_JSON) if as_dict else RDZV_JOINED_JSON
    parsed = parse_event(payload, CREATED_NS)
    assert parsed.kind is EventKind.RENDEZVOUS and parsed.action is RdzvAction.JOINED
    a = parsed.attributes
    assert (a[A.ROUND], a[A.RANK], a[A.WORLD_SIZE]) == (3, 1, 4)
    assert a[A.NODE_STATE] == "RUNNING"
    assert a[A.RUN_ID] == "job-7"
    assert a[A.HOST_NAME] == "node-b.example"
    assert (a[A.PROCESS_PID], a[A.LOCAL_ID]) == (777, 0)
    assert a[A.MASTER_ENDPOINT] == "10.0.0.1:29400"
    assert a[A.EVENT_NAME] == "dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous"
    assert a[A.EVENT_SOURCE] == A.SOURCE_RENDEZVOUS
    log = to_log(parsed)
    assert log.event_name == "torchelastic.rendezvous.joined"
    assert log.time_ns == CREATED_NS and log.severity_text == "INFO"


def test_the_rank_comes_from_the_message_when_the_field_is_null() -> None:
    parsed = parse_event(RDZV_JOINED_RANK_IN_MESSAGE_JSON, 1)
    assert (parsed.round, parsed.rank, parsed.world_size) == (0, 5, 8)
    assert parsed.attributes[A.RANK] == 5
    assert A.MASTER_ENDPOINT not in parsed.attributes  # torch's "" when unknown


def test_failed_rendezvous_event_is_error_with_exception() -> None:
    parsed = parse_event(RDZV_FAILED_JSON, 1)
    a = parsed.attributes
    assert parsed.action is RdzvAction.FAILED and a[A.NODE_STATE] == "FAILED"
    assert a[A.EXCEPTION_TYPE] == "RendezvousTimeoutError"
    assert a[A.EXCEPTION_MESSAGE] == "The node 'node-b.example_777_0' timed out."
    assert a[A.EXCEPTION_STACKTRACE] == json.loads(RDZV_FAILED_JSON)["error_trace"]
    assert to_log(parsed).severity_text == "ERROR"


def with_message(message: str, node_state: str = "RUNNING") -> str:
    """RDZV_JOINED_RANK_IN_MESSAGE_JSON with another message: the same json.dumps torch uses."""
    event = json.loads(RDZV_JOINED_RANK_IN_MESSAGE_JSON)
    return json.dumps(event | {"message": message, "node_state": node_state})


# Messages as torch 2.13's dynamic_rendezvous.py formats them, for actions the job did not take.
@pytest.mark.parametrize(
    ("message", "node_state", "action", "round_"),
    [
        (
            "The node 'n_1_0' added itself to the redundancy list of round 2 of the rendezvous "
            "'r'. Pending sync.",
            "RUNNING",
            RdzvAction.ADDED_TO_REDUNDANCY_LIST,
            2,
        ),
        (
            "The node 'n_1_0' removed itself from the wait list of round 4 of the rendezvous "
            "'r'. Pending sync.",
            "RUNNING",
            RdzvAction.REMOVED_FROM_WAIT_LIST,
            4,
        ),
        (
            "The node 'n_1_0' removed itself from the redundant list of round 5 of the "
            "rendezvous 'r'. Pending sync.",
            "RUNNING",
            RdzvAction.REMOVED_FROM_REDUNDANCY_LIST,
            5,
        ),
        (
            "As part of the sync operation the node(s) 'n_2_0', 'n_3_0' have been removed from "
            "the rendezvous 'r' since they had no heartbeat.",
            "RUNNING",
            RdzvAction.DEAD_NODES_REMOVED,
            None,
        ),
        (
            "The node 'n_1_0' has failed to send a keep-alive heartbeat to the rendezvous 'r' "
            "due to an error of type RendezvousConnectionError.",
            "FAILED",
            RdzvAction.KEEP_ALIVE_FAILED,
            None,
        ),
        (
            "The node 'n_1_0' has failed to shutdown the rendezvous 'r' due to an error of type "
            "RendezvousClosedError.",
            "FAILED",
            RdzvAction.SHUTDOWN_FAILED,
            None,
        ),
        ("RendezvousClosedError: ", "FAILED", RdzvAction.FAILED, None),
    ],
)
def test_rendezvous_messages_the_job_did_not_record(
    message: str, node_state: str, action: RdzvAction, round_: int | None
) -> None:
    parsed = parse_event(with_message(message, node_state), 1)
    assert parsed.action is action
    assert parsed.round == round_
    assert parsed.attributes[A.RDZV_ACTION] == action.value


def test_fields_a_newer_torch_adds_are_kept() -> None:
    event = json.loads(RDZV_JOINED_JSON) | {"attempt_id": 9, "labels": {"team": "ml"}}
    parsed = parse_event(json.dumps(event), 1)
    assert parsed.kind is EventKind.RENDEZVOUS and parsed.round == 3
    assert parsed.attributes["torchelastic.attempt_id"] == 9
    assert parsed.attributes["torchelastic.labels"] == '{"team": "ml"}'
