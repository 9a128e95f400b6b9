"""Section 10: what each trace of a large round weighs (issue 21), and the bridge's own cost
for one node at that world size.

* **Trace sizes.** :func:`benchmarks.rounds.run_round`: every node of one round (8 workers
  each, every worker succeeding) through a bridge conversion of its own (parse → trace model
  → emitter → SDK spans, with the node's resource), every span encoded as OTLP protobuf; per
  trace its spans and bytes (what Tempo counts against ``max_bytes_per_trace``). For each
  node count, both layouts (``ELASTIC_OTEL_ROUND_TRACE_MAX_NODES`` = 0: one trace per round;
  the default: a trace per node past it), without and with the training script's spans
  (``init_process_group``, ``worker.first_step``, ``save_checkpoint`` per worker). All in one
  child process (it imports the package snapshot the suite measures), measured, none scaled.
* **The bridge for one node.** One node's round-0 events (:func:`benchmarks.rounds.node_events`:
  the join, torch's rendezvous steps, 8 workers started and ended, a keep-alive, the exit
  barrier, the close; the same events whatever the world size but for the size in them)
  recorded through torch's ``otel`` destination logger into a real bridge
  (``elastic_otel.register()``, OTLP/gRPC to the counting receiver), in a child pinned to one
  CPU, one child per world size (quick mode: one child for all of them, after the sizes).
  After a warm-up job: the first round's peak RSS above the RSS before it (``VmHWM`` reset
  through ``/proc/self/clear_refs`` first), then ``reps`` rounds of new jobs for the CPU
  (``time.process_time``: every thread of the process, the export included, until the bridge
  has processed and ``flush()`` exported everything), then one more round under
  ``tracemalloc`` for the Python heap's peak and what stays allocated.
"""

from __future__ import annotations

import gc
import re
import statistics
import sys
import time
from typing import Any

from benchmarks import common

MODULE = "benchmarks.trace_sizes"
TEMPO_MAX_BYTES_PER_TRACE = 5_000_000
"""Grafana Tempo's default ``max_bytes_per_trace``."""
JAEGER_MAX_SPANS = 10_000
"""Jaeger on Elasticsearch: spans a query returns by default."""
RUN_ID = "scale-job"
SALT = "benchmark"  # the job salt run_round's trace model uses
NODES = (8, 512, 4096)
QUICK_NODES = (8, 64)
BRIDGE_WORLDS = (8, 512, 4096)


def layouts() -> tuple[tuple[str, int], ...]:
    """(label, ``round_trace_max_nodes``) of both layouts."""
    from elastic_otel.names.environment_variables import DEFAULT_ROUND_TRACE_MAX_NODES as limit

    return (("one trace per round", 0), (f"trace per node past {limit}", limit))


# --- child: trace sizes -----------------------------------------------------------------------


def size_rows(nodes_list: list[int]) -> list[dict[str, Any]]:
    """Every (nodes, layout, training spans) combination through :func:`run_round`."""
    from benchmarks.rounds import NPROC, run_round
    from elastic_otel.model.trace_ids import trace_id_for

    round_trace = trace_id_for(SALT, RUN_ID, 0)
    run_round(1, 0, training_spans=True, run_id="warm-up")  # imports: not in the first row's CPU
    rows = []
    for nodes in nodes_list:
        for label, limit in layouts():
            for training in (False, True):
                cpu0 = time.process_time()
                sized = run_round(nodes, limit, training_spans=training, run_id=RUN_ID)
                cpu = time.process_time() - cpu0
                others = [t for t in sized.bytes if t != round_trace]
                other = max(others, key=sized.bytes.__getitem__) if others else None
                rows.append(
                    {
                        "nodes": nodes,
                        "workers": nodes * NPROC,
                        "layout": label,
                        "round_trace_max_nodes": limit,
                        "training_spans": training,
                        "traces": len(sized.spans),
                        "spans": sized.total_spans,
                        "bytes": sum(sized.bytes.values()),
                        "round_spans": sized.spans.get(round_trace, 0),
                        "round_bytes": sized.bytes.get(round_trace, 0),
                        "other_spans": sized.spans[other] if other is not None else None,
                        "other_bytes": sized.bytes[other] if other is not None else None,
                        "max_spans": max(sized.spans.values()),
                        "max_bytes": max(sized.bytes.values()),
                        "cpu_s": cpu,
                    }
                )
                del sized
                gc.collect()
    for row in rows:
        row["tempo_ok"] = row["max_bytes"] <= TEMPO_MAX_BYTES_PER_TRACE
        row["jaeger_ok"] = row["max_spans"] <= JAEGER_MAX_SPANS
    return rows


