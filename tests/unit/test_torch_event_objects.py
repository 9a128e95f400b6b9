"""torch's own Event / RdzvEvent objects (this file needs torch; test_parsing.py does not).

tests/unit/test_parsing.py parses literal JSON said to be exactly what torch 2.13 serializes:
here the real classes build the same events and must serialize them to the very same text.
The objects themselves (torch documents ``get_logging_handler(dest).info(event)``) must parse
exactly like their JSON, enums (``EventSource``, ``NodeState``) included.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from torch.distributed.elastic.events import Event, EventSource, NodeState, RdzvEvent

from elastic_otel.model.logs import to_log
from elastic_otel.names import attributes as A
from elastic_otel.parsing.records import AgentRecord, ErrorInfo, error_from_message
from elastic_otel.parsing.torch_events import EventKind, RdzvAction, parse_event
from tests.support import event_json as literals

ERROR_FILE = json.dumps(
    {
        "message": {
            "message": "RuntimeError: injected failure on rank 1",
            "extraInfo": {
                "py_callstack": 'Traceback (most recent call last):\n  File "train.py", line 30, '
                "in <module>\nRuntimeError: injected failure on rank 1\n",
                "timestamp": "1700000000",
            },
        }
    }
)
NO_ERROR_FILE = json.dumps(
    {"message": "<NONE>", "errorTraits": {"category": "system_terminated_error"}}
)
AGENT_TRACEBACK = (
    'Traceback (most recent call last):\n  File "api.py", line 3, in next_rendezvous\n'
    "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: timed out\n"
)
RDZV_TRACE = (
    'Traceback (most recent call last):\n  File "dynamic_rendezvous.py", line 1170, in '
    "next_rendezvous\ntorch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: "
    "The node timed out.\n"
)
NEXT_RENDEZVOUS = "dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous"


def worker(state: str, raw_error: str | None, timestamp: int = 0) -> Event:
    """A worker event built as torch's SimpleElasticAgent._construct_event builds it."""
    per_worker = {
        "group_world_size": 2,
        "entry_point": "python",
        "local_rank": (1,),
        "role_rank": (3,),
        "role_world_size": (4,),
        "exit_code": (1 if state == "FAILED" else None,),
        "worker_pid": (4242,),
    }
    metadata: dict[str, str | int | float | bool | None] = {
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
        "metadata": json.dumps(per_worker),
        "agent_restarts": 1,
        "duration_ms": None,
    }
    return Event(f"torchelastic.worker.status.{state}", EventSource.WORKER, timestamp, metadata)


def agent_failed() -> Event:
    metadata: dict[str, str | int | float | bool | None] = {
        "run_id": "job-7",
        "global_rank": None,
        "group_rank": None,
        "worker_id": None,
        "role": "trainer",
        "hostname": "node-b.example",
        "state": "FAILED",
        "total_run_time": 30,
        "rdzv_backend": "c10d",
        "raw_error": AGENT_TRACEBACK,
        "metadata": json.dumps({"group_world_size": None, "entry_point": "python"}),
        "agent_restarts": 0,
        "duration_ms": None,
    }
    return Event("torchelastic.worker.status.FAILED", EventSource.AGENT, 0, metadata)


def rdzv(
    message: str,
    state: NodeState = NodeState.RUNNING,
    master_endpoint: str = "",
    rank: int | None = None,
    error_trace: str = "",
) -> RdzvEvent:
    """A rendezvous event built as DynamicRendezvousHandler._record builds it."""
    return RdzvEvent(
        NEXT_RENDEZVOUS,
        "job-7",
        message,
        "node-b.example",
        777,
        state,
        master_endpoint=master_endpoint,
        rank=rank,
        local_id=0,
        error_trace=error_trace,
    )


OBJECTS: dict[str, Callable[[], Event | RdzvEvent]] = {
    "WORKER_FAILED_JSON": lambda: worker("FAILED", ERROR_FILE),
    "WORKER_SUCCEEDED_AT_JSON": lambda: worker("SUCCEEDED", None, 1_650_000_000_250),
    "WORKER_TERMINATED_JSON": lambda: worker("TERMINATED", NO_ERROR_FILE),
    "AGENT_FAILED_JSON": agent_failed,
    "USER_EVENT_JSON": lambda: Event(
        "my.checkpoint", EventSource.WORKER, 0, {"step": 10, "path": "/ckpt", "ok": True}
    ),
    "RDZV_JOINED_JSON": lambda: rdzv(
        "The node 'node-b.example_777_0' has joined round 3 of the rendezvous 'job-7' as rank 1 "
        "in a world of size 4.",
        master_endpoint="10.0.0.1:29400",
        rank=1,
    ),
    "RDZV_JOINED_RANK_IN_MESSAGE_JSON": lambda: rdzv(
        "The node 'node-b.example_777_0' has joined round 0 of the rendezvous 'job-7' as rank 5 "
        "in a world of size 8."
    ),
    "RDZV_FAILED_JSON": lambda: rdzv(
        "RendezvousTimeoutError: The node 'node-b.example_777_0' timed out.",
        NodeState.FAILED,
        error_trace=RDZV_TRACE,
    ),
}


def test_every_literal_of_event_json_is_checked_here() -> None:
    names = {name for name in vars(literals) if name.endswith("_JSON")}
    assert names == set(OBJECTS)


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_the_json_of_test_parsing_is_what_torch_writes(name: str) -> None:
    literal = getattr(literals, name)
    assert OBJECTS[name]().serialize() == literal
    # and torch reads it back to the same event
    cls = RdzvEvent if name.startswith("RDZV") else Event
    assert cls.deserialize(literal).serialize() == literal


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_objects_parse_like_their_json(name: str) -> None:
    event = OBJECTS[name]()
    from_object = parse_event(event, 5)
    assert from_object.kind is not EventKind.UNPARSED
    assert from_object == parse_event(event.serialize(), 5)


