"""Section 14: what the bridge's store traffic and torch's own rendezvous traffic cost the
store's host, at 256, 1,024 and 4,096 nodes, by simulation against one real ``TCPStore``.

The server is a real ``torch.distributed.TCPStore`` in a process of its own (libuv backend,
``multi_tenant``, as torch's c10d rendezvous backend creates it on the agent that hosts the
store). Each simulated node is a pair of real store clients (the
agent's own connection, and the clone the bridge's exchanges make of ``WorkerGroup.store``),
driven from ``CLIENT_PROCESSES`` processes (not pinned): the bridge's polls by a scheduler and
a pool of threads, torch's traffic by a thread per simulated agent. What a node does, each at
its real period:

- **torch** (``DynamicRendezvousHandler``, c10d backend), read from its source: the agent's
  monitor loop calls ``num_nodes_waiting()`` every ``monitor_interval`` (0.1 s), which syncs
  the rendezvous state unless it was synced in the last ``cache_duration`` (1 s): one ``get``
  of the whole state about once a second; the keep-alive timer, every ``keep_alive_interval``
  (5 s), writes the node's heartbeat into the state with one ``compare_set`` of the whole state
  (expected: the state last read), again with the value it returns while another node wrote
  first. The value is what the backend stores, the base64 of the pickled ``_RendezvousState``
  built with torch's own classes and seeded through ``C10dRendezvousBackend``: it grows with
  the nodes. The simulated nodes do not unpickle it (what the agents' CPUs do is not the store
  host's), so a node writes back the state it read with its own few bytes changed;
- **the bridge**: the package's own ``StallExchange`` and ``StragglerExchange`` over a
  counting proxy of the node's connection, called as the training watch calls them (its
  ``_check`` steps for a stall, over the model's ``training_stall`` and ``startup_stall``),
  every ``poll_period(ELASTIC_OTEL_STALL_AFTER)`` (5 s) and once per straggler window (30 s).
  The ranks' progress is what ``rank_progress`` reads from stalled workers' records.

Where torch's traffic at its real rate would need more of the server (or of the client CPUs)
than ``TORCH_BUDGET_CORES``, or more than ``MAX_TORCH_NODES`` agents, only an evenly spread share
of the nodes runs it (each at its real period, on the full state) and its cost is scaled by the
inverse share: fewer writers conflict less, so its keep-alives' retries are then a lower bound.
The bridge's traffic always runs at its real rate, from every node. ``python -m
benchmarks.store_load`` runs the quick variant alone (``--full``, ``--sizes=4096``,
``--scenarios=healthy,training`` for others).
"""

from __future__ import annotations

import contextlib
import heapq
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from benchmarks import common

MODULE = "benchmarks.store_load"
SIZES = (256, 1024, 4096)
QUICK_SIZES = (64,)
QUICK_TIME_SCALE = 20.0
"""Quick mode divides every period (torch's and the bridge's) by this: a smoke run."""
CLIENT_PROCESSES = 2
CONNECT_THREADS = 128
WORKER_THREADS = 32
HOST = "127.0.0.1"
RUN_ID = "store-load"
RANKS_PER_NODE = 8
COLLECTIVE_NUMBER = 1_000
"""The collective the hung job waits in (any: only the keys' and values' sizes matter)."""
TORCH_BUDGET_CORES = 0.3
"""Most of the server's CPU, and of the clients', torch's simulated traffic may take."""
MAX_TORCH_NODES = 256
"""Most nodes whose torch traffic is simulated (one thread each): the clients share 2 CPUs with
the server, and clients slower than the agents would widen the window in which another node's
write makes a keep-alive's expected value stale, which real agents, each on its own host, do
not."""
KEEP_ALIVE_WRITES = 2
"""``compare_set`` per keep-alive, to size torch's share: the first one's expected value is the
state of the node's last sync (the monitor's, up to a second old), stale once any other node
wrote since, which at scale is nearly always; the retry, with the value it returned, lands."""
SCENARIOS = ("healthy", "training", "training_alone", "startup", "slow_start", "slow_nodes")
SCENARIO_LABELS = {
    "healthy": "1. healthy job",
    "training": "2. hang in training",
    "training_alone": "2b. hang in training, torch's traffic off",
    "startup": "3. hang at start-up",
    "slow_start": "3b. slow start-up, no hang",
    "slow_nodes": "4. slow-node exchange",
}
BRIDGE_OF = {"training_alone": "training"}
"""Scenarios whose bridge traffic is another's (without torch's traffic: the bridge alone)."""
TORCH = "torch"
BRIDGE = "bridge"
FRAME = "stuck_data_loader at train.py:21"
CHECK_ALL = "check (all nodes' keys)"
MULTI_GET_ALL = "multi_get (all nodes' keys)"


def hostname(node: int) -> str:
    """A node's FQDN (torch's ``_NodeDesc`` default address), of a realistic length."""
    return f"gpu-node-{node:05d}.cluster.example.internal"


# --- processes --------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    # torch's client formats its socket's address with a reverse lookup when it connects; where
    # no DNS server answers (a sandbox) each connection would wait for the resolver's 5 s
    # timeout. One try of 1 s bounds it: connections are made before anything is measured.
    return common.clean_env({"RES_OPTIONS": "timeout:1 attempts:1", "TORCH_CPP_LOG_LEVEL": "ERROR"})


