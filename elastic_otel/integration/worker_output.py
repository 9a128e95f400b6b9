"""Every worker's stdout and stderr as log records on its ``worker`` span, with nothing changed
for the job or its console.

The instrumented agent wraps the agent's ``LogsSpecs`` (:func:`capture_logs_specs`): a captured
stream torch would send to the console or to ``/dev/null`` goes to the file ``--redirects``
would have used, and the agent echoes to its console exactly what torch would have shown. The
bridge's event thread reads every file (:class:`WorkerOutput`, one of its tasks); a worker
never writes to a pipe the agent could block, nor the agent to a console that would block it.
Design: ``docs/worker-output.md`` (How it works, and why this way).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import stat
import sys
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any

from elastic_otel.bridge.event_thread import bridge_section
from elastic_otel.bridge.handler import OtelHandler
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from elastic_otel.parsing.worker_output import STDERR, STDOUT, OutputReader, RateLimit

_logger = logging.getLogger("elastic_otel")

POLL_S = 0.1
"""How often the files are read while workers write (torch's ``TailLog`` reads its every 0.1 s
too)."""
QUIET_POLL_S = 0.5
"""How often once no worker wrote for :data:`QUIET_AFTER_S`: an agent of 8 quiet workers polled
16 files ten times a second, its largest CPU cost but one (BENCHMARKS.md, section 13); a line
after a quiet spell reaches the console up to this late. A worker's end is read at once."""
QUIET_AFTER_S = 2.0
CHUNK = 65536
READ_PER_POLL = 1024 * 1024
"""Bytes read of one file per poll at most: what a worker writes faster waits on disk, and the
next poll comes at once, after the events and signals that came meanwhile (the event thread
reads every file: a poll of 16 busy files stays within some tens of milliseconds)."""
DRAIN_TIMEOUT_S = 10.0
"""How long closing a worker group waits for its files to be read to their end."""
_KEPT_READERS = 256  # readers of ended streams kept for their last words


class _Stream:
    """One captured stream of one worker: its file, where it is echoed, its reader."""

    __slots__ = (
        "attributes",
        "context",
        "done",
        "echo",
        "emitter",
        "fd",
        "finishing",
        "path",
        "reader",
        "unechoed",
    )

    def __init__(
        self, path: str, echo: bool, reader: OutputReader, attributes: dict, context: Any
    ) -> None:
        self.path = path
        self.echo = echo
        self.reader = reader
        self.attributes = attributes
        self.context = context  # the worker span's OpenTelemetry context, or None
        self.fd: int | None = None
        self.emitter: Any = None
        self.finishing = False
        self.done = False
        self.unechoed = b""  # read, not yet taken by the console


