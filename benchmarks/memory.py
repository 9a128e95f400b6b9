"""Section 5: resident memory while the bridge converts a million events over 100k run ids.

The measured process (pinned to one CPU) registers the bridge with its real OTLP/gRPC
exporters pointed at the counting receiver in another process (so that exporting costs what
it costs, and the receiver is never the bottleneck: it runs on the other CPUs), then sends
the stream through torch's ``otel`` destination logger in chunks, waiting after each chunk
until the bridge's worker has caught up (so the bridge queue never drops: memory of the
steady state, not of a full queue). RSS is read from ``/proc/self/statm`` every
``sample_every`` events, without forcing a collection.

Each run id gets the first ``events_per_run`` events of a node's life (join, agent steps,
workers started, keep-alives), so spans stay open until the trace model's state bound
(``ELASTIC_OTEL_MAX_OPEN_SPANS``) evicts them: the worst case for state.

Renders section 5 of BENCHMARKS.md (:func:`render`, :func:`targets`).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from benchmarks import common
from benchmarks.format import Target
from benchmarks.format import number as _f
from benchmarks.format import table as _table
from elastic_otel.names.environment_variables import DEFAULT_MAX_OPEN_SPANS as DEFAULT_MAX_TRACKED

MODULE = "benchmarks.memory"
MB = 1024 * 1024


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """Child: stream ``events`` payloads over ``runs`` run ids; RSS samples as it goes."""
    common.pin(common.measured_cpu())
    from torch.distributed.elastic import events

    import elastic_otel
    from benchmarks import events as ev
    from benchmarks.caller_cost import wait_bridge_idle

    total, runs = config["events"], config["runs"]
    every, chunk = config["sample_every"], config["chunk"]
    elastic_otel.register()
    logger = events._get_or_create_logger("otel")
    info = logger.info
    common.settle()
    start_rss = common.rss_bytes()
    samples = []
    t0 = time.monotonic()
    payloads = ev.bulk_payloads(total, runs, config["events_per_run"], open_ended=True)
    for sent, payload in enumerate(payloads, 1):
        info(payload)
        if sent % chunk == 0 or sent == total:
            wait_bridge_idle(elastic_otel.stats, 120.0)
        if sent % every == 0 or sent == total:
            stats = elastic_otel.stats()
            samples.append(
                {
                    "events": sent,
                    "rss_mb": common.rss_bytes() / MB,
                    "elapsed_s": time.monotonic() - t0,
                    "processed": stats.get("processed"),
                    "dropped": stats.get("dropped_queue_full"),
                    "exported": stats.get("exported"),
                }
            )
    flushed = elastic_otel.flush(120.0)
    end_rss = common.rss_bytes()
    return {
        "events": total,
        "runs": runs,
        "start_rss_mb": start_rss / MB,
        "end_rss_mb": end_rss / MB,
        "samples": samples,
        "elapsed_s": time.monotonic() - t0,
        "flushed": flushed,
        "stats": elastic_otel.stats(),
    }


def run(quick: bool) -> dict[str, Any]:
    from benchmarks.receiver import ReceiverProcess

    config = {
        "events": 6_000 if quick else 1_000_000,
        "runs": 600 if quick else 100_000,
        "events_per_run": 10,
        "sample_every": 600 if quick else 50_000,
        "chunk": 1_000,
    }
    with ReceiverProcess("grpc") as rx:
        env = common.clean_env(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "ELASTIC_OTEL_JOB_ID": "benchmark",
            }
        )
        res = common.run_child(MODULE, config, env, timeout=1800.0)
        time.sleep(0.5)
        res["received"] = rx.stats()["records"]
    samples = res["samples"]
    # Warm-up: at least until the trace model's state bound (nodes and agents) is full.
    state_full = DEFAULT_MAX_TRACKED * config["events_per_run"]
    warmup_events = min(config["events"] // 5, max(state_full, config["events"] // 10))
    after = [s["rss_mb"] for s in samples if s["events"] >= warmup_events] or [0.0]
    peak = max(s["rss_mb"] for s in samples)
    res.update(
        config=config,
        exporter="OTLP/gRPC to the counting receiver (separate process)",
        warmup_events=warmup_events,
        min_after_warmup_mb=min(after) - res["start_rss_mb"],
        max_after_warmup_mb=max(after) - res["start_rss_mb"],
        growth_after_warmup_mb=max(after) - min(after),
        peak_above_start_mb=peak - res["start_rss_mb"],
        end_above_start_mb=samples[-1]["rss_mb"] - res["start_rss_mb"],
        lost_logs=res["events"] - res["received"]["logs"],
    )
    return res


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


TITLE = "## 5. Memory"


def render(mem: dict[str, Any]) -> list[str]:
    """Section 5, from :func:`run`'s results."""
    cfg = mem["config"]
    lines = [
        TITLE,
        "",
        f"{mem['events']:,} events over {mem['runs']:,} run ids ({cfg['events_per_run']} "
        "events each: join, agent steps, workers started, keep-alives; spans left open so that "
        "the trace model's state bound has to evict them) through the bridge's "
        f"parse + model + emit path, exporter: {mem['exporter']}. Sent through torch's `otel` "
        f"logger in chunks of {cfg['chunk']:,}, waiting for the worker after each chunk. RSS "
        f"from `/proc/self/statm` every {cfg['sample_every']:,} events, no forced GC. Start = "
        "after `register()` (pipeline built), before the first event.",
        "",
        f"Start {_f(mem['start_rss_mb'])} MB; peak {_f(mem['peak_above_start_mb'])} MB above "
        f"start. Warm-up = the first {mem.get('warmup_events', 0):,} events, after which the "
        f"trace model's state bound ({DEFAULT_MAX_TRACKED:,} nodes and as many agents by "
        "default) is full; after "
        f"it RSS stays between {_f(mem.get('min_after_warmup_mb'))} and "
        f"{_f(mem.get('max_after_warmup_mb'))} MB above start (spread "
        f"{_f(mem['growth_after_warmup_mb'])} MB). {_f(mem['elapsed_s'], 1)} s in all; log "
        f"records lost: {_f(mem['lost_logs'])}.",
        "",
    ]
    start = mem["start_rss_mb"]
    lines += _table(
        ["events", "RSS MB", "above start MB", "elapsed s", "processed", "dropped"],
        (
            (
                _f(s["events"]),
                _f(s["rss_mb"]),
                _f(s["rss_mb"] - start),
                _f(s["elapsed_s"], 1),
                _f(s["processed"]),
                _f(s["dropped"]),
            )
            for s in mem["samples"]
        ),
    )
    return lines


def targets(mem: dict[str, Any]) -> list[Target]:
    """Section 5's row of the results table: the peak, and the spread after the warm-up."""
    rows: list[Target] = []
    if "samples" in mem:
        rows.append(
            (
                f"5. RSS, {mem['events']:,} events / {mem['runs']:,} run ids",
                f"peak +{_f(mem['peak_above_start_mb'])} MB over start; after warm-up "
                f"({mem.get('warmup_events', 0):,} events) between "
                f"{_f(mem.get('min_after_warmup_mb'))} and {_f(mem.get('max_after_warmup_mb'))} "
                f"MB above start",
                "≤ 50 MB, flat (± 5 MB) after warm-up",
                mem["peak_above_start_mb"] <= 50 and mem["growth_after_warmup_mb"] <= 5,
            )
        )
    return rows


if __name__ == "__main__":
    common.child_main(sys.argv[1:], measure)
