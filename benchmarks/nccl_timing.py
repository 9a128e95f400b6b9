"""What torch's NCCL timing events cost per collective: ``python -m benchmarks.nccl_timing``.

With ``TORCH_NCCL_ENABLE_TIMING=1`` torch records a CUDA start event per NCCL collective, which
lets the bridge tell whether a rank's GPU *started* a collective (docs/hangs.md, "On GPUs
(NCCL)"). It is worth turning on where collectives per second x cost per collective stays under
0.5 % of wall time, so this measures that cost: each configuration runs as one-rank child
processes (world size 1, no torchrun, no OpenTelemetry), timing off and on alternating, each
printing its median step and the collectives per step read from the Flight Recorder's status. A
probe child checks what ``ProcessGroup._enable_collectives_timing()`` does to collectives
enqueued before and after it. ``--backend gloo --quick`` runs the same mechanics on the CPU.
Needs a CUDA device otherwise (it says so and exits 0). Not part of ``benchmarks.run``.

Its last run on a lent GPU (``benchmarks/recorded/nccl-timing-*.txt``) is quoted in section 11
of BENCHMARKS.md (:func:`render`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from benchmarks.common import ROOT, clean_env
from benchmarks.format import RECORDED

DDP_DEFAULT_BUCKET_MB = 25.0
QUICK_SCALE = 16  # --quick: widths and batches / 16, bucket caps / 256 (the same buckets)
BUDGET_TARGET = 0.005  # timing's share of wall time the bridge may spend on it
PROBE_SLEEP_CYCLES = 1_000_000_000  # torch.cuda._sleep: about 0.5 s at an H200's boost clock
CHILD_TIMEOUT_S = 120.0
NO_CUDA, VERSIONS = "NO_CUDA", "VERSIONS "  # the probe's first line
# What turns start events on besides timing: dropped so that "off" is off.
_TIMING_ENV = ("TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_DESYNC_DEBUG", "NCCL_DESYNC_DEBUG")
_RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


@dataclass(frozen=True)
class Config:
    """One model and its parallelism; ``parallel`` is ``ddp`` or ``fsdp``."""

    name: str
    parallel: str
    layers: int
    width: int
    batch: int
    bucket_cap_mb: float | None = None  # DDP's; None: its default (25 MB)

    def describe(self) -> str:
        model = f"{self.layers} x Linear({self.width}), batch {self.batch}"
        if self.parallel == "fsdp":
            return f"{model}, FSDP's collectives by hand"
        if self.bucket_cap_mb is None:
            return f"{model}, DDP default buckets"
        return f"{model}, DDP bucket_cap_mb={self.bucket_cap_mb:g}"

    def scaled(self, factor: int) -> Config:
        """Widths and batch divided by ``factor``; DDP's bucket cap by ``factor``² so that each
        weight still fills its buckets alike (the same collectives per step)."""
        cap = None
        if self.parallel == "ddp":
            cap = (self.bucket_cap_mb or DDP_DEFAULT_BUCKET_MB) / factor**2
        return replace(
            self,
            width=max(self.width // factor, 8),
            batch=max(self.batch // factor, 4),
            bucket_cap_mb=cap,
        )


# 8 x Linear(4096) has 8 weights of 64 MB: DDP cannot split a parameter, so a 1 MB cap gives the
# same 8 buckets as the default one. ddp-small-buckets keeps its parameters and FLOPs (32 x
# 2048² = 8 x 4096²) in four times as many weights, one all-reduce each. FSDP2 issues no
# collective at world size 1 (torch skips its all-gathers and reduce-scatters there), so "fsdp"
# issues FSDP's per layer by hand: an all-gather of the layer's parameters before its forward and
# before its backward, a reduce-scatter of its weight's gradient once accumulated.
CONFIGS = (
    Config("ddp-small-buckets", "ddp", 32, 2048, 512, bucket_cap_mb=1.0),
    Config("ddp-default", "ddp", 8, 4096, 512),
    Config("fsdp", "fsdp", 8, 4096, 512),
    Config("small-step", "ddp", 8, 1024, 64),
)


# --- the children ---------------------------------------------------------------------------


def _init(backend: str) -> Any:
    """One rank's process group (MASTER_ADDR/MASTER_PORT from the environment); its device."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, rank=0, world_size=1)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # spinning OpenMP threads make a shared CPU's steps erratic
        dist.init_process_group("gloo", rank=0, world_size=1)
    return device


