"""A CPU worker whose torch answers as a CUDA build in a NCCL job does, for the end-to-end tests.

In a NCCL job torch keeps every collective in NCCL's own Flight Recorder record, read only
through ``_dump_nccl_trace_json`` / ``_dump_nccl_trace``, and gloo's record is empty (checked on
an H100: ``tests/data/nccl-flight-recorder/probe.txt``). NCCL needs a GPU per rank, so on this
machine the job runs on gloo and this ``sitecustomize`` (put on the workers' ``PYTHONPATH``; the
worker start-up chains to it) moves torch's real gloo record behind the NCCL functions, with
their signatures, and leaves the gloo functions an empty record of the same shape. What is
read is torch's own record of the job; only the functions it is read through are moved.

It also gives the record NCCL's states (``tests/data/nccl-flight-recorder/README.md``): without
timing events an open collective stays ``scheduled`` and ``last_started_collective`` is ``-1``;
with them (``TORCH_NCCL_ENABLE_TIMING=1`` at start, or ``ProcessGroup._enable_collectives_timing``
at run time, from the group's next collective on) a collective the rank is inside is
``started``. ``torch.cuda._sleep``, which a GPU script calls to hold its GPU busy, holds this
rank instead: while held, the rank's next collective of the default group reads as NCCL's does
on a GPU that has not reached it, enqueued (issued) and ``scheduled``, its op and sizes those of
the group's last one.
"""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from typing import Any

import torch

_EMPTY = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}
_TRUE = ("1", "true", "yes", "on")
_timed_from: dict[str, int] = {}  # group name → its first collective with timing events
_timed_from_start = os.environ.get("TORCH_NCCL_ENABLE_TIMING", "").lower() in _TRUE
_held: list[int] = []  # ns since the GPU is "held" (empty: not held)
_lock = threading.Lock()


def _as_nccl(record: dict[str, Any]) -> dict[str, Any]:
    """gloo's record of this rank with NCCL's states, timing and a held GPU."""
    status = record.get("pg_status") or {}
    entries = list(record.get("entries") or [])
    for name, st in status.items():
        issued = int(st.get("last_enqueued_collective", -1))
        completed = _completed_in_order(entries, name, int(st.get("last_completed_collective", -1)))
        timed_from = 1 if _timed_from_start else _timed_from.get(name, 0)
        started = -1
        if timed_from and issued >= timed_from:
            started = issued  # on the CPU a rank is inside what it issued last
        if _held and name == "0":
            last = max(
                (e for e in entries if _group(e) == name and not e.get("is_p2p")),
                key=lambda e: e.get("collective_seq_id", 0),
                default=None,
            )
            if last is not None and issued == completed:  # nothing of its own open
                pending = dict(last, collective_seq_id=issued + 1, state="scheduled")
                pending.update(retired=False, time_created_ns=_held[0])
                pending["record_id"] = int(last.get("record_id", 0)) + 1
                entries.append(pending)
                issued += 1
        st = dict(st, last_enqueued_collective=issued, last_started_collective=started)
        status[name] = st
        for i, entry in enumerate(entries):
            if _group(entry) != name or entry.get("is_p2p"):
                continue
            seq = int(entry.get("collective_seq_id", 0))
            if seq <= completed:
                state = "completed"
            elif timed_from and timed_from <= seq <= started:
                state = "started"
            else:
                state = "scheduled"
            entries[i] = dict(entry, state=state)
    return {**record, "pg_status": status, "entries": entries}


def _completed_in_order(entries: list[dict[str, Any]], name: str, status: int) -> int:
    """The last collective of group ``name`` finished with all before it, as NCCL's watchdog
    counts them: from the entries' ``retired`` flags, not gloo's status (each gloo thread
    writes the collective it finished, so that goes back at times)."""
    completed = -1
    for entry in sorted(
        (e for e in entries if _group(e) == name and not e.get("is_p2p")),
        key=lambda e: e.get("collective_seq_id", 0),
    ):
        if not entry.get("retired"):
            break
        completed = int(entry.get("collective_seq_id", 0))
    return completed if completed >= 0 else status


def _group(entry: dict[str, Any]) -> str:
    return str((entry.get("process_group") or ("",))[0])


def _install() -> None:
    extension = torch._C._distributed_c10d
    gloo_json, gloo_pickle = extension._dump_fr_trace_json, extension._dump_fr_trace

    def nccl_json(includeCollectives: bool = True, onlyActive: bool = False) -> bytes:
        record = json.loads(gloo_json(True, onlyActive))
        record = _as_nccl(record)
        if not includeCollectives:
            record.pop("entries", None)
        return json.dumps(record).encode()

    def nccl_pickle(
        includeCollectives: bool = True, includeStackTraces: bool = True, onlyActive: bool = False
    ) -> bytes:
        record = _as_nccl(pickle.loads(gloo_pickle(True, includeStackTraces, onlyActive)))
        if not includeCollectives:
            record.pop("entries", None)
        return pickle.dumps(record)

    def empty_json(includeCollectives: bool = True, onlyActive: bool = False) -> bytes:
        return json.dumps(_EMPTY).encode()

    def empty_pickle(
        includeCollectives: bool = True, includeStackTraces: bool = True, onlyActive: bool = False
    ) -> bytes:
        return pickle.dumps(_EMPTY)

    extension._dump_nccl_trace_json, extension._dump_nccl_trace = nccl_json, nccl_pickle
    extension._dump_fr_trace_json, extension._dump_fr_trace = empty_json, empty_pickle

    process_group = extension.ProcessGroup
    enable = process_group._enable_collectives_timing

    def enable_timing(pg: Any) -> None:
        import torch.distributed.distributed_c10d as c10d

        name = c10d._world.pg_names.get(pg)
        status = json.loads(gloo_json(False, False)).get("pg_status") or {}
        issued = int((status.get(name) or {}).get("last_enqueued_collective", 0))
        with _lock:
            _timed_from.setdefault(str(name), max(issued, 0) + 1)
        enable(pg)

    def hold(cycles: int = 0) -> None:  # torch.cuda._sleep: the GPU held busy
        _held[:] = [time.time_ns()]
        time.sleep(600)

    process_group._enable_collectives_timing = enable_timing
    torch.cuda._sleep = hold


_install()
