"""Renders section 14 of BENCHMARKS.md, what :mod:`benchmarks.store_load` measures (the store's
load at scale)."""

from __future__ import annotations

from typing import Any

from benchmarks.common import ratio
from benchmarks.format import number as _f
from benchmarks.format import size as _bytes
from benchmarks.format import table as _table
from benchmarks.format import times as _x

TITLE = "## 14. Store load at scale"


def render(sl: dict[str, Any]) -> list[str]:
    """Section 14, from :func:`benchmarks.store_load.run`'s results."""
    runs = sl["runs"]
    p = sl["periods"]
    sizes = " / ".join(f"{r['nodes']:,}" for r in runs)
    big = runs[-1]
    lines = [
        TITLE,
        "",
        "What the bridge's store traffic and torch's own rendezvous traffic cost the store's "
        f"host, at {sizes} nodes, by simulation (`benchmarks/store_load.py`). One real "
        "`TCPStore` server in a process of its own, created as torch's c10d "
        "rendezvous backend creates it on the agent that hosts it (multi-tenant; libuv backend: "
        f"{_f(sl['libuv'])}). Each simulated node is two real clients of it, the agent's "
        "connection and the clone the bridge's exchanges make of `WorkerGroup.store` "
        f"({big['connections']:,} connections at {big['nodes']:,} nodes), driven from "
        f"{sl['client_processes']} client processes: the bridge's polls by a scheduler and "
        f"{sl['worker_threads']} threads each, torch's traffic by a thread per simulated agent. "
        "At its real period each node does what torch's `DynamicRendezvousHandler` does "
        "(read from its source): the monitor loop's `num_nodes_waiting()` syncs the state when "
        f"the last sync is over {_f(p['cache_s'], 2)} s old (one `get` of the whole state), "
        f"the keep-alive timer every {_f(p['keep_alive_s'], 2)} s writes the node's heartbeat "
        "with a `compare_set` of the whole state, again with the value it returned where "
        "another node wrote first; the state is torch's pickled `_RendezvousState`, seeded "
        "through `C10dRendezvousBackend`, and the agent's unpickling and pickling of it "
        "between the operations is spent as a sleep of the time it takes here. And what the "
        "bridge does: the package's "
        "`StallExchange` and `StragglerExchange` over counting connections, called as the "
        f"training watch calls them, every {_f(p['poll_s'], 2)} s "
        f"(`poll_period(ELASTIC_OTEL_STALL_AFTER={_f(p['stall_after_s'], 0)})`) and once per "
        f"{_f(p['window_s'], 1)} s straggler window, the training watch's steps for a stall "
        "replicated over the model's `training_stall` and `startup_stall`. A healthy job's "
        "bridge makes no store operation (only a stall, or a start-up past "
        "`ELASTIC_OTEL_STALL_AFTER`, or a timed window starts an exchange's thread). "
        f"Scenarios, {sl['ranks_per_node']} ranks a node: (1) healthy; (2) every node stalled "
        "in training, one rank late (its node appends its entry), every other node's ranks "
        "waiting in the collective; (3) at start-up, one node's ranks never reached "
        "`init_process_group`, every other node's wait inside it; (3b) every node slow to "
        "start, past `ELASTIC_OTEL_STALL_AFTER`, nobody waiting (one `check` of `waiting/init` "
        "a poll each); (4) the slow-node exchange of a timed NCCL job. Operations are the "
        "clients' API calls (a `get` is two "
        "requests on the wire: torch's client waits for the key first), latencies as the "
        "clients see them, the server's CPU its utime + stime over the window, RSS its VmRSS.",
        "",
    ]
    if sl.get("quick"):
        lines += [f"Quick mode: every period divided by {_f(sl['time_scale'], 0)}.", ""]
    scaled = [r for r in runs if r["torch_share"] < 1]
    if scaled:
        lines += [
            "Where torch's traffic at its real rate would take more than "
            f"{_f(sl['budget_cores'] * 100, 0)} % of a core of the server or of the clients, "
            f"or more than {sl.get('max_torch_nodes', 0):,} agents' threads, only an evenly "
            "spread share of the nodes runs it, each at its real period on the whole state, and "
            "its operations and CPU are scaled by the inverse share (marked †; fewer writers "
            "conflict less: its keep-alives' retries are then a lower bound): "
            + "; ".join(
                f"{r['nodes']:,} nodes: {r['torch_nodes']:,} of them (1 in {r['torch_stride']})"
                for r in scaled
            )
            + ". The bridge's traffic always comes from every node at its real rate.",
            "",
        ]
    lines += ["### What one operation costs the server", ""]
    ops = [c["op"] for c in runs[0]["calibration"]]

    def cal(op: str, key: str, digits: int) -> str:
        cells = []
        for r in runs:
            row = next((c for c in r["calibration"] if c["op"] == op), None)
            cells.append(_f(row[key], digits) if row else "-")
        return " / ".join(cells)

    lines += _table(
        ["operation", f"value, bytes ({sizes} nodes)", "server CPU per operation, µs",
         "latency on an idle store, µs"],
        ((f"`{op}`", cal(op, "bytes", 0), cal(op, "server_us", 1), cal(op, "latency_us", 1))
         for op in ops),
    )  # fmt: skip
    lines += [
        "Each operation alone, from one connection, a few thousand times (tens for the "
        "whole-state ones); the server's CPU from its threads' schedstat. `set` and `append` "
        "return once sent (no reply). The bytes of the `all nodes' keys` rows: the keys, and "
        "the values read.",
        "",
    ]
    first, last = runs[0], runs[-1]
    cs = {r["nodes"]: _cal(r, "compare_set (state)") for r in runs}
    if len(runs) > 1 and cs[first["nodes"]] and cs[last["nodes"]]:
        lines += [
            f"torch's state is {_bytes(first['state_bytes'])} at {first['nodes']:,} nodes and "
            f"{_bytes(last['state_bytes'])} at {last['nodes']:,} "
            f"({_f(last['state_bytes'] / last['nodes'], 0)} bytes a node). Its `compare_set` "
            f"costs the server {_f(cs[first['nodes']], 0)} µs and "
            f"{_f(cs[last['nodes']], 0)} µs: "
            f"{_x(ratio(cs[last['nodes']], cs[first['nodes']]), 0)} for a value "
            f"{_x(ratio(last['state_bytes'], first['state_bytes']), 0)} larger (as we read "
            "torch's libuv server, it parses an incomplete request again from its start each "
            "time more of it arrives, copying the expected value each time), where a `get` of "
            "it costs "
            f"{_f(_cal(last, 'get (state)'), 0)} µs.",
            "",
        ]
    lines += ["### Operations per second and latency", ""]
    rows = []
    for r in runs:
        dagger = " †" if r["torch_share"] < 1 else ""
        for ph in r["phases"]:
            bridge = ph["ops"]["bridge"]
            by_op = ", ".join(
                f"`{op}` {_f(o['per_s'], 1 if o['per_s'] >= 1 else 3)}"
                for op, o in bridge.items()
                if o["per_s"] > 0
            )
            rows.append(
                (
                    _f(r["nodes"]),
                    sl["scenario_labels"].get(ph["scenario"], ph["scenario"]),
                    _f(ph["torch_ops_per_s_real"], 0) + (dagger if ph["torch_ops_per_s"] else ""),
                    _f(ph["bridge_ops_per_s"], 1),
                    by_op or "none",
                    _ms(ph["latency_ms"].get("bridge")),
                    _ms(ph["latency_ms"].get("torch")),
                )
            )
    lines += _table(
        ["nodes", "scenario", "torch ops/s", "bridge ops/s", "bridge ops/s by operation",
         "bridge latency ms, median / p99", "torch latency ms, median / p99"],
        rows,
    )  # fmt: skip
    lines += [
        "Over each scenario's window: the hang scenarios from the bridge's first poll on "
        f"({_f(p['poll_s'], 2)} s, once per hang: its `set` of `waiting/<g>`, left out here, "
        "is one per waiting node), the slow-node exchange over one whole window. torch's "
        "operations: `get` of the state by the monitor loop, `compare_set` by the keep-alives "
        "(and their retries).",
        "",
        "### What it costs the store's host",
        "",
    ]
    costs = []
    for r in runs:
        for ph in r["phases"]:
            vs = ph["vs_healthy"]
            healthy = ph["scenario"] == "healthy"
            mark = " †" if r["torch_share"] < 1 and ph["torch_ops_per_s"] else ""
            own = (
                f"{_f(ph['bridge_server_cores'] * 100, 1)} / "
                f"{_f(ph['bridge_model_cores'] * 100, 2)}"
            )
            lag = " / ".join(
                "-" if not stats else _f(stats["p99"], 1)
                for stats in (ph["lag_ms"], ph.get("torch_lag_ms"))
            ) + ("" if ph.get("kept_up", True) else " ‡")
            costs.append(
                (
                    _f(r["nodes"]),
                    sl["scenario_labels"].get(ph["scenario"], ph["scenario"]),
                    _f(ph["server_cpu_cores"] * 100, 1),
                    _f(ph["server_cores_real"] * 100, 1) + mark,
                    "baseline" if healthy else ("-" if vs is None else _x(vs["server_ratio"])),
                    "-" if healthy else own,
                    f"{_f(ph['server_rss_mib'], 1)}"
                    + ("" if healthy or vs is None else f" ({vs['rss_mib']:+.1f})"),
                    _f(ph["client_cpu_cores"] * 100, 0),
                    lag,
                    _f(ph.get("foreign_cores", 0.0) * 100, 0),
                )
            )
    lines += _table(
        ["nodes", "scenario", "server CPU, % of a core (measured)", "at real rates",
         "vs healthy", "the bridge's, % of a core: measured / by op costs", "server RSS, MiB",
         "clients' CPU, %", "start lag p99, ms: bridge / torch", "other processes' CPU, %"],
        costs,
    )  # fmt: skip
    lines += [
        "*At real rates*: the healthy job's server CPU with torch's traffic scaled to every "
        "node (above the idle server's), plus what the scenario measured above the healthy "
        "job. *The bridge's, measured*: the scenario's server CPU less the healthy job's "
        "(beside torch's traffic, whose own variation can be larger than the bridge's share), "
        "or less the idle server's (2b, the bridge alone); *by op costs*: its counted "
        "operations times the per-operation costs above. *Start lag*: how late the bridge's "
        "polls and torch's syncs and keep-alives started (the clients kept up while the "
        "bridge's stays far under the poll period; ‡: it did not, over a tenth of the period, "
        "and that row's rates are low and its latencies high; a node's keep-alive also delays "
        "its own next sync, as torch's heartbeat lock does). *Other processes*: the "
        "machine's busy CPU meanwhile, less the server's and the clients' (the machine may be "
        "shared: latencies suffer first). RSS: the server process (torch "
        "imported), "
        + "; ".join(
            f"{_f(r['server_rss_start_mib'], 1)} MiB at start, "
            f"{_f(r['server_rss_connected_mib'], 1)} with the {r['connections']:,} "
            "connections"
            for r in runs[-1:]
        )
        + ".",
        "",
    ]
    lines += _store_load_reading(sl)
    return lines