def _dump(backend: str, entries: bool) -> dict[str, Any]:
    """The backend's Flight Recorder record as JSON: NCCL's in CUDA builds, gloo's otherwise."""
    from torch._C import _distributed_c10d as c10d

    name = "_dump_nccl_trace_json" if backend == "nccl" else "_dump_fr_trace_json"
    found: dict[str, Any] = json.loads(getattr(c10d, name)(entries, False))
    return found


def _enqueued(backend: str) -> dict[str, int]:
    """Per process group, the sequence number of its last collective enqueued (0: none)."""
    status = _dump(backend, False).get("pg_status") or {}
    return {g: max(int(s.get("last_enqueued_collective", -1)), 0) for g, s in status.items()}


def _fsdp_by_hand(model: Any) -> None:
    """FSDP's collectives for each layer of ``model`` at world size 1, where FSDP2 skips them."""
    import torch
    import torch.distributed as dist

    for layer in model:
        numel = sum(p.numel() for p in layer.parameters())
        shard = torch.zeros(numel, device=layer.weight.device)
        gathered = torch.empty_like(shard)
        grad_shard = torch.empty_like(layer.weight).view(-1)

        def gather(*_: Any, shard: Any = shard, gathered: Any = gathered) -> None:
            dist.all_gather_into_tensor(gathered, shard)

        def reduce(param: Any, out: Any = grad_shard) -> None:
            dist.reduce_scatter_tensor(out, param.grad.view(-1))

        layer.register_forward_pre_hook(gather)
        layer.register_full_backward_pre_hook(gather)
        layer.weight.register_post_accumulate_grad_hook(reduce)


def child(spec: dict[str, Any]) -> None:
    """One run: warm-up steps, then timed steps; prints one JSON line."""
    import torch
    import torch.distributed as dist

    config, backend = Config(**spec["config"]), spec["backend"]
    device = _init(backend)
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    torch.manual_seed(0)
    layers = [torch.nn.Linear(config.width, config.width) for _ in range(config.layers)]
    model: Any = torch.nn.Sequential(*layers).to(device)
    if config.parallel == "fsdp":
        _fsdp_by_hand(model)
    else:
        options: dict[str, Any] = {}
        if config.bucket_cap_mb is not None:
            options["bucket_cap_mb"] = config.bucket_cap_mb
        ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    inputs = torch.randn(config.batch, config.width, device=device)

    def step() -> None:
        model(inputs).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(spec["warmup"]):
        step()
    sync()
    before = _enqueued(backend)
    times = []
    for _ in range(spec["steps"]):
        sync()
        started = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - started)
    after = _enqueued(backend)
    issued = sum(n - before.get(g, 0) for g, n in after.items())
    entries = _dump(backend, True).get("entries") or []
    result = {
        "config": config.name,
        "timing": os.environ.get("TORCH_NCCL_ENABLE_TIMING"),
        "median_ms": statistics.median(times) * 1e3,
        "collectives_per_step": issued / len(times),
        "entries": len(entries),
        "started_entries": sum(1 for e in entries if int(e.get("time_discovered_started_ns", 0))),
    }
    print(json.dumps(result), flush=True)
    dist.destroy_process_group()


def _entry_line(entry: dict[str, Any]) -> str:
    duration = entry.get("duration_ms")
    return (
        f"#{entry.get('collective_seq_id')} {entry.get('profiling_name')} "
        f"state {entry.get('state')}, time_discovered_started_ns "
        f"{entry.get('time_discovered_started_ns')}, duration_ms {duration}"
    )


