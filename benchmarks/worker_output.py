"""Section 12: what capturing the workers' output costs (issue 29).

A child process plays the agent: a real bridge handler exporting OTLP/gRPC to the counting
receiver (:mod:`benchmarks.receiver`, started by the child) and a fresh
:class:`elastic_otel.integration.worker_output.WorkerOutput`, the agent's reading thread.

* **The worker.** A fresh Python process pinned to the measured CPU prints lines on stderr as
  fast as it can (``print``; stderr is line-buffered: one ``write`` per line) and times its
  loop. Without the bridge its stderr is ``/dev/null`` (torch's console at its cheapest) or a
  drained pipe (a console piped to a scheduler); with it, the regular file the bridge's
  capture gives it, read meanwhile by the agent's thread (package defaults: rate limit, line
  cap) on the other CPUs. Interleaved blocks; the ratio of
  the medians is what the bridge costs a worker.
* **The reader.** A file of lines (plain, Python-logging, a traceback every 1,000 lines) is
  read to its end by the real ``WorkerOutput._pump`` on the measuring thread, without a rate
  limit: the thread's CPU (reading, cutting, parsing) per 10,000 lines, without a handler and
  with records emitted on the bridge's SDK logger; the process's CPU then (the SDK's export
  thread included, until flushed); and records per second into the receiver.

Renders section 12 of BENCHMARKS.md (:func:`render`, :func:`targets`).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import common
from benchmarks.format import Target
from benchmarks.format import number as _f
from benchmarks.format import table as _table
from benchmarks.format import times as _x

_WORKER = """
import os, sys, time
cpu = int(sys.argv[2])
if cpu >= 0:
    os.sched_setaffinity(0, {cpu})
n = int(sys.argv[1])
t0 = time.perf_counter()
for i in range(n):
    print(f"step {i} loss 0.{i % 9973:04d} lr 3e-4 tokens/s 81234.5", file=sys.stderr)
print(time.perf_counter() - t0)
"""


def _worker(lines: int, stderr: Any) -> float:
    """Seconds a fresh worker took to print ``lines`` lines on ``stderr``."""
    cpu = common.measured_cpu()
    out = subprocess.run(
        [sys.executable, "-c", _WORKER, str(lines), str(-1 if cpu is None else cpu)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        check=True,
    ).stdout
    return float(out.strip())


def _write_lines(path: str, lines: int) -> None:
    """A worker's stderr: plain lines, Python-logging lines, a traceback every 1,000 lines."""
    with open(path, "w") as f:
        i = 0
        while i < lines:
            if i % 1000 == 999:
                f.write(
                    "Traceback (most recent call last):\n"
                    '  File "train.py", line 42, in step\n'
                    "    loss = model(batch)\n"
                    '  File "model.py", line 7, in forward\n'
                    "    raise ValueError(x)\n"
                    f"ValueError: batch {i}\n"
                )
                i += 6
            elif i % 50 == 0:
                f.write(f"WARNING:train:step {i} grad norm 1.0e+03 clipped\n")
                i += 1
            else:
                f.write(f"step {i} loss 0.{i % 9973:04d} lr 3e-4 tokens/s 81234.5\n")
                i += 1


def _read_file(path: str, handler: Any) -> tuple[float, float, int]:
    """Thread and process CPU seconds of reading ``path`` to its end (records emitted on
    ``handler``'s logger unless ``None``), and the records it made."""
    from elastic_otel.integration.worker_output import WorkerOutput, _Stream
    from elastic_otel.parsing.worker_output import STDERR, OutputReader, RateLimit

    output = WorkerOutput()
    output.handler = handler
    reader = OutputReader(STDERR, 16384, RateLimit(0), keep_last=True)
    stream = _Stream(path, False, reader, {"torchelastic.local_rank": 0}, None)
    stream.finishing = True
    counters = handler.counters if handler is not None else None
    before = counters.worker_output_records if counters is not None else 0
    made = 0
    common.settle()
    thread0, process0 = time.thread_time(), time.process_time()
    while not stream.done:
        output._pump(stream)
    thread = time.thread_time() - thread0
    if handler is not None:
        handler.flush(60.0)
        made = counters.worker_output_records - before
    return thread, time.process_time() - process0, made


