"""Section 9: what hang diagnosis (issue 20) costs a training job.

* **Training thread.** A child process times (``timeit``, best of several repeats) a no-op
  collective with torch's ``all_reduce`` parameters, bare and wrapped by
  :func:`elastic_otel.worker.progress.wrap` (unarmed, then armed; positional and keyword calls),
  :func:`~elastic_otel.worker.progress.mark_step` and the goodput calls
  :func:`~elastic_otel.worker.progress.mark_checkpoint` and ``with``
  :func:`~elastic_otel.worker.progress.saving_checkpoint` (an empty block), unarmed and
  armed. A second child is a worker armed by the worker start-up (the environment the
  instrumented agent gives a worker) and times a real one-process gloo ``all_reduce`` of a
  1-element tensor, bare (``dist.all_reduce.__wrapped__``) and wrapped (``dist.all_reduce``),
  interleaved (not in quick mode).
* **Idle node.** An agent process (a child whose main thread only sleeps) starts 8 real worker
  processes armed by the start-up that mark steps in a loop; its CPU per second with the
  training watch off, then on (:class:`~elastic_otel.integration.training_watch.TrainingWatch`,
  with the stall threshold given), and the CPU of each of the watch's checks (its thread).
* **Stack dump.** The agent process starts stalled armed workers (rank 1 stuck outside any
  collective in a deep stack, the others waiting in ``all_reduce``; each with extra threads) and
  runs the watch's check on them as its thread does (``_check`` → ``_take_stacks`` → the agent
  instrumentation's ``_report_stacks_and_stall`` into a real bridge exporting to the counting
  receiver): wall and CPU of the round in the agent, the workers' CPU for their dumps, the
  stack text per worker, the records and their OTLP bytes. Variants: plain Python workers, and
  workers with torch imported in a real gloo group (the waiting ranks block in gloo's
  ``all_reduce``, the stuck one in a ``nn.Module`` forward; not in quick mode).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks import common

MODULE = "benchmarks.training"
NODES = 4096
WORKERS_PER_NODE = 8
HANG_RANK = 1
PARTS = ("mapping store", "time_ns()", "get_ident()", "list read and write")
"""The operations the armed wrapper is made of, timed alone (see ``HOT_PATH``)."""

# --- the scripts of the processes measured --------------------------------------------------

PIN = """import os, sys
_cpu = sys.argv.pop(1)  # the CPU to run on ("": any)
if _cpu:
    os.sched_setaffinity(0, {int(_cpu)})
"""

HOT_PATH = """
import json, os, sys, timeit
from elastic_otel.worker import progress

def all_reduce(tensor, op=0, group=None, async_op=False):
    return None

wrapped = progress.wrap(all_reduce, 1)
N, REPEAT = int(sys.argv[1]), int(sys.argv[2])
x = object()
CASES = {
    "empty statement": ("pass", {}),
    "bare collective": ("f(x)", {"f": all_reduce}),
    "bare collective, keywords": ("f(x, group=None, async_op=False)", {"f": all_reduce}),
    "wrapped": ("f(x)", {"f": wrapped}),
    "wrapped, keywords": ("f(x, group=None, async_op=False)", {"f": wrapped}),
    "mark_step": ("m(3)", {"m": progress.mark_step}),
    "mark_checkpoint": ("c(3)", {"c": progress.mark_checkpoint}),
    "saving_checkpoint": ("with s(3): pass", {"s": progress.saving_checkpoint}),
}
PARTS = {  # what the armed wrapper is made of (after arm: the mapping exists)
    "mapping store": ("v[9] = 7", {}),
    "time_ns()": ("t()", {"t": progress._time_ns}),
    "get_ident()": ("g()", {"g": progress._get_ident}),
    "list read and write": ("s[0] = s[0] + 1", {"s": [0, 0, 0]}),
}