# --- child: the bridge for one node -----------------------------------------------------------


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    return int(m[1]) if m else 0


def _reset_peak_rss() -> bool:
    """Make ``VmHWM`` the current RSS (Linux ≥ 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def bridge_rows(worlds: list[int], reps: int) -> list[dict[str, Any]]:
    """One node's events per round through the registered bridge, per world size."""
    import tracemalloc

    from torch.distributed.elastic import events

    import elastic_otel
    from benchmarks.caller_cost import wait_bridge_idle
    from benchmarks.rounds import node_events, serialized

    elastic_otel.register()
    info = events._get_or_create_logger("otel").info

    def payloads(run_id: str, world: int) -> list[str]:
        return [serialized(e) for e in node_events(run_id, world - 1, world)]

    def send(texts: list[str]) -> tuple[float, int]:
        """CPU seconds until the bridge processed and exported them; records exported."""
        exported = elastic_otel.stats().get("exported", 0)
        cpu0 = time.process_time()
        for text in texts:
            info(text)
        wait_bridge_idle(elastic_otel.stats, 30.0)
        if not elastic_otel.flush(30.0):
            raise RuntimeError("the bridge did not export within 30 s")
        return time.process_time() - cpu0, elastic_otel.stats().get("exported", 0) - exported

    send(payloads("warm-up-job", 8))  # imports, first export, the gRPC channel
    rows = []
    for world in worlds:
        texts = payloads(f"job-{world}-first", world)
        common.settle()
        resettable = _reset_peak_rss()
        rss0 = _status_kb("VmRSS")
        first_cpu, records = send(texts)
        peak, rss1 = _status_kb("VmHWM"), _status_kb("VmRSS")
        cpus = []
        for rep in range(reps):
            texts = payloads(f"job-{world}-{rep}", world)
            common.settle()
            cpus.append(send(texts)[0])
        texts = payloads(f"job-{world}-traced", world)
        common.settle()
        tracemalloc.start()
        send(texts)
        heap_now, heap_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rows.append(
            {
                "world": world,
                "events": len(texts),
                "records_exported": records,
                "first_cpu_us": first_cpu * 1e6,
                "cpu_us": [c * 1e6 for c in cpus],
                "cpu_us_median": statistics.median(cpus) * 1e6,
                "cpu_us_min": min(cpus) * 1e6,
                "rss_start_kb": rss0,
                "rss_peak_above_start_kb": peak - rss0 if resettable else None,
                "rss_after_above_start_kb": rss1 - rss0,
                "heap_peak_kb": heap_peak / 1024,
                "heap_retained_kb": heap_now / 1024,
            }
        )
    return rows


def child(config: dict[str, Any]) -> dict[str, Any]:
    common.pin(common.measured_cpu())
    result: dict[str, Any] = {}
    if config.get("nodes"):
        result["sizes"] = size_rows(config["nodes"])
    if config.get("worlds"):
        result["bridge"] = bridge_rows(config["worlds"], config["reps"])
    return result


# --- parent -----------------------------------------------------------------------------------


def run(quick: bool) -> dict[str, Any]:
    """The sizes table (one child), then the bridge per world size (quick mode: the same child
    measures both, to start one process fewer)."""
    from benchmarks.receiver import ReceiverProcess

    nodes = list(QUICK_NODES if quick else NODES)
    reps = 3 if quick else 15
    with ReceiverProcess("grpc") as rx:
        env = common.clean_env(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "ELASTIC_OTEL_JOB_ID": SALT,
            }
        )
        if quick:
            config = {"nodes": nodes, "worlds": list(BRIDGE_WORLDS), "reps": reps}
            both = common.run_child(MODULE, config, env, timeout=600)
            sizes, bridge = both["sizes"], both["bridge"]
        else:
            sizes = common.run_child(MODULE, {"nodes": nodes}, env, timeout=3600)["sizes"]
            bridge = [
                row
                for world in BRIDGE_WORLDS
                for row in common.run_child(
                    MODULE, {"worlds": [world], "reps": reps}, env, timeout=600
                )["bridge"]
            ]
    return {
        "nodes": nodes,
        "tempo_max_bytes_per_trace": TEMPO_MAX_BYTES_PER_TRACE,
        "jaeger_max_spans": JAEGER_MAX_SPANS,
        "sizes": sizes,
        "bridge": bridge,
        "bridge_reps": reps,
        "bridge_one_process": quick,
    }


if __name__ == "__main__":
    common.child_main(sys.argv[1:], child)