def child(config: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.receiver import ReceiverProcess

    with ReceiverProcess("grpc") as rx:
        os.environ.update(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "ELASTIC_OTEL_JOB_ID": "benchmark",
            }
        )
        from elastic_otel.bridge.handler import OtelHandler
        from elastic_otel.integration.worker_output import WorkerOutput, _Stream
        from elastic_otel.parsing.worker_output import STDERR, OutputReader, RateLimit

        common.pin(common.helper_cpus())  # the agent; its workers get the measured CPU
        handler = OtelHandler()
        handler.start()
        settings = handler.settings
        directory = tempfile.mkdtemp(prefix="bench_output_")
        output = WorkerOutput()
        lines = config["lines"]
        off: list[float] = []
        pipe: list[float] = []
        on: list[float] = []
        for block in range(config["blocks"]):
            with open(os.devnull, "wb") as null:
                off.append(_worker(lines, null))
            pipe.append(_worker(lines, subprocess.PIPE))
            path = os.path.join(directory, f"{block}", "stderr.log")
            os.makedirs(os.path.dirname(path))
            reader = OutputReader(
                STDERR,
                settings.worker_output_line_max,
                RateLimit(settings.worker_output_rate),
                keep_last=True,
            )
            output.add(
                [_Stream(path, False, reader, {"torchelastic.local_rank": 0}, None)], handler
            )
            with open(path, "wb") as file:
                on.append(_worker(lines, file))
            if not output.finish({path}, 60.0):
                raise RuntimeError("the worker's file was not read to its end")

        path = os.path.join(directory, "reader.log")
        _write_lines(path, config["read_lines"])
        size = os.path.getsize(path)
        parse = [_read_file(path, None) for _ in range(config["reads"])]
        handler.flush(60.0)
        emit = []
        rates = []
        for _ in range(config["reads"]):
            received0 = rx.stats()["records"]["logs"]
            t0 = time.monotonic()
            thread, process, made = _read_file(path, handler)
            common.wait_until(
                lambda r0=received0, m=made: rx.stats()["records"]["logs"] >= r0 + m, 60.0
            )
            got = rx.stats()
            received = got["records"]["logs"] - received0
            rates.append(received / (got["last_monotonic"] - t0))
            emit.append((thread, process, made, received))
        handler.shutdown()
    per = 10_000 / config["read_lines"]
    return {
        "worker_s": {"off": off, "pipe": pipe, "on": on},
        "file_bytes": size,
        "parse_thread_ms": [t * per * 1e3 for t, _, _ in parse],
        "emit_thread_ms": [t * per * 1e3 for t, _, _, _ in emit],
        "emit_process_ms": [p * per * 1e3 for _, p, _, _ in emit],
        "records": [m for _, _, m, _ in emit],
        "received": [r for _, _, _, r in emit],
        "records_per_s": rates,
        "rate_limit": settings.worker_output_rate,
    }


def run(quick: bool) -> dict[str, Any]:
    config = (
        {"lines": 20_000, "blocks": 2, "read_lines": 20_000, "reads": 2}
        if quick
        else {"lines": 100_000, "blocks": 7, "read_lines": 100_000, "reads": 5}
    )
    raw = common.run_child("benchmarks.worker_output", config, common.clean_env())
    off = statistics.median(raw["worker_s"]["off"])
    on = statistics.median(raw["worker_s"]["on"])
    return {
        "config": config,
        "worker_s": {k: common.summarize(v) for k, v in raw["worker_s"].items()},
        "ratio_median": common.ratio(on, off),
        "ratio_pipe_median": common.ratio(on, statistics.median(raw["worker_s"]["pipe"])),
        "file_bytes": raw["file_bytes"],
        "parse_thread_ms": common.summarize(raw["parse_thread_ms"]),
        "emit_thread_ms": common.summarize(raw["emit_thread_ms"]),
        "emit_process_ms": common.summarize(raw["emit_process_ms"]),
        "records": raw["records"][-1],
        "received": min(raw["received"]),
        "records_per_s": common.summarize(raw["records_per_s"]),
        "rate_limit": raw["rate_limit"],
    }


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


