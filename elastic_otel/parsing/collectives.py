"""A worker's process groups as torch's Flight Recorder has them, read by its agent.

The worker's collectives thread (:mod:`elastic_otel.worker.collectives`) writes
:data:`~elastic_otel.names.environment_variables.WORKER_COLLECTIVES_FILE` (JSON, replaced
atomically) whenever what it read changed: for each process group of each backend's record
(gloo's, NCCL's), the sequence numbers of the last collective issued, started on the device
(where the record tracks it) and completed, its members (global ranks), and for a collective
that stayed open a while its op, sizes and state; once per straggler window, when this rank
issued each collective since the last one and, where the record times them, its device's time
inside each one completed (for the agent's straggler scores). Whoever issued the collective
(the Python API, DDP's reducer, a compiled graph) torch records it there. Pure: no torch.
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


SCHEDULED = "scheduled"
"""A collective's state in the record: issued (enqueued on a GPU), not yet started there."""
STARTED = "started"
"""Started by the device, not completed: inside the collective, waiting for its peers."""
STATES = (SCHEDULED, STARTED)


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """One process group of a worker, as one backend's record has it."""

    name: str  # torch's group name ("0": the default group)
    members: tuple[int, ...]  # global ranks (empty: unknown)
    issued: int  # sequence number of the last collective issued (0: none)
    completed: int  # of the last one completed
    open_since_ns: int  # when the worker first saw ``issued`` still open (0: none open)
    op: str | None  # the first open collective's op ("all_reduce"), once identified
    sizes: tuple[tuple[int, ...], ...]  # its input sizes, once identified
    backend: str = ""  # the record it comes from ("gloo", "nccl"; "": not said)
    started: int = -1  # of the last one the device started (-1: the record does not track it)
    state: str | None = None  # the first open one's, once identified: SCHEDULED or STARTED

    @property
    def open(self) -> bool:
        """A collective of this group was issued and has not completed."""
        return self.issued > self.completed

    @property
    def key(self) -> str:
        """Identifies the group across ranks: the backend's records number collectives
        separately, so a group with two backends (``cpu:gloo,cuda:nccl``) is two keys."""
        return group_key(self.name, self.backend)

    @property
    def first_open(self) -> int:
        """The collective the rank waits in: the oldest not completed (with NCCL a rank may
        have enqueued more behind it); 0 when none is open."""
        return self.completed + 1 if self.open else 0

    def state_of(self, number: int) -> str | None:
        """SCHEDULED or STARTED for an open collective ``number`` where the record tracks the
        device's start; ``None`` where it does not (gloo; NCCL without timing events)."""
        if number > self.issued or number <= self.completed:
            return None
        if number == self.first_open and self.state is not None:
            return self.state  # read from the entry itself: fresher than the status
        if self.started < 0:
            return None
        return STARTED if number <= self.started else SCHEDULED


def group_key(name: str, backend: str) -> str:
    """``name`` for a group of one backend's record, ``backend:name`` once the backend is said
    (see :attr:`GroupProgress.key`)."""
    return f"{backend}:{name}" if backend else name


def group_name(key: str) -> str:
    """torch's group name in a :func:`group_key`."""
    return key.rpartition(":")[2]


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
    durations: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    """Per process group, (sequence number, ns its device spent inside it) of the collectives
    completed since the last window, where the record times them (NCCL with timing events;
    the newest :data:`MAX_ARRIVALS` of each; absent from older files)."""

    def open_group(self) -> GroupProgress | None:
        """The group whose collective the worker is in: the open one issued last (a worker
        waits in one collective at a time; with several open, the newest is where it is)."""
        opened = [g for g in self.groups if g.open]
        return max(opened, key=lambda g: g.open_since_ns) if opened else None

    def group(self, name: str, backend: str | None = None) -> GroupProgress | None:
        """Group ``name`` (of ``backend`` where given; else the first record's)."""
        return next(
            (g for g in self.groups if g.name == name and backend in (None, g.backend)), None
        )


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
                backend=str(g.get("backend") or ""),
                started=int(g.get("started", -1)),
                state=g["state"] if g.get("state") in STATES else None,
            )
            for g in data["groups"]
        )
        return CollectiveProgress(
            pid=int(data["pid"]),
            progress_ns=int(data["progress_ns"]),
            groups=groups,
            dumps=int(data.get("dumps") or 0),
            arrivals=_pairs(data.get("arrivals")),
            window_ns=int(data.get("window_ns") or 0),
            durations=_pairs(data.get("durations")),
        )
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def _pairs(data: object) -> tuple[tuple[str, tuple[tuple[int, int], ...]], ...]:
    """Per group key, its (sequence number, ns) pairs, the newest :data:`MAX_ARRIVALS`."""
    if not data:
        return ()
    if not isinstance(data, dict):
        raise ValueError("not an object")
    return tuple(
        (str(name), tuple((int(seq), int(t)) for seq, t in pairs[-MAX_ARRIVALS:]))
        for name, pairs in data.items()
    )


def device_ns(entry: dict[str, object]) -> int | None:
    """The ns a completed collective spent inside on its device (``duration_ms``: from CUDA
    timing events, NCCL with ``TORCH_NCCL_ENABLE_TIMING=1``); ``None`` where not timed."""
    duration = entry.get("duration_ms")
    if entry.get("state") != "completed" or isinstance(duration, bool):
        return None
    if not isinstance(duration, int | float) or not 0 <= duration < 1e9:  # NaN fails too
        return None
    return round(duration * 1e6)


def dump_path(path: str, backend: str) -> str:
    """Where a second record's dump goes beside the first's ``path`` (a job with two
    backends): ``elastic_otel_flight_recorder.gloo.pkl``."""
    stem, dot, suffix = path.rpartition(".")
    return f"{stem}.{backend}{dot}{suffix}"


def op_name(profiling_name: str) -> str:
    """``gloo:all_reduce`` / ``nccl:all_reduce`` → ``all_reduce``."""
    return profiling_name.rpartition(":")[2] or profiling_name
