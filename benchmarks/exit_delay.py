"""Section 2b: how long a process takes to exit after its last event when the collector is down.

A short script imports torch's events module, sets up telemetry the way the variant says,
records N events of the mixed stream through torch's own functions (``events.record`` for
agent/worker events, ``events.record_rdzv_event`` for rendezvous events), prints
``time.monotonic()`` and returns. The parent notes when the process has exited; the
difference is the exit delay (CLOCK_MONOTONIC is shared by all processes).

Variants: ``none`` (no telemetry, torch's ``null`` destination), ``bridge`` (elastic-otel's
``register()``, destination ``otel``), ``sdk`` (the SDK set up the usual way: a global
``LoggerProvider`` with its default atexit shutdown, a ``BatchLogRecordProcessor`` with the
OTLP/gRPC exporter, and ``LoggingHandler`` on torch's destination logger), each against a
closed port, plus ``bridge``/``sdk`` against a live receiver for reference.

Renders section 2 of BENCHMARKS.md, with the ``*-down`` rows of :mod:`benchmarks.caller_cost`
(:func:`render`, :func:`targets`).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.caller_cost import LABELS, paced_runs
from benchmarks.format import Target
from benchmarks.format import number as _f
from benchmarks.format import table as _table

SCRIPT = """\
import sys, time
from torch.distributed.elastic import events
from benchmarks.events import mixed_objects

VARIANT, N = sys.argv[1], int(sys.argv[2])
objects = mixed_objects(N)
dest = "null"
if VARIANT == "bridge":
    import elastic_otel
    elastic_otel.register()
    dest = "otel"
elif VARIANT == "sdk":
    import warnings
    from opentelemetry._logs import set_logger_provider
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from torch.distributed.elastic.events import handlers

    provider = LoggerProvider()  # shutdown_on_exit=True: the SDK's own atexit hook
    set_logger_provider(provider)
    provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
    warnings.simplefilter("ignore", DeprecationWarning)
    handlers._log_handlers["otel_sdk"] = LoggingHandler(logger_provider=provider)
    dest = "otel_sdk"
for obj in objects:
    if hasattr(obj, "node_state"):
        if dest == "null":
            events.record_rdzv_event(obj)  # torch's path; a NullHandler unless routed
        else:
            events._get_or_create_logger(
                "dynamic_rendezvous" if dest == "otel" else dest
            ).info(obj.serialize())
    else:
        events.record(obj, dest)
