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

Renders section 10 of BENCHMARKS.md (:func:`render`, :func:`targets`).
"""

from __future__ import annotations

import gc
import re
import statistics
import sys
import time
from typing import Any

from benchmarks import common
from benchmarks.format import Target
from benchmarks.format import number as _f
from benchmarks.format import size as _bytes
from benchmarks.format import table as _table

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


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


TITLE = "## 10. Trace sizes"


def render(ts: dict[str, Any]) -> list[str]:
    """Section 10, from :func:`run`'s results."""
    tempo, jaeger = ts["tempo_max_bytes_per_trace"], ts["jaeger_max_spans"]
    lines = [
        TITLE,
        "",
        "What each trace of one rendezvous round weighs (issue 21; `benchmarks/trace_sizes.py` "
        "over `benchmarks/rounds.py`, the code `tests/unit/test_trace_layout.py` checks). "
        "Every node of the round (8 workers each, all succeeding) goes through a bridge "
        "conversion of its own (parse → trace model → emitter → SDK spans, with the node's "
        "resource), fed the events its agent records (real torch `Event` / `RdzvEvent` "
        "objects serialized as torch does); every span is encoded as OTLP protobuf when it "
        "ends. A trace's bytes are what Tempo counts against `max_bytes_per_trace`: its "
        "encoded spans plus one resource and scope envelope per node with spans in it. Both "
        "layouts: `ELASTIC_OTEL_ROUND_TRACE_MAX_NODES=0` (the whole round one trace) and the "
        "default (past it, the round's trace keeps one `rendezvous.join` per node, and a "
        "`worker.failure` per root cause, none here; each node's spans are a trace of their "
        "own, linked both ways). *training spans*: the spans `examples/train.py` adds under "
        "each `worker` span (`init_process_group`, `worker.first_step`, one `save_checkpoint`). "
        "Every row is measured (none scaled from fewer nodes), in one child process (*CPU s to "
        "size*: its CPU time for the row, conversion and encoding of every node); MB and KB "
        f"are decimal. Limits: Tempo {_bytes(tempo)} per trace, Jaeger (on Elasticsearch) "
        f"{jaeger:,} spans per query.",
        "",
    ]

    def fits(ok: bool, largest: str) -> str:
        return "yes" if ok else f"**no** ({largest})"

    lines += _table(
        ["nodes x 8", "layout", "training spans", "traces", "spans in all", "round's trace: "
         "spans", "round's trace: bytes", "largest other trace: spans", "bytes",
         f"Tempo ≤ {_bytes(tempo)}", f"Jaeger ≤ {jaeger:,} spans", "CPU s to size"],
        (
            (
                _f(r["nodes"]),
                r["layout"],
                _f(r["training_spans"]),
                _f(r["traces"]),
                _f(r["spans"]),
                _f(r["round_spans"]),
                _bytes(r["round_bytes"]),
                _f(r["other_spans"]) if r["other_spans"] is not None else "-",
                _bytes(r["other_bytes"]),
                fits(r["tempo_ok"], _bytes(r["max_bytes"])),
                fits(r["jaeger_ok"], f"{r['max_spans']:,} spans"),
                _f(r["cpu_s"], 1),
            )
            for r in ts["sizes"]
        ),
    )  # fmt: skip
    one = sorted(
        (r for r in ts["sizes"] if r["round_trace_max_nodes"] == 0), key=lambda r: r["nodes"]
    )
    for training in (False, True):
        rows = [r for r in one if r["training_spans"] == training]
        if len(rows) >= 2 and rows[-1]["nodes"] > rows[0]["nodes"]:
            a, b = rows[0], rows[-1]
            n = b["nodes"] - a["nodes"]
            lines += [
                f"One trace per round, {'with' if training else 'without'} the training "
                f"spans: from {a['nodes']:,} to {b['nodes']:,} nodes the round's trace grows "
                f"by {_f((b['round_spans'] - a['round_spans']) / n, 1)} spans and "
                f"{_bytes((b['round_bytes'] - a['round_bytes']) / n)} per node.",
                "",
            ]
    lines += _bridge_per_node(ts)
    return lines


