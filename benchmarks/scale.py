"""Section 6: what a large job sends to the collector tier, from measured per-event numbers.

A child process replays one node's steady state (join, workers started, then keep-alives,
three events each) through the bridge into the counting receiver and measures the wire size
of a keep-alive log record, how many spans keep-alives produce (none: they are aggregated
into the member span) and the CPU a keep-alive event costs the node (all threads). The
parent combines that with the cluster shape: nodes x events per keep-alive / interval.

Renders section 6 of BENCHMARKS.md (:func:`render`).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from benchmarks import common
from benchmarks.format import number as _f
from benchmarks.format import table as _table

MODULE = "benchmarks.scale"


def keepalive_pattern() -> dict[str, int]:
    """From the captured job: keep-alives and the events recorded around each one."""
    from benchmarks.events import CAPTURED_FILES, captured_rows

    sent = triples = 0
    for name in CAPTURED_FILES:
        msgs = [json.loads(t).get("message", "") for _, t in captured_rows(name)]
        for i, msg in enumerate(msgs):
            if "has sent a keep-alive heartbeat" not in msg:
                continue
            sent += 1
            before = msgs[max(0, i - 2) : i]
            if (
                len(before) == 2
                and "updated its keep-alive heartbeat" in before[0]
                and ("synced" in before[1] or "stale state" in before[1])
            ):
                triples += 1
    return {"keep_alives": sent, "preceded_by_update_and_sync": triples}


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """Child: one node joins, starts its workers, then sends ``keepalives`` keep-alives."""
    common.pin(common.measured_cpu())
    from torch.distributed.elastic import events

    import elastic_otel
    from benchmarks import events as ev
    from benchmarks.caller_cost import wait_bridge_idle

    node_events = ev.node_lifecycle("scale-job", keepalives=0, close=False)
    node = ev.Node("scale-job", "node-0001", 4242)
    triple = ev.serialize(node.keep_alive())
    elastic_otel.register()
    info = events._get_or_create_logger("otel").info
    for p in ev.serialize(node_events):
        info(p)
    wait_bridge_idle(elastic_otel.stats, 30.0)
    elastic_otel.flush(30.0)
    common.pause()  # the parent snapshots the receiver: what follows is the keep-alives'
    common.settle()
    cpu0 = time.process_time()
    for _ in range(config["keepalives"]):
        for p in triple:
            info(p)
        time.sleep(config["pace_s"])
    wait_bridge_idle(elastic_otel.stats, 60.0)
    elastic_otel.flush(60.0)
    cpu = time.process_time() - cpu0
    ka_events = 3 * config["keepalives"]
    return {
        "setup_events": len(node_events),
        "keepalive_events": ka_events,
        "cpu_us_per_event": cpu / ka_events * 1e6 if ka_events else None,
        "json_bytes": [len(p.encode()) for p in triple],
    }


def measure_waiting(config: dict[str, Any]) -> dict[str, Any]:
    """Child: a node with 8 running workers and a second node stuck in a join, then idle.

    What the bridge does on its own while nothing is recorded: open-span snapshots (the member
    span and 8 worker spans) and stall reports (the join), as configured by the parent.
    """
    common.pin(common.measured_cpu())
    from torch.distributed.elastic import events

    import elastic_otel
    from benchmarks import events as ev
    from benchmarks.caller_cost import wait_bridge_idle

    node = ev.Node("scale-job", "node-0001", 4242)
    setup = [*node.join(0, 0, 2), node.agent("RENDEZVOUS", duration_ms=1000.0)]
    setup += [node.agent("START", "WORKER", g, str(4243 + g), world=2, nproc=8) for g in range(8)]
    stuck = ev.Node("scale-job", "node-0002", 4343)
    setup += stuck.join(1, 0, 2)[:2]  # attempts to join, waits in the participants list
    elastic_otel.register()
    info = events._get_or_create_logger("otel").info
    for p in ev.serialize(setup):
        info(p)
    wait_bridge_idle(elastic_otel.stats, 30.0)
    elastic_otel.flush(30.0)
    common.pause()  # the parent snapshots the receiver: what follows is the idle bridge's
    cpu0 = time.process_time()
    time.sleep(config["seconds"])
    cpu = time.process_time() - cpu0
    elastic_otel.flush(30.0)
    return {"idle_cpu_s": cpu, "seconds": config["seconds"]}


def _measure_waiting(rx: Any, seconds: float, interval: str, stall: str) -> dict[str, Any]:
    env = common.clean_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "ELASTIC_OTEL_JOB_ID": "benchmark",
            "OTEL_METRICS_EXPORTER": "none",
            "ELASTIC_OTEL_OPEN_SPAN_INTERVAL": interval,
            "ELASTIC_OTEL_STALL_AFTER": stall,
        }
    )
    got: dict[str, Any] = {}

    def snapshot() -> None:
        time.sleep(0.3)
        got["setup"] = rx.stats()

    res = common.run_child_with_pause(MODULE, {"seconds": seconds, "waiting": True}, env, snapshot)
    time.sleep(0.3)
    after = rx.stats()
    logs = after["records"]["logs"] - got["setup"]["records"]["logs"]
    size = after["bytes"]["logs"] - got["setup"]["bytes"]["logs"]
    return {**res, "log_records": logs, "bytes": size}


def open_span_costs(rx: Any, quick: bool) -> dict[str, Any]:
    """The idle bridge with snapshots (every second) and stall reports (after 1 s) against
    both off: records, bytes and CPU they cost one node, then scaled to 4,096 nodes at the
    defaults (30 s, 60 s)."""
    seconds = 2.0 if quick else 20.0
    off = _measure_waiting(rx, seconds, "0", "0")
    on = _measure_waiting(rx, seconds, "1", "1")
    records = on["log_records"] - off["log_records"]
    cpu_s = on["idle_cpu_s"] - off["idle_cpu_s"]
    per_record_us = cpu_s / records * 1e6 if records > 0 else None
    snap_per_node, interval, stall_after, nodes = 9, 30.0, 60.0, 4096  # member + 8 workers
    return {
        "off": off,
        "on": on,
        "records": records,
        "cpu_us_per_record": per_record_us,
        "bytes_per_record": (on["bytes"] - off["bytes"]) / records if records > 0 else None,
        "idle_cpu_us_per_s_off": off["idle_cpu_s"] / seconds * 1e6,
        "nodes": nodes,
        "snapshot_records_per_s": nodes * snap_per_node / interval,
        "stall_records_per_s_all_stalled": nodes / stall_after,
        "node_cpu_us_per_s": (snap_per_node / interval) * per_record_us
        if per_record_us is not None
        else None,
    }


HEARTBEAT_LOGS_OFF = {"ELASTIC_OTEL_HEARTBEAT_LOGS": "false"}


def _measure(rx: Any, keepalives: int, extra_env: dict[str, str]) -> dict[str, Any]:
    """One child through the bridge into ``rx``: what its keep-alives alone put on the wire."""
    env = common.clean_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "ELASTIC_OTEL_JOB_ID": "benchmark",
            **extra_env,
        }
    )
    got: dict[str, dict[str, Any]] = {}

    def snapshot() -> None:
        time.sleep(0.3)  # nothing is in flight: the child flushed before pausing
        got["setup"] = rx.stats()

    cfg = {"keepalives": keepalives, "pace_s": 0.001}
    res = common.run_child_with_pause(MODULE, cfg, env, snapshot)
    time.sleep(0.3)
    got["all"] = rx.stats()

    def diff(kind: str, signal: str) -> int:
        return got["all"][kind][signal] - got["setup"][kind][signal]

    logs = diff("records", "logs")
    return {
        "child": res,
        "received": got["all"],
        "received_setup_only": got["setup"],
        "keepalive_logs_received": logs,
        "keepalive_events_sent": res["keepalive_events"],
        "spans_from_keepalives": diff("records", "traces"),
        "bytes_per_log": diff("bytes", "logs") / logs if logs else None,
    }


def _cluster(m: dict[str, Any], collector_cpu_per_record: float | None) -> dict[str, Any]:
    """Scale one node's measured keep-alive records to a 4,096-node job."""
    from benchmarks.events import node_lifecycle

    nodes, interval_s, per_ka = 4096, 5.0, 3
    # A re-rendezvous of a node with 8 workers: join (5), agent steps (2), old workers end
    # (8), new workers start (8).
    restart_events = len(node_lifecycle("x", nproc=8, keepalives=0, close=False))
    events_per_s = nodes * per_ka / interval_s
    ka_events = m["keepalive_events_sent"]
    records_per_s = events_per_s * m["keepalive_logs_received"] / ka_events if ka_events else 0
    return {
        "nodes": nodes,
        "keepalive_interval_s": interval_s,
        "events_per_keepalive": per_ka,
        "events_per_s_per_node": per_ka / interval_s,
        "node_cpu_us_per_s": per_ka / interval_s * m["child"]["cpu_us_per_event"],
        "log_records_per_s": records_per_s,
        "spans_per_s": events_per_s * m["spans_from_keepalives"] / ka_events if ka_events else None,
        "otlp_bytes_per_s": records_per_s * (m["bytes_per_log"] or 0),
        # The three events of one keep-alive are recorded within milliseconds, so each node's
        # batch processor (1 s schedule delay) sends them in one export request.
        "export_requests_per_s": nodes / interval_s if records_per_s else 0,
        "connections": nodes,
        "collector_cores": records_per_s * collector_cpu_per_record / 1e6
        if collector_cpu_per_record
        else None,
        "restart_events_per_node": restart_events,
        "restart_storm_events": nodes * restart_events,
    }


