"""Section 3: events per second through the bridge into a real collector, and what gets lost.

Chain: measured process (pinned to one CPU) → OTLP/gRPC → rotel → OTLP/gRPC → counting
receiver (rotel and the receiver share the other CPUs). The measured process registers the
bridge, sends a warm-up, then sends the mixed stream back to back through torch's ``otel``
destination logger and waits until the bridge has processed everything and the SDK has
exported it (``elastic_otel.flush``, which returns once rotel acknowledged). Events/s counts
that whole time on one CPU: caller, bridge worker and exporter threads together.

Phases: below the queue bound with the package's defaults, below the bound with the SDK's
batch queues set back to the SDK's own default (2,048 records, which the package raises to
its own bound unless the user set them), and far above a small bound, where the bridge must
drop and count. Loss = events sent - log records the receiver counted. Then
:mod:`benchmarks.stages` times the bridge's stages one by one to show where the CPU goes.

Renders section 3 of BENCHMARKS.md (:func:`render`, :func:`targets`).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from benchmarks import common, stages
from benchmarks.format import Target
from benchmarks.format import number as _f
from benchmarks.format import table as _table

MODULE = "benchmarks.throughput"
TARGET_EVENTS_PER_S = 10_000
"""Issue 48: eight workers at the default output rate send 8,000 records a second."""


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """Child: warm-up, then ``events`` back to back; timings (monotonic) and counters."""
    common.pin(common.measured_cpu())
    from torch.distributed.elastic import events

    import elastic_otel
    from benchmarks import events as ev
    from benchmarks.caller_cost import wait_bridge_idle

    n, warmup = config["events"], config["warmup"]
    payloads = ev.serialize(ev.mixed_objects(n + warmup))
    elastic_otel.register()
    logger = events._get_or_create_logger("otel")
    info = logger.info
    for p in payloads[:warmup]:
        info(p)
    wait_bridge_idle(elastic_otel.stats, 60.0)
    elastic_otel.flush(60.0)
    before = elastic_otel.stats()
    common.settle()
    cpu0 = time.process_time()
    t0 = time.monotonic()
    for p in payloads[warmup:]:
        info(p)
    t_sent = time.monotonic()
    wait_bridge_idle(elastic_otel.stats, 300.0)
    t_processed = time.monotonic()
    flushed = elastic_otel.flush(120.0)
    t_flushed = time.monotonic()
    cpu = time.process_time() - cpu0
    after = elastic_otel.stats()
    return {
        "events": n,
        "warmup": warmup,
        "t0": t0,
        "send_s": t_sent - t0,
        "process_s": t_processed - t0,
        "export_s": t_flushed - t0,
        "flushed": flushed,
        "cpu_s": cpu,
        "stats": {k: after[k] - before.get(k, 0) for k in after},
        "stats_total": after,
    }


def _phase(name: str, n: int, warmup: int, env: dict[str, str], rx: Any, col: Any) -> dict:
    rx.reset()
    cpu_col0 = col.cpu_seconds()
    cpu_rx0 = common.proc_cpu_seconds(rx.pid)
    res = common.run_child(MODULE, {"events": n, "warmup": warmup}, common.clean_env(env))
    expected_logs = res["stats_total"]["processed"]
    common.wait_until(lambda: rx.stats()["records"]["logs"] >= expected_logs, 15.0, 0.05)
    time.sleep(0.5)  # let rotel forward any last batch (spans) before counting
    got = rx.stats()
    sent = res["events"]
    received_logs = got["records"]["logs"] - warmup  # warm-up logs were all exported first
    res.update(
        phase=name,
        env={k: v for k, v in env.items() if "QUEUE" in k},
        received=got["records"],
        received_bytes=got["bytes"],
        received_requests=got["requests"],
        received_measured_logs=received_logs,
        lost=sent - received_logs,
        # Every drop the package counts: dropped_queue_full, dropped_sdk_queue, ...
        counted=sum(v for k, v in res["stats"].items() if k.startswith("dropped")),
        lost_unaccounted=sent
        - received_logs
        - sum(v for k, v in res["stats"].items() if k.startswith("dropped")),
        events_per_s_exported=sent / res["export_s"] if res["export_s"] > 0 else None,
        events_per_s_processed=res["stats"]["processed"] / res["process_s"]
        if res["process_s"] > 0
        else None,
        e2e_s=got["last_monotonic"] - res["t0"] if got["last_monotonic"] else None,
        collector_cpu_s=col.cpu_seconds() - cpu_col0,
        receiver_cpu_s=common.proc_cpu_seconds(rx.pid) - cpu_rx0,
    )
    return res


def run(quick: bool) -> dict[str, Any]:
    from benchmarks.collector import RotelCollector
    from benchmarks.receiver import ReceiverProcess

    n = 1_000 if quick else 50_000
    bound = 300 if quick else 10_000
    warmup = 200 if quick else 2_000
    out: dict[str, Any] = {"phases": []}
    with ReceiverProcess("grpc") as rx, RotelCollector(rx.endpoint) as col:
        out["collector"] = f"rotel {col.version}"
        base = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": col.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "ELASTIC_OTEL_JOB_ID": "benchmark",
        }
        big = str(max(65_536, n + warmup))
        phases = [
            ("below bound, package defaults", n, {}),
            (
                "below bound, SDK queues at the SDK's default 2,048",
                n,
                {"OTEL_BLRP_MAX_QUEUE_SIZE": "2048", "OTEL_BSP_MAX_QUEUE_SIZE": "2048"},
            ),
            (
                f"above bound (queue {bound:,}, {3 * bound:,} events at once)",
                3 * bound,
                {
                    "ELASTIC_OTEL_QUEUE_SIZE": str(bound),
                    "OTEL_BLRP_MAX_QUEUE_SIZE": big,
                    "OTEL_BSP_MAX_QUEUE_SIZE": big,
                },
            ),
        ]
        if quick:  # CI smoke run: the second phase differs from the first only by env
            del phases[1]
        for name, events_n, extra in phases:
            out["phases"].append(_phase(name, events_n, warmup, {**base, **extra}, rx, col))
    out["stages"] = stages.run(quick)
    return out


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


TITLE = "## 3. Throughput into a real collector"


def render(tp: dict[str, Any]) -> list[str]:
    """Section 3, from :func:`run`'s results (with :mod:`benchmarks.stages`' part)."""
    lines = [
        TITLE,
        "",
        f"Chain: measured process pinned to one CPU → OTLP/gRPC → {tp.get('collector', 'rotel')} "
        "→ OTLP/gRPC → counting receiver (rotel and receiver on the other CPU). The stream is "
        "sent back to back through torch's `otel` destination logger after a warm-up; "
        "*exported in* = until `elastic_otel.flush()` returned, i.e. rotel acknowledged every "
        "batch; events/s = events ÷ that time, on one CPU for caller, bridge worker and "
        "exporters together. *End to end* = until the last record reached the receiver "
        "through rotel. Lost = events sent - log records counted by the receiver (every event "
        "becomes exactly one log record).",
        "",
    ]
    rows = []
    for p in tp["phases"]:
        recv = p["received"]
        records = recv["logs"] + recv["traces"]
        rows.append(
            (
                p["phase"],
                _f(p["events"]),
                _f(p["send_s"], 2),
                _f(p["process_s"], 2),
                _f(p["export_s"], 2),
                _f(p["events_per_s_exported"], 0),
                _f(p["e2e_s"], 2),
                _f(p["received_measured_logs"]),
                _f(p["lost"]),
                _f(p["counted"]),
                _f(p["lost_unaccounted"]),
                _f(p["collector_cpu_s"] / records * 1e6 if records else None, 2),
            )
        )
    lines += _table(
        [
            "phase",
            "events",
            "sent in s",
            "processed in s",
            "exported in s",
            "events/s (exported)",
            "end to end s",
            "logs received",
            "lost",
            "counted (all `dropped_*` counters)",
            "lost, not counted",
            "rotel CPU µs/record",
        ],
        rows,
    )
    above = tp["phases"][-1]
    lines += [
        f"`elastic_otel.stats()` after the above-bound phase ({above['phase']}), "
        "counters of that phase:",
        "",
        "```json",
        json.dumps(above["stats"], indent=2),
        "```",
        "",
    ]
    if tp.get("stages"):
        lines += stages.render(tp["stages"])
    return lines


def targets(tp: dict[str, Any]) -> list[Target]:
    """Section 3's rows of the results table: events/s, and what was lost."""
    rows: list[Target] = []
    if "phases" in tp:
        below = tp["phases"][0]
        rows.append(
            (
                "3. throughput, one core, bridge → rotel",
                f"{_f(below['events_per_s_exported'], 0)} events/s",
                f"≥ {TARGET_EVENTS_PER_S:,} events/s",
                (below["events_per_s_exported"] or 0) >= TARGET_EVENTS_PER_S,
            )
        )
        for phase in (p for p in tp["phases"] if p["phase"] == "below bound, package defaults"):
            rows.append(
                (
                    f"3. loss below the queue bound ({phase['phase']})",
                    f"{_f(phase['lost'])} of {_f(phase['events'])}",
                    "0",
                    phase["lost"] == 0,
                )
            )
        above = tp["phases"][-1]
        rows.append(
            (
                "3. loss above the bound is counted",
                f"lost {_f(above['lost'])}, counted {_f(above['counted'])} "
                f"(dropped_queue_full {_f(above['stats'].get('dropped_queue_full'))})",
                "lost = counted",
                above["lost"] == above["counted"],
            )
        )
    return rows


if __name__ == "__main__":
    common.child_main(sys.argv[1:], measure)
