"""Collective progress from the process group's own record, for the agent to read.

DDP's reducer, FSDP2, tensor parallelism and compiled graphs issue collectives that never pass
through the Python functions :mod:`elastic_otel.worker.progress` wraps; torch's Flight Recorder
records every one, in the record of the backend that runs it (:mod:`.records`: gloo's, NCCL's).
A daemon thread of the worker reads them (a cheap status read per poll, the
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
from elastic_otel.parsing.collectives import (
    MAX_ARRIVALS,
    MAX_TRANSFERS,
    STATES,
    PeerTransfers,
    collective_entry,
    device_ns,
    dump_path,
    entry_bytes,
    entry_group,
    group_key,
    op_name,
    p2p_peer,
    poll_period,
)
from elastic_otel.worker import nccl_timing
from elastic_otel.worker.records.gloo import GlooRecord
from elastic_otel.worker.records.nccl import NcclRecord
from elastic_otel.worker.records.record import FlightRecord

C10D_MODULE = "torch.distributed.distributed_c10d"
THREAD_NAME = "elastic-otel-collectives"
RECORDS: tuple[type[FlightRecord], ...] = (NcclRecord, GlooRecord)
"""The kinds of record read, each where this build has it; the first with groups is the dump's."""
STOP_WAIT_S = 2.0
"""How long a worker's exit waits for a read of torch's records in progress (a dump's)."""
_ORDER = {kind.backend: i for i, kind in enumerate(RECORDS)}
SAMPLE_S = 0.1
"""How often, with straggler windows on, the thread samples whether each group has a collective
open (one status read, tens of µs): the share of samples with one open is the rank's time inside
collectives where the record does not time them (gloo; NCCL without timing events)."""


def start(directory: str) -> threading.Thread | None:
    """Start the worker's collectives thread, writing into ``directory`` (unless
    ``ELASTIC_OTEL_FLIGHT_RECORDER=false`` or stall reports are off); the thread, or ``None``."""
    stall_after = env_float(ELASTIC_OTEL_STALL_AFTER, DEFAULT_STALL_AFTER_S)
    if not env_flag(ELASTIC_OTEL_FLIGHT_RECORDER, True) or stall_after <= 0:
        return None
    timing = nccl_timing.arm()  # before torch makes NCCL's process groups
    fifo = os.path.join(directory, WORKER_REQUESTS_FIFO)
    if not os.path.exists(fifo):
        os.mkfifo(fifo, 0o600)
    # Read and write: a FIFO open for reading alone reads end-of-file whenever no writer has
    # it open, which select() reports as ready, forever.
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    window = max(env_float(ELASTIC_OTEL_STRAGGLER_WINDOW, DEFAULT_STRAGGLER_WINDOW_S), 0.0)
    # Looking twice per window keeps each window's read within half a window of its time.
    period = min(poll_period(stall_after), window / 2) if window > 0 else poll_period(stall_after)
    watch = CollectivesWatch(directory, period, stall_after / 2, window, timing=timing)
    thread = threading.Thread(target=watch.run, args=(fd,), name=THREAD_NAME, daemon=True)
    thread.start()
    # When the main thread returns, before the interpreter finalizes: a daemon thread still
    # inside torch's C++ while exit() destroys its statics crashes the worker's clean exit.
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):  # shutting down already
            register(watch.stop)
    return thread