def _cal(run: dict[str, Any], op: str) -> float | None:
    row = next((c for c in run["calibration"] if c["op"] == op), None)
    return None if row is None else float(row["server_us"])


def _ms(stats: dict[str, float] | None) -> str:
    if not stats:
        return "-"
    return f"{_f(stats['median'], 2)} / {_f(stats['p99'], 2)}"


def _store_load_reading(sl: dict[str, Any]) -> list[str]:
    """What the numbers say, per size: the bridge's traffic beside torch's."""
    p = sl["periods"]
    lines = []
    for r in sl["runs"]:
        by = {ph["scenario"]: ph for ph in r["phases"]}
        healthy, hang = by["healthy"], by.get("training")
        alone = by.get("training_alone")
        if hang is None or alone is None:
            continue
        ka = healthy["keep_alive"]
        need = r["torch_need_cores"]["server_us"]
        steady = 2 * (r["nodes"] - 1) / p["poll_s"]
        text = (
            f"- {r['nodes']:,} nodes: torch's rendezvous needs at least "
            f"{_f(need * 100, 0)} % of a core of the store's server (a `get` of the "
            f"{_bytes(r['state_bytes'])} state per node about every "
            f"{_f(p['cache_s'], 2)} s, two `compare_set` of it per keep-alive, at the costs "
            "above); simulated: "
            f"{_f(healthy['torch_ops_per_s_real'], 0)} operations a second, "
            f"{_f(r['torch_server_cores_real'] * 100, 0)} % of a core"
            + (" (scaled)" if r["torch_share"] < 1 else "")
            + f", {_f(ka['attempts'] / max(1, ka['runs']), 2)} `compare_set` per keep-alive"
            + (
                f", {ka['timeouts']:,} of {ka['runs']:,} keep-alives never landed"
                if ka["timeouts"]
                else ""
            )
            + ". A hang in training adds "
            f"{_f(steady, 0)} small operations a second in steady state (a `check` and a "
            f"`get` per waiting node and poll; {_f(alone['bridge_ops_per_s'], 0)} measured, "
            "with the first polls' extra read), which cost the server "
            f"{_f(alone['bridge_server_cores'] * 100, 1)} % of a core alone "
            f"({_f(alone['bridge_model_cores'] * 100, 1)} % by the operations' costs); p99 "
            f"latency {_f((alone['latency_ms'].get('bridge') or {}).get('p99'), 2)} ms alone, "
            f"{_f((hang['latency_ms'].get('bridge') or {}).get('p99'), 2)} ms beside torch's "
            "traffic"
        )
        if need > 1:
            text += (
                ". The store's libuv loop is one thread: at the defaults it cannot serve "
                "torch's own keep-alives, hang or not"
            )
        lines.append(text + ".")
    return [*lines, ""] if lines else []