class WorkerOutput:
    """The agent's one reader of its workers' output files (see the module docstring): a task
    on the bridge's event thread, held by the agent instrumentation's observer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._reading = threading.Lock()  # one pass at a time: the event thread's, or finish()'s
        self._streams: list[_Stream] = []
        self._ended: OrderedDict[str, OutputReader] = OrderedDict()
        self._scheduled = False  # a task on the handler's event thread
        self._wrote = 0.0  # when a worker last wrote (monotonic)
        self.handler: OtelHandler | None = None
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)  # the hook must not keep a dropped reader alive

            def after_fork_in_child() -> None:
                output = ref()
                if output is not None:
                    output._after_fork_in_child()

            os.register_at_fork(after_in_child=after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._reading = threading.Lock()
        self._streams = []
        self._scheduled = False

    # --- the agent's side -------------------------------------------------------------------

    def add(self, streams: list[_Stream], handler: OtelHandler) -> None:
        with self._lock:
            self.handler = handler
            self._streams.extend(streams)
            self._wrote = time.monotonic()
            if not self._scheduled:
                self._scheduled = handler.schedule(self)

    def finish(self, paths: set[str], timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """The processes writing ``paths`` ended: read those files to their end, and wait for
        it (``False`` after ``timeout_s``; the event thread then goes on reading them)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            mine = [s for s in self._streams if s.path in paths]
            for stream in mine:
                stream.finishing = True
            handler = self.handler
        if handler is None or not handler.schedule(self):  # no event thread: read them here
            while any(not s.done for s in mine) and time.monotonic() < deadline:
                self._read_all()
        with self._lock:
            while not all(s.done for s in mine):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._done.wait(min(left, POLL_S))
        return True

    def reader(self, path: str) -> OutputReader | None:
        """The reader of the stream written to ``path`` (running or ended)."""
        with self._lock:
            for stream in self._streams:
                if stream.path == path:
                    return stream.reader
            return self._ended.get(path)

    # --- the event thread -------------------------------------------------------------------

    def run(self) -> float | None:
        """Read every file once (a task of the event thread): when to read again, or ``None``
        once no stream is left (:meth:`add` schedules it again)."""
        with self._lock:
            if not self._streams:
                self._scheduled = False
                return None
        with bridge_section():  # what the SDK logs from here must not loop into the bridge
            more = self._read_all()
        if more:
            return 0.0
        quiet = time.monotonic() - self._wrote >= QUIET_AFTER_S
        return QUIET_POLL_S if quiet else POLL_S

    def _read_all(self) -> bool:
        """One pass over the files; whether more is waiting to be read or echoed now."""
        with self._reading:
            return self._read_pass()

    def _read_pass(self) -> bool:
        with self._lock:
            streams = list(self._streams)
        more = False
        for stream in streams:
            try:
                read, left = self._pump(stream)
            except Exception:  # never the agent's problem
                stream.done = True
                _logger.debug("elastic-otel: worker output not read", exc_info=True)
                continue
            if read:
                self._wrote = time.monotonic()
            more |= left
        self._retire()
        return more

    def _retire(self) -> None:
        with self._lock:
            ended = [s for s in self._streams if s.done]
            if not ended:
                return
            self._streams = [s for s in self._streams if not s.done]
            for stream in ended:
                self._ended[stream.path] = stream.reader
                while len(self._ended) > _KEPT_READERS:
                    self._ended.popitem(last=False)
            self._done.notify_all()

    def _pump(self, stream: _Stream) -> tuple[int, bool]:
        """Read what is new in one file: the bytes read, and whether more is left now (past
        :data:`READ_PER_POLL`, or bytes the console did not take yet: the rest of the file
        waits on disk until it does)."""
        finishing = stream.finishing  # read before the file: what follows it is all there
        reader = stream.reader
        reader.limit.refill(time.monotonic_ns())
        if stream.unechoed:
            stream.unechoed = _echo(reader.stream, stream.unechoed)
            if stream.unechoed:
                return 0, True
        if stream.fd is None:
            stream.fd = _open_regular(stream.path)
            if stream.fd is None:
                if finishing:
                    stream.done = True
                return 0, False
        read = 0
        while read < READ_PER_POLL and not stream.unechoed:
            data = os.read(stream.fd, CHUNK)
            if not data:
                break
            read += len(data)
            if stream.echo:
                stream.unechoed = _echo(reader.stream, data)
            reader.feed(data)
        more = read >= READ_PER_POLL or bool(stream.unechoed)
        if finishing and not more:
            reader.end()
            os.close(stream.fd)
            stream.fd = None
            stream.done = True
        elif not read:
            reader.idle()
        self._emit(stream)
        return read, more

    def _emit(self, stream: _Stream) -> None:
        reader = stream.reader
        records = reader.take()
        handler = self.handler
        if handler is None:
            return
        dropped = reader.limit.dropped_total
        if dropped:
            reader.limit.dropped_total = 0
            handler.counters.worker_output_dropped += dropped
        if not records:
            return
        if stream.emitter is None:
            logger = handler.output_logger()
            if logger is None:
                return
            from elastic_otel.emit.worker_output import OutputEmitter

            stream.emitter = OutputEmitter(logger, stream.context, stream.attributes)
        now_ns = time.time_ns()
        for record in records:
            stream.emitter.emit(record, now_ns)
        handler.counters.worker_output_records += len(records)


def _open_regular(path: str) -> int | None:
    """A read descriptor of ``path`` if it is a regular file (a FIFO planted there must not
    hang the reader), else ``None``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _echo(stream: str, data: bytes) -> bytes:
    """Write a worker's bytes to the agent's own stream, as the worker would have; what the
    stream cannot take now is returned. A console pipe nobody drains would block a write:
    the event thread writes only what ``poll`` says fits (a pipe takes ``PIPE_BUF`` bytes
    whole once it says so)."""
    target = sys.stdout if stream == STDOUT else sys.stderr
    if target is None:
        return b""
    try:
        fd = target.fileno()
    except (AttributeError, OSError, ValueError):  # not a file: written through Python
        with contextlib.suppress(OSError, ValueError):
            target.write(data.decode("utf-8", "replace"))
            target.flush()
        return b""
    try:
        if not _writable(fd):
            return data
        target.flush()  # what the agent itself wrote comes first
        while data:
            data = data[os.write(fd, data[: select.PIPE_BUF]) :]
            if data and not _writable(fd):
                return data
    except (OSError, ValueError):  # a console gone: what it would have shown is lost with it
        pass
    return b""


def _writable(fd: int) -> bool:
    """Whether ``fd`` takes a write now; ``OSError`` when it never will (closed, no reader)."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    mask = next((m for _, m in poller.poll(0)), 0)
    if mask & (select.POLLNVAL | select.POLLERR | select.POLLHUP):
        raise OSError(f"console descriptor {fd} is gone")
    return bool(mask & select.POLLOUT)


# --- torch's LogsSpecs --------------------------------------------------------------------------


