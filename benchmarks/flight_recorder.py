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
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks import common


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


if __name__ == "__main__":
    common.child_main(sys.argv[1:], child)
