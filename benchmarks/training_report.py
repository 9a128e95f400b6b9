"""Renders section 9 of BENCHMARKS.md, what :mod:`benchmarks.training` measures (hang
diagnosis), and its rows of the results table."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks import link_reads
from benchmarks.format import RECORDED, Target
from benchmarks.format import number as _f
from benchmarks.format import table as _table

TITLE = "## 9. Hang diagnosis"


def render(tr: dict[str, Any]) -> list[str]:
    """Section 9, from :func:`benchmarks.training.run`'s results, and the figures recorded
    elsewhere (the scale suite, the quiet-node soak, the link reads)."""
    hot, idle, cl = tr["hot"], tr["idle"], tr["cluster"]
    ns, added = hot["ns"], hot["added_ns"]
    lines = [
        TITLE,
        "",
        "What issue 20's hang diagnosis costs (`benchmarks/training.py`): the progress record "
        "the training thread writes (`elastic_otel/worker/progress.py`), the agent's training "
        "watch reading it (`elastic_otel/integration/training_watch.py`), and the stack dumps "
        "and records of a stall. Workers are real processes started with the environment the "
        "instrumented agent gives them (the worker start-up first on `PYTHONPATH`, "
        "`ELASTIC_OTEL_WORKER_REPORTS=1`, an error file in a private directory).",
        "",
        "### Training thread: ns per call",
        "",
        f"`timeit` in a fresh process pinned to one CPU, {hot['number']:,} calls per sample, "
        f"{hot['repeat']} samples per case with the cases interleaved; the fastest sample "
        "(median in parentheses). The collective is a no-op with `all_reduce`'s parameters, "
        "wrapped by `progress.wrap` as the start-up wraps torch's; *unarmed* = before "
        "`progress.arm()` (a process the start-up did not arm: nothing is wrapped there, "
        "shown for the wrapper's own cost), *armed* = after it, on the writer thread.",
        "",
    ]

    def cell(name: str) -> str:
        v = ns.get(name)
        return f"{_f(v['min'])} ({_f(v['median'])})" if v else "-"

    cases = [
        ("empty statement", "empty statement"),
        ("no-op collective, bare, `f(x)`", "bare collective"),
        ("no-op collective, bare, `f(x, group=None, async_op=False)`",
         "bare collective, keywords"),
        ("wrapped, `f(x)`", "wrapped"),
        ("wrapped, `f(x, group=None, async_op=False)`", "wrapped, keywords"),
        ("`mark_step(3)`", "mark_step"),
        ("`mark_checkpoint(3)`", "mark_checkpoint"),
        ("`with saving_checkpoint(3): pass`", "saving_checkpoint"),
    ]  # fmt: skip
    lines += _table(
        ["call", "unarmed ns", "armed ns"],
        ((label, cell(f"{key}, unarmed"), cell(f"{key}, armed")) for label, key in cases),
    )
    lines += [
        f"Added per collective call, armed: {_f(added['collective, armed'], 0)} ns positional, "
        f"{_f(added['collective, armed, keywords'], 0)} ns with keywords (unarmed wrapper: "
        f"{_f(added['collective, unarmed'], 0)} / {_f(added['collective, unarmed, keywords'], 0)}"
        f" ns). `mark_step`, less the empty statement: {_f(added['mark_step, armed'], 0)} ns "
        f"armed, {_f(added['mark_step, unarmed'], 0)} ns unarmed."
        + (
            " The goodput calls (issue 22), less the empty statement: `mark_checkpoint` "
            f"{_f(added['mark_checkpoint, armed'], 0)} ns armed, "
            f"{_f(added['mark_checkpoint, unarmed'], 0)} ns unarmed; `with "
            f"saving_checkpoint(3): pass` (the call, the context's enter and exit, and armed "
            "the `mark_checkpoint` with the save's blocking time it makes on exit) "
            f"{_f(added['saving_checkpoint, armed'], 0)} ns armed, "
            f"{_f(added['saving_checkpoint, unarmed'], 0)} ns unarmed."
            if "mark_checkpoint, armed" in added
            else ""
        ),
        "",
        "Where the armed wrapper's time goes: per call it does 10 stores into the mapping "
        "(5 entering: seq odd, collective, since, entered, seq even; 5 leaving), 2 "
        "`time_ns()`, 1 `get_ident()`, about 8 reads and writes of `_state` (a list), two "
        "global stores of `_writer`, two `try` blocks and the forwarding call. Each part "
        "alone, less the empty statement, in the same process: "
        + ", ".join(f"{k} {_f(v, 0)} ns" for k, v in hot["parts_ns"].items())
        + ".",
        "",
    ]
    gloo = hot["gloo"]
    lines += [
        f"Real one-process gloo `all_reduce` of a 1-element tensor in a worker armed by the "
        f"start-up, bare (`dist.all_reduce.__wrapped__`) and wrapped (`dist.all_reduce`), "
        f"{gloo['number']:,} calls per sample, {gloo['repeat']} samples each, interleaved: "
        f"bare {_f(gloo['ns']['bare']['min'] / 1e3, 2)} µs "
        f"({_f(gloo['ns']['bare']['median'] / 1e3, 2)}), wrapped "
        f"{_f(gloo['ns']['wrapped']['min'] / 1e3, 2)} µs "
        f"({_f(gloo['ns']['wrapped']['median'] / 1e3, 2)}): "
        f"{_f(gloo['added_ns'] / 1e3, 2)} µs added (fastest samples); the record "
        f"counted {gloo['recorded_calls']:,} of the {gloo['expected_calls']:,} wrapped calls."
        if gloo
        else "Real gloo `all_reduce`: not measured in quick mode.",
        "",
        "### Idle node: the watch over 8 workers that progress",
        "",
        f"One agent process (its main thread sleeps) over {idle['workers']} armed worker "
        "processes that call `mark_step` every 50 ms. Its CPU (all threads, "
        "`time.process_time`) per second of wall time with no watch "
        f"({_f(idle['off_cpu_us_per_s'])} µs/s: the baseline, measured first in the same "
        "process), then with a `TrainingWatch` over the 8 workers for each threshold in turn "
        "(the watch's period is `min(max(STALL_AFTER / 4, 0.5), 5)` s). *Per check*: the "
        "watch thread's own CPU (`time.thread_time`) for one pass over the 8 records. "
        f"Workers alive at the end: {idle['alive_at_end']} of {idle['workers']}; no report "
        "was made while they progressed"
        + (
            "."
            if not any(p["reports"] for p in idle["phases"])
            else f" - except: {[p['reports'] for p in idle['phases']]}."
        ),
        "",
    ]
    lines += _table(
        ["ELASTIC_OTEL_STALL_AFTER", "period", "measured for", "checks", "agent CPU µs/s",
         "minus no watch", "CPU per check µs (median)", "per check ÷ period µs/s"],
        (
            (
                f"{p['after_s']:g} s",
                f"{p['period_s']:g} s",
                f"{_f(p['on']['seconds'], 1)} s",
                _f(p["checks"]),
                _f(p["on_cpu_us_per_s"]),
                _f(p["added_cpu_us_per_s"]),
                _f(p["check_cpu_us_median"]),
                _f(p["check_cpu_us_per_s"]),
            )
            for p in idle["phases"]
        ),
    )  # fmt: skip
    lines += [
        "### A stall: stacks of stalled workers",
        "",
        "The agent process starts the workers stalled as in a hang: global rank 1 stuck (a "
        "sleep standing in for a data loader) outside any collective, every other rank "
        "waiting for it in `all_reduce`; each worker has 3 more threads (a data loader on "
        "`queue.get`, a checkpoint writer on an `Event`, a metrics pusher in `sleep`), each a "
        "few frames deep, and a training loop 30 frames deep. *plain*: Python only, the "
        "collective wrapped with `progress.wrap`; *torch*: `import torch`, a gloo group of the "
        "workers, the stuck rank inside a forward through nested `nn.Module`s, the others in "
        "gloo's `all_reduce` (wrapped by the start-up). Each round is the watch thread's "
        "check run by hand (`_check` → `_take_stacks` → `_report_stacks_and_stall` into a "
        "bridge exporting to the counting receiver), after which the bridge is flushed (one "
        "export request per report, as when a node reports every `STALL_AFTER` seconds). "
        "Worker CPU: each worker process's CPU-time clock (`clock_gettime` of its process "
        "clock, ns) before and after the round; `/proc/<pid>/stat` (10 ms ticks) alongside.",
        "",
    ]

    def med(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
        return _f(statistics.median(values) * scale, digits) if values else "n/a"

    rows = []
    for d in tr["dumps"]:
        rounds = d["rounds"]
        clock = [x for r in rounds for x in r["worker_cpu_clock_s"]]
        stat = [x for r in rounds for x in r["worker_cpu_stat_s"]]
        rows.append(
            (
                d["variant"],
                f"{d['workers']} x {d['threads']} threads",
                f"{med(d['stack_frames'], digits=0)} (max {_f(max(d['stack_frames'], default=0))})",
                f"{med(d['stack_bytes'], digits=0)} (max {_f(max(d['stack_bytes'], default=0))})",
                f"{sum(r['dumps'] for r in rounds)} of {d['workers'] * len(rounds)}",
                med([r["wall_s"] for r in rounds], 1e3, 0),
                med([r["agent_cpu_s"] for r in rounds], 1e3, 2),
                med([r["agent_cpu_with_export_s"] for r in rounds], 1e3, 2),
                med(clock, 1e3, 2),
                f"{_f(sum(stat) * 1e3, 0)} in {len(rounds)} rounds",
                _f(d["records_per_report"], 1),
                _f(d["bytes_per_report"], 0),
                _f(d["bytes_per_stacks_record"], 0),
                _f(d["stall_record_bytes"]),
            )
        )
    lines += _table(
        ["workers", "each", "frames per dump", "stack bytes per worker", "dumps received",
         "round wall ms", "agent CPU ms (round)", "agent CPU ms (+ export)",
         "worker CPU ms per dump", "workers' CPU ms, /proc stat", "records per report",
         "OTLP bytes per report", "bytes per stacks record", "stall record alone, bytes"],
        rows,
    )  # fmt: skip
    lines += [
        "Medians over the rounds "
        + ", ".join(f"({d['variant']}: {len(d['rounds'])})" for d in tr["dumps"])
        + ". The round's wall time is mostly the watch's waits: it polls the stacks files "
        "every 20 ms and takes a worker's dump once its file stopped growing for one poll, "
        "all workers together. *stall record alone*: an "
        "export request holding only the stall record (resource and scope included); *bytes "
        "per stacks record* = (bytes per report - that) ÷ workers.",
        "",
        f"### {cl['nodes']:,} nodes stalled everywhere",
        "",
        f"Every node of a {cl['nodes']:,}-node job with {cl['workers_per_node']} workers each "
        f"reports every `ELASTIC_OTEL_STALL_AFTER` = {cl['stall_after_s']:g} s (the default) "
        "while the stall lasts: one stall record and one stacks record per local worker. So "
        "records/s = nodes x (1 + workers per node) ÷ STALL_AFTER, and bytes/s = nodes x "
        "(stall record + workers per node x stacks record) ÷ STALL_AFTER, with the record "
        f"sizes measured above ({cl['variant']} variant).",
        "",
    ]
    lines += _table(
        ["", "per node", f"{cl['nodes']:,} nodes"],
        [
            ("records per report", _f(cl["records_per_report"]), "-"),
            ("OTLP bytes per report (uncompressed protobuf)", _f(cl["bytes_per_report"], 0), "-"),
            ("log records/s into the collector tier", _f(cl["records_per_s_per_node"], 3),
             _f(cl["records_per_s"], 1)),
            ("OTLP bytes/s", _f(cl["bytes_per_s_per_node"], 0),
             f"{_f(cl['bytes_per_s'] / 1e6, 2)} MB/s"),
            ("agent CPU for the reports (stacks round + export)",
             f"{_f(cl['agent_cpu_us_per_s_per_node'])} µs/s", "-"),
            ("each worker's CPU for its dumps", f"{_f(cl['worker_cpu_us_per_s'], 2)} µs/s", "-"),
        ],
    )  # fmt: skip
    return lines + _scale_figures() + _quiet_node_figures() + link_reads.render()


def targets(tr: dict[str, Any]) -> list[Target]:
    """Section 9's rows of the results table: what the training thread pays per call."""
    hot = tr.get("hot")
    if not hot:
        return []
    added, ns = hot["added_ns"], hot["ns"]
    gloo = hot["gloo"]
    collective = added["collective, armed"]
    keywords = added["collective, armed, keywords"]
    step = added["mark_step, armed"]
    return [
        (
            "9. added per collective call on the training thread (armed worker, no-op "
            "collective, wrapped - bare)",
            f"{_f(collective / 1e3, 2)} µs ({_f(ns['bare collective, armed']['min'], 0)} → "
            f"{_f(ns['wrapped, armed']['min'], 0)} ns); keyword call {_f(keywords / 1e3, 2)} µs"
            + (
                f"; real gloo `all_reduce` {_f(gloo['added_ns'] / 1e3, 2)} µs on "
                f"{_f(gloo['ns']['bare']['min'] / 1e3, 1)} µs"
                if gloo
                else ""
            ),
            "≤ 1 µs",
            max(collective, keywords) <= 1000,
        ),
        (
            "9. `mark_step` on the training thread (armed worker, - empty statement)",
            f"{_f(step / 1e3, 2)} µs (unarmed {_f(added['mark_step, unarmed'] / 1e3, 2)} µs)",
            "≤ 1 µs",
            step <= 1000,
        ),
        *_checkpoint_target(added),
    ]


