"""The bridge's loop: the one consumer of the event queue, owner of the trace model, and the
agent's one thread for what is due by time.

torch's threads only append to a bounded deque (:meth:`EventThread.put`); one thread takes
events off it and hands them to a :class:`Sink` (parsing, the trace model, emission). While
events come, the thread polls every 50 ms and torch's thread wakes it only for a backlog:
waking a sleeping thread per event costs the caller a system call and often a context switch.
After a poll that found nothing it sleeps until the next :class:`Task` is due (a second at
most: the sink's time-driven work looks once a second), and the next event wakes it.

The same thread runs the agent's periodic work, each :class:`Task` when it is due (the
workers' output, the training watch), and reads the signal wakeup fd (:meth:`watch_fd`), so
that a SIGTERM is seen while torch blocks in C++: one thread instead of four
(``docs/architecture.md``, Threads). Nothing on it waits on the network: exports have a
thread of their own.

Closing is a request to the event thread, not work done beside it: :meth:`EventThread.close`
asks it to process what is queued and then :meth:`Sink.close` (end open spans), and waits.
Events that arrive afterwards, and those still queued when the exit timeout runs out, are
counted (``dropped_after_shutdown``), never fed to a model being closed on another thread.
Only when no event thread runs (it could not be started, or was lost at interpreter
shutdown) does the caller process inline, under a lock.
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Protocol

from elastic_otel.emit.counters import EventCounters
from elastic_otel.emit.export_thread import name_native_thread
from elastic_otel.names import environment_variables as env

_logger = logging.getLogger("elastic_otel")

THREAD_NAME = "elastic-otel"

_POLL_S = 0.05
_IDLE_S = 1.0
"""How long the event thread sleeps at most after a poll that found nothing: the sink's
time-driven work (stall reports, open-span snapshots) looks at most once a second."""
_WAKE_BACKLOG = 256
_TASK_RETRY_S = 1.0
"""When a task that raised runs again."""
_bridge_thread = threading.local()


class Sink(Protocol):
    """What the event thread feeds: called on the event thread only."""

    def process(self, payload: object, created: float) -> None:
        """Convert and emit one event recorded at ``created`` (seconds since the epoch)."""

    def close(self, reason: str, error: bool) -> None:
        """End everything still open; no :meth:`process` call follows."""

    def tick(self, now_ns: int) -> None:
        """Called after every poll (every 50 ms while events come, else at least once a
        second) with the wall clock: time-driven output."""


class Task(Protocol):
    """Periodic work run on the event thread (:meth:`EventThread.schedule`)."""

    def run(self) -> float | None:
        """Do what is due; the seconds until it is due again, or ``None`` when it has nothing
        left to do (until it is scheduled again). Runs outside :func:`bridge_section`: the
        events it records are queued like torch's. It must not block."""


def inside_bridge() -> bool:
    """Whether this thread is running bridge code (a log record it causes must not loop back)."""
    return bool(getattr(_bridge_thread, "inside", False))


@contextmanager
def bridge_section() -> Iterator[None]:
    """Mark this thread as running bridge code (see :func:`inside_bridge`)."""
    previous = inside_bridge()
    _bridge_thread.inside = True
    try:
        yield
    finally:
        _bridge_thread.inside = previous


