"""Parsing torch's serialized events into events and log models, without torch.

parsing.py needs no torch, and neither do these tests: ``Event`` and ``RdzvEvent`` below write
exactly the JSON torch 2.13's ``Event.serialize()`` / ``RdzvEvent.serialize()`` write
(tests/test_torch_event_objects.py checks that against torch's own classes, and the real
objects). The first test proves the independence.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

from elastic_otel import attributes as A
from elastic_otel.logs import to_log
from elastic_otel.parsing import EventKind, RdzvAction, parse_event

CREATED_NS = 1_700_000_000_123_456_789


@dataclass
class Event:
    """torch's ``Event``, as ``Event.serialize()`` writes it (sources are enum names)."""

    name: str
    source: str
    timestamp: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(json.dumps(asdict(self)))  # tuples become lists
        return data

    def serialize(self) -> str:
        return json.dumps(self.as_dict())


@dataclass
class RdzvEvent:
    """torch's ``RdzvEvent``, as ``RdzvEvent.serialize()`` writes it (field order included)."""

    name: str
    run_id: str
    message: str
    hostname: str
    pid: int
    node_state: str
    master_endpoint: str = ""
    rank: int | None = None
    local_id: int | None = None
    error_trace: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def serialize(self) -> str:
        return json.dumps(self.as_dict())


def test_parsing_needs_no_torch() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # any import of torch fails\n"
        "from elastic_otel.parsing import EventKind, parse_event\n"
        "from elastic_otel.logs import to_log\n"
        f"ev = parse_event({RdzvEvent('n', 'r', 'm', 'h', 1, 'RUNNING').serialize()!r}, 1)\n"
        "assert ev.kind is EventKind.RENDEZVOUS and to_log(ev).body == 'm'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


ERROR_FILE = json.dumps(
    {
        "message": {
            "message": "RuntimeError: injected failure on rank 1",
            "extraInfo": {
                "py_callstack": 'Traceback (most recent call last):\n  File "train.py", line 30\n'
                "RuntimeError: injected failure on rank 1\n",
                "timestamp": "1700000000",
            },
        }
    }
)


def worker_event(state: str = "FAILED", raw_error: str | None = ERROR_FILE, ts: int = 0) -> Event:
    """An Event shaped exactly as torch's SimpleElasticAgent._construct_event builds it."""
    md = {
        "group_world_size": 2,
        "entry_point": "python",
        "local_rank": (1,),
        "role_rank": (3,),
        "role_world_size": (4,),
        "exit_code": (1,),
        "worker_pid": (4242,),
    }
    return Event(
        f"torchelastic.worker.status.{state}",
        source="WORKER",
        timestamp=ts,
        metadata={
            "run_id": "job-7",
            "global_rank": 3,
            "group_rank": 1,
            "worker_id": "4242",
            "role": "trainer",
            "hostname": "node-b.example",
            "state": state,
            "total_run_time": 12,
            "rdzv_backend": "c10d",
            "raw_error": raw_error,
            "metadata": json.dumps(md),
            "agent_restarts": 1,
            "duration_ms": None,
        },
    )


