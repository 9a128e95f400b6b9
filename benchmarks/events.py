"""The event stream every section replays: real torch ``Event`` / ``RdzvEvent`` objects.

Two sources, both turned into torch objects and serialized by torch itself:

* the events captured from a real two-agent torchrun job (``tests/data/restart_node*.tsv``,
  with a failure, a restart and keep-alives), deserialized with ``Event.deserialize`` /
  ``RdzvEvent.deserialize`` and given a fresh run id per repetition;
* synthetic node lifecycles built with the same constructors, fields and message texts as
  torch's agent (``_construct_event``) and ``dynamic_rendezvous`` use: join, agent steps,
  worker start, keep-alive rounds (three events each), worker end (some failing), close.

For the million-event runs, :func:`bulk_payloads` serializes one lifecycle per template
with torch and substitutes the run id in the JSON text, which gives byte-identical output
to serializing each event (checked by :func:`check_templates`) without 1M ``asdict`` calls.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

from benchmarks.common import TESTS

DATA = TESTS / "data"
CAPTURED_FILES = ("restart_node0.tsv", "restart_node1.tsv")
_CAPTURED_RUN_ID = "job-cap"
_TEMPLATE_RUN_ID = "RUNIDTEMPLATE0000"

TorchEvent = Any  # torch.distributed.elastic.events.Event | RdzvEvent


def _torch_events() -> Any:
    from torch.distributed.elastic import events

    return events


def captured_rows(name: str) -> list[tuple[float, str]]:
    """(created, JSON text) pairs exactly as captured."""
    rows = []
    for line in (DATA / name).read_text().splitlines():
        created, _, payload = line.partition("\t")
        rows.append((float(created), payload))
    return rows


def captured_objects(name: str, run_id: str = _CAPTURED_RUN_ID, pid_offset: int = 0) -> list:
    """The captured events of one agent as torch objects, moved to ``run_id``."""
    ev = _torch_events()
    out = []
    for _, text in captured_rows(name):
        data = json.loads(text)
        if "node_state" in data:
            obj = ev.RdzvEvent.deserialize(text)
            node = f"{obj.hostname}_{obj.pid}_{obj.local_id}"
            new_pid = obj.pid + pid_offset
            new_node = f"{obj.hostname}_{new_pid}_{obj.local_id}"
            message = obj.message.replace(node, new_node).replace(
                f"'{_CAPTURED_RUN_ID}'", f"'{run_id}'"
            )
            message = message.replace(f"Process {obj.pid} ", f"Process {new_pid} ")
            obj = dataclasses.replace(obj, run_id=run_id, pid=new_pid, message=message)
        else:
            obj = ev.Event.deserialize(text)
            metadata = dict(obj.metadata)
            metadata["run_id"] = run_id
            obj = dataclasses.replace(obj, metadata=metadata)
        out.append(obj)
    return out


# --- synthetic lifecycles -------------------------------------------------------------------


class Node:
    """Builds a node's events the way torch's agent and dynamic_rendezvous do."""

    def __init__(
        self, run_id: str, hostname: str, pid: int, local_id: int = 0, group_rank: int = 0
    ) -> None:
        self.ev = _torch_events()
        self.run_id, self.hostname, self.pid, self.local_id = run_id, hostname, pid, local_id
        self.group_rank = group_rank
        self.node = f"{hostname}_{pid}_{local_id}"

    def rdzv(self, where: str, message: str, state: str = "RUNNING", rank: int | None = None):
        return self.ev.RdzvEvent(
            name=f"dynamic_rendezvous.py:{where}",
            run_id=self.run_id,
            message=message,
            hostname=self.hostname,
            pid=self.pid,
            node_state=self.ev.NodeState[state],
            master_endpoint="",
            rank=rank,
            local_id=self.local_id,
            error_trace="",
        )

    def agent(
        self,
        state: str,
        source: str = "AGENT",
        global_rank: int | None = None,
        worker_id: str | None = None,
        restarts: int = 0,
        duration_ms: float | None = None,
        raw_error: str | None = None,
        world: int = 2,
        nproc: int = 2,
    ):
        md: dict[str, Any] = {"group_world_size": world if source == "WORKER" else None}
        md["entry_point"] = "python3"
        if source == "WORKER":
            local = (global_rank or 0) % nproc
            md.update(
                local_rank=[local],
                role_rank=[global_rank],
                role_world_size=[world * nproc],
                exit_code=[1 if state == "FAILED" else None],
                worker_pid=[None],
            )
        metadata = {
            "run_id": self.run_id,
            "global_rank": global_rank,
            "group_rank": self.group_rank if source == "WORKER" or state != "RENDEZVOUS" else None,
            "worker_id": worker_id,
            "role": "default",
            "hostname": self.hostname,
            "state": state,
            "total_run_time": 0 if state in ("RENDEZVOUS", "ASSIGN_WORKER_RANKS", "START") else 16,
            "rdzv_backend": "c10d",
            "raw_error": raw_error,
            "metadata": json.dumps(md),
            "agent_restarts": restarts,
            "duration_ms": duration_ms,
        }
        return self.ev.Event(
            name=f"torchelastic.worker.status.{state}",
            source=self.ev.EventSource[source],
            timestamp=0,
            metadata=metadata,
        )

    def join(self, rnd: int, rank: int, world: int) -> list:
        n, r = self.node, self.run_id
        return [
            self.rdzv(
                "DynamicRendezvousHandler.next_rendezvous",
                f"The node '{n}' attempts to join the next round of the rendezvous '{r}'.",
            ),
            self.rdzv(
                "_DistributedRendezvousOpExecutor._add_to_participants",
                f"The node '{n}' added itself to the participants of round {rnd} of the "
                f"rendezvous '{r}'. Pending sync.",
            ),
            *self.keep_alive()[:2],
            self.rdzv(
                "DynamicRendezvousHandler.next_rendezvous",
                f"The node '{n}' has joined round {rnd} of the rendezvous '{r}' as rank {rank} "
                f"in a world of size {world}.",
                rank=rank,
            ),
        ]

    def keep_alive(self) -> list:
        """One keep-alive: the three events torch records for it."""
        n, r = self.node, self.run_id
        return [
            self.rdzv(
                "_DistributedRendezvousOpExecutor._keep_alive",
                f"The node '{n}' updated its keep-alive heartbeat time for the rendezvous "
                f"'{r}'. Pending sync.",
            ),
            self.rdzv(
                "_DistributedRendezvousOpExecutor.run",
                f"The node '{n}' has successfully synced its local changes with other nodes in "
                f"the rendezvous '{r}'.",
            ),
            self.rdzv(
                "DynamicRendezvousHandler._keep_alive",
                f"The node '{n}' has sent a keep-alive heartbeat to the rendezvous '{r}'.",
            ),
        ]

    def close(self) -> list:
        n, r = self.node, self.run_id
        return [
            self.rdzv(
                "_DistributedRendezvousOpExecutor._mark_rendezvous_closed",
                f"The node '{n}' marked the rendezvous '{r}' as closed. Pending sync.",
                state="SUCCEEDED",
            ),
            self.keep_alive()[1],
            self.rdzv(
                "DynamicRendezvousHandler._close",
                f"The node '{n}' has closed the rendezvous '{r}'.",
                state="SUCCEEDED",
            ),
        ]


def _error_file(message: str) -> str:
    """A worker error file's JSON, as torch's ``@record`` writes it."""
    return json.dumps(
        {
            "message": {
                "message": message,
                "extraInfo": {
                    "py_callstack": "Traceback (most recent call last):\n"
                    '  File "train.py", line 31, in main\n'
                    f"    raise {message.split(':')[0]}(...)\n{message}\n",
                    "timestamp": "1795303450",
                },
            }
        }
    )


def node_lifecycle(
    run_id: str,
    hostname: str = "node-0001",
    pid: int = 4242,
    nproc: int = 2,
    world: int = 2,
    keepalives: int = 3,
    fail: bool = False,
    close: bool = True,
) -> list:
    """One agent's events for one rendezvous round: join → workers → keep-alives → end."""
    node = Node(run_id, hostname, pid, group_rank=0)
    out = node.join(0, 0, world)
    out.append(node.agent("RENDEZVOUS", duration_ms=1033.1))
    out.append(node.agent("ASSIGN_WORKER_RANKS", duration_ms=6.6))
    for g in range(nproc):
        out.append(node.agent("START", "WORKER", g, str(pid + 1 + g), world=world, nproc=nproc))
    for _ in range(keepalives):
        out.extend(node.keep_alive())
    for g in range(nproc):
        state = "FAILED" if fail and g == nproc - 1 else "SUCCEEDED"
        raw = _error_file(f"RuntimeError: injected failure on rank {g}") if fail else None
        worker_id = str(pid + 1 + g)
        out.append(
            node.agent(state, "WORKER", g, worker_id, raw_error=raw if state == "FAILED" else None,
                       world=world, nproc=nproc)
        )  # fmt: skip
    if close:
        out.append(node.agent("FAILED" if fail else "SUCCEEDED"))
        out.extend(node.close())
    return out