TITLE = "## 12. Worker output"


def render(wo: dict[str, Any]) -> list[str]:
    """Section 12, from :func:`run`'s results."""
    c = wo["config"]
    lines = [
        TITLE,
        "",
        f"A fresh worker process pinned to one CPU prints {c['lines']:,} lines on stderr as "
        "fast as it can (`print`, one `write` a line) and times its loop; its stderr is "
        "`/dev/null` (torch's console at its cheapest), a pipe drained by the agent, or the "
        "file the bridge's capture gives it, read meanwhile by the agent's real reading "
        "thread with the package's defaults (rate limit "
        f"{_f(wo['rate_limit'], 0)} lines/s, counted drops) on the other CPUs; "
        f"{c['blocks']} interleaved blocks (`benchmarks/worker_output.py`). Then the agent "
        f"reads a file of {c['read_lines']:,} lines (plain, Python-logging, a six-line "
        "traceback every 1,000 lines) to its end without a rate limit, on one thread: its "
        "CPU without a handler (read, cut, parse) and with every record emitted on the "
        "bridge's SDK logger, the process's CPU then (the SDK's export thread included, until "
        "flushed), and the records per second into a counting OTLP/gRPC receiver.",
        "",
    ]
    worker = wo["worker_s"]
    lines += _table(
        ["measure", "median", "p90", "max"],
        [
            *(
                (
                    f"worker's loop, stderr to {label}, ms",
                    _f(worker[key]["median"] * 1e3),
                    _f(worker[key]["p90"] * 1e3),
                    _f(worker[key]["max"] * 1e3),
                )
                for key, label in (
                    ("off", "/dev/null"),
                    ("pipe", "a drained pipe"),
                    ("on", "the captured file, read"),
                )
                if key in worker
            ),
            *(
                (
                    label,
                    _f(wo[key]["median"]),
                    _f(wo[key]["p90"]),
                    _f(wo[key]["max"]),
                )
                for key, label in (
                    ("parse_thread_ms", "reader's CPU per 10,000 lines, no handler, ms"),
                    ("emit_thread_ms", "reader's CPU per 10,000 lines, records emitted, ms"),
                    ("emit_process_ms", "agent's CPU per 10,000 lines, exported, ms"),
                )
            ),
            (
                "records per second into the receiver",
                _f(wo["records_per_s"]["median"], 0),
                _f(wo["records_per_s"]["p90"], 0),
                _f(wo["records_per_s"]["max"], 0),
            ),
        ],
    )
    lines += [
        "",
        f"With ÷ without the bridge: median {_x(wo['ratio_median'], 3)} against `/dev/null`, "
        f"{_x(wo.get('ratio_pipe_median'), 3)} against a drained pipe. The reader's file of "
        f"{c['read_lines']:,} lines is {wo['file_bytes'] / 1e3:,.0f} kB and made "
        f"{wo['records']:,} records; the receiver counted {wo['received']:,} of them (the "
        "fewest of a run).",
        "",
    ]
    return lines


def targets(wo: dict[str, Any]) -> list[Target]:
    """Section 12's row of the results table: the worker's loop with ÷ without the bridge."""
    rows: list[Target] = []
    if wo.get("ratio_pipe_median") is not None:
        # Without the bridge the worker writes to the agent's stderr, the job's console: a pipe
        # under a scheduler, a log shipper or `| tee`. /dev/null is in the section, not a target.
        rows.append(
            (
                f"12. a worker printing {wo['config']['lines']:,} lines on stderr as fast as "
                "it can, with the bridge (a captured file, read) ÷ without (the console: a "
                "drained pipe)",
                f"{_x(wo['ratio_pipe_median'], 3)} median (÷ /dev/null: "
                f"{_x(wo['ratio_median'], 3)})",
                "≤ 1.05x",
                wo["ratio_pipe_median"] <= 1.05,
            )
        )
    return rows


if __name__ == "__main__":
    common.child_main(sys.argv[1:], child)
