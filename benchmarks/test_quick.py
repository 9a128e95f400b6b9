"""The benchmark suite's quick variant runs end to end and writes a well-formed report.

Its own step in ``.ci/run`` (``pytest benchmarks/test_quick.py``), outside the README's test
command: its setup alone takes minutes of CPU (fresh venvs, rotel, real jobs).

``python -m benchmarks.run --quick`` uses tiny sizes; this test only checks that every
section ran and that the report and the raw results have the expected shape. It asserts
nothing about timings: those belong to the full run (``python -m benchmarks.run``).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("rotel")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, str]:
    out = tmp_path_factory.mktemp("benchmarks")
    report, raw = out / "BENCHMARKS.md", out / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--output", str(report),
         "--json", str(raw)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert report.exists(), proc.stderr[-3000:]
    return (
        report.read_text(),
        json.loads(raw.read_text()),
        proc.stderr + f"\nexit {proc.returncode}",
    )


def test_every_section_ran(quick_run: tuple[str, dict, str]) -> None:
    text, results, log = quick_run
    assert results["errors"] == {}, log[-3000:]
    assert "Section failed" not in text
    assert log.rstrip().endswith("exit 0"), log[-3000:]


def test_report_is_well_formed(quick_run: tuple[str, dict, str]) -> None:
    from benchmarks.report import SECTION_TITLES

    text, _, _ = quick_run
    assert text.startswith("# Benchmarks\n")
    assert "python -m benchmarks.run --quick" in text
    positions = [text.index(title + "\n") for title in SECTION_TITLES]
    assert positions == sorted(positions), "sections out of order"
    for key in ("cpu", "cores", "python", "torch", "opentelemetry-sdk"):
        assert f"| {key} |" in text
    summary = text[positions[1] : positions[2]]
    verdict_rows = [
        line for line in summary.splitlines() if line.endswith(("**met** |", "**MISSED** |"))
    ]
    assert len(verdict_rows) >= 8, summary
    for line in text.splitlines():
        if line.startswith("|"):
            assert line.endswith("|"), line
    assert not re.search(r"\bnan\b", text, re.IGNORECASE)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def test_results_have_expected_shape(quick_run: tuple[str, dict, str]) -> None:
    _, results, _ = quick_run
    runs = {r["variant"]: r for r in results["caller"]["runs"]}
    for variant in ("timer", "serialize", "null", "console", "sdk", "bridge", "sdk-down",
                    "bridge-down"):  # fmt: skip
        stats = runs[variant]["us"]
        assert stats["n"] == results["caller"]["events"]
        assert all(_finite(stats[k]) for k in ("median", "p99", "max"))
        assert stats["median"] <= stats["p99"] <= stats["max"]
    assert runs["bridge"]["bridge_stats"]["received"] == runs["bridge"]["sent_total"]
    assert runs["bridge"]["received"]["logs"] > 0

    exits = results["exit"]["variants"]
    assert {"none-down", "bridge-down", "sdk-down"} <= set(exits)
    assert all(_finite(v["exit_median_s"]) for v in exits.values())

    phases = results["throughput"]["phases"]
    assert len(phases) == 2  # quick mode: default SDK queues, then above the bound
    for phase in phases:
        assert phase["stats"]["received"] == phase["events"]
        assert phase["lost"] == phase["events"] - phase["received_measured_logs"]
        assert _finite(phase["events_per_s_exported"])
    assert phases[-1]["stats"]["dropped_queue_full"] > 0  # driven above the bound

    startup = results["startup"]
    assert "without" in startup["pass"]["variants"]
    assert all(_finite(v["ratio_mean"]) for v in startup["pass"]["variants"].values())
    assert startup["torchrun"] == {"skipped": "--quick"}

    memory = results["memory"]
    assert memory["events"] == 6_000
    assert len(memory["samples"]) >= 5
    assert memory["samples"][-1]["processed"] == memory["events"]

    scale = results["scale"]
    assert scale["keepalive_events_sent"] == scale["keepalive_logs_received"]
    assert scale["table"]["log_records_per_s"] == pytest.approx(4096 * 3 / 5)
    assert scale["heartbeat_logs_off"] is None  # quick mode: the default variant only
    assert scale["open_spans"] is None  # quick mode: not the open-span snapshots

    recovery = results["recovery"]  # quick mode: the job with the bridge only, no ratio
    assert list(recovery["variants"]) == ["--event-log-handler otel"]
    assert recovery["recovery_ratio_median"] is None

    training = results["training"]
    hot = training["hot"]
    for call in ("mark_step", "mark_checkpoint", "saving_checkpoint"):  # issues 20 and 22
        assert {f"{call}, armed", f"{call}, unarmed"} <= set(hot["added_ns"])
    assert all(_finite(v) for v in hot["added_ns"].values())
    assert hot["gloo"] is None  # quick mode: not the gloo worker
    assert [p["after_s"] for p in training["idle"]["phases"]] == [60.0, 2.0]
    assert training["idle"]["alive_at_end"] == 8
    assert not any(p["reports"] for p in training["idle"]["phases"])  # progressing: no stall
    assert [d["variant"] for d in training["dumps"]] == ["plain"]  # quick mode: not torch
    for dump in training["dumps"]:
        assert dump["stall_waited_for"] == [1]  # rank 1 is stuck, the others wait for it
        dumps = [r["dumps"] for r in dump["rounds"]]  # a record per dump, one for the stall
        assert dump["records_per_report"] == 1 + sum(dumps) / len(dumps)
        assert dump["stall_records_alone"] == 1
        assert min(dump["stack_bytes"]) > 0
    assert training["cluster"]["records_per_s"] == pytest.approx(4096 * 9 / 60)

    sizes = results["trace_sizes"]
    assert sizes["nodes"] == [8, 64]  # quick mode: 512 and 4,096 nodes in the full run only
    rows = sizes["sizes"]
    assert len(rows) == 2 * 2 * 2  # node counts x layouts x with and without training spans
    for row in rows:
        assert row["traces"] == 1  # at most 128 nodes: one trace per round in both layouts
        assert row["spans"] == row["round_spans"] == row["max_spans"]
        assert row["bytes"] == row["round_bytes"] == row["max_bytes"] > 0
        assert row["other_spans"] is None and row["tempo_ok"] and row["jaeger_ok"]
    by = {(r["nodes"], r["round_trace_max_nodes"], r["training_spans"]): r for r in rows}
    for (nodes, limit, training), row in by.items():
        if training:  # 3 spans of the training script per worker, 8 workers per node
            assert row["spans"] == by[(nodes, limit, False)]["spans"] + nodes * 8 * 3
        assert row["spans"] == by[(nodes, 0, training)]["spans"]  # both layouts alike
    assert by[(64, 0, False)]["spans"] == 8 * by[(8, 0, False)]["spans"]  # spans per node
    bridge = sizes["bridge"]
    assert [r["world"] for r in bridge] == [8, 512, 4096]
    for row in bridge:  # one node's round: the same events and records at every world size
        assert (row["events"], row["records_exported"]) == (
            bridge[0]["events"],
            bridge[0]["records_exported"],
        )
        assert row["records_exported"] > row["events"] > 0
        assert len(row["cpu_us"]) == sizes["bridge_reps"]
        assert all(_finite(v) for v in row["cpu_us"]) and row["heap_peak_kb"] > 0

    footprint = results["footprint"]  # issue 42: the agent's own threads, memory and CPU
    steady = footprint["steady"]
    for variant in ("without", "with"):
        assert [r["workers"] for r in steady["runs"][variant]] == [8]  # quick mode: one run
        assert all(_finite(v) for v in steady["median"][variant].values())
    with_, without = steady["names"]["with"], steady["names"]["without"]
    ours = {name for name in with_ if name.startswith(("elastic-otel", "Otel"))}
    assert ours == {"elastic-otel", "elastic-otel-export"}  # issue 48: the loop and the exports
    assert not any(name.startswith("elastic-otel") for name in without)
    soak = footprint["soak"]  # quick mode: 10 restarts, with and without the bridge
    assert (soak["restarts"], soak["attempts"], soak["exit_code"]) == (10, 11, 0)
    assert soak["worker_spans"] == soak["distinct_worker_spans"] == 11 * soak["ranks"]
    baseline = footprint["soak_without"]
    assert (baseline["attempts"], baseline["exit_code"], baseline["worker_spans"]) == (11, 0, 0)
    for run in (soak, baseline):  # every 2 restarts (some may pass unsampled) and the last
        assert [s["restart"] for s in run["samples"]][-1] == 10
        assert all(_finite(v) for s in run["samples"] for v in s.values())

    store = results["store_load"]  # issue 42: 64 nodes, every period divided by 20
    assert store["sizes"] == [64] and store["libuv"]
    by = {ph["scenario"]: ph for ph in store["runs"][0]["phases"]}
    assert list(by) == [
        "healthy", "training", "training_alone", "startup", "slow_start", "slow_nodes"
    ]  # fmt: skip
    assert by["training_alone"]["ops"]["torch"] == {}  # the bridge alone
    assert by["healthy"]["ops"]["bridge"] == {}  # a healthy job's bridge never uses the store
    assert "get (monitor)" in by["healthy"]["ops"]["torch"]  # an operation seen in the phase
    assert {"check", "get"} <= set(by["training"]["ops"]["bridge"])
    assert "elastic_otel/stall/waiting/nccl:0" in by["training"]["keys"]
    assert "elastic_otel/stall/culprits/init/1" in by["startup"]["keys"]
    assert by["slow_start"]["keys"] == ["elastic_otel/stall/waiting/init"]
    assert set(by["slow_start"]["ops"]["bridge"]) == {"check"}  # of waiting/init, a poll
    assert "set" in by["slow_nodes"]["ops"]["bridge"]
    for phase in by.values():
        assert _finite(phase["server_cpu_cores"]) and phase["server_rss_mib"] > 0
        assert all(_finite(v) for v in (phase["vs_healthy"] or {}).values() if v is not None)