@pytest.mark.parametrize("state", list(NodeState))
def test_node_state_enum_objects(state: NodeState) -> None:
    event = parse_event(rdzv("RendezvousClosedError: closed", state), 1)
    assert event.node_state == state.name == event.attributes[A.NODE_STATE]
    failed = state is NodeState.FAILED
    assert (event.action is RdzvAction.FAILED) == failed
    assert (A.EXCEPTION_TYPE in event.attributes) == failed
    assert to_log(event).severity_text == ("ERROR" if failed else "INFO")


@pytest.mark.parametrize("source", list(EventSource))
def test_event_source_enum_objects(source: EventSource) -> None:
    event = parse_event(Event("torchelastic.worker.status.START", source, 0, {}), 1)
    assert event.attributes[A.EVENT_SOURCE] == source.name
    assert event.kind is (EventKind.WORKER if source is EventSource.WORKER else EventKind.AGENT)


def test_python_values_in_metadata_read_as_their_json() -> None:
    """An object hands over tuples and nested dicts that JSON would have made lists."""
    event = Event("my.step", EventSource.AGENT, 0, {"ranks": (1, 2), "cfg": {"lr": 0.1}})  # type: ignore[dict-item]
    from_object = parse_event(event, 1).attributes
    assert from_object["torchelastic.ranks"] == "[1, 2]"
    assert from_object["torchelastic.cfg"] == '{"lr": 0.1}'
    assert from_object == parse_event(event.serialize(), 1).attributes


# --- the agent instrumentation's records ----------------------------------------------------


def _with_metadata(event: Event, facts: dict[str, object]) -> Event:
    """``event`` with ``facts`` in its metadata, as a serialized event would carry them."""
    return Event(event.name, event.source, event.timestamp, {**event.metadata, **facts})  # type: ignore[dict-item]


def test_a_record_parses_as_its_facts_in_the_events_metadata_would() -> None:
    """A worker outcome: the typed facts and error land where metadata keys and torch's error
    file would have put them, in the same order, with the same values."""
    stack = 'Traceback (most recent call last):\n  File "train.py", line 30\n'
    error = error_from_message("RuntimeError: injected failure on rank 1", stack)
    facts = {A.FAILURE_KIND: A.KIND_ROOT_CAUSE, A.LAST_WORDS: "bye", A.OOM_KILL: None}
    record = AgentRecord(worker("FAILED", None, 1_700_000_000_000), facts, error)
    error_file = {"message": {"message": f"{error.type}: {error.message}"}}
    error_file["message"]["extraInfo"] = {"py_callstack": stack}  # type: ignore[index]
    serialized = _with_metadata(
        worker("FAILED", json.dumps(error_file), 1_700_000_000_000),
        {"failure.kind": A.KIND_ROOT_CAUSE, "last_words": "bye"},
    ).serialize()
    typed, text = parse_event(record, 1), parse_event(serialized, 1)
    assert typed == text
    assert list(typed.attributes.items()) == list(text.attributes.items())
    assert typed.error == ErrorInfo("RuntimeError", "injected failure on rank 1", stack)


def test_a_records_rank_lists_are_int_arrays_and_empty_ones_left_out() -> None:
    facts = {A.STALLED_RANKS: (1, 2), A.STALLED_WAITING: (), A.STALLED_SECONDS: 12.5}
    event = Event("torchelastic.stalled", EventSource.AGENT, 1_700_000_000_000, {})
    typed = parse_event(AgentRecord(event, facts), 1)
    metadata = {"stalled.ranks": "1,2", "stalled.waiting": "", "stalled.seconds": 12.5}
    assert typed == parse_event(_with_metadata(event, metadata).serialize(), 1)
    assert typed.attributes[A.STALLED_RANKS] == (1, 2)
    assert A.STALLED_WAITING not in typed.attributes


def test_without_an_error_a_record_reads_torchs_error_file() -> None:
    typed = parse_event(AgentRecord(worker("FAILED", ERROR_FILE)), 1)
    assert typed == parse_event(worker("FAILED", ERROR_FILE), 1)
    assert typed.error is not None and typed.error.type == "RuntimeError"


def test_rendezvous_events_are_named_as_torch_names_them() -> None:
    """The bridge's ``get_method_name`` (``sys._getframe``) names the method torch's
    (``inspect.stack()``) does, at every depth, and falls back the same way; the registration
    puts torch's back when it uninstalls."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from elastic_otel.integration import rendezvous_names

    undo = rendezvous_names.install()
    assert undo is not None, "torch's get_method_name was not replaced"
    assert dynamic_rendezvous.get_method_name is rendezvous_names.get_method_name
    undo()
    torchs = dynamic_rendezvous.get_method_name
    assert torchs is not rendezvous_names.get_method_name

    class Handler:  # the shape of DynamicRendezvousHandler._record and its callers
        def _record(self, name_of: Callable[..., str], depth: int) -> str:
            return name_of(depth)

        def next_rendezvous(self, name_of: Callable[..., str], depth: int) -> str:
            return self._record(name_of, depth)

    for depth in (0, 1, 2, 3, 10_000):
        assert Handler().next_rendezvous(
            rendezvous_names.get_method_name, depth
        ) == Handler().next_rendezvous(torchs, depth), depth
    assert Handler().next_rendezvous(rendezvous_names.get_method_name, 2) == "next_rendezvous"
    assert rendezvous_names.get_method_name(10_000) == rendezvous_names.NO_METHOD_NAME