def run(quick: bool, measured: dict[str, Any]) -> dict[str, Any]:
    """Measure keep-alive records (default, and heartbeat log records off), then scale them."""
    from benchmarks.receiver import ReceiverProcess

    keepalives = 50 if quick else 1000
    with ReceiverProcess("grpc") as rx:
        default = _measure(rx, keepalives, {})
        # Quick mode (CI smoke run): not the variant with heartbeat log records off.
        off = None if quick else _measure(rx, keepalives, HEARTBEAT_LOGS_OFF)
        # Quick mode: not the open-span snapshots either (two torch start-ups fewer).
        waiting = None if quick else open_span_costs(rx, quick)
    collector_cpu_per_record = measured.get("collector_cpu_us_per_record")
    return {
        "pattern": keepalive_pattern(),
        **default,
        "table": _cluster(default, collector_cpu_per_record),
        "heartbeat_logs_off": {**off, "table": _cluster(off, collector_cpu_per_record)}
        if off
        else None,
        "collector_cpu_us_per_record": collector_cpu_per_record,
        "open_spans": waiting,
    }


def child(config: dict[str, Any]) -> dict[str, Any]:
    return measure_waiting(config) if config.get("waiting") else measure(config)


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


TITLE = "## 6. Scale on paper"


def render(sc: dict[str, Any]) -> list[str]:
    """Section 6, from :func:`run`'s results."""
    t = sc["table"]
    pat = sc["pattern"]
    lines = [
        TITLE,
        "",
        f"Keep-alive pattern in the captured job (`tests/data`): {pat['keep_alives']} keep-alives, "
        f"{pat['preceded_by_update_and_sync']} of them recorded as the triple *updated its "
        "keep-alive heartbeat time* → *successfully synced* (or *stale state*) → *has sent a "
        "keep-alive heartbeat*: 3 rendezvous events per keep-alive. Measured for one node in "
        f"steady state ({sc['keepalive_events_sent']:,} keep-alive events through the bridge "
        f"into the receiver): {sc['keepalive_logs_received']:,} log records, "
        f"{sc['spans_from_keepalives']} spans"
        + (
            " (keep-alives are counted on the open member span, not emitted as spans)"
            if sc["spans_from_keepalives"] == 0
            else ""
        )
        + f", {_f(sc['bytes_per_log'], 0)} bytes of OTLP protobuf per "
        f"log record (uncompressed), {_f(sc['child']['cpu_us_per_event'])} µs of CPU per "
        "keep-alive event on the node (all threads, export included).",
        "",
    ]
    off = sc.get("heartbeat_logs_off")
    tables = [t, off["table"]] if off else [t]

    def cores(x: dict[str, Any]) -> str:
        c = x.get("collector_cores")
        return f"{_f(c, 3)} cores" if c is not None else "n/a"

    def mb(x: dict[str, Any]) -> str:
        return f"{_f(x['otlp_bytes_per_s'] / 1e6, 2)} MB/s"

    def cpu(x: dict[str, Any]) -> str:
        us = x["node_cpu_us_per_s"]
        return f"{_f(us)} µs/s ({_f(us / 1e4, 4)} % of one core)"

    rows = [
        ("nodes (agents)", lambda x: _f(x["nodes"])),
        ("keep-alive interval", lambda x: f"{x['keepalive_interval_s']:g} s"),
        ("events per keep-alive", lambda x: _f(x["events_per_keepalive"])),
        ("events per node per second", lambda x: _f(x["events_per_s_per_node"], 2)),
        ("CPU per node for them", cpu),
        ("log records/s into the collector tier", lambda x: _f(x["log_records_per_s"], 0)),
        ("spans/s from keep-alives", lambda x: _f(x["spans_per_s"], 1)),
        ("OTLP bytes/s (uncompressed protobuf)", mb),
        ("export requests/s (one per keep-alive per node)",
         lambda x: _f(x["export_requests_per_s"], 0)),
        ("concurrent OTLP connections", lambda x: _f(x["connections"])),
        ("collector CPU for it (rotel, measured µs/record in §3)", cores),
        (f"re-rendezvous of all nodes ({t['restart_events_per_node']} events/node, 8 workers)",
         lambda x: f"{_f(x['restart_storm_events'])} events within the rendezvous window"),
    ]  # fmt: skip
    headers = ["4,096-node job, 5 s keep-alives", "default (every event a log record)"]
    if off:
        headers.append("`ELASTIC_OTEL_HEARTBEAT_LOGS=false`")
    lines += _table(headers, ((label, *(fn(x) for x in tables)) for label, fn in rows))
    if off:
        lines += [
            f"With `ELASTIC_OTEL_HEARTBEAT_LOGS=false` (measured the same way): "
            f"{off['keepalive_logs_received']:,} log records for "
            f"{off['keepalive_events_sent']:,} keep-alive events, "
            f"{_f(off['child']['cpu_us_per_event'])} µs of CPU per keep-alive event; the "
            "keep-alives stay counted on the member span (`torchelastic.keep_alive.count`).",
            "",
        ]
    lines += [
        "**One collector must absorb all of it per round.** Every node derives the same trace "
        "id for a rendezvous round without talking to the others: `trace_id = "
        "blake2b(job salt, run_id, round)` (`elastic_otel/model/trace_ids.py`), and every log "
        "record of that round carries it (keep-alive logs carry the member span's context). Scaled "
        "out, the agent tier (`collector-config/gateway-agent.yaml`: one collector per node or "
        "rack, any number) routes spans *and* logs with the `loadbalancing` exporter, "
        "`routing_key: traceID`, over a consistent-hash ring of the backend collectors "
        "(`gateway-backend.yaml`); all agents hold the same backend list, so every record of "
        "a round lands on the same backend, which sees whole traces (tail sampling, "
        "`groupbytrace`). Consequence for capacity: the agent tier spreads connections and "
        "requests (4,096 connections, ~820 requests/s), but the steady keep-alive stream of "
        "one job in one round is *one* trace id, so one backend takes the table's whole "
        "record rate; the next round (new trace id) may land elsewhere, and different jobs "
        "spread over the ring. When the backend list changes, ~1/N of trace ids move and a "
        "round in flight can be split.",
        "",
    ]
    lines += _open_spans(sc.get("open_spans"))
    return lines