class EventThread:
    """A bounded queue from torch's threads to one event thread feeding ``sink``, which also
    runs the scheduled :class:`Task` objects and reads the watched descriptors."""

    def __init__(self, sink: Sink, counters: EventCounters, queue_size: int) -> None:
        self.sink = sink
        self.counters = counters
        self.queue_size = max(1, queue_size)
        self._queue: deque[tuple[object, float]] = deque()
        self._idle = threading.Condition(threading.Lock())
        self._busy = False
        self._inline = threading.Lock()  # processing when no event thread runs
        self._calls: deque[_Call] = deque()
        self._appended = 0  # events put on the queue (approximate: torch's threads race it)
        self._taken = 0  # events taken off it, by the owner thread only
        self._closed = threading.Event()
        self._stopped = False
        self._asleep = False  # the event thread sleeps past a poll: the next put wakes it
        self._warned_drop = False
        self._warned_error = False
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1  # the pipe that wakes the thread
        self._woken = False  # a byte is in that pipe
        self._requests: deque[tuple[Task, float]] = deque()  # schedule() from any thread
        self._tasks: dict[Task, float] = {}  # the owner thread's: task → when due (monotonic)
        self._fds: dict[int, Callable[[], bool]] = {}  # descriptor → what reads it

    def start(self) -> None:
        try:
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            os.set_blocking(self._wake_w, False)
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self._thread.start()
        except (OSError, RuntimeError):  # no descriptor left, or interpreter shutting down:
            self._thread = None  # events are processed inline

    # --- torch's threads --------------------------------------------------------------------

    def put(self, payload: object, created: float) -> None:
        """Queue one event; never blocks. Past the bound, or once closed, it is counted."""
        if self._closed.is_set():
            self.counters.dropped_after_shutdown += 1
            return
        queue = self._queue
        if len(queue) >= self.queue_size:
            self.counters.dropped_queue_full += 1
            if not self._warned_drop:
                self._warned_drop = True
                _logger.warning(
                    "elastic-otel: event queue full (%d); dropping events, see "
                    "elastic_otel.stats() (raise %s)",
                    self.queue_size,
                    env.ELASTIC_OTEL_QUEUE_SIZE,
                )
            return
        queue.append((payload, created))
        self._appended += 1
        if self._closed.is_set():  # closed between the check above and the append
            self._drop_queued()
            return
        if self._asleep or len(queue) >= _WAKE_BACKLOG:
            self._asleep = False
            self._wake()

    # --- any thread -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def thread_alive(self) -> bool:
        """Whether the event thread runs (else events are processed inline)."""
        return self._thread is not None and self._thread.is_alive()

    def on_thread(self) -> bool:
        """Whether the caller is the event thread itself (a task, a watched descriptor)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def schedule(self, task: Task, delay_s: float = 0.0) -> bool:
        """Run ``task`` on the event thread in ``delay_s`` seconds (sooner if it was due
        sooner); ``False`` when no event thread runs to run it."""
        if not self.thread_alive or self._stopped:
            return False
        self._requests.append((task, delay_s))
        self._wake()
        return True

    def watch_fd(self, fd: int, on_readable: Callable[[], bool]) -> bool:
        """Call ``on_readable()`` on the event thread whenever ``fd`` can be read (it must
        read it without blocking, and return ``False`` to stop watching, at its end);
        ``False`` when no event thread runs."""
        if not self.thread_alive:
            return False
        self._fds = {**self._fds, fd: on_readable}  # replaced whole: the thread iterates it
        self._wake()
        return True

    def drain(self, timeout_s: float) -> bool:
        """Wait until everything queued so far was processed; ``False`` on timeout."""
        if not self.thread_alive or self.on_thread():
            with self._inline, bridge_section():
                self._process_queue()
            return True
        deadline = time.monotonic() + timeout_s
        self._wake()
        with self._idle:
            while self._queue or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(min(remaining, _POLL_S))
                self._wake()
        return True

    def call(self, fn: Callable[[], None], timeout_s: float) -> bool:
        """Run ``fn`` on the owner thread once what is queued now was processed, and wait.

        ``False`` on timeout: ``fn`` may still run later; the caller must not touch the
        sink's state meanwhile. Never raises what ``fn`` raises (it is counted).
        """
        call = _Call(fn, self._appended)
        if not self.thread_alive or self.on_thread():
            with self._inline, bridge_section():
                self._process_queue()
                call.run(self.counters)
            return True
        self._calls.append(call)
        self._wake()
        return call.done.wait(timeout_s)

    def close(self, reason: str, error: bool, timeout_s: float) -> bool:
        """Process what is queued, then close the sink, on the event thread; ``False`` on timeout.

        On timeout the sink is left alone (the event thread may still be inside it); what it had
        not processed is lost with the process, and counted by the pipeline at its shutdown.
        """
        if self._closed.is_set():
            return True

        def close_sink() -> None:
            try:
                self.sink.close(reason, error)
            finally:
                self._closed.set()

        if self.call(close_sink, timeout_s):
            return True
        # Out of time (a backlog, or a sink stuck in the SDK): what is still queued will not be
        # processed; count it, and whatever comes later, instead of losing it silently.
        self._closed.set()
        self._drop_queued()
        return False

    def _drop_queued(self) -> None:
        """Count what is queued as dropped at shutdown (each item is popped by one thread)."""
        queue = self._queue
        while True:
            try:
                queue.popleft()
            except IndexError:
                return
            self.counters.dropped_after_shutdown += 1

    def stop(self) -> None:
        """Let the event thread end (after :meth:`close`); its tasks stop with it."""
        self._stopped = True
        self._wake()

    def after_fork_in_child(self) -> None:
        """In a forked child, where this thread does not run: close its wake-up pipe."""
        fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        self._thread = None
        for fd in fds:
            if fd >= 0:
                with suppress(OSError):
                    os.close(fd)

    def _wake(self) -> None:
        fd = self._wake_w
        if self._woken or fd < 0:
            return
        self._woken = True
        with suppress(OSError):  # the pipe is full: the thread has a wake-up to read anyway
            os.write(fd, b"\0")

    # --- the event thread ------------------------------------------------------------------

    def _run(self) -> None:
        name_native_thread(THREAD_NAME)
        _bridge_thread.inside = True
        found = True
        poller, polled = self._poller()  # with what was watched before the thread ran
        try:
            while not self._stopped:
                if polled is not self._fds:
                    poller, polled = self._poller()
                # Asleep first, the queue looked at second: a put between the two sees the flag.
                self._asleep = not found
                wait = _POLL_S if found or self._queue else _IDLE_S
                if self._tasks:
                    wait = min(wait, min(self._tasks.values()) - time.monotonic())
                ready = poller.poll(math.ceil(wait * 1000) if wait > 0 else 0)
                self._asleep = False
                found = bool(self._queue or self._calls)
                with self._idle:
                    self._busy = True
                try:
                    self._turn(ready)
                except BaseException:  # keep the event thread alive whatever happens
                    self.counters.internal_errors += 1
                finally:
                    with self._idle:
                        self._busy = False
                        self._idle.notify_all()
        finally:
            self.after_fork_in_child()  # not a fork: the same clean-up, the thread ending

    def _poller(self) -> tuple[select.poll, dict[int, Callable[[], bool]]]:
        fds = self._fds
        poller = select.poll()
        for fd in (self._wake_r, *fds):
            poller.register(fd, select.POLLIN)
        return poller, fds

    def _turn(self, ready: list[tuple[int, int]]) -> None:
        for fd, mask in ready:
            if fd == self._wake_r:
                self._woken = False  # before the read: a later wake-up writes again
                with suppress(OSError):
                    os.read(fd, 4096)
            elif (on_readable := self._fds.get(fd)) is not None:
                try:
                    keep = not mask & select.POLLNVAL and on_readable()
                except Exception:
                    self.counters.internal_errors += 1
                    keep = False
                if not keep:  # its end, or it fails: polled again, it would spin
                    self._fds = {k: v for k, v in self._fds.items() if k != fd}
        self._process_queue()
        while self._calls:
            self._calls.popleft().run(self.counters)
            self._process_queue()  # after a close: counted, not processed
        self._run_tasks()
        if not self._closed.is_set():
            self.sink.tick(time.time_ns())

    def _run_tasks(self) -> None:
        tasks, requests = self._tasks, self._requests
        now = time.monotonic()
        while requests:
            task, delay_s = requests.popleft()
            tasks[task] = min(now + delay_s, tasks.get(task, now + delay_s))
        for task, due in list(tasks.items()):
            if due > now:
                continue
            _bridge_thread.inside = False
            try:
                after = task.run()
            except Exception:
                self.counters.internal_errors += 1
                _logger.debug("elastic-otel: a task on the event thread failed", exc_info=True)
                after = _TASK_RETRY_S
            finally:
                _bridge_thread.inside = True
            if after is None:
                del tasks[task]
            else:
                tasks[task] = time.monotonic() + max(0.0, after)

    def _process_queue(self) -> None:
        queue, calls, closed = self._queue, self._calls, self._closed
        while queue:
            if closed.is_set():  # put() raced the close, or the exit ran out of time
                self._drop_queued()
                return
            if calls and self._taken >= calls[0].after:
                return  # what was queued before the call is done: the call goes first
            try:
                payload, created = queue.popleft()
            except IndexError:
                return
            self._taken += 1
            try:
                self.sink.process(payload, created)
            except Exception:
                self.counters.internal_errors += 1
                if not self._warned_error:
                    self._warned_error = True
                    _logger.warning("elastic-otel: failed to convert an event", exc_info=True)


class _Call:
    """A function to run on the owner thread, and the event its caller waits on."""

    __slots__ = ("after", "done", "fn")

    def __init__(self, fn: Callable[[], None], after: int) -> None:
        self.fn = fn
        self.after = after  # run once this many events were taken off the queue
        self.done = threading.Event()

    def run(self, counters: EventCounters) -> None:
        try:
            self.fn()
        except Exception:
            counters.internal_errors += 1
            _logger.warning("elastic-otel: failed to end open spans", exc_info=True)
        finally:
            self.done.set()
