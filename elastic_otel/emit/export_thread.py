"""One export thread for a process's logs, spans and metrics, every exporter's.

torchrun's agent may gain at most 8 threads from the bridge, gRPC's 6 among them, and the SDK's
batch processors and periodic reader start one each per exporter. Here one daemon thread,
``elastic-otel-export``, runs every queue and reader registered on it, each when it is due: a
queue when its delay is up (``OTEL_BSP_SCHEDULE_DELAY``, ``OTEL_BLRP_SCHEDULE_DELAY``) or it
holds a batch, a reader every ``OTEL_METRIC_EXPORT_INTERVAL``; in between it sleeps. The
span and log processors (:mod:`elastic_otel.emit.export_queue`) and the metric reader
(:mod:`elastic_otel.emit.export_reader`) are the SDK's interfaces, the exporters the SDK's. It
imports nothing of the SDK. Design: ``docs/architecture.md`` (Threads).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Protocol

THREAD_NAME = "elastic-otel-export"

_logger = logging.getLogger("elastic_otel")


def name_native_thread(name: str) -> None:
    """Give the calling thread ``name`` in the kernel too (``/proc/<pid>/task/*/comm``, 15
    characters), where ``top -H``, ``ps -T`` and py-spy read it; Python 3.11 leaves its threads
    the process's name. Nothing happens where the kernel has no such file."""
    try:
        with open("/proc/thread-self/comm", "w") as comm:
            comm.write(name[:15])
    except OSError:
        pass


class Job(Protocol):
    """What the export thread runs: a queue or a metric reader."""

    def due_at(self) -> float:
        """When it is next due (``time.monotonic()``)."""
        ...

    def run(self, now: float) -> None:
        """Export what is due at ``now``."""
        ...

    def after_fork_in_child(self) -> None:
        """In a forked child: become inert (the records and exporters are the parent's)."""
        ...


class ExportThread:
    """One daemon thread running every job added, each when due (module docstring). It starts
    with the first job and ends once the last is removed; the next job starts a new one."""

    def __init__(self, name: str = THREAD_NAME) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._jobs: list[Job] = []
        self._thread: threading.Thread | None = None
        if hasattr(os, "register_at_fork"):
            hook = weakref.WeakMethod(self._after_fork_in_child)

            def after_fork_in_child() -> None:
                method = hook()
                if method is not None:
                    method()

            os.register_at_fork(after_in_child=after_fork_in_child)

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def add(self, job: Job) -> None:
        """Run ``job`` from now on, starting the thread if none runs."""
        with self._lock:
            self._jobs.append(job)
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                try:
                    thread.start()
                    self._thread = thread
                except RuntimeError:  # interpreter finalising: flush and shutdown still export
                    _logger.debug("elastic-otel: export thread not started", exc_info=True)
        self._wake.set()  # the new job may be due before the thread's sleep ends

    def remove(self, job: Job) -> None:
        """Stop running ``job``; the thread ends when no job is left."""
        with self._lock:
            if job in self._jobs:
                self._jobs.remove(job)
        self._wake.set()

    def wake(self) -> None:
        """Have the thread look at its jobs now (a queue holds a batch). Never blocks."""
        if not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        name_native_thread(self.name)
        me = threading.current_thread()
        while True:
            self._wake.clear()  # before the jobs run: a wake-up meanwhile cuts the sleep short
            with self._lock:
                jobs = tuple(self._jobs)
                if not jobs or self._thread is not me:
                    if self._thread is me:
                        self._thread = None
                    return
            now = time.monotonic()
            for job in jobs:
                try:
                    job.run(now)
                except Exception:  # one job's failure must not stop the others' exports
                    _logger.debug("elastic-otel: export job failed", exc_info=True)
            due = min(job.due_at() for job in jobs)
            self._wake.wait(max(0.0, due - time.monotonic()))

    def _after_fork_in_child(self) -> None:
        # The thread did not survive the fork, and the jobs hold the parent's records and
        # exporters: not the child's to send. Their locks may have been held at the fork.
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.after_fork_in_child()
