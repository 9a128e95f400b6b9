"""Shared helpers: statistics, CPU pinning, child processes, machine description."""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
RESULT_PREFIX = "RESULT "
PAUSE = "PAUSE"
_STRIPPED_ENV_PREFIXES = ("OTEL_", "ELASTIC_OTEL_", "PET_", "TORCHELASTIC_", "ROTEL_")
SNAPSHOT_ENV = "BENCHMARKS_PACKAGE_SNAPSHOT"
"""Directory holding a frozen copy of ``elastic_otel/`` that child processes import."""


# --- statistics -----------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of already sorted values."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo]) * (1 - frac) + float(sorted_values[hi]) * frac


def summarize(values: Sequence[float]) -> dict[str, float]:
    """n, mean, stdev, min, median, p90, p99, p99.9 and max of ``values``."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return {"n": 0}
    return {
        "n": n,
        "mean": statistics.fmean(ordered),
        "stdev": statistics.stdev(ordered) if n > 1 else 0.0,
        "min": float(ordered[0]),
        "median": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "p99": percentile(ordered, 99),
        "p99.9": percentile(ordered, 99.9),
        "max": float(ordered[-1]),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing or ``b`` is not positive."""
    if a is None or b is None or not b or b <= 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


# --- process helpers ------------------------------------------------------------------------


