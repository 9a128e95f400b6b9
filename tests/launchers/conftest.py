"""The launcher and framework end-to-end suites (docs/launchers.md): real ``accelerate launch``,
``torchx run``, ``ft_launcher`` and ``elastic_launch`` jobs beside plain ``torchrun`` ones, each
read from a real OTLP receiver. Collected only with ``ELASTIC_OTEL_LAUNCHER_TESTS=1`` (a CI step
of its own, ``.ci/run``): they need packages the README's install leaves out (the ``launchers``
extra), and every job's workers import torch, so the README's test command leaves this folder
alone."""

from __future__ import annotations

import os

ENABLED = os.environ.get("ELASTIC_OTEL_LAUNCHER_TESTS") == "1"
if not ENABLED:
    collect_ignore_glob = ["test_*.py"]
