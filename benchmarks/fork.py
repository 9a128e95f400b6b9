"""Section 8: the fork guard's cost (:mod:`elastic_otel.bridge.fork_safety`).

A process with the bridge running (torch imported, a few c10d stores open, OTLP/gRPC to an
unreachable collector, so gRPC's threads are up) forks children that exit at once; the parent
times ``os.fork()`` to ``waitpid``: raising the default thread stack size (a memory map read),
the fork, the child's finished threads on the inherited stacks, its exit. The same in
processes with ``ELASTIC_OTEL_FORK_GUARD=false``, interleaved.

Renders section 8 of BENCHMARKS.md (:func:`render`, :func:`targets`).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

from benchmarks import common
from benchmarks.format import Target
from benchmarks.format import number as _f
from benchmarks.format import table as _table
from benchmarks.format import times as _x


def child(config: dict[str, Any]) -> dict[str, Any]:
    import socket

    from torch.distributed import TCPStore
    from torch.distributed.elastic import events

    import elastic_otel

    common.pin(common.measured_cpu())
    elastic_otel.register()
    for i in range(20):
        events.record(events.Event(f"bench.fork.{i}", events.EventSource.AGENT), "otel")
    stores = []
    for _ in range(config["stores"]):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        stores.append(TCPStore("127.0.0.1", port, 1, True, use_libuv=True))
    time.sleep(0.5)  # the exporters have tried the collector: gRPC's threads exist
    from elastic_otel.bridge.process import bridge_process

    threads = len(os.listdir("/proc/self/task"))
    times = []
    for _ in range(config["forks"]):
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - t0)
    return {
        "threads_in_parent": threads,
        "fork_s": times,
        "guard_on": bridge_process().fork_guard.bridge_running,
    }


def run(quick: bool) -> dict[str, Any]:
    reps, forks = (1, 10) if quick else (4, 60)
    variants: dict[str, list[float]] = {"guard off": [], "guard on": []}
    threads: dict[str, int] = {}
    for _ in range(reps):
        for name, flag in (("guard off", "false"), ("guard on", "true")):
            env = common.clean_env(
                {
                    "ELASTIC_OTEL_FORK_GUARD": flag,
                    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                    "OTEL_BLRP_SCHEDULE_DELAY": "100",
                }
            )
            result = common.run_child("benchmarks.fork", {"forks": forks, "stores": 3}, env)
            assert result["guard_on"] == (flag == "true") or flag == "false"
            variants[name] += result["fork_s"]
            threads[name] = result["threads_in_parent"]
    off = statistics.median(variants["guard off"])
    on = statistics.median(variants["guard on"])
    return {
        "forks": forks * reps,
        "threads_in_parent": threads,
        "variants": {k: common.summarize([t * 1e3 for t in v]) for k, v in variants.items()},
        "ratio_median": common.ratio(on, off),
        "added_ms_median": (on - off) * 1e3,
    }


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


TITLE = "## 8. Fork guard"


def render(fk: dict[str, Any]) -> list[str]:
    """Section 8, from :func:`run`'s results."""
    lines = [
        TITLE,
        "",
        "A process with the bridge running (torch, three c10d stores, OTLP/gRPC to an "
        f"unreachable collector: {fk['threads_in_parent']['guard on']} threads) forks "
        f"{fk['forks']} children that exit at once, timed from `os.fork()` to `waitpid`, with "
        "`ELASTIC_OTEL_FORK_GUARD` on and off, interleaved (`benchmarks/fork.py`). On: before "
        "each fork the parent reads its memory map and raises the default thread stack size "
        "above every stack in it, and restores it after; the child starts a finished thread "
        "on each of those stacks (`elastic_otel/bridge/fork_safety.py`).",
        "",
    ]
    lines += _table(
        ["variant", "median ms", "mean", "p90", "max"],
        (
            (name, _f(v["median"], 2), _f(v["mean"], 2), _f(v["p90"], 2), _f(v["max"], 2))
            for name, v in fk["variants"].items()
        ),
    )
    lines += [
        f"Fork round trip, on ÷ off: median {_x(fk['ratio_median'], 3)} "
        f"({fk['added_ms_median']:+.2f} ms).",
        "",
    ]
    return lines


def targets(fk: dict[str, Any]) -> list[Target]:
    """Section 8's row of the results table: a fork with the guard ÷ without."""
    rows: list[Target] = []
    if fk.get("ratio_median") is not None:
        rows.append(
            (
                "8. fork of a bridged process, guard on ÷ off",
                f"{_x(fk['ratio_median'], 3)} median ({fk['added_ms_median']:+.2f} ms)",
                "≤ 1.10x",
                fk["ratio_median"] <= 1.10,
            )
        )
    return rows


if __name__ == "__main__":
    common.child_main(sys.argv[1:], child)