class _Child:
    """A long-lived child process spoken to in JSON lines (``python -m MODULE ROLE CONFIG``)."""

    def __init__(self, role: str, config: dict[str, Any]) -> None:
        self._err: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", MODULE, role, json.dumps(config)],
            cwd=common.child_cwd(),
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(common.RESULT_PREFIX):
                reply: dict[str, Any] = json.loads(line[len(common.RESULT_PREFIX) :])
                return reply
        self._err.seek(0)
        raise RuntimeError(
            f"{MODULE} child exited ({self.proc.wait()}):\n{self._err.read()[-3000:]}"
        )

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


def _reply(message: dict[str, Any]) -> None:
    common.emit_result(message)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return math.nan


def _sched_ns(pid: int) -> int:
    """ns on CPU of every thread of ``pid`` (schedstat: finer than utime + stime's ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


# --- the server -------------------------------------------------------------------------------


def server_main() -> None:
    """The store torch's agent on node 0 hosts: until stdin closes. Not pinned: its loop is one
    thread, which on a shared machine would queue behind other processes on a pinned CPU."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    # As torch's c10d rendezvous backend creates it (``_create_tcp_store``): multi-tenant, the
    # read timeout's default of 60 s, the default (libuv) backend.
    store = TCPStore(
        HOST, 0, is_master=True, multi_tenant=True, wait_for_workers=False,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    libuv = bool(getattr(store, "libuvBackend", False))
    _reply({"port": store.port, "libuv": libuv, "pid": os.getpid()})
    sys.stdin.read()


# --- the clients: periods, values, counting ---------------------------------------------------


def periods(scale: float) -> dict[str, float]:
    """The real periods, from the package and from torch's defaults, divided by ``scale``."""
    import dataclasses
    import inspect

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
        _BackendRendezvousStateHolder,
    )
    from torch.distributed.launcher.api import LaunchConfig

    from elastic_otel.names.environment_variables import (
        DEFAULT_STALL_AFTER_S,
        DEFAULT_STRAGGLER_WINDOW_S,
    )
    from elastic_otel.parsing.collectives import poll_period

    handler = inspect.signature(DynamicRendezvousHandler.from_backend).parameters
    holder = inspect.signature(_BackendRendezvousStateHolder.__init__).parameters
    monitor: Any = next(f for f in dataclasses.fields(LaunchConfig) if f.name == "monitor_interval")
    return {
        "stall_after_s": DEFAULT_STALL_AFTER_S,
        "poll_s": poll_period(DEFAULT_STALL_AFTER_S) / scale,
        "window_s": DEFAULT_STRAGGLER_WINDOW_S / scale,
        "keep_alive_s": float(handler["keep_alive_interval"].default) / scale,
        "cache_s": float(holder["cache_duration"].default) / scale,
        "monitor_s": float(monitor.default) / scale,
        "heartbeat_timeout_s": RendezvousTimeout().heartbeat.total_seconds() / scale,
    }


def rendezvous_state(nodes: int) -> bytes:
    """torch's pickled ``_RendezvousState`` of a complete round of ``nodes`` participants."""
    import pickle
    from datetime import datetime, timezone

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _NodeDesc,
        _RendezvousState,
    )

    state = _RendezvousState()
    now = datetime.now(timezone.utc)
    state.round, state.complete, state.deadline = 1, True, now
    for i in range(nodes):
        node = _NodeDesc(hostname(i), 10_000 + i, 0)
        state.participants[node] = i
        state.last_heartbeats[node] = now
    return pickle.dumps(state)


def _pickle_times(state: bytes) -> dict[str, float]:
    """What the agent spends on the state between its store operations (its sync reads
    ``b64decode`` + ``pickle.loads``, its write ``pickle.dumps`` + ``b64encode``): the least
    of 5, here (what the CPU needs, without other processes' share of it)."""
    import base64
    import pickle

    loads, dumps = [], []
    text = base64.b64encode(state)
    for _ in range(5):
        t0 = time.perf_counter()
        obj = pickle.loads(base64.b64decode(text))
        t1 = time.perf_counter()
        base64.b64encode(pickle.dumps(obj))
        t2 = time.perf_counter()
        loads.append(t1 - t0)
        dumps.append(t2 - t1)
    return {"loads_s": min(loads), "dumps_s": min(dumps)}


class _Recorder:
    """Every store operation of this process: (start ns, source, op, ns, ok)."""

    def __init__(self) -> None:
        self.ops: list[tuple[int, str, str, int, bool]] = []
        self.keys: set[str] = set()

    def clear(self) -> None:
        self.ops, self.keys = [], set()


def _check_label(keys: list[str]) -> str:
    if len(keys) == 1:
        return "check"
    return "check (2 keys)" if len(keys) == 2 else CHECK_ALL


def _key_pattern(key: str) -> str:
    """``key``, a slow-node key's node rank replaced (one key per node)."""
    from elastic_otel.integration.straggler_exchange import PREFIX

    head, _, tail = key.rpartition("/")
    return f"{head}/<node rank>" if key.startswith(PREFIX + "/") and tail.isdigit() else key