def _open_spans(w: dict[str, Any] | None) -> list[str]:
    if not w:
        return []
    on = w["on"]
    lines = [
        "### Open-span snapshots and stall reports",
        "",
        "What the bridge sends on its own, with no event recorded: one node with 8 running "
        "workers and a second one stuck in a join, idle for "
        f"{_f(on['seconds'], 0)} s, with snapshots every second and stall reports after 1 s "
        f"against both off: {w['records']:,} more log records, "
        f"{_f(w['bytes_per_record'], 0)} bytes each (OTLP protobuf; the span as OTLP JSON in "
        f"the body), {_f(w['cpu_us_per_record'])} µs of CPU each on the node. The idle "
        f"bridge without them costs {_f(w['idle_cpu_us_per_s_off'])} µs of CPU per second "
        "(the worker's 50 ms poll). Neither runs on torch's threads.",
        "",
    ]
    rows = [
        ("snapshot records/s into the collector tier (member + 8 workers per node, every 30 s)",
         _f(w["snapshot_records_per_s"], 0)),
        ("CPU per node for them", f"{_f(w['node_cpu_us_per_s'])} µs/s"),
        ("stall reports/s if every node is stalled (one per node per 60 s)",
         _f(w["stall_records_per_s_all_stalled"], 0)),
    ]  # fmt: skip
    lines += _table([f"{w['nodes']:,}-node job, defaults", "value"], rows)
    return lines


if __name__ == "__main__":
    common.child_main(sys.argv[1:], child)