def measure(phase):
    runs = {name: [] for name in CASES}
    for _ in range(REPEAT):  # the cases interleaved, so drift hits them alike
        for name, (statement, names) in CASES.items():
            t = timeit.timeit(statement, globals={"x": x, **names}, number=N)
            runs[name].append(t / N * 1e9)
    return {f"{name}, {phase}": ns for name, ns in runs.items()}

result = measure("unarmed")
progress.arm(os.path.join(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"]), "record"))
assert progress.armed()
PARTS["mapping store"][1]["v"] = progress._view
CASES.update(PARTS)
result.update(measure("armed"))
print("RESULT " + json.dumps(result))
"""

GLOO = """
import json, os, socket, sys, timeit
import torch
import torch.distributed as dist
from elastic_otel.worker import progress
from elastic_otel.parsing.worker_progress import read_progress

N, REPEAT = int(sys.argv[1]), int(sys.argv[2])
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
one = torch.ones(1)
bare, wrapped = dist.all_reduce.__wrapped__, dist.all_reduce
for f in (bare, wrapped):
    for _ in range(200):
        f(one)
before = read_progress(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"])).completed
runs = {"bare": [], "wrapped": []}
for _ in range(REPEAT):
    for name, f in (("bare", bare), ("wrapped", wrapped)):
        runs[name].append(timeit.timeit(lambda: f(one), number=N) / N * 1e9)
after = read_progress(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"])).completed
dist.destroy_process_group()
print("RESULT " + json.dumps({
    "ns": runs,
    "armed": progress.armed(),
    "wrapped": hasattr(wrapped, "_elastic_otel_collective"),
    "recorded_calls": after - before,
}))
"""

PROGRESSING = """
import sys, time
import elastic_otel

step_s, deadline = float(sys.argv[1]), time.monotonic() + float(sys.argv[2])
step = 0
while time.monotonic() < deadline:
    elastic_otel.mark_step(step)
    step += 1
    time.sleep(step_s)
"""

# Shared by both stalled variants: helper threads (a data loader, a checkpoint writer, a metrics
# pusher) each some frames deep, and a training loop whose frames nest ``depth`` deep.
_STALLED_COMMON = """
import queue, sys, threading, time
import elastic_otel

RANK, DEPTH, THREADS, SECONDS = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                 float(sys.argv[4]))
HANG_RANK = 1

def nested(depth, fn, *args):
    if depth <= 0:
        return fn(*args)
    return nested(depth - 1, fn, *args)

def data_loader(q):
    return q.get(timeout=SECONDS)

def checkpoint_writer(done):
    return done.wait(SECONDS)

def metrics_pusher():
    time.sleep(SECONDS)

HELPERS = (
    lambda: nested(8, data_loader, queue.Queue()),
    lambda: nested(6, checkpoint_writer, threading.Event()),
    lambda: nested(4, metrics_pusher),
)
for i in range(THREADS):
    threading.Thread(target=HELPERS[i % len(HELPERS)], name=f"helper-{i}", daemon=True).start()

def stuck_input():
    time.sleep(SECONDS)  # rank 1: a stuck data loader, outside any collective
"""

STALLED_PLAIN = (
    _STALLED_COMMON
    + """
from elastic_otel.parsing.worker_progress import COLLECTIVES
from elastic_otel.worker import progress

release = threading.Event()

def blocking_all_reduce(tensor, op=0, group=None, async_op=False):
    if tensor == "wait":
        release.wait(SECONDS)  # stands in for a collective waiting for rank 1

all_reduce = progress.wrap(blocking_all_reduce, COLLECTIVES.index("all_reduce"))

def train_step(step):
    if step == 3 and RANK == HANG_RANK:
        nested(DEPTH, stuck_input)
    nested(DEPTH, all_reduce, "wait" if step == 3 else None)

def train():
    for step in range(5):
        elastic_otel.mark_step(step)
        train_step(step)

train()
"""
)

STALLED_TORCH = (
    _STALLED_COMMON
    + """
import torch
import torch.distributed as dist
from torch import nn

WORLD, INIT = int(sys.argv[5]), sys.argv[6]

class Stall(nn.Module):
    def __init__(self):
        super().__init__()
        self.stall = False

    def forward(self, x):
        if self.stall:
            stuck_input()
        return x

class Block(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.inner = inner

    def forward(self, x):
        return self.inner(torch.relu(self.linear(x)))

stall = Stall()
model = stall
for _ in range(max(1, DEPTH // 3)):  # each Block is three frames of the stack
    model = Block(model)

def sync_gradients():
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)

def train_step(step):
    stall.stall = step == 3 and RANK == HANG_RANK
    loss = model(torch.ones(2, 4)).sum()
    model.zero_grad()
    loss.backward()
    sync_gradients()

def train():
    for step in range(5):
        elastic_otel.mark_step(step)
        train_step(step)

dist.init_process_group("gloo", rank=RANK, world_size=WORLD, init_method=INIT)
train()
"""
)


Workers = list[tuple[subprocess.Popen[bytes], Path]]
"""Worker processes and their private directories."""

# --- helpers ----------------------------------------------------------------------------------


def cpu_clock_s(pid: int) -> float | None:
    """CPU seconds of process ``pid`` (all its threads) from its CPU-time clock, to the
    nanosecond (``clock_getcpuclockid(pid)`` as Linux computes it); ``None`` where unreadable."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        return None


def _site() -> str:
    """The worker start-up's directory, in the package snapshot the suite measures."""
    snapshot = os.environ.get(common.SNAPSHOT_ENV)
    if snapshot:
        return os.path.join(snapshot, "elastic_otel", "worker", "site")
    from elastic_otel.worker.startup import SITE_DIRECTORY

    return SITE_DIRECTORY


def _worker_env(directory: Path) -> dict[str, str]:
    """What the instrumented agent gives a worker (``_add_worker_startup``): the start-up's
    directory first on ``PYTHONPATH``, the worker's own path to put back, its error file."""
    env = common.clean_env()
    base = env.get("PYTHONPATH", "")
    env.update(
        {
            "PYTHONPATH": _site() + (os.pathsep + base if base else ""),
            "ELASTIC_OTEL_WORKER_PYTHONPATH": base,
            "ELASTIC_OTEL_WORKER_REPORTS": "1",
            "TORCHELASTIC_ERROR_FILE": str(directory / "error.json"),
        }
    )
    env.pop("PYTHONFAULTHANDLER", None)
    return env


def _start_workers(tmp: Path, n: int, script: str, args: Callable[[int], list[str]]) -> Workers:
    """``n`` armed worker processes running ``script`` (each in its own private directory)."""
    path = tmp / "train.py"
    path.write_text(textwrap.dedent(script))
    workers = []
    for rank in range(n):
        directory = tmp / "attempt_0" / str(rank)
        directory.mkdir(parents=True)
        with open(directory / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, str(path), *args(rank)],
                env=_worker_env(directory),
                cwd=tmp,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        workers.append((proc, directory))
    return workers


def _stop_workers(workers: Workers) -> None:
    for proc, _ in workers:
        if proc.poll() is None:
            proc.kill()
    for proc, _ in workers:
        proc.wait(30)


def _wait_records(
    workers: Workers,
    ready: Callable[[int, Any], bool],
    timeout_s: float,
) -> list[Any]:
    """Every worker's progress record, once ``ready(rank, record)`` holds for all of them."""
    from elastic_otel.parsing.worker_progress import read_progress

    deadline = time.monotonic() + timeout_s
    while True:
        records = [read_progress(str(d)) for _, d in workers]
        if all(r is not None and ready(rank, r) for rank, r in enumerate(records)):
            return records
        for proc, directory in workers:
            if proc.poll() is not None:
                err = (directory / "stderr.txt").read_text()[-3000:]
                raise RuntimeError(f"worker exited ({proc.returncode}):\n{err}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not ready within {timeout_s} s: {records}")
        time.sleep(0.05)


class _Reports(list[str]):
    """The reasons the watch reported (none expected while the workers progress)."""

    def append_reason(self, reason: str, stacks: Any, stall: Any) -> None:
        self.append(reason)


class _PContext:
    """Stands in for torch's process context (the watch keys its groups on it, weakly)."""


def _watched(workers: Workers, torch_workers: bool = True) -> list[Any]:
    from elastic_otel.integration.training_watch import WatchedWorker

    watched = []
    for rank, (proc, directory) in enumerate(workers):
        worker: Any = None
        if torch_workers:
            from torch.distributed.elastic.agent.server.api import Worker

            worker = Worker(
                local_rank=rank,
                global_rank=rank,
                role_rank=rank,
                world_size=len(workers),
                role_world_size=len(workers),
            )
            worker.id = proc.pid
        watched.append(WatchedWorker(rank, rank, proc.pid, str(directory), worker))
    return watched


def _agent() -> Any:
    """An object with torch's own ``SimpleElasticAgent._construct_event`` and the state it
    reads, as the agent instrumentation's ``_construct`` calls it."""
    import types

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    rdzv = types.SimpleNamespace(get_run_id=lambda: "bench-job", get_backend=lambda: "c10d")
    spec = types.SimpleNamespace(
        rdzv_handler=rdzv, role="trainer", max_restarts=3, get_entrypoint_name=lambda: "train.py"
    )
    group = types.SimpleNamespace(spec=spec, group_world_size=NODES, group_rank=0)
    agent = types.SimpleNamespace(
        _worker_group=group, _total_execution_time=0, _remaining_restarts=3
    )
    agent._construct_event = types.MethodType(SimpleElasticAgent._construct_event, agent)
    return agent


# --- children ---------------------------------------------------------------------------------


def _script_result(what: str, script: str, args: list[str], env: Mapping[str, str]) -> Any:
    """Run ``script`` (pinned to the measured CPU) in a fresh interpreter; its RESULT line."""
    cpu = common.measured_cpu()
    with tempfile.TemporaryDirectory(prefix="eo-bench-training-") as tmp:
        path = Path(tmp) / "measure.py"
        path.write_text(PIN + script)
        directory = Path(tmp) / "attempt_0" / "0"
        directory.mkdir(parents=True)
        proc = subprocess.run(
            [sys.executable, str(path), "" if cpu is None else str(cpu), *args],
            env={**env, "TORCHELASTIC_ERROR_FILE": str(directory / "error.json")},
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=600,
        )
    return common._child_result(what, proc.stdout, proc.stderr, proc.returncode)


def idle_child(config: dict[str, Any]) -> dict[str, Any]:
    """The agent process over progressing workers: its CPU per second with no watch, then
    with a watch per threshold in turn (each stopped before the next); each check's CPU."""
    from elastic_otel.bridge.handler import OtelHandler
    from elastic_otel.integration.training_watch import TrainingWatch

    common.pin(common.measured_cpu())
    handler = OtelHandler(pipeline_factory=lambda: None)  # the event thread the watch runs on
    handler.start()
    n, phases = config["workers"], config["phases"]
    lifetime = sum(p["seconds"] for p in phases) + config["off_s"] + 120
    with tempfile.TemporaryDirectory(prefix="eo-bench-idle-") as tmp:
        workers = _start_workers(
            Path(tmp), n, PROGRESSING, lambda _: [str(config["step_s"]), str(lifetime)]
        )
        try:
            _wait_records(workers, lambda _, r: r.step is not None, 120)
            common.settle()
            cpu0, t0 = time.process_time(), time.monotonic()
            time.sleep(config["off_s"])
            off = {"cpu_s": time.process_time() - cpu0, "seconds": time.monotonic() - t0}
            results = []
            for phase in phases:
                watch = TrainingWatch()
                checks: list[float] = []
                reports = _Reports()
                check = watch._check

                def timed_check(
                    group: Any, now_ns: int, check: Any = check, checks: list[float] = checks
                ) -> None:
                    t = time.thread_time()
                    check(group, now_ns)
                    checks.append(time.thread_time() - t)

                watch._check = timed_check  # type: ignore[method-assign]
                pcontext = _PContext()
                cpu0, t0 = time.process_time(), time.monotonic()
                watch.watch(pcontext, _watched(workers, False), reports.append_reason,
                            phase["after_s"], dict, schedule=handler.schedule)  # fmt: skip
                time.sleep(phase["seconds"])
                on = {"cpu_s": time.process_time() - cpu0, "seconds": time.monotonic() - t0}
                watch.before_stop(pcontext, False)  # its task finds nothing to do from now
                results.append(
                    {
                        "after_s": phase["after_s"],
                        "period_s": min(max(phase["after_s"] / 4, 0.5), 5.0),
                        "on": on,
                        "checks": len(checks),
                        "check_cpu_us": [c * 1e6 for c in checks],
                        "reports": reports,
                    }
                )
            alive = sum(proc.poll() is None for proc, _ in workers)
            steps = [r.step for r in _wait_records(workers, lambda _, r: True, 10)]
        finally:
            _stop_workers(workers)
    return {"workers": n, "alive_at_end": alive, "steps_marked": steps, "off": off,
            "phases": results}  # fmt: skip


def _stalled(rank: int, record: Any) -> bool:
    """Rank 1 stuck after marking step 3, outside any collective; the others in all_reduce."""
    if rank == HANG_RANK:
        return bool(record.step == 3 and record.collective is None)
    return bool(record.collective == "all_reduce" and record.step == 3)


def dump_child(config: dict[str, Any]) -> dict[str, Any]:
    """Per variant: stalled workers, rounds of the watch's check (stacks and the stall report)
    into a real bridge, then one stall record alone; pauses twice per variant for the
    parent's receiver snapshots (before the rounds, before the stall record alone)."""
    import elastic_otel

    common.pin(common.measured_cpu())
    elastic_otel.register()
    return {"variants": [_dump_variant(v, config) for v in config["variants"]]}


def _dump_variant(v: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    import socket

    import elastic_otel
    from elastic_otel.integration.agent_events import report_stacks_and_stall
    from elastic_otel.integration.training_watch import REASON_TRAINING, TrainingWatch, _Group
    from elastic_otel.model.stalls import RankProgress, training_stall

    bridge = elastic_otel.get_handler()
    n, variant = v["workers"], v["variant"]
    torch_workers = variant == "torch"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        init = f"tcp://127.0.0.1:{s.getsockname()[1]}"

    def args(rank: int) -> list[str]:
        base = [str(rank), str(config["depth"]), str(config["threads"]), str(config["hang_s"])]
        return base + ([str(n), init] if torch_workers else [])

    with tempfile.TemporaryDirectory(prefix="eo-bench-dump-") as tmp:
        script = STALLED_TORCH if torch_workers else STALLED_PLAIN
        workers = _start_workers(Path(tmp), n, script, args)
        try:
            agent = _agent()
            records = _wait_records(workers, _stalled, 300)
            after_s = 1.0  # the threshold the rounds use: the workers are stalled longer
            last = max(r.progress_ns for r in records)
            time.sleep(max(0.0, (last + after_s * 1e9 - time.time_ns()) / 1e9) + 0.1)
            watched = _watched(workers)
            texts: list[list[str]] = []

            def report(reason: str, stacks: list[tuple[Any, str]], stall: Any, dumps: Any) -> None:
                texts.append([text for _, text in stacks])
                report_stacks_and_stall(agent, bridge, reason, stacks, stall, dumps)

            watch = TrainingWatch()
            group = _Group(watched, report, int(after_s * 1e9), dict)
            elastic_otel.flush(30.0)
            common.pause()  # the parent snapshots the receiver: the rounds' records follow
            rounds = []
            for _ in range(v["rounds"]):
                group.last_training_ns = 0  # report again, as after every STALL_AFTER seconds
                pids = [w.pid for w in watched]
                clock0 = [cpu_clock_s(p) for p in pids]
                stat0 = [common.proc_cpu_seconds(p) for p in pids]
                reported = len(texts)
                cpu0, t0 = time.process_time(), time.perf_counter()
                watch._check(group, time.time_ns())
                for request in watch._requests:  # as the event thread awaits them, a poll at a time
                    while not request.poll():
                        time.sleep(0.02)
                    request.finish()
                watch._requests.clear()
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                time.sleep(0.1)  # a dump still being written is charged to this round
                clock1 = [cpu_clock_s(p) for p in pids]
                stat1 = [common.proc_cpu_seconds(p) for p in pids]
                elastic_otel.flush(30.0)  # one export request per report, as in a real stall
                rounds.append(
                    {
                        "wall_s": wall,
                        "agent_cpu_s": cpu,
                        "agent_cpu_with_export_s": time.process_time() - cpu0,
                        "worker_cpu_clock_s": [
                            b - a
                            for a, b in zip(clock0, clock1, strict=True)
                            if a is not None and b is not None
                        ],
                        "worker_cpu_stat_s": [b - a for a, b in zip(stat0, stat1, strict=True)],
                        "dumps": len(texts[-1]) if len(texts) > reported else 0,
                    }
                )
                time.sleep(0.2)
            common.pause()  # the parent snapshots again: one stall record alone follows
            ranks = [
                RankProgress(w.global_rank, p.collective, p.entered, p.step, p.progress_ns)
                for w in watched
                for p in [group.seen[w.global_rank]]
            ]
            stall = training_stall(ranks, time.time_ns(), int(after_s * 1e9))
            report_stacks_and_stall(agent, bridge, REASON_TRAINING, [], stall)
            elastic_otel.flush(30.0)
            alive = sum(proc.poll() is None for proc, _ in workers)
        finally:
            _stop_workers(workers)
    dumps = [t for round_texts in texts for t in round_texts]
    return {
        "variant": variant,
        "workers": n,
        "depth": config["depth"],
        "threads": config["threads"] + 1,
        "alive_at_end": alive,
        "rounds": rounds,
        "stall_waited_for": list(stall.waited_for) if stall else None,
        "stall_waiting": list(stall.waiting) if stall else None,
        "stack_bytes": [len(t.encode()) for t in dumps],
        "stack_frames": [t.count('  File "') for t in dumps],
        "stack_threads": [t.count("hread 0x") for t in dumps],
    }


def child(config: dict[str, Any]) -> dict[str, Any]:
    return idle_child(config) if config["kind"] == "idle" else dump_child(config)


# --- parent -----------------------------------------------------------------------------------


def _min_median(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values)}


def hot_path(quick: bool) -> dict[str, Any]:
    """ns per call on the training thread: the no-op collective and mark_step, the parts of
    the wrapper, and a real gloo all_reduce."""
    number, repeat = (20_000, 3) if quick else (200_000, 15)
    raw = _script_result("hot path", HOT_PATH, [str(number), str(repeat)], common.clean_env())
    ns = {name: _min_median(v) for name, v in raw.items()}

    def added(wrapped: str, bare: str) -> float:
        return ns[wrapped]["min"] - ns[bare]["min"]

    empty = ns["empty statement, armed"]["min"]
    return {
        "number": number,
        "repeat": repeat,
        "ns": ns,
        "added_ns": {
            "collective, armed": added("wrapped, armed", "bare collective, armed"),
            "collective, armed, keywords": added(
                "wrapped, keywords, armed", "bare collective, keywords, armed"
            ),
            "collective, unarmed": added("wrapped, unarmed", "bare collective, unarmed"),
            "collective, unarmed, keywords": added(
                "wrapped, keywords, unarmed", "bare collective, keywords, unarmed"
            ),
            "mark_step, armed": added("mark_step, armed", "empty statement, armed"),
            "mark_step, unarmed": added("mark_step, unarmed", "empty statement, unarmed"),
            **{
                f"{call}, {phase}": added(f"{call}, {phase}", f"empty statement, {phase}")
                for call in ("mark_checkpoint", "saving_checkpoint")
                for phase in ("armed", "unarmed")
            },
        },
        "parts_ns": {k: ns[f"{k}, armed"]["min"] - empty for k in PARTS},
        # Quick mode (CI smoke run): not the gloo worker, one torch start-up fewer.
        "gloo": None if quick else gloo_all_reduce(),
    }


def gloo_all_reduce() -> dict[str, Any]:
    """A real one-process gloo all_reduce in a worker armed by the start-up: bare, wrapped."""
    gloo_n, gloo_r = 3_000, 9
    worker = _worker_env(Path(tempfile.gettempdir()))
    gloo = _script_result("gloo all_reduce", GLOO, [str(gloo_n), str(gloo_r)], worker)
    if not (gloo["armed"] and gloo["wrapped"]):
        raise RuntimeError(f"the gloo worker was not armed and wrapped: {gloo}")
    gloo_ns = {name: _min_median(v) for name, v in gloo["ns"].items()}
    return {
        "number": gloo_n,
        "repeat": gloo_r,
        "ns": gloo_ns,
        "added_ns": gloo_ns["wrapped"]["min"] - gloo_ns["bare"]["min"],
        "recorded_calls": gloo["recorded_calls"],
        "expected_calls": gloo_n * gloo_r,
    }


def idle(quick: bool) -> dict[str, Any]:
    """One agent process over 8 progressing workers: no watch, then the default threshold,
    then a short one."""
    from elastic_otel.names.environment_variables import DEFAULT_STALL_AFTER_S

    seconds = (5.5, 2.0) if quick else (40.0, 20.0)
    config = {
        "kind": "idle",
        "workers": WORKERS_PER_NODE,
        "step_s": 0.05,
        "off_s": seconds[1],
        "phases": [
            {"after_s": DEFAULT_STALL_AFTER_S, "seconds": seconds[0]},
            {"after_s": 2.0, "seconds": seconds[1]},
        ],
    }
    r = common.run_child(MODULE, config, common.clean_env(), timeout=sum(seconds) * 2 + 300)
    off_us = r["off"]["cpu_s"] / r["off"]["seconds"] * 1e6
    r["off_cpu_us_per_s"] = off_us
    for phase in r["phases"]:
        on_us = phase["on"]["cpu_s"] / phase["on"]["seconds"] * 1e6
        checks = phase["check_cpu_us"]
        median = statistics.median(checks) if checks else None
        phase.update(
            on_cpu_us_per_s=on_us,
            added_cpu_us_per_s=on_us - off_us,
            check_cpu_us_median=median,
            check_cpu_us_per_s=median / phase["period_s"] if median is not None else None,
        )
    return r


def dumps(quick: bool) -> list[dict[str, Any]]:
    """Both stalled variants in one agent process, exporting to one receiver."""
    from benchmarks.receiver import ReceiverProcess

    variants = (  # quick mode (CI smoke run): not the torch variant, two torch start-ups fewer
        [{"variant": "plain", "workers": WORKERS_PER_NODE, "rounds": 2}]
        if quick
        else [{"variant": "plain", "workers": WORKERS_PER_NODE, "rounds": 5},
              {"variant": "torch", "workers": WORKERS_PER_NODE, "rounds": 5}]
    )  # fmt: skip
    config = {"kind": "dump", "variants": variants, "depth": 30, "threads": 3, "hang_s": 600.0}
    with ReceiverProcess("grpc") as rx:
        env = common.clean_env(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "ELASTIC_OTEL_JOB_ID": "benchmark",
                "OTEL_METRICS_EXPORTER": "none",
                "ELASTIC_OTEL_OPEN_SPAN_INTERVAL": "0",
                "ELASTIC_OTEL_STALL_AFTER": "0",  # the bridge's own stall reports: none
            }
        )
        snapshots: list[dict[str, Any]] = []

        def snapshot() -> None:
            time.sleep(0.3)  # the child flushed before pausing
            snapshots.append(rx.stats())

        result = common.run_child_with_pause(MODULE, config, env, snapshot)
        time.sleep(0.3)
        snapshots.append(rx.stats())
    out = []
    for i, r in enumerate(result["variants"]):
        before, after_rounds, after_alone = snapshots[2 * i : 2 * i + 3]

        def diff(a: dict[str, Any], b: dict[str, Any], kind: str) -> int:
            return int(b[kind]["logs"] - a[kind]["logs"])

        rounds = len(r["rounds"])
        report_bytes = diff(before, after_rounds, "bytes") / rounds
        alone = diff(after_rounds, after_alone, "bytes")
        r.update(
            records_per_report=diff(before, after_rounds, "records") / rounds,
            requests_per_report=diff(before, after_rounds, "requests") / rounds,
            bytes_per_report=report_bytes,
            stall_record_bytes=alone,  # an export request holding the stall record alone
            stall_records_alone=diff(after_rounds, after_alone, "records"),
            bytes_per_stacks_record=(report_bytes - alone) / r["workers"],
        )
        out.append(r)
    return out


def cluster(dump: dict[str, Any], stall_after_s: float) -> dict[str, Any]:
    """A 4,096-node job stalled everywhere: each node reports every ``stall_after_s`` seconds
    one stall record and one stacks record per local worker (8)."""
    per_report = 1 + WORKERS_PER_NODE
    stacks_bytes = WORKERS_PER_NODE * dump["bytes_per_stacks_record"]
    bytes_per_report = dump["stall_record_bytes"] + stacks_bytes
    scale = WORKERS_PER_NODE / dump["workers"]  # 1 but in quick mode
    agent_cpu = statistics.median(r["agent_cpu_with_export_s"] for r in dump["rounds"]) * scale
    worker_cpu = statistics.median(
        statistics.fmean(r["worker_cpu_clock_s"] or r["worker_cpu_stat_s"]) for r in dump["rounds"]
    )
    return {
        "nodes": NODES,
        "workers_per_node": WORKERS_PER_NODE,
        "stall_after_s": stall_after_s,
        "variant": dump["variant"],
        "records_per_report": per_report,
        "bytes_per_report": bytes_per_report,
        "records_per_s_per_node": per_report / stall_after_s,
        "bytes_per_s_per_node": bytes_per_report / stall_after_s,
        "records_per_s": NODES * per_report / stall_after_s,
        "bytes_per_s": NODES * bytes_per_report / stall_after_s,
        "agent_cpu_us_per_s_per_node": agent_cpu / stall_after_s * 1e6,
        "worker_cpu_us_per_s": worker_cpu / stall_after_s * 1e6,
    }


def run(quick: bool) -> dict[str, Any]:
    from elastic_otel.names.environment_variables import DEFAULT_STALL_AFTER_S

    hot = hot_path(quick)
    watch = idle(quick)
    stalled = dumps(quick)
    scaled = next((d for d in stalled if d["variant"] == "torch"), stalled[-1])
    return {
        "hot": hot,
        "idle": watch,
        "dumps": stalled,
        "cluster": cluster(scaled, DEFAULT_STALL_AFTER_S),
    }


if __name__ == "__main__":
    common.child_main(sys.argv[1:], child)
