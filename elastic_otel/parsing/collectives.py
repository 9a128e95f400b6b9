"""A worker's process groups as torch's Flight Recorder has them, read by its agent.

The worker's collectives thread (:mod:`elastic_otel.worker.collectives`) writes
:data:`~elastic_otel.names.environment_variables.WORKER_COLLECTIVES_FILE` (JSON, replaced
atomically) whenever what it read changed: for each process group, the sequence number of the
last collective issued and of the last one completed, its members (global ranks), and for a
collective that stayed open a while its op and sizes; once per straggler window, when this rank
issued each collective since the last window (its arrivals, per process group, which the agent's
straggler scores compare). Whoever issued the collective (the Python API, DDP's reducer,
functional collectives, a compiled graph) torch records it there. Pure: no torch, no clock of
its own.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from elastic_otel.names.environment_variables import WORKER_COLLECTIVES_FILE

MAX_ARRIVALS = 512
"""Arrivals a worker leaves per process group and window (the newest): enough to score a
window, bounded however fast the job issues collectives."""

MAX_BYTES = 1 << 20
"""Largest collectives file read (a worker has a few process groups, each a few hundred bytes;
its member list grows with the job)."""


def poll_period(stall_after_s: float) -> float:
    """How often the agent's training watch and the workers' collectives threads look: a
    quarter of ``ELASTIC_OTEL_STALL_AFTER``, within 0.5 to 5 seconds."""
    return min(max(stall_after_s / 4, 0.5), 5.0)


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """One process group of a worker."""

    name: str  # torch's group name ("0": the default group)
    members: tuple[int, ...]  # global ranks (empty: unknown)
    issued: int  # sequence number of the last collective issued (0: none)
    completed: int  # of the last one completed
    open_since_ns: int  # when the worker first saw ``issued`` still open (0: none open)
    op: str | None  # the open collective's op ("all_reduce"), once identified
    sizes: tuple[tuple[int, ...], ...]  # its input sizes, once identified

    @property
    def open(self) -> bool:
        """A collective of this group was issued and has not completed."""
        return self.issued > self.completed


@dataclass(frozen=True, slots=True)
class CollectiveProgress:
    """What a worker's collectives file says."""

    pid: int
    progress_ns: int  # when the worker last saw any group issue or complete a collective
    groups: tuple[GroupProgress, ...]
    dumps: int  # Flight Recorder dumps written on the agent's request so far
    arrivals: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    """Per process group, (sequence number, when this rank issued it, ns) of the collectives
    issued in the last straggler window (the newest :data:`MAX_ARRIVALS` of each)."""
    window_ns: int = 0  # when the worker read those arrivals (0: never)

    def open_group(self) -> GroupProgress | None:
        """The group whose collective the worker is in: the open one issued last (a worker
        waits in one collective at a time; with several open, the newest is where it is)."""
        opened = [g for g in self.groups if g.open]
        return max(opened, key=lambda g: g.open_since_ns) if opened else None

    def group(self, name: str) -> GroupProgress | None:
        return next((g for g in self.groups if g.name == name), None)


def read_collectives(directory: str) -> CollectiveProgress | None:
    """The worker's collectives file in ``directory``; ``None`` if absent or malformed."""
    try:
        with open(os.path.join(directory, WORKER_COLLECTIVES_FILE), "rb") as f:
            data = json.loads(f.read(MAX_BYTES))
        return parse_collectives(data)
    except (OSError, ValueError):
        return None


def parse_collectives(data: object) -> CollectiveProgress | None:
    """The file's JSON object as a :class:`CollectiveProgress`; ``None`` if malformed."""
    if not isinstance(data, dict):
        return None
    try:
        groups = tuple(
            GroupProgress(
                name=str(g["name"]),
                members=tuple(int(r) for r in g.get("members") or ()),
                issued=int(g["issued"]),
                completed=int(g["completed"]),
                open_since_ns=int(g.get("open_since_ns") or 0),
                op=str(g["op"]) if g.get("op") else None,
                sizes=tuple(tuple(int(n) for n in s) for s in g.get("sizes") or ()),
            )
            for g in data["groups"]
        )
        return CollectiveProgress(
            pid=int(data["pid"]),
            progress_ns=int(data["progress_ns"]),
            groups=groups,
            dumps=int(data.get("dumps") or 0),
            arrivals=tuple(
                (str(name), tuple((int(seq), int(t)) for seq, t in pairs[-MAX_ARRIVALS:]))
                for name, pairs in (data.get("arrivals") or {}).items()
            ),
            window_ns=int(data.get("window_ns") or 0),
        )
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def op_name(profiling_name: str) -> str:
    """``gloo:all_reduce`` / ``nccl:all_reduce`` → ``all_reduce``."""
    return profiling_name.rpartition(":")[2] or profiling_name
