"""docs/outcomes.md, row by row: torch's recorded event sequence for each situation (torch
``Event`` / ``RdzvEvent`` objects, in the order torch's agent and launcher record them) through
the trace model, and what it exports for each outcome word torch said."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from torch.distributed.elastic.events import Event, EventSource, NodeState

from elastic_otel.model.agent_outcome import CHILD_FAILED
from elastic_otel.model.logs import to_log
from elastic_otel.model.spans import LogOut, SpanRecord
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import parse_event
from tests.support.helpers import RUN, Node

DOC = Path(__file__).parents[2] / "docs" / "outcomes.md"
ERROR_FILE = json.dumps(
    {"message": {"message": "RuntimeError: injected failure on rank 1", "extraInfo": {}}}
)
SIGNAL = (
    'Traceback (most recent call last):\n  File "run.py", line 1, in main\n'
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 77 got signal: 15"
)
RDZV_TIMEOUT = (
    'Traceback (most recent call last):\n  File "api.py", line 1, in run\n'
    "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"  # raised bare: no ": "
)


def _agent(state: str, restarts: int = 0, raw_error: str | None = None) -> Event:
    """torch's agent event, as ``get_event_succeeded`` / ``get_event_failed`` build it."""
    return Event(
        f"torchelastic.worker.status.{state}",
        EventSource.AGENT,
        0,
        {
            "run_id": RUN,
            "global_rank": None,
            "group_rank": 0,
            "worker_id": None,
            "role": "default",
            "hostname": "h",
            "state": state,
            "total_run_time": 3,
            "rdzv_backend": "c10d",
            "raw_error": raw_error,
            "metadata": json.dumps({"group_world_size": 1, "entry_point": "python"}),
            "agent_restarts": restarts,
            "duration_ms": None,
        },
    )


def _worker(state: str, rank: int, restarts: int = 0, raw_error: str | None = None) -> Event:
    """A worker event as ``_construct_event`` builds it (torch's final events, ``START``, and
    the instrumented agent's ``PEER_FAILED`` / ``STOPPED``)."""
    code = 1 if state == "FAILED" else (-15 if state == "TERMINATED" else None)
    per_worker = {"local_rank": (rank,), "exit_code": (code,), "worker_pid": (100 + rank,)}
    return Event(
        f"torchelastic.worker.status.{state}",
        EventSource.WORKER,
        0,
        {
            "run_id": RUN,
            "global_rank": rank,
            "group_rank": 0,
            "worker_id": str(100 + rank),
            "role": "default",
            "hostname": "h",
            "state": state,
            "rdzv_backend": "c10d",
            "raw_error": raw_error,
            "metadata": json.dumps(per_worker),
            "agent_restarts": restarts,
        },
    )


def _stall() -> Event:
    """The instrumented agent's training stall report: rank 1 at its line for 34 s."""
    facts = {
        "run_id": RUN,
        "state": "STALLED",
        "stalled.in": "training",
        "stalled.ranks": "1",
        "stalled.seconds": 34.0,
        "stack.frame": 'File "train.py", line 9 in step',
    }
    return Event("torchelastic.stalled", EventSource.AGENT, 0, facts)  # type: ignore[arg-type]


def _round(node: Node, rnd: int, restarts: int) -> list:
    join = node.ev(
        f"The node '{node.desc}' has joined round {rnd} of the rendezvous '{RUN}' as rank 0 "
        f"in a world of size 1.",
        NodeState.SUCCEEDED,
        rank=0,
    )
    return [node.attempt(), join, *(_at(node, _worker("START", r, restarts)) for r in (0, 1))]


def _at(node: Node, event: Event) -> tuple[float, Event]:
    node.t += 0.5
    return node.t, event


def _sequence(situation: str) -> list:
    """What torch records, in order, in ``situation`` (one node, two workers)."""
    n = Node(1)
    if situation == "rendezvous_failed":
        return [n.attempt(), n.timeout(), _at(n, _agent("FAILED", 0, RDZV_TIMEOUT))]
    rows = _round(n, 0, 0)
    final = 0
    if situation in ("succeeded_after_restart", "restarts_exhausted"):
        rows += _round(n, 1, 1)  # the failure before a restart: torch records nothing
        final = 1
    ending = {
        "run_succeeded": [_worker("SUCCEEDED", r, final) for r in (0, 1)],
        "succeeded_after_restart": [_worker("SUCCEEDED", r, final) for r in (0, 1)],
        "worker_failed_no_restart": [
            _worker("FAILED", 1, 0, ERROR_FILE),
            _worker("TERMINATED", 0),
        ],
        "restarts_exhausted": [_worker("FAILED", 1, 1, ERROR_FILE), _worker("TERMINATED", 0, 1)],
        "instrumented_peer_failed_no_restart": [
            _worker("PEER_FAILED", 1),  # the instrumented agent's, as its monitor saw it
            _worker("STOPPED", 0),
            _worker("FAILED", 1, 0, ERROR_FILE),  # then torch's final events
            _worker("TERMINATED", 0),
        ],
        "signal": [],
        "signal_during_stall": [_stall()],
    }[situation]
    agent = (
        _agent("FAILED", final, SIGNAL) if situation.startswith("signal") else _agent("SUCCEEDED")
    )
    return rows + [_at(n, e) for e in [*ending, agent]]


