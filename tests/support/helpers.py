"""Helpers several test modules share: torch event builders and lookups in exported items."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch.distributed.elastic.events import Event, EventSource, NodeState, RdzvEvent

from elastic_otel.model.spans import SpanRecord
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.parsing.torch_events import parse_event

RUN = "job-7"
CONFIGURATION_DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def documented_defaults() -> dict[str, str]:
    """``ELASTIC_OTEL_*`` (and ``OTEL_SEMCONV_*``) variable → its default column in
    docs/configuration.md."""
    rows = {}
    for line in CONFIGURATION_DOC.read_text().splitlines():
        match = re.match(r"^\| `((?:ELASTIC_OTEL|OTEL_SEMCONV)_[A-Z_]+)` \|([^|]*)\|", line)
        if match:
            rows[match.group(1)] = match.group(2).strip()
    return rows


def as_documented(value: object) -> str:
    """A default as docs/configuration.md writes it (``unset``, `` `true` ``, `` `2` ``)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def by_name(spans: list[SpanRecord], name: str) -> list[SpanRecord]:
    """The model's span records called ``name``."""
    return [s for s in spans if s.name == name]


def attr(item: dict, key: str) -> Any:
    """An attribute of a record or span as the OTLP receiver decodes it."""
    return item["attributes"].get(key)


class Node:
    """Builds real RdzvEvents for one node, with torch's exact message texts."""

    def __init__(self, pid: int, run_id: str = RUN, host: str = "h") -> None:
        self.pid, self.run_id, self.host = pid, run_id, host
        self.t = 1000.0
        self.desc = f"{host}_{pid}_0"

    def ev(
        self,
        message: str,
        state: NodeState = NodeState.RUNNING,
        rank: int | None = None,
        trace: str = "",
    ) -> tuple[float, RdzvEvent]:
        self.t += 0.5
        return self.t, RdzvEvent(
            name="dynamic_rendezvous.py:x",
            run_id=self.run_id,
            message=message,
            hostname=self.host,
            pid=self.pid,
            node_state=state,
            rank=rank,
            local_id=0,
            error_trace=trace,
        )

    def attempt(self):
        return self.ev(
            f"The node '{self.desc}' attempts to join the next round of the "
            f"rendezvous '{self.run_id}'."
        )

    def participant(self, rnd: int):
        return self.ev(
            f"The node '{self.desc}' added itself to the participants of round {rnd} "
            f"of the rendezvous '{self.run_id}'. Pending sync."
        )

    def joined(self, rnd: int, rank: int, world: int):
        return self.ev(
            f"The node '{self.desc}' has joined round {rnd} of the rendezvous "
            f"'{self.run_id}' as rank {rank} in a world of size {world}.",
            rank=rank,
        )

    def keep_alive(self):
        return self.ev(
            f"The node '{self.desc}' has sent a keep-alive heartbeat to the "
            f"rendezvous '{self.run_id}'."
        )

    def heartbeat_triple(self):
        """What torch records per keep-alive: update, sync, then the heartbeat itself."""
        return [
            self.ev(
                f"The node '{self.desc}' updated its keep-alive heartbeat time for the "
                f"rendezvous '{self.run_id}'. Pending sync."
            ),
            self.ev(
                f"The node '{self.desc}' has successfully synced its local changes with other "
                f"nodes in the rendezvous '{self.run_id}'."
            ),
            self.keep_alive(),
        ]

    def timeout(self):
        return self.ev("RendezvousTimeoutError: ", NodeState.FAILED, trace="Traceback ...")

    def closed(self):
        return self.ev(
            f"The node '{self.desc}' has closed the rendezvous '{self.run_id}'.",
            NodeState.SUCCEEDED,
        )


def feed(model: TraceModel, rows: list[tuple[float, object]]):
    """Run ``(created, event)`` rows through the parser and ``model``: its spans and logs."""
    spans: list[SpanRecord] = []
    logs = []
    for created, payload in rows:
        out = model.process(parse_event(payload, int(created * 1e9)))
        spans += out.spans
        logs += out.logs
    return spans, logs


def worker(t: float, state: str, global_rank: int, restarts: int, run_id: str = RUN):
    """A ``(created, Event)`` row: torch's worker status event of one rank."""
    return t, Event(
        f"torchelastic.worker.status.{state}",
        EventSource.WORKER,
        0,
        {
            "run_id": run_id,
            "global_rank": global_rank,
            "group_rank": 0,
            "state": state,
            "agent_restarts": restarts,
            "role": "default",
            "metadata": "{}",
        },
    )
