"""What the bridge costs a DDP step on a GPU (issue 35): ``python -m benchmarks.gpu_step``.

The GPU training script of the tests (``tests/scripts/gpu_ddp_train.py``, one NCCL rank on this
machine's first GPU, 8 x Linear(WIDTH), BATCH rows) runs under torchrun with the bridge
(``--event-log-handler otel``, the worker start-up, its collectives thread) and without it
(torch's ``null`` destination, ``ELASTIC_OTEL_ENABLED=false``), alternating, RUNS times each,
with telemetry written to a file so that no collector is needed; it prints each run's median step
time and the ratio of the medians, with ÷ without. Needs a CUDA device: it says so and exits 0
where there is none. Not part of ``benchmarks.run``, which runs on the CPU.

Its last run on a lent GPU (``benchmarks/recorded/gpu-*.txt``) is quoted in section 11 of
BENCHMARKS.md (:func:`recorded_gpu_step`).
"""

from __future__ import annotations

import argparse
import functools
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT, clean_env
from benchmarks.format import RECORDED

SCRIPT = ROOT / "tests" / "scripts" / "gpu_ddp_train.py"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def one_run(bridge: bool, width: int, batch: int, steps: int, out: Path) -> float:
    env = clean_env(
        {"WIDTH": str(width), "BATCH": str(batch), "STEPS": str(steps), "PYTHONUNBUFFERED": "1"}
    )
    if bridge:
        env.update(
            OTEL_TRACES_EXPORTER="elastic_otel_file",
            OTEL_LOGS_EXPORTER="elastic_otel_file",
            OTEL_METRICS_EXPORTER="elastic_otel_file",
            ELASTIC_OTEL_OTLP_JSON_FILE=str(out),
            # GPU machines may run a torch outside TESTED_TORCH: the agent wrapped regardless.
            ELASTIC_OTEL_AGENT_INSTRUMENTATION="true",
        )
    else:
        env["ELASTIC_OTEL_ENABLED"] = "false"
    cmd = [
        TORCHRUN,
        "--standalone",
        "--nproc-per-node=1",
        "--event-log-handler",
        "otel" if bridge else "null",
        str(SCRIPT),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    found = re.search(r"median step ms ([0-9.]+)", done.stdout + done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"run failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_step: no CUDA device, nothing measured")
        return
    print(f"gpu_step: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    out = Path(tempfile.mkdtemp(prefix="gpu_step_")) / "telemetry.jsonl"
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.runs):
        for bridge in (False, True):
            ms = one_run(bridge, args.width, args.batch, args.steps, out)
            times[bridge].append(ms)
            print(f"{'with' if bridge else 'without'} the bridge: median step {ms:.3f} ms")
    with_, without = statistics.median(times[True]), statistics.median(times[False])
    print(f"with / without: {with_ / without:.4f}x (target <= 1.01x); telemetry {out}")


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


@dataclass(frozen=True)
class RecordedGpuStep:
    """``benchmarks.gpu_step``'s output as a lent GPU machine printed it (newest file)."""

    path: str
    device: str
    ratio: float
    lines: tuple[str, ...]


@functools.cache  # the results table and section 11 both quote it: read once
def recorded_gpu_step() -> RecordedGpuStep | None:
    """The newest ``benchmarks/recorded/gpu-*.txt``'s step-time lines; ``None`` without one."""
    files = sorted(RECORDED.glob("gpu-*.txt"))
    if not files:
        return None
    text = files[-1].read_text().splitlines()
    lines = tuple(line for line in text if line.startswith(("gpu_step:", "with", "without")))
    found = [re.search(r"with / without: ([0-9.]+)x", line) for line in lines]
    ratio = next((float(m.group(1)) for m in found if m), None)
    device = next((line.split(", torch")[0][len("gpu_step: ") :] for line in lines[:1]), "")
    if ratio is None or not device:
        return None
    return RecordedGpuStep(str(files[-1].relative_to(RECORDED.parents[1])), device, ratio, lines)


if __name__ == "__main__":
    main()
