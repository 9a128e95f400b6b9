"""Process exit: flush the bridge at interpreter exit and on an unhandled SIGTERM.

``atexit`` runs the bridge's bounded shutdown. A SIGTERM with the default disposition would
kill the process without running ``atexit``, so where nobody handles SIGTERM (plain scripts;
torchrun before its workers start) a handler shuts the bridge down first and then lets the
signal take its default course, so the exit status stays what the sender expects. torchrun
installs its own handler once workers start (raising ``SignalException``, which exits through
``atexit``); that one is left alone.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable

Shutdown = Callable[[str, bool], None]
"""The bridge's shutdown: ``(reason, error)``."""


def install(shutdown: Shutdown) -> None:
    """Run ``shutdown`` at interpreter exit, and on SIGTERM where nobody handles it."""
    atexit.register(shutdown, "process exit", False)
    _install_sigterm(shutdown)


def _install_sigterm(shutdown: Shutdown) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal only works on the main thread
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
    except (ValueError, OSError):
        return

    def on_sigterm(signum: int, _frame: object) -> None:
        shutdown(f"process terminated ({signal.Signals(signum).name})", True)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGTERM, on_sigterm)