print("MARK", time.monotonic(), flush=True)
"""

VARIANTS: tuple[tuple[str, str], ...] = (
    ("none", "down"),
    ("bridge", "down"),
    ("sdk", "down"),
    ("bridge", "up"),
    ("sdk", "up"),
)


def _one(script: Path, variant: str, n: int, env: dict[str, str], timeout: float) -> dict:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(script), variant, str(n)],
        cwd=common.child_cwd(),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"timeout": True, "wall_s": time.monotonic() - t0}
    t_end = time.monotonic()
    mark = None
    for line in out.splitlines():
        if line.startswith("MARK "):
            mark = float(line.split()[1])
    if mark is None:
        raise RuntimeError(f"exit-delay script ({variant}) failed:\n{err[-2000:]}")
    return {"exit_s": t_end - mark, "wall_s": t_end - t0, "returncode": proc.returncode}


def run(quick: bool) -> dict[str, Any]:
    """Every variant ``reps`` times, interleaved; exit delay statistics per variant."""
    from benchmarks.caller_cost import closed_port
    from benchmarks.receiver import ReceiverProcess

    n = 100 if quick else 500
    reps = 1 if quick else 3
    # Quick mode: collector-down variants only, run concurrently (CI smoke, not a measurement).
    variants = [vc for vc in VARIANTS if vc[1] == "down"] if quick else list(VARIANTS)
    closed = f"http://127.0.0.1:{closed_port()}"
    results: dict[str, list[dict]] = {f"{v}-{c}": [] for v, c in variants}
    with tempfile.TemporaryDirectory(prefix="eo-exit-") as tmp, ReceiverProcess() as rx:
        script = Path(tmp) / "record_and_exit.py"
        script.write_text(SCRIPT)
        base = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "ELASTIC_OTEL_JOB_ID": "benchmark"}

        def one(variant: str, collector: str) -> dict:
            endpoint = closed if collector == "down" else rx.endpoint
            env = common.clean_env({**base, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
            if quick and variant == "sdk":
                env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1"  # keep the CI smoke run short
            return _one(script, variant, n, env, 120.0)

        for _ in range(reps):
            if quick:
                with ThreadPoolExecutor(len(variants)) as pool:
                    futures = {f"{v}-{c}": pool.submit(one, v, c) for v, c in variants}
                for key, future in futures.items():
                    results[key].append(future.result())
                continue
            for variant, collector in variants:
                results[f"{variant}-{collector}"].append(one(variant, collector))
    summary = {}
    for key, runs in results.items():
        exits = [r["exit_s"] for r in runs if "exit_s" in r]
        summary[key] = {
            "runs": runs,
            "exit_median_s": statistics.median(exits) if exits else None,
            "exit_max_s": max(exits) if exits else None,
            "wall_median_s": statistics.median(r["wall_s"] for r in runs),
            "timeouts": sum(1 for r in runs if r.get("timeout")),
        }
    note = (
        "Quick mode: the scripts ran concurrently, and the SDK default with "
        "`OTEL_EXPORTER_OTLP_TIMEOUT=1`; not a measurement."
        if quick
        else ""
    )
    return {"events": n, "reps": reps, "variants": summary, "note": note}


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


TITLE = "## 2. Collector down"


def render(caller: dict[str, Any], exit_: dict[str, Any]) -> list[str]:
    """Section 2: the caller's cost with the collector down (section 1's `*-down`
    variants) and :func:`run`'s exit delays."""
    lines = [TITLE, ""]
    if caller and "runs" in caller:
        pace = caller["paces_us"][0]
        runs = paced_runs(caller, pace)
        lines += [
            f"Caller cost with `OTEL_EXPORTER_OTLP_ENDPOINT` at a closed local port, paced "
            f"{pace} µs, same method and stream as section 1:",
            "",
        ]
        rows = []
        for name in ("null", "sdk-down", "bridge-down"):
            if name not in runs:
                continue
            r = runs[name]
            us = r["us"]
            bs = r.get("bridge_stats") or {}
            rows.append(
                (
                    LABELS[name] + (" (reference: the noise floor)" if name == "null" else ""),
                    _f(us["median"]),
                    _f(us["p99"]),
                    _f(us["p99.9"]),
                    _f(us["max"]),
                    _f(r.get("cpu_us_per_event")),
                    _f(bs.get("dropped_queue_full")) if bs else "-",
                )
            )
        lines += _table(
            ["destination", "median µs", "p99", "p99.9", "max", "CPU µs/event", "bridge drops"],
            rows,
        )
    if exit_ and "variants" in exit_:
        lines += [
            f"Exit delay: a script records {exit_['events']:,} events of the stream through "
            "torch's `events.record` / `record_rdzv_event`, prints `time.monotonic()` and "
            "returns; the delay is the time from that print to the process having exited "
            f"(median of {exit_['reps']} runs, variants interleaved). *SDK default* = a global "
            "`LoggerProvider` (its own atexit shutdown), `BatchLogRecordProcessor`, OTLP/gRPC "
            "exporter, `LoggingHandler` as a torch destination.",
            "",
        ]
        base = exit_["variants"].get("none-down", {}).get("exit_median_s")
        rows = []
        names = {
            "none": "no telemetry (torch `null`)",
            "bridge": "elastic-otel bridge",
            "sdk": "SDK default",
        }
        for key, v in exit_["variants"].items():
            variant, collector = key.rsplit("-", 1)
            med = v["exit_median_s"]
            rows.append(
                (
                    names.get(variant, variant),
                    "down (closed port)" if collector == "down" else "up (receiver)",
                    _f(med, 2),
                    _f(v["exit_max_s"], 2),
                    _f(med - base, 2) if med is not None and base is not None else "n/a",
                    _f(v["wall_median_s"], 2),
                    _f(v["timeouts"]),
                )
            )
        lines += _table(
            [
                "script",
                "collector",
                "exit delay s (median)",
                "worst",
                "minus no-telemetry",
                "whole run s",
                "timeouts",
            ],
            rows,
        )
        if exit_.get("note"):
            lines += [exit_["note"], ""]
    return lines


def targets(caller: dict[str, Any], exit_: dict[str, Any]) -> list[Target]:
    """Section 2's rows of the results table: the caller's p99 and the exit delay."""
    rows: list[Target] = []
    if "runs" in caller:
        pace = caller["paces_us"][0]
        runs = paced_runs(caller, pace)
        if "bridge-down" in runs:
            p99 = runs["bridge-down"]["us"]["p99"]
            floor = runs["null"]["us"]["p99"] if "null" in runs else None
            rows.append(
                (
                    "2. caller p99, collector down",
                    f"{_f(p99)} µs (torch `null` p99 in the same run: {_f(floor)} µs)",
                    "≤ 200 µs",
                    p99 <= 200,
                )
            )
    if "variants" in exit_:
        v = exit_["variants"]
        base = v.get("none-down", {}).get("exit_median_s")
        bridge = v.get("bridge-down", {}).get("exit_median_s")
        worst = v.get("bridge-down", {}).get("exit_max_s")
        if base is not None and bridge is not None:
            delay = bridge - base
            rows.append(
                (
                    "2. exit delay, collector down (bridge - no bridge)",
                    f"{_f(delay, 2)} s median (worst run {_f((worst or bridge) - base, 2)} s)",
                    "≤ 2 s",
                    delay <= 2.0,
                )
            )
    return rows
