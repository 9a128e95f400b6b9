"""Run the whole benchmark suite and write BENCHMARKS.md.

Usage::

    python -m benchmarks.run            # full run (several minutes), writes BENCHMARKS.md
    python -m benchmarks.run --quick    # CI-sized run (< 60 s)
    python -m benchmarks.run --output /tmp/B.md --json /tmp/b.json --sections caller,memory
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # ``python benchmarks/run.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common, report


def package_fingerprint(root: Path | None = None) -> str:
    """Hash of the package's sources (``root/elastic_otel``, default the working tree)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(((root or common.ROOT) / "elastic_otel").rglob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


SECTIONS = (
    "caller",
    "exit",
    "throughput",
    "startup",
    "memory",
    "scale",
    "recovery",
    "fork",
    "training",
    "trace_sizes",
    "flight_recorder",
    "worker_output",
    "footprint",
    "store_load",
)


def _stream_description(quick: bool) -> dict[str, int]:
    from benchmarks import events

    n = 600 if quick else 12_000
    return events.describe(events.mixed_objects(n))


def run_sections(quick: bool, sections: tuple[str, ...], log: Any) -> dict[str, Any]:
    """Run the chosen sections in order; a failing section is recorded, not fatal."""
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
        store_load,
        throughput,
        trace_sizes,
        training,
        worker_output,
    )

    results: dict[str, Any] = {"errors": {}}
    runners = {
        "caller": lambda: caller_cost.run(quick),
        "exit": lambda: exit_delay.run(quick),
        "throughput": lambda: throughput.run(quick),
        "startup": lambda: startup.run(quick),
        "memory": lambda: memory.run(quick),
        "scale": lambda: scale.run(quick, _scale_inputs(results)),
        "recovery": lambda: recovery.run(quick),
        "fork": lambda: fork.run(quick),
        "training": lambda: training.run(quick),
        "trace_sizes": lambda: trace_sizes.run(quick),
        "flight_recorder": lambda: flight_recorder.run(quick),
        "worker_output": lambda: worker_output.run(quick),
        "footprint": lambda: footprint.run(quick),
        "store_load": lambda: store_load.run(quick),
    }
    results["load"] = {}
    for name in sections:
        load = common.ForeignLoad()
        log(f"[benchmarks] {name} ...")
        try:
            results[name] = runners[name]()
        except Exception as e:  # keep going: the report says what failed
            results[name] = None
            results["errors"][name] = f"{type(e).__name__}: {e}"
            log(traceback.format_exc())
        results["load"][name] = load.stop()
        log(
            f"[benchmarks] {name} done in {results['load'][name]['elapsed_s']:.1f} s "
            f"(other processes used {100 * results['load'][name]['foreign_share']:.0f} % "
            "of the machine meanwhile)"
        )
    if results.get("caller"):
        results["caller"]["stream"] = _stream_description(quick)
    return results


def _scale_inputs(results: dict[str, Any]) -> dict[str, Any]:
    """Numbers section 6 takes from earlier sections (rotel's CPU per record)."""
    tp = results.get("throughput") or {}
    below = [p for p in tp.get("phases", []) if p["phase"].startswith("below")]
    for phase in below[::-1]:
        records = phase["received"]["logs"] + phase["received"]["traces"]
        if records and phase["collector_cpu_s"]:
            return {"collector_cpu_us_per_record": phase["collector_cpu_s"] / records * 1e6}
    return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument(
        "--output", type=Path, default=common.ROOT / "BENCHMARKS.md", help="report path"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write raw results here")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}"
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        metavar="FILE",
        help="re-render the report from results saved with --json (runs nothing)",
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="first wait up to S seconds for the machine to be idle (other processes)",
    )
    args = parser.parse_args(argv)
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {sorted(unknown)}")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.from_json:
        results = json.loads(args.from_json.read_text())
        args.output.write_text(report.render(results))
        log(f"[benchmarks] re-rendered {args.output} from {args.from_json}")
        return 1 if results.get("errors") else 0

    idle = None
    if args.wait_idle > 0:
        log(f"[benchmarks] waiting up to {args.wait_idle:.0f} s for an idle machine ...")
        idle = common.wait_idle(args.wait_idle)
    t0 = time.monotonic()
    fingerprint = package_fingerprint()
    with tempfile.TemporaryDirectory(prefix="eo-bench-pkg-") as tmp:
        snapshot = common.snapshot_package(Path(tmp))
        try:
            results = run_sections(args.quick, sections, log)
        finally:
            os.environ.pop(common.SNAPSHOT_ENV, None)
        measured = package_fingerprint(snapshot)
    results["machine"] = common.machine()
    command = "python -m benchmarks.run" + (" --quick" if args.quick else "")
    if args.sections != ",".join(SECTIONS):
        command += f" --sections {args.sections}"
    results["meta"] = {
        "command": command,
        "mode": "quick" if args.quick else "full",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "elapsed_s": time.monotonic() - t0,
        "idle_at_start": idle,
        "package_fingerprint": measured,
        "package_changed_during_run": measured != fingerprint,
        "tree_changed_during_run": package_fingerprint() != fingerprint,
    }
    if results["meta"]["tree_changed_during_run"]:
        log(
            "[benchmarks] note: elastic_otel/ changed while the suite ran; the snapshot taken "
            "at the start was measured"
        )
    args.output.write_text(report.render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    log(f"[benchmarks] wrote {args.output} in {results['meta']['elapsed_s']:.0f} s")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
