"""The multi-node diagnosis suite: real two-node torchrun jobs that hang, straggle or fail the
way the bridge must explain (hangs in training and start-up, stragglers, root causes, NCCL's
record through the stand-in, goodput, a lost host), read from a real OTLP receiver. Collected
only with ``ELASTIC_OTEL_MULTINODE_TESTS=1`` (a CI step of its own, ``.ci/run``): every job's
workers import torch, and together they take the two cores for minutes, so the README's test
command leaves this folder alone to keep within its time (CONTRIBUTING.md, Multi-node)."""

from __future__ import annotations

import os

ENABLED = os.environ.get("ELASTIC_OTEL_MULTINODE_TESTS") == "1"
if not ENABLED:
    collect_ignore_glob = ["test_*.py"]