def cpus() -> list[int]:
    """CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def measured_cpu() -> int | None:
    """The CPU measured processes are pinned to (the first one), None on one-CPU machines."""
    available = cpus()
    return available[0] if len(available) > 1 else None


def helper_cpus() -> set[int] | None:
    """CPUs for receivers and collectors: all but the measured one (None: no pinning)."""
    available = cpus()
    return set(available[1:]) if len(available) > 1 else None


def pin(cpu_set: set[int] | int | None) -> None:
    """Pin this process (and threads it creates later) to ``cpu_set``."""
    if cpu_set is None or not hasattr(os, "sched_setaffinity"):
        return
    os.sched_setaffinity(0, {cpu_set} if isinstance(cpu_set, int) else cpu_set)


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ without OTel/elastic-otel/torchelastic settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STRIPPED_ENV_PREFIXES)}
    snapshot = env.get(SNAPSHOT_ENV)
    # The snapshot first: ``import elastic_otel`` must not find the live tree under ROOT.
    first = [snapshot, str(ROOT)] if snapshot else [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(
        first + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in first]
    )
    env.setdefault("LOGLEVEL", "INFO")
    if extra:
        env.update(extra)
    return env


def child_cwd() -> Path:
    """Working directory for child processes: ``python -m``/``-c`` put it first on sys.path,
    so it is the package snapshot when there is one (``benchmarks`` comes from PYTHONPATH)."""
    snapshot = os.environ.get(SNAPSHOT_ENV)
    return Path(snapshot) if snapshot else ROOT


def snapshot_package(dest: Path) -> Path:
    """Copy ``elastic_otel/`` to ``dest`` and make every later child process import the copy.

    The package may be edited while the suite runs; all sections then still measure the same
    version (the one at the start). Returns the directory to put on ``PYTHONPATH``.
    """
    import shutil

    shutil.copytree(
        ROOT / "elastic_otel",
        dest / "elastic_otel",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    os.environ[SNAPSHOT_ENV] = str(dest)
    return dest


def run_child(
    module: str,
    config: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Run ``python -m module child CONFIG`` and return the JSON it prints after RESULT."""
    proc = subprocess.run(
        _child_cmd(module, config),
        cwd=child_cwd(),
        env=dict(env) if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return _child_result(module, proc.stdout, proc.stderr, proc.returncode)


def run_child_with_pause(
    module: str,
    config: Mapping[str, Any],
    env: Mapping[str, str],
    on_pause: Any,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Like :func:`run_child`; each time the child prints PAUSE, call ``on_pause()``, then
    resume it."""
    proc = subprocess.Popen(
        _child_cmd(module, config),
        cwd=child_cwd(),
        env=dict(env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    out = []
    for line in proc.stdout:
        if line.strip() == PAUSE:
            on_pause()
            proc.stdin.write("\n")
            proc.stdin.flush()
        else:
            out.append(line)
    rest, err = proc.communicate(timeout=timeout)
    return _child_result(module, "".join(out) + rest, err, proc.returncode)


def _child_cmd(module: str, config: Mapping[str, Any]) -> list[str]:
    return [sys.executable, "-m", module, "child", json.dumps(dict(config))]


def _child_result(module: str, out: str, err: str | None, code: int | None) -> dict[str, Any]:
    """The JSON a child printed after RESULT, or an error with the tail of its stderr."""
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise RuntimeError(f"{module} child failed (exit {code}):\n{(err or '')[-3000:]}")


def pause() -> None:
    """Child side of :func:`run_child_with_pause`."""
    sys.stdout.write(PAUSE + "\n")
    sys.stdout.flush()
    sys.stdin.readline()


def emit_result(result: Mapping[str, Any]) -> None:
    """Print a child's result for :func:`run_child`."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()


def child_main(argv: Sequence[str], fn: Any) -> None:
    """Entry point shared by the section modules: ``child CONFIG_JSON``."""
    if len(argv) != 2 or argv[0] != "child":
        raise SystemExit("usage: python -m benchmarks.<section> child CONFIG_JSON")
    emit_result(fn(json.loads(argv[1])))


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds consumed so far by process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def settle() -> None:
    """Same GC state before every measured phase: full collection, nothing pending."""
    gc.collect()
    gc.collect()


def gc_collections() -> int:
    return sum(s["collections"] for s in gc.get_stats())


def wait_until(predicate: Any, timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


# --- machine load -------------------------------------------------------------------------


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs of the machine spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of its waited-for children (and theirs)."""
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def cpu_probe_ms() -> float:
    """Best of 5 timings of one fixed pure-Python workload (integer arithmetic, JSON text both
    ways), ms: how fast this virtual machine runs right now. Its host's speed drifts from day
    to day and hour to hour, which moves every absolute number (events/s, ms of CPU) with it."""
    doc = {"name": "probe", "metadata": {"rank": 3, "hosts": ["node-0001"] * 8, "t": 1.5}}
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        total = sum(i * i for i in range(100_000))
        for _ in range(2_000):
            total += len(json.loads(json.dumps(doc)))
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


class ForeignLoad:
    """CPU used by processes outside this benchmark between start() and stop(), and the
    machine's speed (:func:`cpu_probe_ms`) at the start."""

    def __init__(self) -> None:
        self.probe_ms = cpu_probe_ms()
        self.t0 = time.monotonic()
        self.busy0 = machine_busy_seconds()
        self.own0 = own_cpu_seconds()

    def stop(self) -> dict[str, float]:
        elapsed = time.monotonic() - self.t0
        foreign = (machine_busy_seconds() - self.busy0) - (own_cpu_seconds() - self.own0)
        capacity = elapsed * (os.cpu_count() or 1)
        return {
            "elapsed_s": elapsed,
            "foreign_cpu_s": max(0.0, foreign),
            "foreign_share": max(0.0, foreign) / capacity if capacity else 0.0,
            "probe_ms": self.probe_ms,
        }


def wait_idle(timeout_s: float, threshold: float = 0.1, window_s: float = 3.0) -> bool:
    """Wait until the machine's CPUs are less than ``threshold`` busy over ``window_s``."""
    deadline = time.monotonic() + timeout_s
    ncpu = os.cpu_count() or 1
    while True:
        busy0 = machine_busy_seconds()
        time.sleep(window_s)
        if (machine_busy_seconds() - busy0) / (window_s * ncpu) < threshold:
            return True
        if time.monotonic() > deadline:
            return False


# --- machine --------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _mem_total() -> str:
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"MemTotal:\s+(\d+) kB", f.read())
        return f"{int(m[1]) / 1024 / 1024:.1f} GiB" if m else "unknown"
    except OSError:
        return "unknown"


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    try:
        with open("/proc/sys/kernel/osrelease") as f:
            kernel = f.read().strip()
    except OSError:
        kernel = platform.release()
    virt = "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        m = re.search(r"Hypervisor vendor:\s+(\S+)", out)
        virt = f"virtualised ({m[1]})" if m else "bare metal or undetected"
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "cpu": _cpu_model(),
        "cores": f"{os.cpu_count()} logical ({len(cpus())} usable)",
        "memory": _mem_total(),
        "virtualisation": virt,
        "os": f"{platform.system()} {kernel}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "torch": _version("torch"),
        "opentelemetry-sdk": _version("opentelemetry-sdk"),
        "opentelemetry-exporter-otlp": _version("opentelemetry-exporter-otlp-proto-grpc"),
        "grpcio": _version("grpcio"),
        "protobuf": _version("protobuf"),
        "elastic-otel": _version("elastic-otel"),
        "rotel": _version("rotel"),
    }
