"""Collective progress from the process group's own record, for the agent to read.

DDP's reducer, FSDP2, tensor parallelism and compiled graphs issue collectives that never pass
through the Python functions :mod:`elastic_otel.worker.progress` wraps; torch's Flight Recorder
records every one. A daemon thread of the worker reads it (a cheap status read per poll, the
whole record only for a collective that stays open, a dump or a straggler window) and leaves
what it found for the agent; the training thread does nothing for any of it.
Design: ``docs/hangs.md`` (The Flight Recorder, and what reading it costs).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import sys
import threading
import time
from typing import Any

from elastic_otel.config.environment import env_flag, env_float
from elastic_otel.names.environment_variables import (
    DEFAULT_STALL_AFTER_S,
    DEFAULT_STRAGGLER_WINDOW_S,
    ELASTIC_OTEL_FLIGHT_RECORDER,
    ELASTIC_OTEL_STALL_AFTER,
    ELASTIC_OTEL_STRAGGLER_WINDOW,
    WORKER_COLLECTIVES_FILE,
    WORKER_FLIGHT_RECORDER_FILE,
    WORKER_REQUESTS_FIFO,
)
from elastic_otel.parsing.collectives import MAX_ARRIVALS, op_name, poll_period

C10D_MODULE = "torch.distributed.distributed_c10d"
THREAD_NAME = "elastic-otel-collectives"


def start(directory: str) -> threading.Thread | None:
    """Start the worker's collectives thread, writing into ``directory`` (unless
    ``ELASTIC_OTEL_FLIGHT_RECORDER=false`` or stall reports are off); the thread, or ``None``."""
    stall_after = env_float(ELASTIC_OTEL_STALL_AFTER, DEFAULT_STALL_AFTER_S)
    if not env_flag(ELASTIC_OTEL_FLIGHT_RECORDER, True) or stall_after <= 0:
        return None
    fifo = os.path.join(directory, WORKER_REQUESTS_FIFO)
    if not os.path.exists(fifo):
        os.mkfifo(fifo, 0o600)
    # Read and write: a FIFO open for reading alone reads end-of-file whenever no writer has
    # it open, which select() reports as ready, forever.
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    window = max(env_float(ELASTIC_OTEL_STRAGGLER_WINDOW, DEFAULT_STRAGGLER_WINDOW_S), 0.0)
    # Looking twice per window keeps each window's read within half a window of its time.
    period = min(poll_period(stall_after), window / 2) if window > 0 else poll_period(stall_after)
    watch = CollectivesWatch(directory, period, stall_after / 2, window)
    thread = threading.Thread(target=watch.run, args=(fd,), name=THREAD_NAME, daemon=True)
    thread.start()
    return thread


class CollectivesWatch:
    """Reads the Flight Recorder's status of every process group; owns the collectives file."""

    def __init__(
        self, directory: str, period_s: float, identify_after_s: float, window_s: float = 0.0
    ) -> None:
        self.path = os.path.join(directory, WORKER_COLLECTIVES_FILE)
        self.dump_path = os.path.join(directory, WORKER_FLIGHT_RECORDER_FILE)
        self.period_s = period_s
        self.identify_after_ns = int(identify_after_s * 1e9)
        self.pid = os.getpid()
        self.groups: dict[str, dict[str, Any]] = {}
        self.progress_ns = 0
        self.dumps = 0
        self.window_ns = int(window_s * 1e9)
        self.window_read_ns = 0  # when the arrivals were last read (0: not yet)
        self.arrivals: dict[str, list[tuple[int, int]]] = {}
        self._last_seq: dict[str, int] = {}  # per group: the newest arrival already left
        self._written: str | None = None

    def run(self, fd: int) -> None:
        while os.getpid() == self.pid:  # not in a forked child (the thread is not there)
            ready, _, _ = select.select([fd], [], [], self.period_s)
            asked = False
            if ready:
                with contextlib.suppress(BlockingIOError):
                    asked = bool(os.read(fd, 64))
            with contextlib.suppress(Exception):  # never the worker's problem
                self.poll(time.time_ns(), asked)

    def poll(self, now_ns: int, dump: bool = False) -> None:
        """Read every group's status; identify collectives open long enough; dump on request;
        write the file when anything changed."""
        c10d = sys.modules.get(C10D_MODULE)
        if c10d is None or not c10d.is_initialized():
            return
        extension = sys.modules["torch"]._C._distributed_c10d
        dump_json = getattr(extension, "_dump_fr_trace_json", None)
        if dump_json is None:  # torch before the Flight Recorder's JSON dump: nothing to read
            return
        status = json.loads(dump_json(False))
        changed = self._update(c10d, status.get("pg_status") or {}, now_ns)
        if changed:
            self.progress_ns = now_ns
        # Identified once per open collective (tried once: a record without it, say with
        # TORCH_FR_BUFFER_SIZE=0, must not cost a whole read every poll).
        stuck = [
            g
            for g in self.groups.values()
            if g["open_since_ns"]
            and g["_tried"] != g["issued"]
            and now_ns - g["open_since_ns"] >= self.identify_after_ns
        ]
        # The window's read: only once a collective was issued (an empty record, say with
        # TORCH_FR_BUFFER_SIZE=0, stops the reads for good: window_ns set to 0 below).
        window = (
            self.window_ns > 0
            and any(g["issued"] for g in self.groups.values())
            and now_ns - self.window_read_ns >= self.window_ns
        )
        if dump or stuck or window:
            # No stack traces: symbolizing them holds the GIL for seconds on the first dump.
            raw = extension._dump_fr_trace(includeStackTraces=False)
            record = pickle.loads(raw)  # torch's own bytes, from this process
            if window:
                self._arrive(record.get("entries") or [], now_ns)
            if dump:
                self._write(self.dump_path, pickle.dumps(self._complete(record)))
                self.dumps += 1
            self._identify(record.get("entries") or [])
            for group in stuck:
                group["_tried"] = group["issued"]
        self._publish()

    def _update(self, c10d: Any, pg_status: dict[str, Any], now_ns: int) -> bool:
        changed = False
        for name, st in pg_status.items():
            issued = int(st.get("last_enqueued_collective", -1))
            completed = int(st.get("last_completed_collective", -1))
            group = self.groups.get(name)
            if group is None:
                group = self.groups[name] = {
                    "name": name,
                    "members": _members(c10d, name),
                    "issued": 0,
                    "completed": 0,
                    "open_since_ns": 0,
                    "op": None,
                    "sizes": [],
                    "_tried": 0,
                }
            if (issued, completed) == (group["issued"], group["completed"]):
                continue
            changed = True
            was_open = group["issued"] if group["issued"] > group["completed"] else None
            if issued != group["issued"]:
                group["op"], group["sizes"] = None, []
            group["issued"], group["completed"] = max(issued, 0), max(completed, 0)
            if issued <= completed:
                group["open_since_ns"] = 0
            elif was_open != issued:
                group["open_since_ns"] = now_ns  # a newly open collective
        return changed

    def _arrive(self, entries: list[dict[str, Any]], now_ns: int) -> None:
        """Keep when each collective issued since the last window was issued, per group (the
        newest :data:`MAX_ARRIVALS`); point-to-point operations are not collectives."""
        if not entries:
            self.window_ns = 0  # torch keeps no record: nothing to score, ever
            return
        self.window_read_ns = now_ns
        arrivals: dict[str, list[tuple[int, int]]] = {}
        for entry in entries:
            pg = entry.get("process_group") or ("",)
            seq, created = entry.get("collective_seq_id"), entry.get("time_created_ns")
            name = str(pg[0])
            if entry.get("is_p2p") or not isinstance(seq, int) or not isinstance(created, int):
                continue
            if seq > self._last_seq.get(name, 0):
                arrivals.setdefault(name, []).append((seq, created))
        for name, pairs in arrivals.items():
            pairs.sort()
            del pairs[:-MAX_ARRIVALS]
            self._last_seq[name] = pairs[-1][0]
        self.arrivals = arrivals

    def _complete(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record with a ``pg_config`` entry for every process group its entries name:
        gloo's lacks them (one entry under ``""``), and ``torchfrtrace`` needs them."""
        config = dict(record.get("pg_config") or {})
        for entry in record.get("entries") or []:
            name, desc = [*(entry.get("process_group") or ()), "", ""][:2]
            if name and name not in config:
                group = self.groups.get(str(name))
                members = group["members"] if group is not None else []
                config[name] = {"name": name, "desc": desc, "ranks": str(members)}
        config.pop("", None)
        return {**record, "pg_config": config}

    def _identify(self, entries: list[dict[str, Any]]) -> None:
        for group in self.groups.values():
            if group["issued"] <= group["completed"] or group["op"] is not None:
                continue
            for entry in reversed(entries):
                pg = entry.get("process_group") or ("",)
                if (
                    str(pg[0]) == group["name"]
                    and entry.get("collective_seq_id") == group["issued"]
                    and not entry.get("is_p2p")
                ):
                    group["op"] = op_name(str(entry.get("profiling_name", "")))
                    group["sizes"] = entry.get("input_sizes") or []
                    break

    def _publish(self) -> None:
        groups = [
            {k: v for k, v in g.items() if not k.startswith("_")} for g in self.groups.values()
        ]
        body = {
            "groups": groups,
            "dumps": self.dumps,
            "arrivals": self.arrivals,
            "window_ns": self.window_read_ns,
        }
        text = json.dumps(body, sort_keys=True)
        if text == self._written:
            return
        self._written = text
        data = {"pid": self.pid, "progress_ns": self.progress_ns, **body}
        self._write(self.path, json.dumps(data).encode())

    @staticmethod
    def _write(path: str, data: bytes) -> None:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


def _members(c10d: Any, name: str) -> list[int]:
    """The global ranks of process group ``name`` (empty where torch does not say)."""
    try:
        for pg, pg_name in list(c10d._world.pg_names.items()):
            if pg_name == name:
                return [int(r) for r in c10d.get_process_group_ranks(pg)]
    except Exception:
        pass
    return []
