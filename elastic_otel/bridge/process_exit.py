"""Process exit: flush the bridge at interpreter exit, on an unhandled SIGTERM, and on a signal
that arrives while torch blocks in C++.

Every owner of something to flush registers a bounded step on the process's :class:`ExitPath`;
the steps run together within one ``ELASTIC_OTEL_EXIT_TIMEOUT`` bound, once, so the exit costs
the slowest step, not their sum. :class:`SignalWatcher` holds the signal wakeup fd, which the
bridge's event thread reads, so that open spans are ended and exported even while the main
thread is blocked in C++. Design: ``docs/architecture.md`` (Life cycle),
``docs/guarantees.md`` (A thread stuck in C++).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable

from elastic_otel.emit.bounded import run_bounded

_logger = logging.getLogger("elastic_otel")

Shutdown = Callable[[str, bool], object]
"""A bounded shutdown step: ``(reason, error)``."""

Terminate = Callable[[str], None]
"""The bridge's terminate path: end open spans with ``reason`` and export them, stay open."""

_TERMINATING = frozenset({int(signal.SIGTERM), int(signal.SIGINT)})


def signal_reason(signum: int) -> str:
    """The ``torchelastic.end_reason`` of spans a signal ended: its name and number."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "unknown signal"
    return f"process terminated ({name}, signal {signum})"


class ExitPath:
    """The process's one exit path: the bounded shutdown steps its owners registered, run
    together (each on its own daemon thread) within one bound, once.

    The bound is ``ELASTIC_OTEL_EXIT_TIMEOUT``: every owner passes the value it read
    (:class:`~elastic_otel.config.settings.Settings`), so they agree; the largest is used. A step
    still running at the bound is abandoned. Steps run at interpreter exit (one ``atexit``
    hook), on an unhandled SIGTERM (see the module docstring), or when :meth:`run` is called.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: dict[str, tuple[Shutdown, float]] = {}
        self._at_exit = False
        self._watcher: SignalWatcher | None = None
        self._watch_lock = threading.Lock()

    def add(self, name: str, step: Shutdown, timeout_s: float, sigterm: bool = True) -> None:
        """Run ``step(reason, error)`` on this path (replacing a step of the same ``name``).

        ``sigterm``: also run the path on a SIGTERM nobody handles (only from the main
        thread, where ``signal.signal`` works); the worker's telemetry does not ask for it,
        so that a worker torch stops dies as promptly as it would without it.
        """
        with self._lock:
            self._steps[name] = (step, timeout_s)
            if not self._at_exit:
                atexit.register(self.run)
                self._at_exit = True
        if sigterm:
            _install_sigterm(self.run)

    def remove(self, name: str) -> bool:
        """Take ``name``'s step off the path (its owner shut it down itself)."""
        with self._lock:
            return self._steps.pop(name, None) is not None

    def steps(self) -> list[str]:
        """The names of the steps still to run."""
        with self._lock:
            return list(self._steps)

    def run(self, reason: str = "process exit", error: bool = False) -> bool:
        """Run every registered step once, together, within the bound; ``True`` when all
        returned in time. Steps registered later run on a later call."""
        with self._lock:
            steps = list(self._steps.values())
            self._steps.clear()
        if not steps:
            return True
        timeout_s = max(timeout for _, timeout in steps)
        return run_bounded([functools.partial(step, reason, error) for step, _ in steps], timeout_s)

    # --- signals that arrive while the main thread is blocked (the module docstring) ---------

    def watch_signals(self, terminate: Terminate) -> SignalWatcher | None:
        """Have ``terminate(reason)`` called when SIGTERM or SIGINT arrives, by whoever reads
        the returned watcher's socket when it can be read (the bridge's event thread).

        Arms the signal wakeup fd on first use, from the main thread only, and only when no
        wakeup fd is set (an event loop's is put back, without full-buffer warnings). ``None``
        when not watching.
        """
        try:
            with self._watch_lock:
                watcher = self._watcher
                if watcher is not None and watcher.pid == os.getpid():
                    watcher.callbacks.append(terminate)
                    return watcher
                if threading.current_thread() is not threading.main_thread():
                    return None  # signal.set_wakeup_fd only works on the main thread
                watcher = _arm()
                if watcher is None:
                    return None
                watcher.callbacks.append(terminate)
                self._watcher = watcher
                return watcher
        except Exception:  # the host process must never see our failure
            _logger.debug("elastic-otel: signal watcher not started", exc_info=True)
            return None

    def after_fork_in_child(self) -> None:
        """In a forked child: drop the parent's watcher (its socket is shared with the parent,
        whose event thread would read the child's signals). The
        child's bridge arms a watcher of its own when it starts again."""
        self._watch_lock = threading.Lock()  # another thread may have held it at fork
        watcher = self._watcher
        if watcher is None or watcher.pid == os.getpid():
            return
        self._watcher = None
        try:
            _restore_wakeup_fd(watcher.writer.fileno())
            watcher.close()
        except Exception:  # never the child's problem
            _logger.debug("elastic-otel: signal watcher reset after fork failed", exc_info=True)


