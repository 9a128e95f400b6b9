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
import math
import os
import re
from dataclasses import dataclass
from typing import Any

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
    timed_from: int = 0  # the first collective with NCCL timing events (0: none known)

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
        if 0 < number < self.timed_from:
            return None  # enqueued before timing was turned on: it never gets a start event
        if number == self.first_open and self.state is not None:
            return self.state  # read from the entry itself: fresher than the status
        if self.started < 0 and not 0 < self.timed_from <= number:
            return None  # not tracked (gloo; NCCL without timing)
        return STARTED if number <= self.started else SCHEDULED


def group_key(name: str, backend: str) -> str:
    """``name`` for a group of one backend's record, ``backend:name`` once the backend is said
    (see :attr:`GroupProgress.key`)."""
    return f"{backend}:{name}" if backend else name


def group_name(key: str) -> str:
    """torch's group name in a :func:`group_key`."""
    return key.rpartition(":")[2]


TIMING_WITHIN_BUDGET = "within_budget"
"""Why NCCL timing is on: the measured collective rate times the cost per collective is within
the budget (``ELASTIC_OTEL_NCCL_TIMING=auto``)."""
TIMING_OVER_BUDGET = "over_budget"
TIMING_MEASURING = "measuring"
"""Off while ``auto`` still measures the collective rate."""
TIMING_FORCED = "forced"
"""``ELASTIC_OTEL_NCCL_TIMING`` is ``true`` or ``false``."""
TIMING_SET_BY_JOB = "set_by_job"
"""The job set ``TORCH_NCCL_ENABLE_TIMING`` itself."""
TIMING_NOT_AT_RUN_TIME = "not_at_run_time"
"""This torch cannot turn timing on at run time (no ``ProcessGroup._enable_collectives_timing``)."""
TIMING_REASONS = (
    TIMING_WITHIN_BUDGET,
    TIMING_OVER_BUDGET,
    TIMING_MEASURING,
    TIMING_FORCED,
    TIMING_SET_BY_JOB,
    TIMING_NOT_AT_RUN_TIME,
)


@dataclass(frozen=True, slots=True)
class NcclTiming:
    """A worker's NCCL timing events, on or off, and why (``ELASTIC_OTEL_NCCL_TIMING``)."""

    on: bool
    reason: str  # one of TIMING_REASONS
    rate: float | None = None  # collectives a second measured (auto)
    share_percent: float | None = None  # what timing costs at that rate: % of wall time
    budget_percent: float | None = None
    cost_us: float | None = None  # per collective, as configured

    @property
    def state(self) -> str:
        return "on" if self.on else "off"

    def as_json(self) -> dict[str, object]:
        return {
            "on": self.on,
            "reason": self.reason,
            "rate": self.rate,
            "share_percent": self.share_percent,
            "budget_percent": self.budget_percent,
            "cost_us": self.cost_us,
        }


def parse_nccl_timing(data: object) -> NcclTiming | None:
    """:meth:`NcclTiming.as_json`'s object read back; ``None`` if absent or malformed."""
    if not isinstance(data, dict) or data.get("reason") not in TIMING_REASONS:
        return None
    if not isinstance(data.get("on"), bool):
        return None
    return NcclTiming(
        data["on"],
        str(data["reason"]),
        _non_negative(data.get("rate")),
        _non_negative(data.get("share_percent")),
        _non_negative(data.get("budget_percent")),
        _non_negative(data.get("cost_us")),
    )