class CollectivesWatch:
    """Reads every backend's Flight Recorder status of every process group; owns the
    collectives file."""

    def __init__(
        self,
        directory: str,
        period_s: float,
        identify_after_s: float,
        window_s: float = 0.0,
        records: list[FlightRecord] | None = None,
        timing: nccl_timing.TimingSwitch | None = None,
        enable_timing: nccl_timing.Enable | None = None,
    ) -> None:
        self.path = os.path.join(directory, WORKER_COLLECTIVES_FILE)
        self.dump_path = os.path.join(directory, WORKER_FLIGHT_RECORDER_FILE)
        self.period_s = period_s
        self.identify_after_ns = int(identify_after_s * 1e9)
        self.pid = os.getpid()
        self.records = records  # by default this build's, once c10d is up
        self.groups: dict[str, dict[str, Any]] = {}  # by group key (backend:name)
        self.progress_ns = 0
        self.dumps = 0
        self.window_ns = int(window_s * 1e9)
        self.window_read_ns = 0  # when the arrivals were last read (0: not yet)
        self.arrivals: dict[str, list[tuple[int, int]]] = {}
        self.durations: dict[str, list[tuple[int, int]]] = {}
        self.open_share: dict[str, tuple[int, int]] = {}  # per group key, the last window's
        self.transfers: list[PeerTransfers] = []  # the last window's sends and receives
        self._samples = OpenSamples()
        self._last_poll_ns = 0
        self._last_seq: dict[str, int] = {}  # per group key: the newest arrival already left
        self._last_done: dict[str, int] = {}  # per group key: the newest duration already left
        self._last_p2p: dict[str, int] = {}  # per group key: the newest send or receive left
        self._written: str | None = None
        self.timing = timing
        self.enable_timing = enable_timing or _enable_timing
        self.stopped = False  # the loop's end (at the worker's exit, or a benchmark's)
        self._reading = threading.Lock()  # held while torch's records are read

    def run(self, fd: int) -> None:
        period_ns = int(self.period_s * 1e9)
        while os.getpid() == self.pid and not self.stopped:  # not in a forked child
            timeout = min(self.period_s, SAMPLE_S) if self.window_ns > 0 else self.period_s
            ready, _, _ = select.select([fd], [], [], timeout)
            asked = False
            if ready:
                with contextlib.suppress(BlockingIOError):
                    asked = bool(os.read(fd, 64))
            now_ns = time.time_ns()
            with self._reading, contextlib.suppress(Exception):  # never the worker's problem
                if self.stopped:
                    break
                if asked or now_ns - self._last_poll_ns >= period_ns:
                    self._last_poll_ns = now_ns
                    self.poll(now_ns, asked)
                else:
                    self.sample()

    def stop(self, timeout_s: float = STOP_WAIT_S) -> None:
        """Read torch's records no more: once this returns, the thread is in none of torch's
        functions and enters none (unless a read outlasted ``timeout_s``)."""
        self.stopped = True
        if os.getpid() != self.pid:
            return  # a forked child: no thread, and the lock may be the parent's, held
        if self._reading.acquire(timeout=timeout_s):
            self._reading.release()

    def sample(self) -> None:
        """Count, per group, whether a collective is open now (between polls)."""
        if self.records is not None and self.window_ns > 0:
            for record in self.records:
                self._samples.count(record.backend, record.status())

    def poll(self, now_ns: int, dump: bool = False) -> None:
        """Read every group's status in every record; identify collectives open long enough;
        dump on request; write the file when anything changed."""
        if self.records is None:
            c10d = sys.modules.get(C10D_MODULE)
            if c10d is None or not c10d.is_initialized():
                return
            extension = sys.modules["torch"]._C._distributed_c10d
            self.records = [r for kind in RECORDS if (r := kind(extension)).available]
            self._place_default_group(c10d)
        changed = False
        for record in self.records:
            status = record.status()
            if self.window_ns > 0:
                self._samples.count(record.backend, status)
            changed |= self._update(record.backend, status, now_ns)
        if changed:
            self.progress_ns = now_ns
        if self.timing is not None:
            self.timing.observe(now_ns, self.groups.values(), self.enable_timing)
        # Identified once per open collective (tried once: a record without it, say with
        # TORCH_FR_BUFFER_SIZE=0, must not cost a whole read every poll).
        stuck = [
            g
            for g in self.groups.values()
            if g["open_since_ns"]
            and g["_tried"] != g["completed"] + 1
            and now_ns - g["open_since_ns"] >= self.identify_after_ns
        ]
        # The window's read: only once a collective was issued (an empty record, say with
        # TORCH_FR_BUFFER_SIZE=0, stops the reads for good: window_ns set to 0 below).
        window = (
            self.window_ns > 0
            and any(g["issued"] for g in self.groups.values())
            and now_ns - self.window_read_ns >= self.window_ns
        )
        if not (dump or stuck or window):
            self._publish()
            return
        # A whole read of the records that matter now: those with a group issued (in a NCCL
        # job gloo's is empty, and the other way round on the CPU).
        used = [
            r
            for r in self.records
            if any(g["backend"] == r.backend and g["issued"] for g in self.groups.values())
        ]
        if dump and not used:
            used = self.records[:1]  # a dump with nothing issued yet: the record, empty
        wholes = {r.backend: r.record() for r in used}
        for r in used:
            self._settle(r, wholes[r.backend], now_ns)
        if window:
            self._arrive(wholes, now_ns)
        if dump:
            self._dump(wholes)
        for backend, whole in wholes.items():
            self._identify(backend, whole.get("entries") or [])
        for group in stuck:
            group["_tried"] = group["completed"] + 1
        self._publish()

    def _place_default_group(self, c10d: Any) -> None:
        """The default group, issued nothing yet, in every record this build has: torch's
        status lists a group only once it recorded a collective, and a rank past
        ``init_process_group`` that never issued one is what the others wait for."""
        found = _default_group(c10d)
        if found is None:
            return
        name, used = found
        for record in self.records or ():
            if used and record.backend not in used:
                continue
            self._update(record.backend, {name: {}}, 0)
            self.groups[group_key(name, record.backend)]["_placeholder"] = True

    def _update(self, backend: str, pg_status: dict[str, Any], now_ns: int) -> bool:
        """Take each group's status; whether any group issued or completed a collective."""
        changed = False
        for name, st in pg_status.items():
            # -1 (none yet) is kept as 0 (-1 for ``started``: not tracked), and compared so: a
            # group with no collective completed must not read as progress at every poll.
            issued = max(int(st.get("last_enqueued_collective", -1)), 0)
            started = max(int(st.get("last_started_collective", -1)), -1)
            completed = max(int(st.get("last_completed_collective", -1)), 0)
            key = group_key(name, backend)
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = {
                    "name": name,
                    "backend": backend,
                    "members": _members(name),
                    "issued": 0,
                    "started": -1,
                    "completed": 0,
                    "open_since_ns": 0,
                    "op": None,
                    "sizes": [],
                    "state": None,
                    "timed_from": 0,
                    "_tried": 0,
                }
            if st:
                group.pop("_placeholder", None)  # torch's status has it now
            if (issued, started, completed) == (
                group["issued"],
                group["started"],
                group["completed"],
            ):
                continue
            # A collective its device started is no progress: the rank may wait in it for good
            # (a peer whose GPU never reaches it), and the stall's clock must not restart.
            changed = changed or (issued, completed) != (group["issued"], group["completed"])
            was_open = group["completed"] + 1 if group["issued"] > group["completed"] else None
            if completed != group["completed"]:
                group["op"], group["sizes"], group["state"] = None, [], None
            elif started != group["started"]:
                group["state"] = None  # the status is newer than the entry read
            group["issued"], group["completed"] = max(issued, 0), max(completed, 0)
            group["started"] = started if started >= 0 else -1
            if issued <= completed:
                group["open_since_ns"] = 0
            elif was_open != group["completed"] + 1:
                group["open_since_ns"] = now_ns  # a newly open collective
        return changed

    def _settle(self, record: FlightRecord, whole: dict[str, Any], now_ns: int) -> None:
        """Take the completions a whole read tells where the record's status lags (gloo's):
        they finished before now, so they are no progress now; a collective then found open
        is open since torch created its entry."""
        status = record.status_from(whole)
        if status is None:
            return
        issued = {k: g["issued"] for k, g in self.groups.items()}
        self._update(record.backend, status, now_ns)
        if any(g["issued"] != issued.get(k) for k, g in self.groups.items()):
            self.progress_ns = now_ns  # one issued since the status read: that is progress
        for group in self.groups.values():
            if group["backend"] == record.backend and group["open_since_ns"] == now_ns:
                entries = whole.get("entries") or []
                entry = collective_entry(entries, group["name"], group["completed"] + 1)
                group["open_since_ns"] = int((entry or {}).get("time_created_ns") or now_ns)

    def _arrive(self, wholes: dict[str, dict[str, Any]], now_ns: int) -> None:
        """Keep when each collective issued since the last window was issued, per group (the
        newest :data:`MAX_ARRIVALS`), and the device's time inside each one completed since
        (``duration_ms``: NCCL with timing events; gloo has none); point-to-point operations
        are not collectives."""
        if not any(w.get("entries") for w in wholes.values()):
            self.window_ns = 0  # torch keeps no record: nothing to score, ever
            return
        self.window_read_ns = now_ns
        arrivals: dict[str, list[tuple[int, int]]] = {}
        durations: dict[str, list[tuple[int, int]]] = {}
        for backend, whole in wholes.items():
            for entry in whole.get("entries") or []:
                seq, created = entry.get("collective_seq_id"), entry.get("time_created_ns")
                key = group_key(entry_group(entry), backend)
                if entry.get("is_p2p") or not isinstance(seq, int) or not isinstance(created, int):
                    continue
                if seq > self._last_seq.get(key, 0):
                    arrivals.setdefault(key, []).append((seq, created))
                inside = device_ns(entry)
                if inside is not None and seq > self._last_done.get(key, 0):
                    durations.setdefault(key, []).append((seq, inside))
        for kept, last in ((arrivals, self._last_seq), (durations, self._last_done)):
            for key, pairs in kept.items():
                pairs.sort()
                del pairs[:-MAX_ARRIVALS]
                last[key] = pairs[-1][0]
        self.arrivals, self.durations, self.open_share = arrivals, durations, self._samples.take()
        self.transfers = peer_transfers(wholes, self.groups, self._last_p2p)

    def _dump(self, wholes: dict[str, dict[str, Any]]) -> None:
        """torch's own pickle of each record read, for ``torchfrtrace``: the first record with
        groups in the dump file, any other (a job with two backends) beside it."""
        for n, (backend, whole) in enumerate(wholes.items()):
            path = dump_path(self.dump_path, backend) if n else self.dump_path
            _write(path, pickle.dumps(_complete(whole, self.groups, backend)))
        self.dumps += 1

    def _identify(self, backend: str, entries: list[dict[str, Any]]) -> None:
        """Name each open group's first open collective (op, sizes, state) from its entry."""
        for group in self.groups.values():
            if group["backend"] != backend or group["issued"] <= group["completed"]:
                continue
            if group["op"] is not None:
                continue
            number = group["completed"] + 1
            entry = collective_entry(entries, group["name"], number)
            if entry is None:
                continue
            group["op"] = op_name(str(entry.get("profiling_name", "")))
            group["sizes"] = entry.get("input_sizes") or []
            # The entry's state is the device's where the record tracks starts: timing on
            # from before ``number`` (or, as before this switch existed, a start seen at all).
            timed_from = group["timed_from"]
            timed = 0 < timed_from <= number or (group["started"] >= 0 and not timed_from)
            if timed and entry.get("state") in STATES:
                group["state"] = entry["state"]  # the device's, where it is tracked

    def _publish(self) -> None:
        # In the records' order (NCCL's first), whatever order the groups were met in: a group
        # read by its name is its NCCL side in a group of both backends.
        met = sorted(self.groups.values(), key=lambda g: _ORDER.get(g["backend"], len(_ORDER)))
        groups = [{k: v for k, v in g.items() if not k.startswith("_")} for g in met]
        body = {
            "groups": groups,
            "dumps": self.dumps,
            "arrivals": self.arrivals,
            "durations": self.durations,
            "open_share": self.open_share,
            "transfers": [t.as_json() for t in self.transfers],
            "window_ns": self.window_read_ns,
        }
        decision = self.timing.decision if self.timing is not None else None
        if decision is not None:
            body["nccl_timing"] = decision.as_json()
        text = json.dumps(body, sort_keys=True)
        if text == self._written:
            return
        self._written = text
        data = {"pid": self.pid, "progress_ns": self.progress_ns, **body}
        _write(self.path, json.dumps(data).encode())