def _install_sigterm(run: Shutdown) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal only works on the main thread
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
    except (ValueError, OSError):
        return

    def on_sigterm(signum: int, _frame: object) -> None:
        run(signal_reason(signum), True)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGTERM, on_sigterm)


# --- signals that arrive while the main thread is blocked --------------------------------------


class SignalWatcher:
    """The read end of this process's signal wakeup fd, read on the bridge's event thread.

    CPython writes one byte, the signal number, per signal that has a Python-level handler.
    SIGTERM and SIGINT bytes call every registered ``terminate``; other signals' bytes are
    ignored.
    """

    def __init__(self, reader: socket.socket, writer: socket.socket) -> None:
        self.reader, self.writer = reader, writer
        self.pid = os.getpid()
        self.callbacks: list[Terminate] = []

    def on_readable(self) -> bool:
        """Read what the C handler wrote; ``False`` at the socket's end (closed)."""
        try:
            data = self.reader.recv(256)
        except BlockingIOError:  # another event thread read it first
            return True
        except OSError:
            return False
        for signum in data:  # one terminate per burst: the first terminating signal
            if signum in _TERMINATING:
                self._fire(signum)
                break
        return bool(data)

    def _fire(self, signum: int) -> None:
        reason = signal_reason(signum)
        for terminate in list(self.callbacks):
            try:
                terminate(reason)
            except BaseException:  # never let the host process see our failure
                _logger.debug("elastic-otel: terminate on %s failed", reason, exc_info=True)

    def close(self) -> None:
        for sock in (self.reader, self.writer):
            with contextlib.suppress(OSError):
                sock.close()


def _arm() -> SignalWatcher | None:
    reader, writer = socket.socketpair()
    watcher = SignalWatcher(reader, writer)
    try:
        reader.setblocking(False)  # read on the event thread, which must never block
        writer.setblocking(False)  # the C handler must never block
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except (ValueError, OSError):
        watcher.close()
        return None
    if previous != -1:
        signal.set_wakeup_fd(previous, warn_on_full_buffer=False)
        watcher.close()
        _logger.debug(
            "elastic-otel: a signal wakeup fd (%d) is already set; spans open when a signal "
            "arrives while torch blocks in C++ end only when its handler runs",
            previous,
        )
        return None
    return watcher


def _restore_wakeup_fd(ours: int) -> None:
    """Unset the wakeup fd if it is still ``ours`` (put back whatever else is set)."""
    with contextlib.suppress(ValueError, OSError):
        current = signal.set_wakeup_fd(-1)
        if current not in (-1, ours):
            signal.set_wakeup_fd(current, warn_on_full_buffer=False)
