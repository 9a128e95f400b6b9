"""torch's own Event / RdzvEvent objects: what tests/test_parsing.py assumes about them holds.

tests/test_parsing.py runs without torch, on JSON written like torch writes it; here the real
classes serialize the same events to the same JSON, and the objects themselves (torch documents
``get_logging_handler(dest).info(event)``) parse exactly like their JSON.
"""

from __future__ import annotations

import json

import pytest
import test_parsing as fake
from torch.distributed.elastic.events import Event, EventSource, NodeState, RdzvEvent

from elastic_otel.parsing import parse_event


def _real_worker_event() -> Event:
    ev = fake.worker_event()
    return Event(ev.name, EventSource.WORKER, ev.timestamp, ev.metadata)


def _real_rdzv_event(state: NodeState = NodeState.RUNNING) -> RdzvEvent:
    ev = fake.rdzv_event(
        "The node 'x' has joined round 4 of the rendezvous 'job-7' as rank 2 in a world of size 3.",
        state.name,
        rank=2,
    )
    fields = ev.as_dict() | {"node_state": state}
    return RdzvEvent(**fields)


def test_the_json_of_test_parsing_is_torchs() -> None:
    assert _real_worker_event().serialize() == fake.worker_event().serialize()
    real = _real_rdzv_event()
    assert (
        json.loads(real.serialize()) == fake.rdzv_event(real.message, "RUNNING", rank=2).as_dict()
    )
    assert real.serialize() == fake.RdzvEvent(**json.loads(real.serialize())).serialize()


@pytest.mark.parametrize(
    "make", [_real_worker_event, _real_rdzv_event, lambda: _real_rdzv_event(NodeState.FAILED)]
)
def test_objects_parse_like_their_json(make: object) -> None:
    event = make()  # type: ignore[operator]
    from_object = parse_event(event, 5)
    from_json = parse_event(event.serialize(), 5)
    assert from_object == from_json