# --- streams --------------------------------------------------------------------------------


def mixed_objects(n: int) -> list:
    """``n`` torch event objects: captured agents and synthetic lifecycles, run ids rotating.

    One block = both captured agents (74 events) + one lifecycle with 8 keep-alives + one
    failing lifecycle with 2 keep-alives; blocks repeat with new run ids until ``n``.
    """
    out: list = []
    block = 0
    while len(out) < n:
        run_id = f"bench-job-{block:06d}"
        for i, name in enumerate(CAPTURED_FILES):
            out.extend(captured_objects(name, run_id, pid_offset=block * 10 + i))
        out.extend(node_lifecycle(f"{run_id}-a", "node-0002", 7000 + block, keepalives=8))
        out.extend(
            node_lifecycle(f"{run_id}-b", "node-0003", 9000 + block, keepalives=2, fail=True)
        )
        block += 1
    return out[:n]


def describe(objects: list) -> dict[str, int]:
    """How many events of each kind a stream holds (for the report)."""
    counts: Counter[str] = Counter()
    for obj in objects:
        if hasattr(obj, "node_state"):
            msg = obj.message
            if "keep-alive" in msg or "successfully synced" in msg:
                counts["rendezvous keep-alive/sync"] += 1
            else:
                counts["rendezvous other"] += 1
        elif obj.source.name == "WORKER":
            counts["worker"] += 1
        else:
            counts["agent"] += 1
    return dict(counts)