def _world_entries(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's entries of the default process group ("0")."""
    entries = record.get("entries") or []
    return [e for e in entries if str((e.get("process_group") or ["0"])[0]) == "0"]


def probe(backend: str) -> None:
    """Timing off at the start; what ``_enable_collectives_timing()`` changes, printed."""
    import torch
    import torch.distributed as dist

    if backend == "nccl" and not torch.cuda.is_available():
        print(NO_CUDA, flush=True)
        return
    print(f"{VERSIONS}{_versions(backend)}", flush=True)
    device = _init(backend)
    cuda = device.type == "cuda"
    group: Any = dist.group.WORLD
    tensor = torch.ones(1 << 20, device=device)
    for _ in range(5):
        dist.all_reduce(tensor)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda._sleep(PROBE_SLEEP_CYCLES)  # the GPU busy: what follows stays enqueued
        print("PROBE GPU held busy (torch.cuda._sleep) before the next all-reduce")
    else:
        print("PROBE no GPU to hold busy: gloo runs each collective on its own threads")
    dist.all_reduce(tensor)
    before_seq = _enqueued(backend).get("0", 0)
    if not hasattr(group, "_enable_collectives_timing"):
        enabled = "missing on this release"
    else:
        try:
            group._enable_collectives_timing()
            enabled = "present, returned"
        except Exception as error:  # what it raised is the finding
            enabled = f"present, raised {type(error).__name__}: {error}"
    dist.all_reduce(tensor)
    after_seq = _enqueued(backend).get("0", 0)
    dumps = []
    for when in ("just after enqueueing", "after completion"):
        if when == "after completion":
            if cuda:
                torch.cuda.synchronize()
            time.sleep(1.0 if cuda else 0.1)  # NCCL's watchdog updates pg_status later
        record = _dump(backend, True)
        dumps.append(record)
        print(f"PROBE record {when}: pg_status {record.get('pg_status')}")
        for entry in record.get("entries") or []:
            print(f"PROBE   {_entry_line(entry)}")

    def life(seq: int) -> str:
        seen: list[dict[str, Any]] = [
            next((e for e in _world_entries(d) if e.get("collective_seq_id") == seq), {})
            for d in dumps
        ]
        states = "→".join(str(e.get("state")) for e in seen)
        last = seen[-1]
        start = int(last.get("time_discovered_started_ns") or 0)
        if "started" in states or start:
            return (
                f"state {states}, started (start event seen; duration_ms {last.get('duration_ms')})"
            )
        return f"state {states}, never started (no start event)"

    print(f"PROBE _enable_collectives_timing: {enabled}")
    print(f"PROBE warm-up #1 (timing off from the start): {life(1)}")
    print(f"PROBE enqueued-before-enable #{before_seq}: {life(before_seq)}")
    print(f"PROBE enqueued-after-enable #{after_seq}: {life(after_seq)}")
    statuses = [(d.get("pg_status") or {}).get("0", {}) for d in dumps]
    started = " → ".join(str(s.get("last_started_collective")) for s in statuses)
    completed = " → ".join(str(s.get("last_completed_collective")) for s in statuses)
    print(f"PROBE pg_status last_started_collective {started}, last_completed {completed}")
    dist.destroy_process_group()


# --- the parent -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _child_env(timing: bool) -> dict[str, str]:
    env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    for name in _TIMING_ENV + _RANK_ENV:
        env.pop(name, None)
    env["TORCH_NCCL_ENABLE_TIMING"] = "1" if timing else "0"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _spawn(args: Sequence[str], timing: bool, timeout: float) -> tuple[int, str, str]:
    cmd = [sys.executable, "-m", "benchmarks.nccl_timing", *args]
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, env=_child_env(timing), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as error:
        out = error.stdout.decode() if isinstance(error.stdout, bytes) else error.stdout or ""
        return -1, out, f"timed out after {timeout:.0f} s"
    return done.returncode, done.stdout, done.stderr


def one_run(config: Config, timing: bool, backend: str, steps: int, warmup: int) -> dict[str, Any]:
    spec = {"config": asdict(config), "backend": backend, "steps": steps, "warmup": warmup}
    code, out, err = _spawn(["child", json.dumps(spec)], timing, CHILD_TIMEOUT_S)
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            found: dict[str, Any] = json.loads(line)
            if code == 0:
                return found
    raise RuntimeError(f"exit {code}:\n{(out + err)[-2000:]}")


def _versions(backend: str) -> str:
    import torch

    if backend == "nccl":
        device = torch.cuda.get_device_name(0)
    else:
        device = f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    try:
        nccl = ".".join(str(n) for n in torch.cuda.nccl.version())
    except Exception:  # a CPU build has no NCCL
        nccl = "none"
    return f"{device}, torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}"


def _ms(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


def _count(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"


def report(
    configs: Sequence[Config], results: dict[str, dict[bool, list[dict[str, Any]]]]
) -> list[float]:
    """The markdown table; returns the µs per collective of the resolved configurations."""
    print(
        "| configuration | model | collectives / step | timing off: median step (ms) "
        "| timing on (ms) | spread off / on (ms) | on - off (ms) | µs / collective "
        "| % of step | resolved |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    costs = []
    for config in configs:
        runs = results.get(config.name, {})
        off = [r["median_ms"] for r in runs.get(False, [])]
        on = [r["median_ms"] for r in runs.get(True, [])]
        if not off or not on:
            print(f"| {config.name} | {config.describe()} | failed | | | | | | | |")
            continue
        counts = [r["collectives_per_step"] for r in runs[False] + runs[True]]
        per_step = statistics.median(counts)
        spread_off, spread_on = max(off) - min(off), max(on) - min(on)
        diff = statistics.median(on) - statistics.median(off)
        share = diff / statistics.median(off) * 100
        # Resolved: timing's cost stands above the noise (a negative difference never does).
        resolved = min(len(off), len(on)) > 1 and max(spread_off, spread_on) < diff
        cost = diff * 1e3 / per_step if per_step else None
        if resolved and cost is not None:
            costs.append(cost)
        print(
            f"| {config.name} | {config.describe()} | {_count(per_step)} | {_ms(off)} "
            f"| {_ms(on)} | {spread_off:.3f} / {spread_on:.3f} | {diff:+.3f} "
            f"| {'n/a' if cost is None else f'{cost:+.1f}'} | {share:+.2f} % "
            f"| {'yes' if resolved else 'no'} |"
        )
    return costs


def _check_events(results: dict[str, dict[bool, list[dict[str, Any]]]]) -> str:
    """Whether each run's record had start events exactly when its timing was on."""
    wrong = [
        f"{name} timing {'on' if timing else 'off'}"
        for name, by_timing in results.items()
        for timing, runs in by_timing.items()
        for run in runs
        if bool(run["started_entries"]) != timing
    ]
    if not wrong:
        return "start events: in every timing-on run's record, in no timing-off run's"
    return "start events NOT as set (the setting did not take): " + ", ".join(wrong)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["child"]:
        child(json.loads(argv[1]))
        return
    if argv[:1] == ["probe"]:
        probe(argv[1])
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--quick", action="store_true", help="2 runs, 30 steps, smaller widths")
    parser.add_argument("--runs", type=int, help="runs of each setting (default 3; quick 2)")
    parser.add_argument("--steps", type=int, help="timed steps a run (default 300; quick 30)")
    parser.add_argument("--warmup", type=int, help="steps before timing (default 20; quick 3)")
    parser.add_argument("--only", action="append", choices=[c.name for c in CONFIGS])
    parser.add_argument(
        "--budget", type=float, default=180.0, help="seconds: no round that would end past it"
    )
    args = parser.parse_args(argv)
    runs = args.runs or (2 if args.quick else 3)
    steps = args.steps or (30 if args.quick else 300)
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 20)
    configs = [c for c in CONFIGS if not args.only or c.name in args.only]
    if args.quick:
        configs = [c.scaled(QUICK_SCALE) for c in configs]
    started = time.monotonic()
    # The probe imports torch (the parent does not): it says whether there is a GPU, and what.
    code, out, err = _spawn(["probe", args.backend], False, 60.0)
    if NO_CUDA in out.splitlines():
        print("nccl_timing: no CUDA device, nothing measured (--backend gloo runs it on the CPU)")
        return
    lines = out.splitlines()
    versions = [line[len(VERSIONS) :] for line in lines if line.startswith(VERSIONS)]
    print(f"nccl_timing: {versions[0] if versions else '(the probe printed no versions)'}")
    print(
        f"backend {args.backend}: {runs} runs x {steps} steps ({warmup} warm-up) of each "
        "configuration, timing off and on alternating, one rank"
    )
    if args.backend == "gloo":
        print("gloo: TORCH_NCCL_ENABLE_TIMING changes nothing here; this checks the mechanics")
    for line in lines:
        if not line.startswith(VERSIONS):
            print(line)
    if code != 0:
        print(f"PROBE failed (exit {code}): {(err or '')[-1500:]}")

    results: dict[str, dict[bool, list[dict[str, Any]]]] = {}
    failed: set[str] = set()
    done_rounds, round_seconds = 0, 0.0
    for round_ in range(runs):
        if done_rounds:  # timeout 200 in tests/gpu/device_check.sh: end with a table
            elapsed, last = time.monotonic() - started, round_seconds
            if elapsed + 1.1 * last > args.budget:
                print(f"stopping after {done_rounds} runs: another ({last:.0f} s) passes --budget")
                break
        round_started = time.monotonic()
        for config in configs:
            for timing in (False, True):
                if config.name in failed:
                    continue
                run_started = time.monotonic()
                try:
                    result = one_run(config, timing, args.backend, steps, warmup)
                except RuntimeError as error:
                    print(f"{config.name} timing {'on' if timing else 'off'} failed: {error}")
                    failed.add(config.name)
                    continue
                results.setdefault(config.name, {}).setdefault(timing, []).append(result)
                print(
                    f"{config.name:<18} timing {'on ' if timing else 'off'} run {round_ + 1}: "
                    f"median step {result['median_ms']:.3f} ms, "
                    f"{_count(result['collectives_per_step'])} collectives/step, start events "
                    f"{result['started_entries']}/{result['entries']} entries "
                    f"({time.monotonic() - run_started:.1f} s)",
                    flush=True,
                )
        round_seconds = time.monotonic() - round_started
        done_rounds += 1

    print()
    costs = report(configs, results)
    print()
    if args.backend == "nccl":
        print(_check_events(results))
    if costs:
        cost = statistics.median(costs)
        print(
            f"median over {len(costs)} resolved configurations: {cost:.2f} µs per collective; "
            f"timing stays within {BUDGET_TARGET:.1%} of wall time up to "
            f"{BUDGET_TARGET / (cost * 1e-6):,.0f} collectives per second"
        )
        print(f"NCCL_TIMING_COST_US {cost:.2f}")
    else:
        print("NCCL_TIMING_COST_US n/a (no configuration's difference exceeds its spread)")
    print(f"nccl_timing: {time.monotonic() - started:.0f} s")


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


H100_ALL_REDUCES_PER_STEP = 8
"""DDP's all-reduces per step of 8 x Linear(4096): one bucket per 64 MB weight (the H200's
record agrees: all-reduce #161 at step 20)."""
H100_STEPS = ROOT / "tests/data/nccl-flight-recorder/README.md"
"""The H100's timing-off / timing-on steps, recorded with the Flight Recorder fixtures."""


def render() -> list[str]:
    """What NCCL's timing events cost a collective, behind ``ELASTIC_OTEL_NCCL_TIMING=auto``:
    ``python -m benchmarks.nccl_timing`` as a lent GPU printed it (the newest
    ``benchmarks/recorded/nccl-timing-*.txt``), else the H100's recorded steps."""
    from elastic_otel.names.environment_variables import (
        DEFAULT_NCCL_TIMING_BUDGET_PERCENT as budget,
    )
    from elastic_otel.names.environment_variables import DEFAULT_NCCL_TIMING_COST_US as cost

    lines = [
        "**NCCL timing's cost per collective.** `ELASTIC_OTEL_NCCL_TIMING=auto` (the default) "
        "turns NCCL's timing events on in a worker whose collective rate x cost per collective "
        f"is within {budget:g} % of wall time, with a cost of {cost:g} µs per collective "
        f"(`ELASTIC_OTEL_NCCL_TIMING_COST_US`): about {budget / 100 / (cost * 1e-6):,.0f} "
        "collectives a second at most (docs/hangs.md, NCCL timing by default).",
        "",
    ]
    files = sorted(RECORDED.glob("nccl-timing-*.txt"))
    if files:
        text = files[-1].read_text().splitlines()
        table = [line for line in text if line.startswith("|")]
        heads = [line for line in text if line.startswith(("nccl_timing:", "NCCL_TIMING_COST_US"))]
        rel = files[-1].relative_to(RECORDED.parents[1])
        return [
            *lines,
            f"`python -m benchmarks.nccl_timing` on a lent GPU (`{rel}`, as printed: timing "
            "off and on alternating, one rank):",
            "",
            *table,
            "",
            *(f"- {line}" for line in heads),
            "",
        ]
    rows = _h100_timing_rows()
    return [
        *lines,
        "`python -m benchmarks.nccl_timing` (DDP with small and default buckets, FSDP's "
        "per-layer collectives, a small step; timing off and on alternating) has not run on a "
        "GPU yet. The figure behind the default is the H100's, recorded with the Flight "
        "Recorder fixtures (`tests/data/nccl-flight-recorder/README.md`: DDP, one rank, median "
        "of 400 steps, three alternating runs each):",
        "",
        "| model | timing off, ms | timing on, ms | spread off / on, ms | on - off, ms | "
        "all-reduces / step | µs / collective | % of step | resolved |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _h100_timing_rows() -> list[str]:
    """The H100's timing-off / timing-on table, with what it says per collective."""
    try:
        text = H100_STEPS.read_text()
    except OSError:
        return ["| (the recorded steps are missing) | | | | | | | | |"]
    rows = []
    for found in re.finditer(
        r"^\| (8 \u00d7 Linear\((\d+)\), batch \d+) \| ([^|]+) \| ([^|]+) \|", text, re.M
    ):
        model, width = found.group(1), int(found.group(2))
        off = [float(v) for v in re.findall(r"[0-9]+\.[0-9]+", found.group(3))]
        on = [float(v) for v in re.findall(r"[0-9]+\.[0-9]+", found.group(4))[:3]]
        if len(off) != 3 or len(on) != 3:
            continue
        diff = statistics.median(on) - statistics.median(off)
        spread = max(max(off) - min(off), max(on) - min(on))
        resolved = spread < diff
        per = H100_ALL_REDUCES_PER_STEP if width == 4096 else None  # counted for that model only
        us = f"{diff * 1e3 / per:.1f}" if per and resolved else "—"
        rows.append(
            f"| {model} | {', '.join(f'{v:.3f}' for v in off)} | "
            f"{', '.join(f'{v:.3f}' for v in on)} | {max(off) - min(off):.3f} / "
            f"{max(on) - min(on):.3f} | {diff:+.3f} | {per or 'not counted'} | {us} | "
            f"{diff / statistics.median(off) * 100:+.2f} % | {'yes' if resolved else 'no'} |"
        )
    return rows


if __name__ == "__main__":
    main()