def _bridge_per_node(ts: dict[str, Any]) -> list[str]:
    rows = ts.get("bridge") or []
    if not rows:
        return []
    lines = [
        "### The bridge's own cost for one node, by world size",
        "",
        "One node's events of a round (the join, torch's rendezvous steps, its 8 workers "
        "started and ended, a keep-alive, the exit barrier, the close: the same events at "
        "every world size but for the size in them) recorded through torch's `otel` "
        "destination logger into a real bridge (`elastic_otel.register()`, OTLP/gRPC to the "
        "counting receiver), in a process pinned to one CPU"
        + (
            ", all world sizes in one process (quick mode)"
            if ts.get("bridge_one_process")
            else ", a fresh one per world size"
        )
        + ", after a warm-up round of another job. Each round is a new job. *CPU*: the "
        "process's CPU time (all threads: the caller, the bridge's worker, the exporters) "
        "from the first event until the bridge processed them all and `flush()` exported "
        f"the records; median (and fastest) of {ts['bridge_reps']} rounds, the first round "
        "apart. *Peak RSS*: `VmHWM` (reset through `/proc/self/clear_refs` just before) "
        "during the first round, above the RSS before it (Linux counts RSS in per-thread "
        "batches, so these are good to a few hundred KB either way); *Python heap*: one "
        "more round under `tracemalloc` (exact), its peak and what was still allocated after "
        "it.",
        "",
    ]
    lines += _table(
        ["world (nodes x 8)", "events", "records exported", "CPU µs per round, median",
         "fastest", "first round CPU µs", "peak RSS above start KB", "RSS after, above start "
         "KB", "Python heap peak KB", "Python heap retained KB"],
        (
            (
                _f(r["world"]),
                _f(r["events"]),
                _f(r["records_exported"]),
                _f(r["cpu_us_median"], 0),
                _f(r["cpu_us_min"], 0),
                _f(r["first_cpu_us"], 0),
                _f(r["rss_peak_above_start_kb"]),
                _f(r["rss_after_above_start_kb"]),
                _f(r["heap_peak_kb"], 1),
                _f(r["heap_retained_kb"], 1),
            )
            for r in rows
        ),
    )  # fmt: skip
    return lines


def targets(ts: dict[str, Any]) -> list[Target]:
    """Section 10's rows of the results table: the largest trace's bytes and spans."""
    if not ts.get("sizes"):
        return []
    rows = _default_layout_rows(ts)
    with_, without = rows[True], rows[False]
    one = next(
        r
        for r in ts["sizes"]
        if r["nodes"] == with_["nodes"] and r["round_trace_max_nodes"] == 0 and r["training_spans"]
    )
    where = f"{with_['nodes']:,} nodes x 8, default layout ({with_['layout']}), with the "
    where += "training script's spans"
    split = with_["other_bytes"] is not None  # the round past the limit: a trace per node
    return [
        (
            f"10. largest trace of a round, {where}: bytes",
            f"{_bytes(with_['max_bytes'])} "
            + (
                f"(the round's trace {_bytes(with_['round_bytes'])}, each node's "
                f"{_bytes(with_['other_bytes'])})"
                if split
                else "(the round is one trace)"
            )
            + f"; without the script's spans {_bytes(without['max_bytes'])}; one trace per "
            f"round: {_bytes(one['max_bytes'])}",
            f"≤ {_bytes(ts['tempo_max_bytes_per_trace'])} (Tempo's `max_bytes_per_trace`)",
            with_["tempo_ok"] and without["tempo_ok"],
        ),
        (
            f"10. largest trace of a round, {where}: spans",
            f"{_f(with_['max_spans'])} "
            + (
                f"(the round's trace {_f(with_['round_spans'])}, each node's "
                f"{_f(with_['other_spans'])})"
                if split
                else "(the round is one trace)"
            )
            + f"; without the script's spans {_f(without['max_spans'])}; one trace per round: "
            f"{_f(one['max_spans'])}",
            f"≤ {_f(ts['jaeger_max_spans'])} (Jaeger's spans per query)",
            with_["jaeger_ok"] and without["jaeger_ok"],
        ),
    ]


def _default_layout_rows(ts: dict[str, Any]) -> dict[bool, dict[str, Any]]:
    """The largest round measured in the default layout: {training spans: its row}."""
    nodes = max(ts["nodes"])
    default = max(r["round_trace_max_nodes"] for r in ts["sizes"])
    return {
        r["training_spans"]: r
        for r in ts["sizes"]
        if r["nodes"] == nodes and r["round_trace_max_nodes"] == default
    }


if __name__ == "__main__":
    common.child_main(sys.argv[1:], child)
