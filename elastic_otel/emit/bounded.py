"""One bounded runner for every flush and shutdown: calls on daemon threads, abandoned after a
deadline.

The SDK's ``force_flush`` ignores its timeout and an export to an unreachable collector retries
for ``OTEL_EXPORTER_OTLP_TIMEOUT``; a call still blocked at the deadline is abandoned (its daemon
thread ends with the interpreter). The pipeline's flush and shutdown, the worker's providers and
the process's exit path (:mod:`elastic_otel.bridge.process_exit`) all bound their work with
:func:`run_bounded`. It imports nothing of the SDK: the exit path loads it at start-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

_logger = logging.getLogger("elastic_otel")


def run_bounded(
    calls: list[Callable[[], Any]], timeout_s: float, give_up: Callable[[], bool] | None = None
) -> bool:
    """Run ``calls`` concurrently on daemon threads; give up on them after ``timeout_s``, or
    as soon as ``give_up()`` is true. ``True`` when every call returned in time.

    A call still blocked then (an export retrying against a dead collector) is abandoned:
    its daemon thread ends with the interpreter.
    """
    threads = []
    for call in calls:
        t = threading.Thread(target=_quiet(call), name="elastic-otel-flush", daemon=True)
        try:
            t.start()
        except RuntimeError:  # interpreter finalising: run inline, it is all we can do
            _quiet(call)()
            continue
        threads.append(t)
    deadline = time.monotonic() + timeout_s
    for t in threads:
        while t.is_alive() and time.monotonic() < deadline:
            t.join(min(0.02, max(0.0, deadline - time.monotonic())))
            if give_up is not None and give_up():
                return False
    return not any(t.is_alive() for t in threads)


def _quiet(call: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            call()
        except Exception:  # exporter errors are the SDK's to report; never ours to raise
            _logger.debug("elastic-otel: flush step failed", exc_info=True)

    return run
