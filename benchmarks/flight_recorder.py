"""Section 11: what reading torch's Flight Recorder costs (issue 28).

A child process runs a real one-rank gloo process group and fills the Flight Recorder's ring
buffer (2,000 entries by default) with all-reduces. It times, on its training thread, blocks of
real ``all_reduce`` calls with the worker's collectives thread
(:class:`elastic_otel.worker.collectives.CollectivesWatch`, its own loop) polling every 0.5 s
(its shortest period) and sampling the status every 0.1 s between polls, and without it,
interleaved: the ratio is what the thread costs the training thread. It also times the thread's
poll (the status read, tens of µs), the agent's read of the file
(:func:`elastic_otel.parsing.collectives.read_collectives`), and a whole-record dump of the
full buffer (what a stall, or an open collective's identification, costs): its time, the GIL it
holds and its size; and a straggler window's poll, which reads the whole record and keeps the
arrivals of the collectives issued since the last window (here every entry: the most a window
costs). And what a NCCL job's poll adds: the thread then reads two records, NCCL's (every
collective) and gloo's (empty); here the real record is moved behind NCCL's functions as the
tests' stand-in does, so the difference is the second record's read, measured interleaved with
one; the C++ side of NCCL's own status read on a GPU is the H100's recorded figure
(``tests/data/nccl-flight-recorder/costs.txt``), which the report quotes.

Renders section 11 of BENCHMARKS.md (:func:`render`, :func:`targets`).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks import common, nccl_timing
from benchmarks.format import Target
from benchmarks.format import number as _f
from benchmarks.format import table as _table
from benchmarks.format import times as _x
from benchmarks.gpu_step import recorded_gpu_step


def child(config: dict[str, Any]) -> dict[str, Any]:
    import os

    import torch
    import torch.distributed as dist

    from elastic_otel.parsing.collectives import read_collectives
    from elastic_otel.worker.collectives import CollectivesWatch

    common.pin(common.measured_cpu())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tensor = torch.ones(256)
    for _ in range(2_100):  # a full ring buffer
        dist.all_reduce(tensor)
    directory = tempfile.mkdtemp(prefix="bench_fr_")

    def block() -> float:
        t0 = time.perf_counter()
        for _ in range(config["calls"]):
            dist.all_reduce(tensor)
        return (time.perf_counter() - t0) / config["calls"]

    on: list[float] = []
    off: list[float] = []
    for _ in range(config["blocks"]):
        off.append(block())
        # The worker's own loop: a poll every 0.5 s and, straggler windows on, a status sample
        # every 0.1 s between them. The window's whole-record read is taken first (once a
        # window in a worker: its cost is the window poll's row, not every block's).
        watch = CollectivesWatch(directory, 0.5, 3600.0, window_s=30.0)
        watch.poll(time.time_ns())
        watch._last_poll_ns = time.time_ns()
        wake, wakes = os.pipe()
        thread = threading.Thread(target=watch.run, args=(wake,), daemon=True)
        thread.start()
        on.append(block())
        watch.stopped = True
        os.close(wakes)  # end of file: the loop wakes and sees it is stopped
        thread.join()
        os.close(wake)

    watch = CollectivesWatch(directory, 0.5, 3600.0)
    polls = []
    for _ in range(config["polls"]):
        dist.all_reduce(tensor)  # something changed: the file is rewritten each time
        t0 = time.perf_counter()
        watch.poll(time.time_ns())
        polls.append(time.perf_counter() - t0)
    reads = []
    for _ in range(config["polls"]):
        t0 = time.perf_counter()
        read_collectives(directory)
        reads.append(time.perf_counter() - t0)
    extension = torch._C._distributed_c10d
    dumps, sizes = [], []
    for _ in range(config["dumps"]):
        t0 = time.perf_counter()
        raw = extension._dump_fr_trace(includeStackTraces=False)
        dumps.append(time.perf_counter() - t0)
        sizes.append(len(raw))
    windows = []
    for _ in range(config["dumps"]):
        windowed = CollectivesWatch(directory, 0.5, 3600.0, window_s=1e-9)
        windowed.poll(time.time_ns())  # the groups' status first: the window read needs one
        windowed.window_read_ns = 0  # and every entry new
        t0 = time.perf_counter()
        windowed.poll(time.time_ns())
        windows.append(time.perf_counter() - t0)
    one_record, two_records = _poll_one_and_two_records(directory, extension, config, tensor)
    t0 = time.perf_counter()
    watch.poll(time.time_ns(), dump=True)
    requested = time.perf_counter() - t0
    file_bytes = os.path.getsize(os.path.join(directory, "elastic_otel_flight_recorder.pkl"))
    return {
        "collective_us": {"off": [t * 1e6 for t in off], "on": [t * 1e6 for t in on]},
        "poll_us": [t * 1e6 for t in polls],
        "agent_read_us": [t * 1e6 for t in reads],
        "dump_ms": [t * 1e3 for t in dumps],
        "dump_bytes": statistics.median(sizes),
        "window_ms": [t * 1e3 for t in windows],
        "requested_dump_ms": requested * 1e3,
        "file_bytes": file_bytes,
        "poll_one_record_us": one_record,
        "poll_two_records_us": two_records,
    }


def _poll_one_and_two_records(
    directory: str, extension: Any, config: dict[str, Any], tensor: Any
) -> tuple[list[float], list[float]]:
    """Polls of a watch reading gloo's record alone and of one reading the same record behind
    NCCL's functions plus an empty gloo record (a NCCL job's two reads), interleaved."""
    import json
    import pickle

    import torch.distributed as dist

    from elastic_otel.worker.collectives import CollectivesWatch
    from elastic_otel.worker.records.gloo import GlooRecord
    from elastic_otel.worker.records.nccl import NcclRecord

    empty = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}
    empty_json, empty_pickle = json.dumps(empty).encode(), pickle.dumps(empty)

    class Moved:  # the stand-in's arrangement, in this process
        _dump_nccl_trace_json = staticmethod(extension._dump_fr_trace_json)
        _dump_nccl_trace = staticmethod(extension._dump_fr_trace)
        _dump_fr_trace_json = staticmethod(lambda *args: empty_json)
        _dump_fr_trace = staticmethod(lambda *args: empty_pickle)

    one = CollectivesWatch(directory, 0.5, 3600.0, records=[GlooRecord(extension)])
    two = CollectivesWatch(
        directory, 0.5, 3600.0, records=[NcclRecord(Moved()), GlooRecord(Moved())]
    )
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(config["polls"]):
        for watch, out in ((one, times[0]), (two, times[1])):
            dist.all_reduce(tensor)
            t0 = time.perf_counter()
            watch.poll(time.time_ns())
            out.append((time.perf_counter() - t0) * 1e6)
    return times


def run(quick: bool) -> dict[str, Any]:
    config = (
        {"calls": 2_000, "blocks": 3, "polls": 50, "dumps": 3}
        if quick
        else {"calls": 20_000, "blocks": 8, "polls": 500, "dumps": 10}
    )
    raw = common.run_child("benchmarks.flight_recorder", config, common.clean_env())
    off = statistics.median(raw["collective_us"]["off"])
    on = statistics.median(raw["collective_us"]["on"])
    return {
        "config": config,
        "collective_us": {k: common.summarize(v) for k, v in raw["collective_us"].items()},
        "ratio_median": common.ratio(on, off),
        "poll_us": common.summarize(raw["poll_us"]),
        "agent_read_us": common.summarize(raw["agent_read_us"]),
        "dump_ms": common.summarize(raw["dump_ms"]),
        "dump_bytes": raw["dump_bytes"],
        "window_ms": common.summarize(raw["window_ms"]),
        "requested_dump_ms": raw["requested_dump_ms"],
        "file_bytes": raw["file_bytes"],
        "poll_one_record_us": common.summarize(raw["poll_one_record_us"]),
        "poll_two_records_us": common.summarize(raw["poll_two_records_us"]),
        "nccl_added_us_median": statistics.median(raw["poll_two_records_us"])
        - statistics.median(raw["poll_one_record_us"]),
    }


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


TITLE = "## 11. Flight Recorder"


def render(fr: dict[str, Any]) -> list[str]:
    """Section 11, from :func:`run`'s results, and the figures recorded on lent GPUs (by
    :mod:`benchmarks.gpu_step` and :mod:`benchmarks.nccl_timing`)."""
    c = fr["config"]
    lines = [
        TITLE,
        "",
        "A real one-rank gloo process group whose Flight Recorder buffer is full (2,000 "
        "entries), in a child pinned to one CPU (`benchmarks/flight_recorder.py`). Its training "
        f"thread times blocks of {c['calls']:,} real `all_reduce` calls (256 floats) with the "
        "worker's collectives thread running its own loop (a poll every 0.5 s, its shortest "
        "period, and a status sample every 0.1 s between polls) and without it, "
        f"interleaved ({c['blocks']} blocks each). Then: one poll of the thread (the status "
        "read, and the file rewritten since a collective ran meanwhile), the agent's read of "
        "that file per worker and check, and a whole-record dump, without stack traces, as a "
        "stall or an open collective's identification takes it (it holds the GIL), and a "
        "straggler window's poll (that read, and the arrivals of every entry kept).",
        "",
    ]
    lines += _table(
        ["measure", "median", "p90", "max"],
        [
            (
                "`all_reduce` without the thread, µs",
                _f(fr["collective_us"]["off"]["median"], 2),
                _f(fr["collective_us"]["off"]["p90"], 2),
                _f(fr["collective_us"]["off"]["max"], 2),
            ),
            (
                "`all_reduce` with the thread, µs",
                _f(fr["collective_us"]["on"]["median"], 2),
                _f(fr["collective_us"]["on"]["p90"], 2),
                _f(fr["collective_us"]["on"]["max"], 2),
            ),
            (
                "the thread's poll, µs",
                _f(fr["poll_us"]["median"]),
                _f(fr["poll_us"]["p90"]),
                _f(fr["poll_us"]["max"]),
            ),
            (
                "the agent's read of a worker's file, µs",
                _f(fr["agent_read_us"]["median"]),
                _f(fr["agent_read_us"]["p90"]),
                _f(fr["agent_read_us"]["max"]),
            ),
            (
                "whole-record dump of 2,000 entries, ms",
                _f(fr["dump_ms"]["median"], 2),
                _f(fr["dump_ms"]["p90"], 2),
                _f(fr["dump_ms"]["max"], 2),
            ),
            *(
                [
                    (
                        "a straggler window's poll (2,000 new entries), ms",
                        _f(fr["window_ms"]["median"], 2),
                        _f(fr["window_ms"]["p90"], 2),
                        _f(fr["window_ms"]["max"], 2),
                    )
                ]
                if "window_ms" in fr
                else []
            ),
            *(
                [
                    (
                        "the thread's poll, gloo's record alone, µs",
                        _f(fr["poll_one_record_us"]["median"]),
                        _f(fr["poll_one_record_us"]["p90"]),
                        _f(fr["poll_one_record_us"]["max"]),
                    ),
                    (
                        "the thread's poll, NCCL's record and gloo's (empty), µs",
                        _f(fr["poll_two_records_us"]["median"]),
                        _f(fr["poll_two_records_us"]["p90"]),
                        _f(fr["poll_two_records_us"]["max"]),
                    ),
                ]
                if "poll_two_records_us" in fr
                else []
            ),
        ],
    )
    lines += [
        "",
        f"With ÷ without the thread: median {_x(fr['ratio_median'], 3)}. A dump of 2,000 "
        f"entries is {fr['dump_bytes'] / 1e3:,.0f} kB; the requested dump (read, completed "
        f"and written by the thread) took {_f(fr['requested_dump_ms'], 1)} ms and wrote "
        f"{fr['file_bytes'] / 1e3:,.0f} kB.",
        "",
    ]
    if "nccl_added_us_median" in fr:
        lines += [
            "**NCCL's record.** In a NCCL job the thread reads two records each poll: NCCL's, "
            "which holds the collectives, and gloo's, empty. The rows above measure that here "
            "with the job's real record moved behind NCCL's functions (as the tests' stand-in "
            "does): the second record adds "
            f"{fr['nccl_added_us_median']:.1f} µs to the median poll on this machine. What "
            "torch's own calls cost on a GPU was recorded on an H100 (torch 2.11.0+cu130, NCCL "
            "2.28.9, the record full: `tests/data/nccl-flight-recorder/costs.txt`):",
            "",
            *_nccl_costs(),
            "",
        ]
    gpu = recorded_gpu_step()
    if gpu is not None:
        lines += [
            "**On a GPU.** What the bridge costs a real step cannot be measured on this machine. "
            "`python -m benchmarks.gpu_step` runs a NCCL DDP job (one rank, 8 x Linear(4096), "
            "batch 512, 300 steps) under torchrun with the bridge and without it, alternating; "
            f"its last run on a lent machine ({gpu.device}, `{gpu.path}`, as printed):",
            "",
            *(f"- {line}" for line in gpu.lines),
            "",
        ]
    return lines + nccl_timing.render()


def targets(fr: dict[str, Any]) -> list[Target]:
    """Section 11's rows of the results table: the thread's cost, NCCL's record, a GPU step."""
    rows: list[Target] = []
    if fr.get("ratio_median") is not None:
        rows.append(
            (
                "11. training thread's real all_reduce with the collectives thread polling "
                "(0.5 s) ÷ without",
                f"{_x(fr['ratio_median'], 3)} median",
                "≤ 1.01x",
                fr["ratio_median"] <= 1.01,
            )
        )
    if fr.get("nccl_added_us_median") is not None:
        rows.append(
            (
                "11. what reading NCCL's record as well adds to the collectives thread's poll "
                "(median; torch's own NCCL status call on an H100: section 11)",
                f"{fr['nccl_added_us_median']:.1f} µs",
                "≤ 20 µs",
                fr["nccl_added_us_median"] <= 20,
            )
        )
    gpu = recorded_gpu_step()
    if gpu is not None:
        rows.append(
            (
                f"11. a DDP step on a GPU with the bridge ÷ without (recorded: {gpu.device}, "
                f"`{gpu.path}`)",
                f"{_x(gpu.ratio, 4)} median",
                "≤ 1.01x",
                gpu.ratio <= 1.01,
            )
        )
    return rows


NCCL_COSTS = common.ROOT / "tests/data/nccl-flight-recorder/costs.txt"


def _nccl_costs() -> list[str]:
    """The H100's recorded costs of NCCL's dump functions, as recorded."""
    try:
        lines = NCCL_COSTS.read_text().splitlines()
    except OSError:
        return ["(the recorded costs are missing)"]
    return [f"- {line.strip()}" for line in lines if ": median" in line]


if __name__ == "__main__":
    common.child_main(sys.argv[1:], child)