def capture_logs_specs(agent: Any, handler: OtelHandler, output: WorkerOutput) -> None:
    """Have ``agent`` start its workers with the captured streams in files that ``output``
    reads (idempotent)."""
    specs = agent._logs_specs
    if specs is None or getattr(specs, "elastic_otel_inner", None) is not None:
        return
    agent._logs_specs = _capturing_class()(specs, handler, output)


@functools.cache  # made once: torch is imported only here
def _capturing_class() -> type:
    """A ``LogsSpecs`` that delegates to the agent's own and captures."""
    from torch.distributed.elastic.multiprocessing.api import LogsSpecs

    class CapturingLogsSpecs(LogsSpecs):
        """The agent's ``LogsSpecs`` (``elastic_otel_inner``), its streams captured."""

        def __init__(  # no super(): delegates
            self, inner: Any, handler: OtelHandler, output: WorkerOutput
        ) -> None:
            self.elastic_otel_inner = inner
            self.elastic_otel_handler = handler
            self.elastic_otel_output = output

        def __getattr__(self, name: str) -> Any:  # anything else is the inner spec's
            return getattr(self.__dict__["elastic_otel_inner"], name)

        @property
        def root_log_dir(self) -> str:
            return str(self.elastic_otel_inner.root_log_dir)

        def reify(self, envs: dict[int, dict[str, str]]) -> Any:
            dest = self.elastic_otel_inner.reify(envs)
            try:
                _capture(dest, envs, self.elastic_otel_handler, self.elastic_otel_output)
            except Exception:  # never the agent's problem: torch's destinations stand
                _logger.debug("elastic-otel: worker output not captured", exc_info=True)
            return dest

        def __repr__(self) -> str:
            return repr(self.elastic_otel_inner)

    return CapturingLogsSpecs


def _capture(
    dest: Any, envs: dict[int, dict[str, str]], handler: OtelHandler, output: WorkerOutput
) -> None:
    """Redirect the captured streams of ``dest`` (torch's ``LogsDest``) and read them."""
    if not handler.can_schedule():  # nothing would read them: torch's destinations stand
        return
    settings = handler.settings
    streams: list[_Stream] = []
    for local_rank, worker_env in envs.items():
        error_file = dest.error_files.get(local_rank)
        if not error_file or error_file == os.devnull:
            continue  # --log-dir /dev/null: torch keeps nothing, neither does the bridge
        directory = os.path.dirname(error_file)
        if not os.path.isdir(directory):
            continue
        limit = RateLimit(settings.worker_output_rate)  # one per worker, both streams
        base = _attributes(worker_env, local_rank)
        context = _context(worker_env.get(env.TRACEPARENT, ""))
        for stream in settings.worker_output_streams:
            paths = dest.stdouts if stream == STDOUT else dest.stderrs
            where = paths.get(local_rank)
            if where is None:
                continue
            echo = where == ""  # torch's "to the console"
            if where in ("", os.devnull):
                where = os.path.join(directory, f"{stream}.log")
                if where in dest.stdouts.values() or where in dest.stderrs.values():
                    continue
                paths[local_rank] = where
            reader = OutputReader(
                stream, settings.worker_output_line_max, limit, keep_last=stream == STDERR
            )
            attributes = {**base, A.LOG_IOSTREAM: stream}
            streams.append(_Stream(where, echo, reader, attributes, context))
    if streams:
        output.add(streams, handler)


def _attributes(worker_env: dict[str, str], local_rank: int) -> dict[str, Any]:
    attributes: dict[str, Any] = {A.LOCAL_RANK: local_rank}
    for key, variable in (
        (A.GLOBAL_RANK, "RANK"),
        (A.AGENT_RESTARTS, "TORCHELASTIC_RESTART_COUNT"),
    ):
        with contextlib.suppress(KeyError, ValueError):
            attributes[key] = int(worker_env[variable])
    run_id = worker_env.get("TORCHELASTIC_RUN_ID")
    if run_id:
        attributes[A.RUN_ID] = run_id
    return attributes


def _context(traceparent: str) -> Any:
    """The worker span's context from the ``TRACEPARENT`` the agent gave it (``None``: none)."""
    parts = traceparent.split("-")
    if len(parts) != 4:
        return None
    try:
        trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    from elastic_otel.emit.worker_output import span_context

    return span_context(trace_id, span_id)


def finish(pcontext: Any, output: WorkerOutput) -> None:
    """torch closed ``pcontext``: read its workers' captured files to their end."""
    paths = {p for p in (*pcontext.stdouts.values(), *pcontext.stderrs.values()) if p}
    output.finish(paths)


def last_output(pcontext: Any, local_rank: int, output: WorkerOutput) -> tuple[str, str | None]:
    """A worker's last lines of stderr and the ``faulthandler`` dump it carried, if captured."""
    path = (getattr(pcontext, "stderrs", None) or {}).get(local_rank)
    reader = output.reader(path) if path else None
    if reader is None:
        return "", None
    return reader.last_words(), reader.fault_stack()
