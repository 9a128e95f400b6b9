"""Run a two-node elastic job on this machine and look at its telemetry.

What ``elastic-otel demo`` does, as a script to read and adapt. Each of the two agents is
started like this (the run id and the port are made up per run)::

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 \\
    OTEL_TRACES_EXPORTER=elastic_otel_file OTEL_LOGS_EXPORTER=elastic_otel_file \\
    OTEL_METRICS_EXPORTER=elastic_otel_file \\
    ELASTIC_OTEL_OTLP_JSON_FILE=$PWD/elastic-otel-demo.jsonl \\
    TRAIN_FAIL_RANK=1 TRAIN_FAIL_ONCE_DIR=/tmp/demo \\
    torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=127.0.0.1:29400 --rdzv-id=demo-1 \\
        --max-restarts=1 --monitor-interval=0.5 --event-log-handler otel \\
        elastic_otel/cli/demo_train.py

``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` lets two agents on one host restart; the
``elastic_otel_file`` exporters append OTLP JSON lines to one file that both agents share. With
``OTEL_EXPORTER_OTLP_ENDPOINT`` set, the telemetry also goes to that collector. Afterwards::

    elastic-otel timeline elastic-otel-demo.jsonl --html timeline.html

Usage: python examples/run_local_job.py [--nproc-per-node 2] [--html timeline.html]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from elastic_otel.cli.demo import DemoConfig, DemoError, run_demo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("elastic-otel-demo.jsonl"))
    parser.add_argument("--html", type=Path)
    parser.add_argument("--nproc-per-node", type=int, choices=(1, 2), default=1)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    config = DemoConfig(
        out=args.out, nproc_per_node=args.nproc_per_node, timeout_s=args.timeout, html=args.html
    )
    try:
        return run_demo(config)
    except DemoError as e:
        print(f"run_local_job: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("run_local_job: interrupted; the job was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