class _Counted:
    """A node's connection to the store, each operation timed and counted. ``clone`` is the
    connection itself: made beforehand, one per node, as the exchange's clone is."""

    def __init__(self, store: Any, source: str, rec: _Recorder) -> None:
        self._store = store
        self._source = source
        self._rec = rec

    def clone(self) -> _Counted:
        return self

    def set_timeout(self, timeout: Any) -> None:
        self._store.set_timeout(timeout)

    def _do(self, op: str, keys: list[str], fn: Callable[..., Any], *args: Any) -> Any:
        if self._source == BRIDGE and len(keys) <= 2:
            self._rec.keys.update(_key_pattern(k) for k in keys)
        t0 = time.monotonic_ns()
        ok = False
        try:
            out = fn(*args)
            ok = True
            return out
        finally:
            self._rec.ops.append((t0, self._source, op, time.monotonic_ns() - t0, ok))

    def set(self, key: str, value: bytes) -> None:
        self._do("set", [key], self._store.set, key, value)

    def get(self, key: str, op: str = "get") -> bytes:
        return bytes(self._do(op, [key], self._store.get, key))

    def check(self, keys: list[str]) -> bool:
        return bool(self._do(_check_label(keys), keys, self._store.check, keys))

    def add(self, key: str, value: int) -> int:
        return int(self._do("add", [key], self._store.add, key, value))

    def append(self, key: str, value: bytes) -> None:
        self._do("append", [key], self._store.append, key, value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        label = MULTI_GET_ALL if len(keys) > 2 else "multi_get"
        return list(self._do(label, keys, self._store.multi_get, keys))

    def compare_set(self, key: str, expected: bytes, desired: bytes, op: str) -> bytes:
        return bytes(self._do(op, [key], self._store.compare_set, key, expected, desired))


class _Scheduler:
    """Runs callables at their due times (monotonic s) on a pool of threads; records how late
    each started (the clients keeping up or not)."""

    def __init__(self, workers: int) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cond = threading.Condition()
        self._seq = 0
        self._stopped = False
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="store-load")
        self.lags: list[tuple[float, float]] = []  # (due, late by s)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def at(self, due: float, fn: Callable[[], None]) -> None:
        with self._cond:
            if self._stopped:
                return
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, fn))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    if wait is not None and wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stopped:
                    return
                due, _, fn = heapq.heappop(self._heap)
            self._pool.submit(self._call, due, fn)

    def _call(self, due: float, fn: Callable[[], None]) -> None:
        self.lags.append((due, time.monotonic() - due))
        try:
            fn()
        except Exception as e:  # one node's failure is counted, never the run's end
            print(f"store-load: {type(e).__name__}: {e}", file=sys.stderr)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify()
        self._thread.join()
        self._pool.shutdown(wait=True)


# --- what a node does ---------------------------------------------------------------------------