def _complete(
    record: dict[str, Any], groups: dict[str, dict[str, Any]], backend: str
) -> dict[str, Any]:
    """``record`` with a ``pg_config`` entry for every process group its entries name (the
    members from ``groups``, by group key): gloo's lacks them (one entry under ``""``), and
    ``torchfrtrace`` needs them."""
    config = dict(record.get("pg_config") or {})
    for entry in record.get("entries") or []:
        name, desc = [*(entry.get("process_group") or ()), "", ""][:2]
        if name and name not in config:
            group = groups.get(group_key(str(name), backend))
            members = group["members"] if group is not None else []
            config[name] = {"name": name, "desc": desc, "ranks": str(members)}
    config.pop("", None)
    return {**record, "pg_config": config}


def _default_group(c10d: Any) -> tuple[str, frozenset[str]] | None:
    """The default group's name and the records of its backends (only those: a gloo job on a
    CUDA build must not read as a rank that never issued its first NCCL collective)."""
    try:
        world = c10d.GroupMember.WORLD
        name = c10d._world.pg_names.get(world)
        config = str(c10d.get_backend_config(world))
    except Exception:
        return None
    return (name, frozenset(record_backends(config))) if isinstance(name, str) else None


def _write(path: str, data: bytes) -> None:
    """``data`` into ``path`` at once: the agent never reads half a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class OpenSamples:
    """Per group key, of the status reads sampled, how many found a collective open: the share
    of the window the rank spent inside the group's collectives."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}  # key → [samples open, samples]

    def count(self, backend: str, pg_status: dict[str, Any]) -> None:
        for name, st in pg_status.items():
            issued = int(st.get("last_enqueued_collective", -1))
            completed = int(st.get("last_completed_collective", -1))
            counts = self._counts.setdefault(group_key(name, backend), [0, 0])
            counts[0] += issued > completed
            counts[1] += 1

    def take(self) -> dict[str, tuple[int, int]]:
        """The counts since the last take, and a fresh start."""
        counts, self._counts = self._counts, {}
        return {key: (c[0], c[1]) for key, c in counts.items() if c[1]}