def _export(situation: str) -> tuple[list[SpanRecord], list[LogOut]]:
    model = TraceModel(salt="s")
    spans: list[SpanRecord] = []
    logs: list[LogOut] = []
    for created, payload in _sequence(situation):
        out = model.process(parse_event(payload, int(created * 1e9)))
        spans += out.spans
        logs += out.logs
    return spans, logs


def _rows() -> list[dict[str, str]]:
    lines = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    head = ["word", "source", "situation", "event_name", "severity", "span", "status"]
    return [
        dict(zip(head, (c.strip().strip("`") for c in line.strip("|").split("|")), strict=True))
        for line in lines
    ]


def test_the_table_has_every_situation_and_word() -> None:
    rows = _rows()
    assert len(rows) >= 14
    words = {(r["source"], r["word"]) for r in rows}
    assert {("agent", "SUCCEEDED"), ("agent", "FAILED"), ("worker", "TERMINATED")} <= words
    assert {("rendezvous", "FAILED"), ("rendezvous", "SUCCEEDED")} <= words


@pytest.mark.parametrize(
    "row", _rows(), ids=lambda r: f"{r['source']}-{r['word']}-{r['situation']}"
)
def test_each_row_is_what_the_model_exports(row: dict[str, str]) -> None:
    spans, logs = _export(row["situation"])
    if row["source"] == "rendezvous":
        mine = [lo for lo in logs if lo.event.node_state == row["word"]]
    else:
        torch_name = f"torchelastic.worker.status.{row['word']}"
        mine = [
            lo
            for lo in logs
            if lo.event.attributes.get(A.EVENT_SOURCE) == row["source"].upper()
            and lo.event.attributes.get(A.EVENT_NAME) == torch_name  # torch's name, kept
        ]
    assert mine, row
    record = mine[-1]
    log = to_log(record.event)
    assert (log.event_name, log.severity_text) == (row["event_name"], row["severity"])
    span = next(s for s in spans if s.span_id == record.span_id)
    assert (span.name, span.status) == (row["span"], row["status"])


@pytest.mark.parametrize("situation", ["worker_failed_no_restart", "restarts_exhausted"])
def test_a_failed_run_is_an_error_with_its_root_cause(situation: str) -> None:
    spans, logs = _export(situation)
    (run,) = [s for s in spans if s.name == A.SPAN_AGENT_RUN]
    (root,) = [s for s in spans if s.attributes.get(A.STATE) == "FAILED" and s.name == "worker"]
    assert run.status_message.startswith("worker global rank 1 FAILED: RuntimeError: injected")
    assert run.attributes[A.STATE] == "FAILED" and run.attributes[A.TORCH_STATE] == "SUCCEEDED"
    assert run.attributes[A.ERROR_TYPE] == CHILD_FAILED
    assert run.attributes[A.PROCESS_EXIT_CODE] == 1
    assert root.span_id in {link.span_id for link in run.links}
    agent_logs = [lo.event for lo in logs if lo.event.attributes.get(A.EVENT_SOURCE) == "AGENT"]
    assert [to_log(e).event_name for e in agent_logs] == ["torchelastic.worker.status.FAILED"]
    assert agent_logs[0].body == run.status_message


@pytest.mark.parametrize("situation", ["run_succeeded", "succeeded_after_restart"])
def test_a_run_that_succeeded_says_so(situation: str) -> None:
    spans, _ = _export(situation)
    (run,) = [s for s in spans if s.name == A.SPAN_AGENT_RUN]
    assert run.status == "OK" and run.attributes[A.PROCESS_EXIT_CODE] == 0
    assert A.TORCH_STATE not in run.attributes


def test_a_signal_during_a_stall_names_the_stalled_rank() -> None:
    spans, logs = _export("signal_during_stall")
    (run,) = [s for s in spans if s.name == A.SPAN_AGENT_RUN]
    assert re.match(
        r"stalled: global rank 1 at File \"train.py\", line 9 in step for 34 s", run.status_message
    )
    assert "got signal: 15" in run.status_message
    assert run.attributes[A.STALLED_RANKS] == (1,) and run.attributes[A.PROCESS_EXIT_CODE] == 1
    (final,) = [lo.event for lo in logs if lo.event.name.endswith("status.FAILED")]
    assert final.attributes[A.STALLED_RANKS] == (1,)


def test_a_signal_without_a_stall_and_a_rendezvous_failure() -> None:
    for situation, error in (("signal", "SignalException"), ("rendezvous_failed", "Timeout")):
        spans, _ = _export(situation)
        (run,) = [s for s in spans if s.name == A.SPAN_AGENT_RUN]
        assert run.status == "ERROR" and error in str(run.attributes[A.ERROR_TYPE])
        assert run.attributes[A.PROCESS_EXIT_CODE] == 1