def _non_negative(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        return None  # NaN fails too
    return float(value)


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
    nccl_timing: NcclTiming | None = None  # absent until the worker has a NCCL group
    open_share: tuple[tuple[str, int, int], ...] = ()
    """Per process group, over the last straggler window: (key, samples with a collective open,
    samples), from the worker's sampling of the record's status (absent from older files)."""
    transfers: tuple[PeerTransfers, ...] = ()
    """This rank's point-to-point sends and receives its device timed over the last straggler
    window, per process group, op and peer (absent from older files)."""

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
                timed_from=int(g.get("timed_from") or 0),
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
            nccl_timing=parse_nccl_timing(data.get("nccl_timing")),
            open_share=_shares(data.get("open_share")),
            transfers=_transfers(data.get("transfers")),
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


def _shares(data: object) -> tuple[tuple[str, int, int], ...]:
    """Per group key, (samples open, samples): both non-negative, open at most samples."""
    if not data:
        return ()
    if not isinstance(data, dict):
        raise ValueError("not an object")
    out = []
    for name, (opened, samples) in list(data.items())[:MAX_GROUPS_SHARED]:
        opened, samples = int(opened), int(samples)
        if not 0 <= opened <= samples:
            raise ValueError("not a share")
        out.append((str(name), opened, samples))
    return tuple(out)


MAX_GROUPS_SHARED = 64
"""Process groups whose open share is read from one worker's file."""


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


@dataclass(frozen=True, slots=True)
class PeerTransfers:
    """A rank's sends to (or receives from) one peer over one window, as its device timed them
    (NCCL with timing events: torch's gloo records no sends or receives)."""

    key: str  # the process group's key
    op: str  # SEND or RECV
    peer: int  # the peer's global rank
    count: int
    bytes: int
    device_ns: int  # the device's time inside them, all together
    best_rate: float  # bytes a second of the fastest (the one that waited least for its peer)

    def as_json(self) -> list[object]:
        rate = round(self.best_rate)
        return [self.key, self.op, self.peer, self.count, self.bytes, self.device_ns, rate]


SEND = "send"
RECV = "recv"
_P2P_NAME = re.compile(r"^\w+:(send|recv) (\d+)(?:->|<-)(\d+)$")
MAX_TRANSFERS = 256
"""(group, op, peer) entries a worker leaves per window: a pipeline stage has a few peers."""

DTYPE_BYTES = {
    "Bool": 1, "Byte": 1, "Char": 1, "QInt8": 1, "QUInt8": 1, "QUInt4x2": 1, "QUInt2x4": 1,
    "Float8_e5m2": 1, "Float8_e4m3fn": 1, "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1,
    "Float8_e8m0fnu": 1, "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2, "Int": 4,
    "Float": 4, "QInt32": 4, "UInt32": 4, "ComplexHalf": 4, "Long": 8, "Double": 8,
    "UInt64": 8, "ComplexFloat": 8, "ComplexDouble": 16,
}  # fmt: skip
"""Bytes per element of the Flight Recorder's ``input_dtypes`` (c10's scalar type names)."""


def p2p_peer(profiling_name: str) -> tuple[str, int] | None:
    """NCCL's ``nccl:send 0->1`` / ``nccl:recv 1<-0`` → (SEND or RECV, the peer's rank in the
    group); ``None`` for any other name (a coalesced batch of them has one name for all)."""
    found = _P2P_NAME.match(profiling_name)
    return (found.group(1), int(found.group(3))) if found else None


def entry_bytes(entry: dict[str, object]) -> int | None:
    """The bytes an entry's inputs hold (``input_sizes`` by ``input_dtypes``); ``None`` where a
    dtype is unknown or the two do not match."""
    sizes, dtypes = entry.get("input_sizes"), entry.get("input_dtypes")
    if not isinstance(sizes, list) or not isinstance(dtypes, list) or len(sizes) != len(dtypes):
        return None
    total = 0
    for shape, dtype in zip(sizes, dtypes, strict=True):
        width = DTYPE_BYTES.get(str(dtype))
        if width is None or not isinstance(shape, list):
            return None
        total += math.prod(int(n) for n in shape) * width
    return total


def _transfers(data: object) -> tuple[PeerTransfers, ...]:
    """:meth:`PeerTransfers.as_json` rows read back (counts and sizes non-negative)."""
    if not data:
        return ()
    if not isinstance(data, list):
        raise ValueError("not a list")
    out = []
    for key, op, peer, count, size, inside, best in data[:MAX_TRANSFERS]:
        numbers = int(peer), int(count), int(size), int(inside)
        row = PeerTransfers(str(key), str(op), *numbers, float(best))
        if row.op not in (SEND, RECV) or min(row.peer, row.count, row.bytes, row.device_ns) < 0:
            raise ValueError("not a transfer")
        if not (math.isfinite(row.best_rate) and row.best_rate >= 0):
            raise ValueError("not a rate")
        out.append(row)
    return tuple(out)


def entry_group(entry: dict[str, Any]) -> str:
    """The name of the process group a Flight Recorder entry belongs to (``""``: none given)."""
    return str((entry.get("process_group") or ("",))[0])


def group_collectives(entries: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The collectives (not sends or receives) of process group ``name`` among a Flight
    Recorder record's ``entries``, in the record's order."""
    return [e for e in entries if entry_group(e) == name and not e.get("is_p2p")]


def collective_entry(
    entries: list[dict[str, Any]], name: str, number: int
) -> dict[str, Any] | None:
    """Group ``name``'s collective #``number`` among ``entries`` (the newest such), or ``None``."""
    found = [e for e in group_collectives(entries, name) if e.get("collective_seq_id") == number]
    return found[-1] if found else None


def op_name(profiling_name: str) -> str:
    """``gloo:all_reduce`` / ``nccl:all_reduce`` → ``all_reduce``."""
    return profiling_name.rpartition(":")[2] or profiling_name