def _checkpoint_target(added: dict[str, float]) -> list[Target]:
    """The goodput calls (issue 22): ``mark_checkpoint`` judged, the context manager beside."""
    if "mark_checkpoint, armed" not in added:  # results from before the calls were measured
        return []
    mark, saving = added["mark_checkpoint, armed"], added["saving_checkpoint, armed"]
    return [
        (
            "9. `mark_checkpoint` on the training thread (armed worker, - empty statement)",
            f"{_f(mark / 1e3, 2)} µs (unarmed {_f(added['mark_checkpoint, unarmed'] / 1e3, 2)} "
            f"µs); `with saving_checkpoint(step): pass` {_f(saving / 1e3, 2)} µs (unarmed "
            f"{_f(added['saving_checkpoint, unarmed'] / 1e3, 2)} µs)",
            "≤ 1 µs",
            mark <= 1000,
        )
    ]


def _recorded(pattern: str, title: str, intro: str) -> list[str]:
    """A suite's figures as it printed them, from the newest ``benchmarks/recorded/<pattern>``:
    ``intro`` ends before the file's name, which it is followed by; nothing without a file."""
    files = sorted(RECORDED.glob(pattern))
    if not files:
        return []
    text = [line for line in files[-1].read_text().splitlines() if line.strip()]
    rel = files[-1].relative_to(RECORDED.parents[1])
    return [
        "",
        f"### {title}",
        "",
        f"{intro} (`{rel}`, as printed):",
        "",
        *(f"- {line.lstrip('# ')}" for line in text),
        "",
    ]


def _scale_figures() -> list[str]:
    """The scale suite's: from a stall to the last node naming it."""
    return _recorded(
        "scale-16-nodes-*.txt",
        "16 nodes: from a stall to the last node naming it",
        "The scale suite (`tests/scale/test_sixteen_nodes.py`, real torchrun agents in network "
        "namespaces of their own, one DDP rank each; CI runs it in a step of its own) records "
        "when each node's first report and its naming of the late rank arrived",
    )


def _quiet_node_figures() -> list[str]:
    """The quiet-node soak's: each node's naming and re-reports, run by run."""
    return _recorded(
        "quiet-node-*.txt",
        "A held GPU, named by every node at every interval: the quiet-node soak",
        "`tests/multinode/test_quiet_node.py` repeated (CI runs it once, at a 4 s bound): two "
        "nodes of two DDP ranks under the NCCL stand-in, rank 3's GPU held before an all-reduce "
        "its peers' GPUs started; each node must name rank 3 within `ELASTIC_OTEL_STALL_AFTER` "
        "plus one report interval (the interval is `ELASTIC_OTEL_STALL_AFTER`) and report again "
        "at each interval; a failed run prints no line",
    )
