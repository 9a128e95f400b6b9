"""Compose ``BENCHMARKS.md`` from the results of :mod:`benchmarks.run`: the machine, the
results against the targets and the sections in their order; each section module renders its
own section (``render``) and its rows of the results table (``targets``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks import (
    caller_cost,
    exit_delay,
    flight_recorder,
    footprint,
    fork,
    memory,
    recovery,
    scale,
    startup,
    store_load_report,
    throughput,
    trace_sizes,
    training_report,
    worker_output,
)
from benchmarks.format import Target
from benchmarks.format import table as _table
from benchmarks.format import verdict as _verdict

SECTIONS: tuple[tuple[str, str, Callable[[dict[str, Any]], list[str]]], ...] = (
    ("caller", caller_cost.TITLE, lambda r: caller_cost.render(r["caller"])),
    (
        "exit",
        exit_delay.TITLE,
        lambda r: exit_delay.render(r.get("caller") or {}, r.get("exit") or {}),
    ),
    ("throughput", throughput.TITLE, lambda r: throughput.render(r["throughput"])),
    ("startup", startup.TITLE, lambda r: startup.render(r["startup"])),
    ("memory", memory.TITLE, lambda r: memory.render(r["memory"])),
    ("scale", scale.TITLE, lambda r: scale.render(r["scale"])),
    ("recovery", recovery.TITLE, lambda r: recovery.render(r["recovery"])),
    ("fork", fork.TITLE, lambda r: fork.render(r["fork"])),
    ("training", training_report.TITLE, lambda r: training_report.render(r["training"])),
    ("trace_sizes", trace_sizes.TITLE, lambda r: trace_sizes.render(r["trace_sizes"])),
    (
        "flight_recorder",
        flight_recorder.TITLE,
        lambda r: flight_recorder.render(r["flight_recorder"]),
    ),
    ("worker_output", worker_output.TITLE, lambda r: worker_output.render(r["worker_output"])),
    ("footprint", footprint.TITLE, lambda r: footprint.render(r["footprint"])),
    ("store_load", store_load_report.TITLE, lambda r: store_load_report.render(r["store_load"])),
)
"""The sections in their order: (results key, title, renderer of the whole results)."""

SECTION_TITLES = (
    "## Machine",
    "## Results against the targets",
    *(title for _, title, _ in SECTIONS),
)


def targets(results: dict[str, Any]) -> list[Target]:
    """(target, measured, threshold, ok) rows for the summary table, each section's from its
    module, in the table's order (which is not the sections')."""
    caller = results.get("caller") or {}
    return [
        *caller_cost.targets(caller),
        *exit_delay.targets(caller, results.get("exit") or {}),
        *throughput.targets(results.get("throughput") or {}),
        *startup.targets(results.get("startup") or {}),
        *recovery.targets(results.get("recovery") or {}),
        *fork.targets(results.get("fork") or {}),
        *training_report.targets(results.get("training") or {}),
        *flight_recorder.targets(results.get("flight_recorder") or {}),
        *worker_output.targets(results.get("worker_output") or {}),
        *trace_sizes.targets(results.get("trace_sizes") or {}),
        *footprint.targets(results.get("footprint") or {}),
        *memory.targets(results.get("memory") or {}),
    ]


def _machine(results: dict[str, Any]) -> list[str]:
    m = results["machine"]
    lines = [SECTION_TITLES[0], "", *_table(["", ""], ((k, v) for k, v in m.items()))]
    load = results.get("load") or {}
    if load:
        lines += [
            "CPU used by *other* processes on this machine while each section ran (machine-wide "
            "busy time from `/proc/stat` minus this suite's own processes; share of all CPUs): "
            + ", ".join(f"{name} {100 * v['foreign_share']:.0f} %" for name, v in load.items())
            + ". Numbers of a section with a high share are disturbed.",
            "",
        ]
        probes = [(name, v["probe_ms"]) for name, v in load.items() if "probe_ms" in v]
        if probes:
            lines += [
                "The machine's speed before each section: one fixed pure-Python workload "
                "(`benchmarks/common.py` `cpu_probe_ms`, best of 5), ms: "
                + ", ".join(f"{name} {ms:.1f}" for name, ms in probes)
                + ". The virtual machine's host runs faster or slower from hour to hour; "
                "absolute numbers (events/s, ms of CPU per second) move with it, ratios "
                "measured within one section much less.",
                "",
            ]
    return lines


def _summary(results: dict[str, Any]) -> list[str]:
    lines = [SECTION_TITLES[1], ""]
    rows = targets(results)
    lines += _table(
        ["target", "measured", "threshold", "verdict"],
        ((t, m, th, _verdict(ok)) for t, m, th, ok in rows),
    )
    failed = [k for k, v in results.get("errors", {}).items()]
    if failed:
        lines += [f"Sections that failed to run: {', '.join(failed)} (see below).", ""]
    return lines


def render(results: dict[str, Any]) -> str:
    """BENCHMARKS.md's text for ``results``."""
    meta = results["meta"]
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `{meta['command']}` on {meta['date']} ({meta['mode']} mode, "
        f"{meta['elapsed_s']:.0f} s). Do not edit by hand: re-run the command.",
        "",
    ]
    if meta.get("package_changed_during_run"):
        lines += [
            "> **Warning**: the sources of `elastic_otel/` changed while the suite ran, so "
            "sections may have measured different versions of the package. Re-run.",
            "",
        ]
    if meta.get("package_fingerprint"):
        lines += [
            "Every section measured the same copy of `elastic_otel/`, taken when the run started "
            f"(sources sha256 `{meta['package_fingerprint']}`)"
            + (
                "; the working tree changed during the run, which the numbers do not reflect."
                if meta.get("tree_changed_during_run")
                else "."
            )
            + " The start-up section's `python -c` timings use the installed package as it is.",
            "",
        ]
    if meta["mode"] == "quick":
        lines += [
            "> **Quick mode**: tiny sizes so that the suite cannot rot in CI; these numbers are "
            "not meaningful. Run `python -m benchmarks.run` for real numbers.",
            "",
        ]
    lines += _machine(results)
    lines += _summary(results)
    errors = results.get("errors", {})
    for key, title, section in SECTIONS:
        if key in errors or results.get(key) is None:
            lines += [title, "", f"Section failed: `{errors.get(key, 'not run')}`", ""]
            continue
        lines += section(results)
    lines += [
        "## Method",
        "",
        "`python -m benchmarks.run` (add `--quick` for the CI-sized run, `--json FILE` for the "
        "raw numbers). Sources in `benchmarks/`: `events.py` (the stream), `receiver.py` (the "
        "counting OTLP receiver, built on `tests/support/otlp_receiver.py`, in its own process), "
        "`collector.py` (rotel), one module per section. Every measured process is a fresh "
        "subprocess pinned to the first CPU; receivers and rotel are pinned to the others.",
        "",
    ]
    return "\n".join(lines)