def rdzv_event(message: str, state: str = "RUNNING", **kw: object) -> RdzvEvent:
    fields: dict = dict(
        name="dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous",
        run_id="job-7",
        message=message,
        hostname="node-b.example",
        pid=777,
        node_state=state,
        local_id=0,
    )
    fields.update(kw)
    return RdzvEvent(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("as_json", [False, True], ids=["dict", "json"])
def test_worker_event_every_field(as_json: bool) -> None:
    ev = worker_event()
    parsed = parse_event(ev.serialize() if as_json else ev.as_dict(), CREATED_NS)
    assert parsed.kind is EventKind.WORKER
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
    assert A.DURATION_MS not in a  # None values are not attributes
    # nested metadata JSON, one-element lists flattened to scalars
    assert a[A.LOCAL_RANK] == 1
    assert a[A.ROLE_RANK] == 3
    assert a["torchelastic.role_world_size"] == 4
    assert a[A.EXIT_CODE] == 1
    assert a[A.WORKER_PID] == 4242
    assert a["torchelastic.group_world_size"] == 2
    assert a["torchelastic.entry_point"] == "python"
    # raw_error JSON error file
    assert a[A.EXCEPTION_TYPE] == "RuntimeError"
    assert a[A.EXCEPTION_MESSAGE] == "injected failure on rank 1"
    assert a[A.EXCEPTION_STACKTRACE].startswith("Traceback (most recent call last)")
    assert "raw_error" not in "".join(a) and "torchelastic.metadata" not in a
    assert all(v is not None for v in a.values())

    log = to_log(parsed)
    assert log.body == "torchelastic.worker.status.FAILED"
    assert (log.severity_number, log.severity_text) == (17, "ERROR")
    assert log.event_name == "torchelastic.worker.status.FAILED"
    assert log.time_ns == CREATED_NS  # torch's agent events carry timestamp 0


def test_non_zero_timestamp_wins_over_record_time() -> None:
    parsed = parse_event(worker_event(state="SUCCEEDED", raw_error=None, ts=1_650_000_000_250), 5)
    assert parsed.time_ns == 1_650_000_000_250 * 1_000_000
    assert to_log(parsed).severity_text == "INFO"
    assert A.EXCEPTION_TYPE not in parsed.attributes


def test_terminated_is_warn_and_agent_traceback_is_parsed() -> None:
    assert to_log(parse_event(worker_event("TERMINATED", None), 1)).severity_text == "WARN"
    tb = (
        'Traceback (most recent call last):\n  File "api.py", line 3, in run\n'
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: timed out\n"
    )
    agent = Event(
        "torchelastic.worker.status.FAILED",
        source="AGENT",
        metadata={"run_id": "r", "state": "FAILED", "raw_error": tb, "group_rank": None},
    )
    parsed = parse_event(agent, 1)
    assert parsed.kind is EventKind.AGENT
    assert parsed.attributes[A.EXCEPTION_TYPE] == (
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"
    )
    assert parsed.attributes[A.EXCEPTION_MESSAGE] == "timed out"
    assert parsed.attributes[A.EXCEPTION_STACKTRACE] == tb
    assert A.RANK not in parsed.attributes


def test_worker_without_error_file_has_no_exception_but_category() -> None:
    raw = json.dumps({"message": "<NONE>", "errorTraits": {"category": "system_terminated_error"}})
    parsed = parse_event(worker_event(raw_error=raw), 1)
    assert A.EXCEPTION_TYPE not in parsed.attributes
    assert parsed.attributes[A.ERROR_CATEGORY] == "system_terminated_error"


def test_agent_step_carries_duration() -> None:
    ev = Event(
        "torchelastic.worker.status.RENDEZVOUS",
        source="AGENT",
        metadata={"run_id": "r", "state": "RENDEZVOUS", "duration_ms": 1234.5, "metadata": "{}"},
    )
    parsed = parse_event(ev.serialize(), 1)
    assert parsed.duration_ms == 1234.5
    assert parsed.attributes[A.DURATION_MS] == 1234.5
    assert parsed.state == "RENDEZVOUS"


@pytest.mark.parametrize("as_json", [False, True], ids=["dict", "json"])
def test_joined_rdzv_event_gives_round_rank_world(as_json: bool) -> None:
    ev = rdzv_event(
        "The node 'node-b.example_777_0' has joined round 3 of the rendezvous 'job-7' as rank 1 "
        "in a world of size 4.",
        rank=1,
        master_endpoint="10.0.0.1:29400",
    )
    parsed = parse_event(ev.serialize() if as_json else ev.as_dict(), CREATED_NS)
    assert parsed.kind is EventKind.RENDEZVOUS
    assert parsed.action is RdzvAction.JOINED
    a = parsed.attributes
    assert (a[A.ROUND], a[A.RANK], a[A.WORLD_SIZE]) == (3, 1, 4)
    assert a[A.NODE_STATE] == "RUNNING"
    assert a[A.RUN_ID] == "job-7"
    assert a[A.HOST_NAME] == "node-b.example"
    assert a[A.PROCESS_PID] == 777
    assert a[A.LOCAL_ID] == 0
    assert a[A.MASTER_ENDPOINT] == "10.0.0.1:29400"
    assert a[A.EVENT_NAME] == "dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous"
    log = to_log(parsed)
    assert log.body.startswith("The node 'node-b.example_777_0' has joined round 3")
    assert log.event_name == "torchelastic.rendezvous.joined"
    assert log.time_ns == CREATED_NS


def test_rank_from_message_when_field_missing() -> None:
    ev = rdzv_event(
        "The node 'x_1_0' has joined round 0 of the rendezvous 'job-7' as rank 5 in a world of "
        "size 8."
    )
    assert parse_event(ev, 1).attributes[A.RANK] == 5


def test_failed_rdzv_event_is_error_with_exception() -> None:
    try:
        raise TimeoutError("boom")
    except TimeoutError:
        import traceback

        trace = traceback.format_exc()
    ev = rdzv_event("RendezvousTimeoutError: The node 'x' timed out.", "FAILED", error_trace=trace)
    parsed = parse_event(ev.serialize(), 1)
    a = parsed.attributes
    assert a[A.NODE_STATE] == "FAILED"
    assert a[A.EXCEPTION_TYPE] == "RendezvousTimeoutError"
    assert a[A.EXCEPTION_MESSAGE] == "The node 'x' timed out."
    assert a[A.EXCEPTION_STACKTRACE] == trace
    assert to_log(parsed).severity_text == "ERROR"


@pytest.mark.parametrize(
    ("message", "action", "round_"),
    [
        (
            "The node 'n' attempts to join the next round of the rendezvous 'r'.",
            RdzvAction.JOIN_ATTEMPT,
            None,
        ),
        (
            "The node 'n' added itself to the participants of round 2 of the rendezvous 'r'. "
            "Pending sync.",
            RdzvAction.ADDED_TO_PARTICIPANTS,
            2,
        ),
        (
            "The node 'n' added itself to the wait list of round 4 of the rendezvous 'r'. "
            "Pending sync.",
            RdzvAction.ADDED_TO_WAIT_LIST,
            4,
        ),
        (
            "The node 'n' marked round 2 of the rendezvous 'r' as complete. Pending sync.",
            RdzvAction.MARKED_COMPLETE,
            2,
        ),
        (
            "The node 'n' marked the rendezvous 'r' as closed. Pending sync.",
            RdzvAction.MARKED_CLOSED,
            None,
        ),
        (
            "The node 'n' has sent a keep-alive heartbeat to the rendezvous 'r'.",
            RdzvAction.KEEP_ALIVE,
            None,
        ),
        (
            "The node 'n' has a stale state and failed to sync its local changes with other nodes "
            "in the rendezvous 'r'.",
            RdzvAction.STALE_STATE,
            None,
        ),
        ("The node 'n' has closed the rendezvous 'r'.", RdzvAction.CLOSED, None),
    ],
)
def test_rdzv_messages_are_classified(message: str, action: RdzvAction, round_: int | None) -> None:
    parsed = parse_event(rdzv_event(message), 1)
    assert parsed.action is action
    assert parsed.round == round_
    assert parsed.attributes[A.RDZV_ACTION] == action.value


def test_unknown_fields_from_other_torch_versions_are_kept() -> None:
    payload = json.loads(rdzv_event("The node 'n' attempts to join the next round.").serialize())
    payload["attempt_id"] = 9
    parsed = parse_event(json.dumps(payload), 1)
    assert parsed.kind is EventKind.RENDEZVOUS
    assert parsed.attributes["torchelastic.attempt_id"] == 9


def test_generic_user_event() -> None:
    ev = Event("my.checkpoint", "WORKER", 0, {"step": 10, "path": "/ckpt", "ok": True})
    parsed = parse_event(ev, 1)
    assert parsed.kind is EventKind.GENERIC
    assert parsed.attributes["torchelastic.step"] == 10
    assert parsed.attributes["torchelastic.ok"] is True
    assert to_log(parsed).body == "my.checkpoint"