def _enable_timing(name: str) -> bool:
    """Turn NCCL's timing events on for process group ``name`` (torch's
    ``ProcessGroup._enable_collectives_timing``: every backend of the group, from its next
    collective on); ``False`` where torch has no such call or no such group."""
    c10d: Any = sys.modules.get(C10D_MODULE)
    try:
        group = next((pg for pg, n in list(c10d._world.pg_names.items()) if n == name), None)
    except Exception:
        return False
    if group is None:
        return False
    try:
        group._enable_collectives_timing()
        return True
    except Exception:  # a backend of the group without it (cpu:gloo,cuda:nccl): NCCL's alone
        pass
    try:
        torch: Any = sys.modules["torch"]
        group._get_backend(torch.device("cuda"))._enable_collectives_timing()
        return True
    except Exception:
        return False


def record_backends(config: str) -> set[str]:
    """The records a group's collectives land in, from its backend config
    (``"cpu:gloo,cuda:nccl"``, ``"nccl"``): NCCL's for NCCL, gloo's for any other backend;
    empty when the config names none."""
    names = {part.rpartition(":")[2].strip().lower() for part in config.split(",")}
    names.discard("")
    return {NcclRecord.backend if n == NcclRecord.backend else GlooRecord.backend for n in names}


def peer_transfers(
    wholes: dict[str, dict[str, Any]], groups: dict[str, dict[str, Any]], last: dict[str, int]
) -> list[PeerTransfers]:
    """The sends and receives the device timed since the ones in ``last`` (per group key, the
    newest left; updated), per group, op and peer (the peer's global rank: torch's name holds
    its rank in the group)."""
    sums: dict[tuple[str, str, int], list[float]] = {}  # → count, bytes, ns, best rate
    newest: dict[str, int] = {}
    for backend, whole in wholes.items():
        for entry in whole.get("entries") or []:
            seq, inside = entry.get("p2p_seq_id"), device_ns(entry)
            name = entry_group(entry)
            key = group_key(name, backend)
            if not entry.get("is_p2p") or not isinstance(seq, int) or inside is None:
                continue
            named, size = p2p_peer(str(entry.get("profiling_name", ""))), entry_bytes(entry)
            if seq <= last.get(key, 0) or named is None or size is None:
                continue
            newest[key] = max(seq, newest.get(key, 0))
            peer = _global_rank(groups.get(key), name, named[1])
            if peer is None:
                continue
            row = sums.setdefault((key, named[0], peer), [0, 0, 0, 0.0])
            row[0] += 1
            row[1] += size
            row[2] += inside
            row[3] = max(row[3], size * 1e9 / inside if inside else 0.0)
    last.update(newest)
    return [
        PeerTransfers(key, op, peer, int(c), int(b), int(ns), best)
        for (key, op, peer), (c, b, ns, best) in sorted(sums.items())[:MAX_TRANSFERS]
    ]


def _global_rank(group: dict[str, Any] | None, name: str, rank: int) -> int | None:
    """Group ``name``'s rank ``rank`` as a global rank (the default group's are the same);
    ``None`` where the group's members are not known."""
    members = group["members"] if group is not None else []
    if 0 <= rank < len(members):
        return int(members[rank])
    return rank if name == "0" and not members else None


def _members(name: str) -> list[int]:
    """The global ranks of process group ``name`` (empty where torch does not say)."""
    c10d: Any = sys.modules.get(C10D_MODULE)
    try:
        for pg, pg_name in list(c10d._world.pg_names.items()):
            if pg_name == name:
                return [int(r) for r in c10d.get_process_group_ranks(pg)]
    except Exception:
        pass
    return []