def serialize(objects: list) -> list[str]:
    """What torch hands its handlers: ``obj.serialize()``."""
    return [obj.serialize() for obj in objects]


def _templates(events_per_run: int, open_ended: bool) -> list[str]:
    """One lifecycle serialized by torch with a placeholder run id, cut to a length."""
    if open_ended:
        # Join, agent steps, workers start, keep-alives: spans stay open (worst case for state).
        objs = node_lifecycle(_TEMPLATE_RUN_ID, keepalives=max(1, events_per_run), close=False)
    else:
        objs = node_lifecycle(_TEMPLATE_RUN_ID, keepalives=max(1, events_per_run // 3))
    return serialize(objs)[:events_per_run]


def check_templates(events_per_run: int = 10, open_ended: bool = True) -> bool:
    """Substituting the run id in the JSON gives exactly what torch would serialize."""
    run_id = "bench-run-0000042"
    direct = serialize(
        node_lifecycle(run_id, keepalives=max(1, events_per_run), close=False)
        if open_ended
        else node_lifecycle(run_id, keepalives=max(1, events_per_run // 3))
    )[:events_per_run]
    templates = _templates(events_per_run, open_ended)
    return direct == [t.replace(_TEMPLATE_RUN_ID, run_id) for t in templates]


def bulk_payloads(
    total: int, runs: int, events_per_run: int = 10, open_ended: bool = True
) -> Iterator[str]:
    """``total`` JSON payloads, ``events_per_run`` per run id, cycling over ``runs`` run ids."""
    templates = _templates(events_per_run, open_ended)
    produced = 0
    run = 0
    while produced < total:
        run_id = f"bench-run-{run % runs:07d}"
        for text in templates:
            if produced >= total:
                return
            yield text.replace(_TEMPLATE_RUN_ID, run_id)
            produced += 1
        run += 1


def keep_alive_triple_sizes() -> list[int]:
    """Serialized sizes (bytes) of the three events of one keep-alive."""
    return [len(t.encode()) for t in serialize(Node("job-4096", "node-0001", 4242).keep_alive())]
