"""The ``elastic-otel`` command line: ``demo``, ``replay`` and ``timeline``.

Nothing in the runtime bridge imports this package: it holds the tools that run beside a job
(the demo and its training script, log replay, the timeline views).
"""

from elastic_otel.cli.main import main

__all__ = ["main"]
