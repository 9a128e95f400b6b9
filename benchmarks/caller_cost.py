"""Sections 1 and 2a: what ``events.record`` costs the thread that records the event.

Each variant runs in its own fresh process pinned to one CPU (the OTLP receiver runs in
another process on the other CPUs). The process builds the same mixed stream of real torch
events, gets torch's cached destination logger (``events._get_or_create_logger(dest)``, what
``events.record(event, dest)`` uses) and times every ``logger.info(json)`` call with
``time.perf_counter_ns``. Warm-up events go through the same path first and are exported;
then the GC is settled and the measured events are sent, either paced (a sleep between
events, leaving background threads time to work, as a real agent does) or back to back.

Variants: ``null`` and ``console`` (torch's own destinations, console written to
``/dev/null``), ``sdk`` (OpenTelemetry's ``LoggingHandler`` with a ``BatchLogRecordProcessor``
and the OTLP/gRPC exporter), ``bridge`` (elastic-otel's ``otel`` destination: logs + spans,
batch processors, OTLP/gRPC), and ``*-down`` variants whose endpoint is a closed port.
Queue bounds are raised above the number of events so that no variant is flattered by drops;
drops are reported anyway.

Renders section 1 of BENCHMARKS.md (:func:`render`, :func:`targets`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from benchmarks import common
from benchmarks.common import ratio, settle, summarize
from benchmarks.format import Target
from benchmarks.format import number as _f
from benchmarks.format import table as _table
from benchmarks.format import times as _x

VARIANTS = ("null", "console", "sdk", "bridge", "sdk-down", "bridge-down")
PACED_ROUNDS = 3
MODULE = "benchmarks.caller_cost"


def _setup(variant: str) -> tuple[logging.Logger, Any, Any]:
    """(torch's cached logger for the variant, flush(), extra stats())."""
    from torch.distributed.elastic import events
    from torch.distributed.elastic.events import handlers

    if variant == "null":
        return events._get_or_create_logger("null"), lambda: True, dict
    if variant == "console":
        handler = handlers.get_logging_handler("console")
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the process
        return events._get_or_create_logger("console"), lambda: True, dict
    if variant in ("sdk", "sdk-down"):
        import warnings

        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.resources import Resource

        provider = LoggerProvider(
            resource=Resource.create({"service.name": "torchelastic"}), shutdown_on_exit=False
        )
        provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            sdk_handler = LoggingHandler(logger_provider=provider)
        handlers._log_handlers["otel_sdk"] = sdk_handler
        return events._get_or_create_logger("otel_sdk"), provider.force_flush, dict
    if variant in ("bridge", "bridge-down"):
        import elastic_otel

        elastic_otel.register()
        return (
            events._get_or_create_logger("otel"),
            lambda: elastic_otel.flush(60.0),
            elastic_otel.stats,
        )
    raise ValueError(f"unknown variant {variant!r}")


def wait_bridge_idle(stats: Any, timeout: float) -> None:
    """Until the bridge's worker has processed (or dropped) everything it received."""
    common.wait_until(
        lambda: (
            (s := stats()).get("processed", 0) + s.get("dropped_queue_full", 0)
            >= s.get("received", 0)
        ),
        timeout,
    )


def _send(logger: logging.Logger, payloads: list[str], pace_s: float) -> list[int]:
    info = logger.info
    clock = time.perf_counter_ns
    sleep = time.sleep
    samples = [0] * len(payloads)
    for i, payload in enumerate(payloads):
        t0 = clock()
        info(payload)
        samples[i] = clock() - t0
        if pace_s:
            sleep(pace_s)
    return samples


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """Child: the listed variants in turn (one, except in quick mode); see :func:`_variant`."""
    common.pin(common.measured_cpu())
    from benchmarks import events as ev

    n, warmup = config["events"], config["warmup"]
    objects = ev.mixed_objects(warmup + n)
    payloads = ev.serialize(objects)
    return {"runs": [_variant(v, config, objects, payloads) for v in config["variants"]]}


def _variant(variant: str, config: dict[str, Any], objects: list, payloads: list[str]) -> dict:
    """Warm-up, settle, measured events; per-call µs statistics and what it cost in all."""
    n, warmup, pace_s = config["events"], config["warmup"], config["pace_us"] / 1e6
    result: dict[str, Any] = {"variant": variant, "events": n, "pace_us": config["pace_us"]}
    clock = time.perf_counter_ns
    if variant == "serialize":  # torch's own cost before any handler sees the event
        for obj in objects[:warmup]:
            obj.serialize()
        settle()
        samples = []
        for obj in objects[warmup:]:
            t0 = clock()
            obj.serialize()
            samples.append(clock() - t0)
        result["us"] = summarize([s / 1000 for s in samples])
        return result
    if variant == "timer":  # perf_counter_ns pair around nothing
        samples = []
        for _ in range(n):
            t0 = clock()
            samples.append(clock() - t0)
        result["us"] = summarize([s / 1000 for s in samples])
        return result

    logger, flush, stats = _setup(variant)
    down = variant.endswith("-down")
    _send(logger, payloads[:warmup], pace_s)
    if variant.startswith("bridge"):
        wait_bridge_idle(stats, 60.0)
    if not down:
        flush()
    settle()
    gc0, cpu0 = common.gc_collections(), time.process_time()
    t_start = time.perf_counter()
    samples = _send(logger, payloads[warmup:], pace_s)
    t_sent = time.perf_counter()
    gc_during = common.gc_collections() - gc0
    if variant.startswith("bridge"):
        wait_bridge_idle(stats, 120.0)
    t_drained = time.perf_counter()
    flushed = True if down else bool(flush())
    t_flushed = time.perf_counter()
    cpu = time.process_time() - cpu0
    result.update(
        us=summarize([s / 1000 for s in samples]),
        samples_us=[round(s / 1000, 3) for s in samples],
        gc_collections=gc_during,
        send_s=t_sent - t_start,
        drain_s=t_drained - t_sent,
        flush_s=t_flushed - t_drained,
        flushed=flushed,
        # All threads of the process: caller + bridge worker + batch exporters.
        cpu_us_per_event=cpu / n * 1e6,
        bridge_stats=stats(),
        sent_total=warmup + n,
    )
    return result


def _groups(quick: bool, pace: int) -> list[tuple[str, ...]]:
    """Variants per child process: one each, except in quick mode (fewer torch start-ups).

    A group never holds two exporting variants, so the receiver's counts stay attributable.
    """
    variants = [v for v in VARIANTS if pace or not v.endswith("-down")]
    if not quick:
        return [(v,) for v in variants]
    up = tuple(v for v in variants if v not in ("bridge",) and not v.endswith("-down"))
    return [g for g in (up, ("bridge",), tuple(v for v in variants if v.endswith("-down"))) if g]


def run(
    quick: bool,
    events: int | None = None,
    warmup: int | None = None,
    paces: list[int] | None = None,
) -> dict[str, Any]:
    """Parent: every variant, paced and back to back, against one receiver per child."""
    from benchmarks.receiver import ReceiverProcess

    n = events or (200 if quick else 9_000)
    warmup = warmup or (100 if quick else 1_000)
    paces = paces or ([200] if quick else [2000, 0])
    queue = str(4 * (n + warmup))
    closed = f"http://127.0.0.1:{closed_port()}"
    out: dict[str, Any] = {"events": n, "warmup": warmup, "paces_us": paces, "runs": []}
    base_env = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_BLRP_MAX_QUEUE_SIZE": queue,
        "OTEL_BSP_MAX_QUEUE_SIZE": queue,
        "ELASTIC_OTEL_QUEUE_SIZE": queue,
        "ELASTIC_OTEL_JOB_ID": "benchmark",
        "OTEL_SERVICE_NAME": "torchelastic",
    }
    cfg: dict[str, Any] = {"events": n, "warmup": warmup}
    refs = ["timer", "serialize"]  # pace-independent; run in the first child, before its variants
    if not quick:
        child_cfg = {**cfg, "variants": refs, "pace_us": 0}
        out["runs"] += common.run_child(MODULE, child_cfg, common.clean_env(base_env))["runs"]
        refs = []
    closed_env = common.clean_env({**base_env, "OTEL_EXPORTER_OTLP_ENDPOINT": closed})
    with ReceiverProcess("grpc") as rx:
        live_env = common.clean_env({**base_env, "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint})
        for pace in paces:
            # Paced latencies drift with the machine's state over minutes: interleave rounds
            # of all variants and pool their samples, so that every variant sees the same drift.
            rounds = 1 if quick or not pace else PACED_ROUNDS
            per_variant: dict[str, list[dict[str, Any]]] = {}
            for _ in range(rounds):
                for group in _groups(quick, pace):
                    child_cfg = {**cfg, "events": n // rounds, "variants": [*refs, *group]}
                    child_cfg["pace_us"] = pace
                    refs = []
                    down = all(v.endswith("-down") for v in group)
                    rx.reset()
                    runs = common.run_child(MODULE, child_cfg, closed_env if down else live_env)
                    received = None if down else rx.stats()["records"]
                    for res in runs["runs"]:
                        res["received"] = received
                        per_variant.setdefault(res["variant"], []).append(res)
            out["runs"] += [_pool(results) for results in per_variant.values()]
    return out


def _pool(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from a variant's rounds: samples pooled, counters summed."""
    first = dict(rounds[0])
    samples = [x for r in rounds for x in r.pop("samples_us", [])]
    if len(rounds) == 1:
        pooled = first
    else:
        pooled = first
        pooled["us"] = summarize(samples)
        pooled["events"] = sum(r["events"] for r in rounds)
        pooled["round_medians_us"] = [r["us"]["median"] for r in rounds]
        for key in ("gc_collections", "sent_total"):
            if key in first:
                pooled[key] = sum(r[key] for r in rounds)
        if "cpu_us_per_event" in first:
            pooled["cpu_us_per_event"] = (
                sum(r["cpu_us_per_event"] * r["events"] for r in rounds) / pooled["events"]
            )
        for key in ("received", "bridge_stats"):
            if first.get(key):
                pooled[key] = {
                    k: sum(r[key].get(k, 0) for r in rounds)
                    for k in first[key]
                    if isinstance(first[key][k], int | float)
                }
    pooled.pop("samples_us", None)
    if pooled.get("received") is not None and pooled["variant"] in ("sdk", "bridge"):
        # Everything sent (warm-ups included) must have arrived.
        pooled["export_incomplete"] = pooled["received"]["logs"] < pooled["sent_total"]
    return pooled


def closed_port() -> int:
    """A local port nothing listens on (bound and released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


TITLE = "## 1. Caller-thread cost per event"


LABELS = {
    "null": "torch `null`",
    "console": "torch `console` (stream → /dev/null)",
    "sdk": "OTel `LoggingHandler` (BLRP + OTLP/gRPC)",
    "bridge": "elastic-otel `otel` (logs + spans, OTLP/gRPC)",
    "sdk-down": "OTel `LoggingHandler`, collector down",
    "bridge-down": "elastic-otel `otel`, collector down",
}


def render(caller: dict[str, Any]) -> list[str]:
    """Section 1, from :func:`run`'s results."""
    lines = [
        TITLE,
        "",
        "Per call, `time.perf_counter_ns()` around `logger.info(json)` on torch's cached "
        "destination logger (`events._get_or_create_logger(dest)`, the logger "
        "`events.record(event, dest)` uses), in a fresh process per row pinned to one CPU; the "
        "OTLP receiver runs in another process on the other CPU(s). Every row gets the same "
        f"{caller['events']:,} measured events after {caller['warmup']:,} warm-up events "
        "(exported before measuring), a full GC before measuring, GC left enabled (its "
        "collections during the measurement are counted). Queue bounds (bridge, BLRP, BSP) are "
        "4x the number of events, so no row is flattered by drops. *CPU/event* is the "
        "process's CPU time (all threads: caller, bridge worker, exporters) from the first "
        "measured event until everything was exported, divided by the events; *CPU above "
        "null* subtracts the `null` row's (the loop and its sleeps).",
        "",
    ]
    stream = caller.get("stream")
    if stream:
        lines += [
            "Event stream (real torch objects serialized by torch): "
            + ", ".join(f"{k} {v:,}" for k, v in stream.items())
            + ".",
            "",
        ]
    timer, ser = _ref(caller, "timer"), _ref(caller, "serialize")
    if timer and ser:
        lines += [
            "References: timer overhead (empty `perf_counter_ns` pair) median "
            f"{_f(timer['us']['median'], 2)} µs; torch's own `Event.serialize()` / "
            f"`RdzvEvent.serialize()` (paid by torch before any handler runs) median "
            f"{_f(ser['us']['median'])} µs, p99 {_f(ser['us']['p99'])} µs.",
            "",
        ]
    for pace in caller["paces_us"]:
        runs = paced_runs(caller, pace)
        runs = {k: v for k, v in runs.items() if not k.endswith("-down")}
        title = (
            f"### Paced: one event every {pace} µs (background threads get to run between events)"
            if pace
            else "### Back to back (burst: background threads compete for the GIL)"
        )
        lines += [title, ""]
        if any(r.get("round_medians_us") for r in runs.values()):
            lines += [
                "Measured in rounds: every variant in turn, three times, each round a third of the "
                "events in a fresh process; samples pooled. The medians of the rounds are in "
                "parentheses: their spread is the machine's drift, larger than some differences.",
                "",
            ]
        sdk, null = runs.get("sdk"), runs.get("null")
        rows = []
        for name, r in runs.items():
            us = r["us"]
            recv = r.get("received") or {}
            bs = r.get("bridge_stats") or {}
            rounds = r.get("round_medians_us")
            rows.append(
                (
                    LABELS.get(name, name),
                    _f(us["median"])
                    + (f" ({' / '.join(_f(m) for m in rounds)})" if rounds else ""),
                    _f(us["p90"]),
                    _f(us["p99"]),
                    _f(us["p99.9"]),
                    _f(us["max"]),
                    _x(ratio(us["median"], sdk["us"]["median"])) if sdk else "n/a",
                    _x(ratio(us["p99"], sdk["us"]["p99"])) if sdk else "n/a",
                    _f(us["median"] - null["us"]["median"]) if null else "n/a",
                    _f(r.get("cpu_us_per_event")),
                    _f(r["cpu_us_per_event"] - null["cpu_us_per_event"])
                    if null and r.get("cpu_us_per_event") is not None
                    else "n/a",
                    _f(r.get("gc_collections")),
                    f"{_f(recv.get('logs'))} logs, {_f(recv.get('traces'))} spans / "
                    f"{_f(r.get('sent_total'))} events"
                    if name in ("sdk", "bridge")
                    else "-",
                    _f(bs.get("dropped_queue_full")) if bs else "-",
                )
            )
        lines += _table(
            [
                "destination",
                "median µs",
                "p90",
                "p99",
                "p99.9",
                "max",
                "median ÷ LoggingHandler",
                "p99 ÷ LoggingHandler",
                "median - null",
                "CPU µs/event (all threads)",
                "CPU above null",
                "GC runs",
                "received by collector",
                "bridge drops",
            ],
            rows,
        )
    return lines


def targets(caller: dict[str, Any]) -> list[Target]:
    """Section 1's row of the results table: the bridge's cost ÷ the `LoggingHandler`'s."""
    rows: list[Target] = []
    if "runs" in caller:
        pace = caller["paces_us"][0]
        runs = paced_runs(caller, pace)
        if "bridge" in runs and "sdk" in runs:
            r_med = ratio(runs["bridge"]["us"]["median"], runs["sdk"]["us"]["median"])
            r_p99 = ratio(runs["bridge"]["us"]["p99"], runs["sdk"]["us"]["p99"])
            invalid = runs["bridge"].get("export_incomplete") or runs["sdk"].get(
                "export_incomplete"
            )
            rows.append(
                (
                    f"1. caller cost, bridge ÷ LoggingHandler (median, paced {pace} µs)",
                    f"{_x(r_med)} ({_f(runs['bridge']['us']['median'])} vs "
                    f"{_f(runs['sdk']['us']['median'])} µs); p99 {_x(r_p99)}"
                    + (" - INVALID: not every record reached the collector" if invalid else ""),
                    "≤ 0.5x",
                    None if invalid else (r_med is not None and r_med <= 0.5),
                )
            )
    return rows


def paced_runs(caller: dict[str, Any], pace: int) -> dict[str, dict[str, Any]]:
    """The runs paced ``pace`` µs apart, by variant (the references left out)."""
    return {
        r["variant"]: r
        for r in caller.get("runs", [])
        if r.get("pace_us") == pace and r["variant"] not in ("timer", "serialize")
    }


def _ref(caller: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((r for r in caller.get("runs", []) if r["variant"] == name), None)


if __name__ == "__main__":
    common.child_main(sys.argv[1:], measure)