class _TorchNode:
    """One agent's rendezvous traffic, on a thread of its own as the agent's: the monitor
    loop's state syncs and the keep-alive timer's writes, one at a time (torch's heartbeat
    lock). The agent's own CPU between the store operations, unpickling the state it read and
    pickling the one it writes, is spent as a sleep of the time measured for this state
    (``think``): it widens the window in which another node's write makes a keep-alive's
    expected value stale."""

    def __init__(
        self,
        index: int,
        nodes: int,
        store: _Counted,
        key: str,
        p: dict[str, float],
        think: dict[str, float],
    ) -> None:
        self.index, self.nodes, self.store, self.key, self.p = index, nodes, store, key, p
        self.loads_s, self.dumps_s = think["loads_s"], think["dumps_s"]
        self.token = b""
        self.last_sync = -math.inf
        self.stamp = index * 7919
        self.rng = random.Random(index)
        self.keep_alives: list[tuple[float, int, bool]] = []  # (start, attempts, landed)
        self.lags: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, t0: float) -> None:
        self.thread = threading.Thread(target=self._run, args=(t0,), daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()

    def _sleep(self, seconds: float) -> bool:
        return self.stop.wait(seconds) if seconds > 0 else self.stop.is_set()

    def _run(self, t0: float) -> None:
        monitor = t0 + self.rng.uniform(0, self.p["cache_s"] + self.p["monitor_s"])
        keep_alive = t0 + self.rng.uniform(0, self.p["keep_alive_s"])
        while True:
            due = min(monitor, keep_alive)
            if self._sleep(due - time.monotonic()):
                return
            self.lags.append((due, time.monotonic() - due))
            try:
                if keep_alive <= monitor:
                    self.keep_alive()  # the timer waits its interval from the end of a run
                    keep_alive = time.monotonic() + self.p["keep_alive_s"]
                else:
                    self.sync("get (monitor)")
            except Exception as e:  # a timed-out operation: counted as failed, go on
                print(f"store-load: {type(e).__name__}: {e}", file=sys.stderr)
            monitor = self.last_sync + self.p["cache_s"] + self.rng.uniform(0, self.p["monitor_s"])

    def sync(self, op: str) -> None:
        """``sync()`` of a clean state: a ``get`` unless synced within ``cache_duration``."""
        if time.monotonic() - self.last_sync > self.p["cache_s"]:
            self.token = self.store.get(self.key, op)
            self._sleep(self.loads_s)
            self.last_sync = time.monotonic()

    def _patched(self, state: bytes) -> bytes:
        """``state`` with this node's heartbeat changed: 8 bytes of its own, same length."""
        self.stamp += 1
        head = min(64, len(state) // 2)
        at = head + self.index * max(0, len(state) - head - 8) // self.nodes
        return state[:at] + f"{self.stamp & 0xFFFFFFFF:08x}".encode() + state[at + 8 :]

    def keep_alive(self) -> None:
        """``_keep_alive``: sync (cached), then write the heartbeat (pickle, ``compare_set``,
        unpickle the value returned) until it lands, or the heartbeat timeout passes."""
        start = time.monotonic()
        self.sync("get (keep-alive)")
        deadline = start + self.p["heartbeat_timeout_s"]
        op, attempts = "compare_set", 0
        while True:
            attempts += 1
            self._sleep(self.dumps_s)
            desired = self._patched(self.token)
            current = self.store.compare_set(self.key, self.token, desired, op)
            self._sleep(self.loads_s)
            self.last_sync, self.token = time.monotonic(), current
            if self.stop.is_set():
                return  # the phase ended: not counted
            if current == desired or time.monotonic() > deadline:
                self.keep_alives.append((start, attempts, current == desired))
                return
            op = "compare_set (retry)"


class _Poller:
    """A node's training watch thread: ``poll`` every ``period``; a wake (the exchange found
    something new) polls at once and restarts the period, as the watch's loop does."""

    def __init__(self, sched: _Scheduler, period: float) -> None:
        self.sched, self.period = sched, period
        self.poll: Callable[[], None] = lambda: None
        self.generation = 0

    def start(self, due: float) -> None:
        self.sched.at(due, self._tick(self.generation))

    def wake(self) -> None:
        self.generation += 1
        self.sched.at(time.monotonic(), self._tick(self.generation))

    def _tick(self, generation: int) -> Callable[[], None]:
        def tick() -> None:
            if generation != self.generation:
                return  # a wake restarted the period
            self.poll()
            self.sched.at(time.monotonic() + self.period, self._tick(generation))

        return tick


def _ranks(node: int) -> tuple[int, ...]:
    return tuple(range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE))


class _Client:
    """One client process's share of the nodes."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.port: int = config["port"]
        self.nodes: int = config["nodes"]
        self.mine: list[int] = config["mine"]
        self.server_pid: int = config["server_pid"]
        self.scale: float = config["scale"]
        self.p = periods(self.scale)
        self.rec = _Recorder()
        self.torch_conn: dict[int, Any] = {}
        self.bridge_conn: dict[int, Any] = {}
        self.key = ""

    # --- set-up ---

    def _new(self) -> Any:
        from datetime import timedelta

        from torch.distributed import TCPStore

        return TCPStore(
            HOST, self.port, is_master=False, wait_for_workers=False,
            timeout=timedelta(seconds=60),
        )  # fmt: skip

    def connect(self) -> dict[str, Any]:
        """Per node: the agent's connection, and the bridge's clone of it."""
        t0 = time.monotonic()

        def both(node: int) -> tuple[int, Any, Any]:
            conn = self._new()
            return node, conn, conn.clone()

        with ThreadPoolExecutor(CONNECT_THREADS) as pool:
            for node, conn, clone in pool.map(both, self.mine):
                self.torch_conn[node], self.bridge_conn[node] = conn, clone
        return {"connect_s": time.monotonic() - t0, "connections": 2 * len(self.mine)}

    def seed(self) -> dict[str, Any]:
        """The rendezvous state of a complete round, stored through torch's own backend."""
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
            C10dRendezvousBackend,
        )

        state = rendezvous_state(self.nodes)
        backend = C10dRendezvousBackend(self._new(), RUN_ID)
        backend.set_state(state)
        key = str(getattr(backend, "_key", "torch.rendezvous." + RUN_ID))
        stored = bytes(self._new().get(key))
        return {
            "key": key,
            "pickled_bytes": len(state),
            "state_bytes": len(stored),
            "think": _pickle_times(state),
        }

    def calibrate(self, key: str, reps: int, big_reps: int) -> list[dict[str, Any]]:
        """Each operation alone from one connection: the server's CPU per operation, and the
        latency a client sees on an idle store."""
        from elastic_otel.integration.straggler_exchange import key as node_key
        from elastic_otel.model.slow_nodes import encode

        store, raw = self._new(), self._new()
        state = bytes(raw.get(key))
        value = encode(_inside(0, self.nodes, 1))
        keys = [f"cal/slow/{n}" for n in range(self.nodes)]
        raw.multi_set(keys, [value] * self.nodes)
        raw.set("cal/small", b"x" * 100)
        token = [state]
        stamp = [0]

        def compare_set() -> None:
            stamp[0] += 1
            desired = token[0][:64] + f"{stamp[0]:08x}".encode() + token[0][72:]
            token[0] = bytes(store.compare_set(key, token[0], desired))

        appended = [0]

        def append() -> None:
            appended[0] += 1
            store.append(f"cal/append/{appended[0] // 16}", b"a" * 100)

        def add() -> None:
            store.add("cal/count", 1)

        cases: list[tuple[str, int, Callable[[], Any], int]] = [
            ("check", 0, lambda: store.check(["cal/small"]), reps),
            ("check (2 keys)", 0, lambda: store.check(["cal/none", "cal/small"]), reps),
            ("get", 100, lambda: store.get("cal/small"), reps),
            ("set", 40, lambda: store.set("cal/set", b"s" * 40), reps),
            ("add", 0, add, reps),
            ("append", 100, append, reps),
            ("set (slow-node value)", len(value), lambda: store.set(node_key(9, 0), value), reps),
            (CHECK_ALL, self.nodes, lambda: store.check(keys), big_reps),
            (MULTI_GET_ALL, self.nodes * len(value), lambda: store.multi_get(keys), big_reps),
            ("get (state)", len(state), lambda: store.get(key), big_reps),
            ("compare_set (state)", len(state), compare_set, big_reps),
        ]
        rows = []
        for name, size, fn, n in cases:
            for _ in range(max(3, n // 20)):
                fn()
            latencies = []
            cpu0, server0 = time.process_time(), _sched_ns(self.server_pid)
            for _ in range(n):
                t0 = time.monotonic_ns()
                fn()
                latencies.append(time.monotonic_ns() - t0)
            store.check(["cal/small"])  # ``set`` and ``append`` return once sent: until served
            server_us = (_sched_ns(self.server_pid) - server0) / n / 1e3
            client_us = (time.process_time() - cpu0) / n * 1e6
            latencies.sort()
            rows.append(
                {
                    "op": name,
                    "bytes": size,
                    "reps": n,
                    "server_us": server_us,
                    "client_us": client_us,
                    "latency_us": common.percentile(latencies, 50) / 1e3,
                }
            )
        return rows

    # --- a phase ---

    def phase(self, msg: dict[str, Any]) -> dict[str, Any]:
        from torch.distributed import PrefixStore

        scenario: str = msg["scenario"]
        t0 = time.monotonic() + (msg["t0_wall"] - time.time())
        w0, w1 = t0 + msg["window"][0], t0 + msg["window"][1]
        prefix = f"torch.rendezvous.{RUN_ID}.{msg['round']}"  # WorkerGroup.store's prefix
        self.rec.clear()
        sched = _Scheduler(WORKER_THREADS)
        torch_nodes = [
            _TorchNode(
                i,
                self.nodes,
                _Counted(self.torch_conn[i], TORCH, self.rec),
                msg["key"],
                self.p,
                msg["think"],
            )
            for i in self.mine
            if msg["stride"] and i % msg["stride"] == 0
        ]
        for t in torch_nodes:
            t.start(t0)
        bridge = {
            i: _Counted(PrefixStore(prefix, self.bridge_conn[i]), BRIDGE, self.rec)
            for i in self.mine
        }
        closers = self._bridge(scenario, msg, bridge, sched, t0)
        cpu: list[float] = []

        def sample(at: float) -> None:
            time.sleep(max(0.0, at - time.monotonic()))
            cpu.append(time.process_time())

        sample(w0)
        sample(w1)
        sched.stop()
        for t in torch_nodes:
            t.join()
        for close in closers:
            close()
        return self._results(w0, w1, cpu[1] - cpu[0], sched, torch_nodes)

    def _bridge(
        self,
        scenario: str,
        msg: dict[str, Any],
        bridge: dict[int, _Counted],
        sched: _Scheduler,
        t0: float,
    ) -> list[Callable[[], None]]:
        """Start this scenario's bridge traffic; the exchanges' ``close``."""
        if scenario == "healthy":
            return []  # nothing: a healthy job's bridge never touches the store (see README)
        if scenario == "slow_nodes":
            return self._slow_nodes(msg, bridge, sched, t0 + msg["window"][0])
        return self._stalled(BRIDGE_OF.get(scenario, scenario), bridge, sched, t0)

    def _stalled(
        self, scenario: str, bridge: dict[int, _Counted], sched: _Scheduler, t0: float
    ) -> list[Callable[[], None]]:
        """Each node's training watch polling its stalled ranks, through the real model and
        exchange; every node's ranks stopped ``ELASTIC_OTEL_STALL_AFTER`` before ``t0``."""
        from elastic_otel.integration.stall_exchange import STORE_TIMEOUT_S, StallExchange

        after_ns = int(self.p["stall_after_s"] * 1e9 / self.scale)
        since_ns = time.time_ns() - after_ns - 1_000_000_000
        rng = random.Random(f"{scenario}-{self.mine[0]}")
        closers: list[Callable[[], None]] = []
        for node in self.mine:
            poller = _Poller(sched, self.p["poll_s"])
            exchange = StallExchange(bridge[node], poller.wake, STORE_TIMEOUT_S)
            closers.append(exchange.close)
            ranks = _progress(scenario, node, node == self.nodes - 1, since_ns)
            poller.poll = _Watch(exchange, ranks, after_ns, since_ns).poll
            poller.start(t0 + rng.uniform(0, self.p["poll_s"]))
        return closers

    def _slow_nodes(
        self, msg: dict[str, Any], bridge: dict[int, _Counted], sched: _Scheduler, w0: float
    ) -> list[Callable[[], None]]:
        """Every node publishes its window's value once at its own time in the window; node 0
        then reads them all. Each key already holds the previous window's value."""
        from elastic_otel.integration.straggler_exchange import StragglerExchange
        from elastic_otel.integration.straggler_exchange import key as node_key
        from elastic_otel.model.slow_nodes import encode

        rng = random.Random(7)
        closers: list[Callable[[], None]] = []
        for node in self.mine:
            raw = bridge[node]._store  # not counted: the previous window
            raw.set(node_key(msg["round"], node), encode(_inside(node, self.nodes, 1)))
            exchange = StragglerExchange(
                bridge[node], msg["round"], node, self.nodes, 0.75, lambda slow: None
            )
            closers.append(exchange.close)
            value = _inside(node, self.nodes, 2)
            sched.at(w0 + rng.uniform(0, self.p["window_s"]), _publish(exchange, value))
        return closers

    def _results(
        self,
        w0: float,
        w1: float,
        client_cpu_s: float,
        sched: _Scheduler,
        torch_nodes: list[_TorchNode],
    ) -> dict[str, Any]:
        lo, hi = int(w0 * 1e9), int(w1 * 1e9)
        counts: dict[str, list[int]] = {}  # "source|op" → [in window, before it, failed]
        latencies: dict[str, list[int]] = {}
        for start, source, op, ns, ok in self.rec.ops:
            row = counts.setdefault(f"{source}|{op}", [0, 0, 0])
            if start < lo:
                row[1] += 1
            elif start < hi:
                row[0] += 1
                row[2] += 0 if ok else 1
                latencies.setdefault(f"{source}|{op}", []).append(ns)
        runs = [k for t in torch_nodes for k in t.keep_alives if w0 <= k[0] < w1]
        return {
            "counts": counts,
            "latency_ns": latencies,
            "lag_s": [late for due, late in sched.lags if w0 <= due < w1],
            "torch_lag_s": [late for t in torch_nodes for due, late in t.lags if w0 <= due < w1],
            "client_cpu_s": client_cpu_s,
            "keys": sorted(self.rec.keys),
            "torch_nodes": len(torch_nodes),
            "keep_alive": {
                "runs": len(runs),
                "attempts": sum(k[1] for k in runs),
                "timeouts": sum(1 for k in runs if not k[2]),
            },
        }


def _inside(node: int, nodes: int, window: int) -> Any:
    """A node's slow-node value: one NCCL group timed over the window, 8 ranks."""
    from elastic_otel.model.slow_nodes import node_inside
    from elastic_otel.model.stragglers import GroupInside

    ranks = _ranks(node)
    inside = GroupInside(600, {r: 1.0e6 + 1_000 * (r % 7) for r in ranks}, 5.0e7)
    return node_inside(node, hostname(node), ranks, window, {"nccl:0": inside})


def _progress(scenario: str, node: int, late: bool, since_ns: int) -> list[Any]:
    """A node's ranks as ``rank_progress`` reads them from their records, stalled since
    ``since_ns``: in training, every rank in collective ``COLLECTIVE_NUMBER`` of the default
    group but, on the late node, its first rank, which issued the one before; at start-up,
    every rank inside ``init_process_group`` but the late node's, none of which reached it;
    in a slow start, no rank anywhere reached it."""
    from elastic_otel.model.stalls import INIT, INIT_GROUP, RankProgress
    from elastic_otel.parsing.collectives import group_key

    default, n = group_key("0", "nccl"), COLLECTIVE_NUMBER
    out = []
    for r in _ranks(node):
        if scenario == "training":
            if late and r == _ranks(node)[0]:
                out.append(RankProgress(r, None, n - 1, None, since_ns, None, ((default, n - 1),)))
            else:
                out.append(
                    RankProgress(r, "all_reduce", n, None, since_ns, default, ((default, n),))
                )
        elif scenario == "startup" and not late:
            out.append(RankProgress(r, INIT, 0, None, since_ns, init=1))
        else:
            out.append(RankProgress(r, None, 0, None, since_ns, issued=((INIT_GROUP, 0),)))
    return out


class _Watch:
    """The training watch's steps for a stall (``TrainingWatch._check``): the model says who
    waits for whom, the exchange adds what other nodes said; a report is due every
    ``ELASTIC_OTEL_STALL_AFTER`` or at once when newly named, and a report that names local
    ranks publishes them (after their stacks, which are not taken here)."""

    def __init__(self, exchange: Any, ranks: list[Any], after_ns: int, started_ns: int) -> None:
        self.exchange, self.ranks = exchange, ranks
        self.after_ns, self.started_ns = after_ns, started_ns
        self.local = [r.global_rank for r in ranks]
        self.last_ns = 0
        self.named = False

    def poll(self) -> None:
        from elastic_otel.model.stalls import STARTUP, startup_stall, training_stall

        now_ns = time.time_ns()
        stall = training_stall(self.ranks, now_ns, self.after_ns, self.local)
        if stall is None:
            stall = startup_stall(self.ranks, now_ns, self.after_ns, self.started_ns)
        if stall is not None:
            stall = self.exchange.exchanged(stall, self.ranks)
        if stall is not None and stall.phase == STARTUP and not (stall.waiting or stall.waited_for):
            stall = None  # a slow start, nobody waiting
        named = stall is not None and bool(stall.waited_for or stall.remote)
        if stall is None:
            self.last_ns = 0
        elif now_ns - self.last_ns >= self.after_ns or (named and not self.named):
            self.last_ns, self.named = now_ns, named
            if stall.waited_for:  # its stacks are taken, then it publishes
                self.exchange.publish(stall, FRAME)


def _publish(exchange: Any, value: Any) -> Callable[[], None]:
    return lambda: exchange.publish(value)


def client_main(config: dict[str, Any]) -> None:
    # Not pinned: on a shared machine the clients need every CPU they can get to keep up.
    client = _Client(config)
    _reply({"periods": client.p})
    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg["cmd"]
        if cmd == "connect":
            _reply(client.connect())
        elif cmd == "seed":
            _reply(client.seed())
        elif cmd == "calibrate":
            _reply({"rows": client.calibrate(msg["key"], msg["reps"], msg["big_reps"])})
        elif cmd == "phase":
            _reply(client.phase(msg))
        else:
            break


# --- the parent -----------------------------------------------------------------------------------


def _summary_ms(values: list[int] | list[float], unit: float) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "median": common.percentile(ordered, 50) * unit,
        "p99": common.percentile(ordered, 99) * unit,
        "max": float(ordered[-1]) * unit,
    }


def _merge(replies: list[dict[str, Any]], window_s: float) -> dict[str, Any]:
    """The clients' replies of one phase as one: per source and op, per second and latency."""
    counts: dict[str, list[int]] = {}
    latencies: dict[str, list[int]] = {}
    for r in replies:
        for k, row in r["counts"].items():
            total = counts.setdefault(k, [0, 0, 0])
            for i in range(3):
                total[i] += row[i]
        for k, values in r["latency_ns"].items():
            latencies.setdefault(k, []).extend(values)
    ops: dict[str, dict[str, Any]] = {TORCH: {}, BRIDGE: {}}
    for k, (n, before, failed) in sorted(counts.items()):
        source, op = k.split("|", 1)
        ops[source][op] = {
            "per_s": n / window_s,
            "count": n,
            "before_window": before,
            "failed": failed,
            "latency_ms": _summary_ms(latencies.get(k, []), 1e-6),
        }
    by_source = {
        source: _summary_ms(
            [v for k, vs in latencies.items() if k.startswith(source + "|") for v in vs], 1e-6
        )
        for source in (TORCH, BRIDGE)
    }
    keep_alive = {
        k: sum(r["keep_alive"][k] for r in replies) for k in ("runs", "attempts", "timeouts")
    }
    return {
        "ops": ops,
        "torch_ops_per_s": sum(o["per_s"] for o in ops[TORCH].values()),
        "bridge_ops_per_s": sum(o["per_s"] for o in ops[BRIDGE].values()),
        "latency_ms": by_source,
        "lag_ms": _summary_ms([x for r in replies for x in r["lag_s"]], 1e3),
        "torch_lag_ms": _summary_ms([x for r in replies for x in r["torch_lag_s"]], 1e3),
        "client_cpu_cores": sum(r["client_cpu_s"] for r in replies) / window_s,
        "keys": sorted({k for r in replies for k in r["keys"]}),
        "keep_alive": keep_alive,
    }


def _windows(p: dict[str, float], quick: bool) -> dict[str, tuple[float, float]]:
    """Each scenario's measured window, from its start: torch runs from 0; the bridge of a
    stall from 0 too (its first poll writes, excluded), of the slow-node exchange from the
    window's start."""
    measure = 3 * p["poll_s"]
    lead = p["keep_alive_s"]
    return {
        "healthy": (lead, lead + measure),
        "training": (p["poll_s"], p["poll_s"] + measure),
        "startup": (p["poll_s"], p["poll_s"] + measure),
        "slow_start": (p["poll_s"], p["poll_s"] + measure),
        "slow_nodes": (lead, lead + p["window_s"]),
        "training_alone": (p["poll_s"], p["poll_s"] + measure),
    }


def _run_size(
    nodes: int,
    scale: float,
    quick: bool,
    log: Callable[[str], None],
    scenarios: tuple[str, ...] = SCENARIOS,
) -> dict[str, Any]:
    server = _Child("server", {})
    clients: list[_Child] = []
    try:
        srv = server.receive()
        pid = srv["pid"]
        rss_start = _rss_mib(pid)
        for k in range(CLIENT_PROCESSES):
            mine = [i for i in range(nodes) if i % CLIENT_PROCESSES == k]
            cfg = {"port": srv["port"], "nodes": nodes, "mine": mine, "server_pid": pid}
            clients.append(_Child("client", {**cfg, "scale": scale}))
        ready = [c.receive() for c in clients]
        p = ready[0]["periods"]
        for c in clients:
            c.send({"cmd": "connect"})
        connected = [c.receive() for c in clients]
        rss_connected = _rss_mib(pid)
        clients[0].send({"cmd": "seed"})
        seeded = clients[0].receive()
        reps, big = (200, 10) if quick else (2000, 60)
        clients[0].send({"cmd": "calibrate", "key": seeded["key"], "reps": reps, "big_reps": big})
        calibration = clients[0].receive()["rows"]
        idle_s = 1.0 if quick else 3.0
        cpu0 = common.proc_cpu_seconds(pid)
        time.sleep(idle_s)
        idle = (common.proc_cpu_seconds(pid) - cpu0) / idle_s
        costs = {r["op"]: r for r in calibration}
        torch_rate = {  # per node per second, at the real periods
            "get (state)": 1.0 / (p["cache_s"] + p["monitor_s"] / 2),
            "compare_set (state)": KEEP_ALIVE_WRITES / p["keep_alive_s"],
        }
        need = {
            side: nodes * sum(rate * costs[op][side] for op, rate in torch_rate.items()) / 1e6
            for side in ("server_us", "client_us")
        }
        share = min(1.0, TORCH_BUDGET_CORES / max(need.values()), MAX_TORCH_NODES / nodes)
        stride = max(1, math.ceil(1 / share))
        torch_nodes = len(range(0, nodes, stride))
        log(
            f"[store_load] {nodes} nodes: connected in "
            f"{max(c['connect_s'] for c in connected):.0f} s; torch's traffic from "
            f"{torch_nodes} nodes (1 in {stride})"
        )
        windows = _windows(p, quick)
        phases = []
        for i, scenario in enumerate(scenarios):
            w = windows[scenario]
            t0 = time.time() + (0.3 if quick else 1.0)  # for the clients to set up
            msg = {"cmd": "phase", "scenario": scenario, "t0_wall": t0, "window": list(w),
                   "round": i + 1, "key": seeded["key"], "think": seeded["think"],
                   "stride": 0 if scenario in BRIDGE_OF else stride}  # fmt: skip
            for c in clients:
                c.send(msg)
            time.sleep(max(0.0, t0 + w[0] - time.time()))
            cpu_w0, busy_w0 = common.proc_cpu_seconds(pid), common.machine_busy_seconds()
            time.sleep(max(0.0, t0 + w[1] - time.time()))
            cpu_w1, busy_w1 = common.proc_cpu_seconds(pid), common.machine_busy_seconds()
            replies = [c.receive() for c in clients]
            window_s = w[1] - w[0]
            merged = _merge(replies, window_s)
            server_cores = (cpu_w1 - cpu_w0) / window_s
            busy = (busy_w1 - busy_w0) / window_s
            lag = merged["lag_ms"]
            phases.append(
                {
                    "scenario": scenario,
                    "window_s": window_s,
                    # The bridge's polls started within a tenth of their period: the clients
                    # kept up (else the row's rates are low and its latencies high).
                    "kept_up": lag is None or lag["p99"] <= p["poll_s"] * 100,
                    "server_cpu_cores": server_cores,
                    "server_rss_mib": _rss_mib(pid),
                    # Other processes' CPU meanwhile (the machine may be shared).
                    "foreign_cores": max(0.0, busy - server_cores - merged["client_cpu_cores"]),
                    **merged,
                }
            )
            log(f"[store_load] {nodes} nodes, {scenario}: done")
        return _derive(
            {
                "nodes": nodes,
                "periods": p,
                "libuv": srv["libuv"],
                "connections": sum(c["connections"] for c in connected),
                "connect_s": max(c["connect_s"] for c in connected),
                "state_bytes": seeded["state_bytes"],
                "pickled_state_bytes": seeded["pickled_bytes"],
                "think": seeded["think"],
                "server_rss_start_mib": rss_start,
                "server_rss_connected_mib": rss_connected,
                "idle_server_cores": idle,
                "calibration": calibration,
                "torch_need_cores": need,
                "torch_stride": stride,
                "torch_nodes": torch_nodes,
                "torch_share": torch_nodes / nodes,
                "phases": phases,
            }
        )
    finally:
        for c in clients:
            c.close()
        server.close()


def _model_cores(ops: dict[str, dict[str, Any]], costs: dict[str, dict[str, Any]]) -> float:
    """Server cores the counted operations cost at the calibrated per-operation costs."""
    alias = {
        "get (monitor)": "get (state)",
        "get (keep-alive)": "get (state)",
        "compare_set": "compare_set (state)",
        "compare_set (retry)": "compare_set (state)",
    }
    total = 0.0
    for op, row in ops.items():
        cost = costs.get(alias.get(op, op))
        if cost is not None:
            total += row["per_s"] * cost["server_us"] / 1e6
    return total


def _derive(run: dict[str, Any]) -> dict[str, Any]:
    """torch's traffic at its real rate (scaled by the share of nodes that ran it), and each
    scenario against the healthy job's baseline measured in the same run."""
    share, idle = run["torch_share"], run["idle_server_cores"]
    costs = {r["op"]: r for r in run["calibration"]}
    healthy = next((ph for ph in run["phases"] if ph["scenario"] == "healthy"), None)
    if healthy is None:  # a subset of the scenarios (python -m benchmarks.store_load)
        return run
    torch_cores = idle + max(0.0, healthy["server_cpu_cores"] - idle) / share
    base_ops = healthy["torch_ops_per_s"] / share
    for phase in run["phases"]:
        alone = phase["scenario"] in BRIDGE_OF
        measured = phase["server_cpu_cores"]
        phase["torch_ops_per_s_real"] = phase["torch_ops_per_s"] / share
        phase["ops_per_s_real"] = phase["torch_ops_per_s_real"] + phase["bridge_ops_per_s"]
        phase["bridge_model_cores"] = _model_cores(phase["ops"][BRIDGE], costs)
        phase["torch_model_cores"] = _model_cores(phase["ops"][TORCH], costs) / share
        if alone:  # the bridge alone: its own cost, measured
            phase["bridge_server_cores"] = measured - idle
            phase["server_cores_real"] = measured
            phase["vs_healthy"] = None
            continue
        # With torch's traffic: what the scenario measured above the healthy job is the
        # bridge's (and the noise of torch's traffic, which is larger from 1,024 nodes).
        phase["bridge_server_cores"] = measured - healthy["server_cpu_cores"]
        phase["server_cores_real"] = torch_cores + phase["bridge_server_cores"]
        phase["vs_healthy"] = {
            "ops_per_s": phase["ops_per_s_real"] - base_ops,
            "ops_ratio": common.ratio(phase["ops_per_s_real"], base_ops),
            "server_cores": phase["server_cores_real"] - torch_cores,
            "server_ratio": common.ratio(phase["server_cores_real"], torch_cores),
            "rss_mib": phase["server_rss_mib"] - healthy["server_rss_mib"],
        }
    run["torch_server_cores_real"] = torch_cores
    run["torch_model_cores"] = healthy["torch_model_cores"]
    return run


def run(
    quick: bool,
    log: Callable[[str], None] | None = None,
    sizes: tuple[int, ...] | None = None,
    scenarios: tuple[str, ...] = SCENARIOS,
) -> dict[str, Any]:
    """Every size, every scenario; quick mode: 64 nodes, every period divided by 20."""
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    scale = QUICK_TIME_SCALE if quick else 1.0
    runs = [_run_size(n, scale, quick, say, scenarios) for n in sizes]
    return {
        "quick": quick,
        "time_scale": scale,
        "sizes": list(sizes),
        "client_processes": CLIENT_PROCESSES,
        "worker_threads": WORKER_THREADS,
        "budget_cores": TORCH_BUDGET_CORES,
        "max_torch_nodes": MAX_TORCH_NODES,
        "ranks_per_node": RANKS_PER_NODE,
        "periods": runs[0]["periods"],
        "libuv": runs[0]["libuv"],
        "scenario_labels": SCENARIO_LABELS,
        "runs": runs,
    }


def main(argv: list[str]) -> None:
    if argv and argv[0] == "server":
        server_main()
    elif argv and argv[0] == "client":
        client_main(json.loads(argv[1]))
    else:  # [--full] [--sizes=4096,...] [--scenarios=healthy,training,...]
        opts = dict(a.split("=", 1) for a in argv if "=" in a)
        sizes = tuple(int(n) for n in opts["--sizes"].split(",")) if "--sizes" in opts else None
        scenarios = tuple(opts.get("--scenarios", ",".join(SCENARIOS)).split(","))
        print(json.dumps(run("--full" not in argv, None, sizes, scenarios), indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
