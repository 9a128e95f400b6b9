"""Replay torch elastic events found in log files as OpenTelemetry spans and logs.

:class:`Replayer` streams each file (plain, gzip or standard input), finds the ``Event`` /
``RdzvEvent`` JSON objects in its lines, whatever prefix they carry, and feeds them to the live
bridge's own :class:`~elastic_otel.bridge.conversion.Conversion`, with a trace model and an
emitter per file (one file is one agent's log). What replay adds is only what a file needs:
finding the events, their times, the ``--run-id`` filter. Design: ``docs/cli.md`` (replay).
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import logging
import os
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, cast

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from elastic_otel.bridge.conversion import Conversion
from elastic_otel.config import environment
from elastic_otel.emit.emitter import Emitter
from elastic_otel.emit.otlp_json import OtlpJsonFileLogExporter, OtlpJsonFileSpanExporter
from elastic_otel.emit.pipeline import Pipeline, build_resource
from elastic_otel.model.spans import Output
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.names import environment_variables as env
from elastic_otel.parsing.torch_events import EventKind
from elastic_otel.version import __version__

STDIN = "-"

SKIP_NO_EVENT = "no event"
SKIP_INVALID_JSON = "invalid JSON"
SKIP_NOT_EVENT = "JSON that is not an event"
SKIP_OTHER_RUN = "event of another run id"
SKIP_UNPARSED = "event that could not be parsed"

_MAX_OBJECTS_PER_LINE = 64
_decoder = json.JSONDecoder()


# --- finding events in a line ---------------------------------------------------------------


def is_event(obj: object) -> bool:
    """Whether a decoded JSON object has the shape of torch's Event or RdzvEvent."""
    if not isinstance(obj, dict):
        return False
    if "name" in obj and "source" in obj:
        return True
    return "node_state" in obj and "run_id" in obj and "message" in obj


def find_events(text: str) -> tuple[list[tuple[dict[str, Any], int]], str | None]:
    """Every event object in ``text`` with its offset; else why the line holds none."""
    found: list[tuple[dict[str, Any], int]] = []
    reason: str | None = None
    pos = text.find("{")
    attempts = 0
    while pos != -1 and attempts < _MAX_OBJECTS_PER_LINE:
        attempts += 1
        try:
            obj, end = _decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            reason = reason or SKIP_INVALID_JSON
            pos = text.find("{", pos + 1)
            continue
        if is_event(obj):
            found.append((obj, pos))
            pos = text.find("{", end)
        else:
            reason = SKIP_NOT_EVENT  # an object wrapping an event is searched inside too
            pos = text.find("{", pos + 1)
    if found:
        return found, None
    return found, reason or SKIP_NO_EVENT


# --- timestamps of log lines ----------------------------------------------------------------

_GLOG = re.compile(rb"\[?[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9})\b")
_ISO = re.compile(
    rb"\[?(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?"
    rb"\s?(Z|[+-]\d\d:?\d\d)?"
)
_PREFIX = re.compile(rb"\[[\w.\-/]{1,64}\]:\s?")  # torchrun's worker prefix, e.g. [default0]:


def header_time_ns(line: bytes, year: int) -> int | None:
    """Time in a glog (``I1121 23:23:40.128000``, the year is ``year``) or ISO 8601 header."""
    m = _PREFIX.match(line)
    if m:
        line = line[m.end() :]
    try:
        m = _GLOG.match(line)
        if m:
            month, day, hour, minute, second = (int(g) for g in m.groups()[:5])
            frac = m[6].decode()
            stamp = dt.datetime(year, month, day, hour, minute, second).timestamp()
            return int(stamp) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])
        m = _ISO.match(line)
        if m:
            y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
            frac = (m[7] or b"").decode()
            tz = _tz(m[8])
            stamp = dt.datetime(y, mo, d, h, mi, s, tzinfo=tz).timestamp()
            return int(stamp) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])
    except (ValueError, OverflowError):  # 31 Feb, year 0, ...
        return None
    return None


def _tz(raw: bytes | None) -> dt.tzinfo | None:
    if not raw:
        return None  # local time, as glog and Python's logging write it
    if raw == b"Z":
        return dt.timezone.utc
    text = raw.decode().replace(":", "")
    sign = -1 if text[0] == "-" else 1
    return dt.timezone(sign * dt.timedelta(hours=int(text[1:3]), minutes=int(text[3:5])))


_HEADER_START = frozenset(b"IWEF[0123456789")
_HEADER_LOOKBACK_LINES = 64


def header_line_before(data: bytes, end: int, year: int) -> bytes | None:
    """The nearest of the (at most 64) lines before offset ``end`` that has a time header."""
    stop = end - 1 if end > 0 and data[end - 1 : end] == b"\n" else end
    for _ in range(_HEADER_LOOKBACK_LINES):
        if stop <= 0:
            return None
        begin = data.rfind(b"\n", 0, stop) + 1
        if begin < stop and data[begin] in _HEADER_START:
            line = data[begin:stop]
            if header_time_ns(line, year) is not None:
                return line
        stop = begin - 1
    return None


class LineClock:
    """Times for events without their own, in one file's order."""

    def __init__(self, year: int, base_ns: int) -> None:
        self.year = year
        self.base_ns = base_ns
        self.last_ns: int | None = None
        self.real = False  # a real time was seen: synthetic steps stay small
        self.pending: bytes | None = None  # a recent line with a header, not yet used

    def time_for(self, line: bytes) -> int:
        """The event line's own header time; else that of the latest header line ahead of it
        (``pending``) when it is newer than the last time used; else a synthetic time."""
        own = header_time_ns(line, self.year)
        if own is not None:
            self.pending = None
            return self.observe(own)
        candidate, self.pending = self.pending, None
        if candidate is not None:
            seen = header_time_ns(candidate, self.year)
            if seen is not None and (self.last_ns is None or seen > self.last_ns):
                return self.observe(seen)
        if self.last_ns is None:
            self.last_ns = self.base_ns
        else:
            self.last_ns += 1_000 if self.real else 1_000_000
        return self.last_ns

    def observe(self, time_ns: int) -> int:
        self.real = True
        self.last_ns = time_ns
        return time_ns


# --- input ----------------------------------------------------------------------------------


@dataclass
class Source:
    """One input: its name, a binary line stream, and what the progress bar needs."""

    name: str
    stream: IO[bytes]
    size: int | None  # bytes on disk (compressed size for gzip), None for stdin
    position: Callable[[], int]
    year: int
    base_ns: int


@contextmanager
def open_source(path: str) -> Iterator[Source]:
    """Open ``path`` (or ``-``) for replay; gzip is recognised by its magic bytes."""
    if path == STDIN:
        raw = sys.stdin.buffer
        now = time.time()
        stream: IO[bytes] = raw
        if _starts_with_gzip_magic(raw):
            stream = cast(IO[bytes], gzip.GzipFile(fileobj=raw))
        yield Source(
            "<stdin>",
            stream,
            None,
            lambda: 0,
            dt.datetime.fromtimestamp(now).year,
            int(now * 1e9),
        )
        return
    raw_file = open(path, "rb")  # noqa: SIM115 - closed below
    try:
        stat = os.fstat(raw_file.fileno())
        stream = raw_file
        if _starts_with_gzip_magic(raw_file):
            stream = cast(IO[bytes], gzip.GzipFile(fileobj=raw_file))
        yield Source(
            path,
            stream,
            stat.st_size,
            raw_file.tell,
            dt.datetime.fromtimestamp(stat.st_mtime).year,
            int(stat.st_mtime * 1e9),
        )
    finally:
        raw_file.close()


def _starts_with_gzip_magic(stream: Any) -> bool:
    peek = getattr(stream, "peek", None)
    return callable(peek) and peek(2)[:2] == b"\x1f\x8b"


# --- replay ---------------------------------------------------------------------------------


@dataclass
class ReplayStats:
    files: int = 0
    lines: int = 0
    bytes: int = 0
    events: Counter[str] = field(default_factory=Counter)  # by kind
    skipped: Counter[str] = field(default_factory=Counter)  # lines (or events) by reason
    spans: int = 0
    logs: int = 0
    run_ids: Counter[str] = field(default_factory=Counter)

    @property
    def found(self) -> int:
        return sum(self.events.values())


class Progress:
    """A one-line progress bar on a stream, redrawn at most a few times a second."""

    def __init__(self, stream: IO[str], interval_s: float = 0.2) -> None:
        self.stream = stream
        self.interval_s = interval_s
        self._next = 0.0
        self._start = time.monotonic()
        self._drawn = False

    def update(
        self, name: str, done: int, total: int | None, stats: ReplayStats, force: bool = False
    ) -> None:
        now = time.monotonic()
        if now < self._next and not force:
            return
        self._next = now + self.interval_s
        rate = stats.bytes / max(now - self._start, 1e-6) / 1e6
        if total:
            frac = min(done / total, 1.0)
            filled = int(frac * 24)
            head = f"[{'#' * filled}{'.' * (24 - filled)}] {frac * 100:5.1f}%"
        else:
            head = f"{stats.bytes / 1e6:,.1f} MB"
        line = (
            f"\rreplay {os.path.basename(name)} {head}  {stats.lines:,} lines  "
            f"{stats.found:,} events  {rate:,.0f} MB/s"
        )
        self.stream.write(line.ljust(100)[:120])
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()


_BLOCK = 1 << 20
_MAX_LINE = 64 << 20  # a longer "line" is cut: no event is that large


@dataclass
class _FileState:
    emitter: Emitter
    model: TraceModel
    source: Source
    clock: LineClock = field(init=False)
    conversion: Conversion = field(init=False)  # the live bridge's, on this file's model

    def __post_init__(self) -> None:
        self.clock = LineClock(self.source.year, self.source.base_ns)
        self.conversion = Conversion(self.model, self.emitter)


class Replayer:
    """Feeds the events of one or more log files through models into an emitter."""

    def __init__(
        self,
        emitter_for: Callable[[Source], Emitter],
        salt: str = "",
        run_id: str | None = None,
        flush: Callable[[], None] | None = None,
        flush_every: int = 1024,
        progress: Progress | None = None,
    ) -> None:
        self.emitter_for = emitter_for
        self.salt = salt
        self.run_id = run_id
        self.flush = flush
        self.flush_every = max(1, flush_every)
        self.progress = progress
        self.stats = ReplayStats()
        self._since_flush = 0
        self._candidates = 0  # lines that looked like they might hold an event

    def replay(self, source: Source) -> None:
        """Replay one file: its own trace model, closed at the file's end."""
        stats = self.stats
        stats.files += 1
        lines_before, candidates_before = stats.lines, self._candidates
        file = _FileState(
            self.emitter_for(source),
            TraceModel(
                salt=self.salt,
                heartbeat_logs=environment.env_flag(env.ELASTIC_OTEL_HEARTBEAT_LOGS, True),
                round_trace_max_nodes=environment.env_int(
                    env.ELASTIC_OTEL_ROUND_TRACE_MAX_NODES, env.DEFAULT_ROUND_TRACE_MAX_NODES
                ),
            ),
            source,
        )
        carry = b""
        while True:
            block = source.stream.read(_BLOCK)
            if not block:
                break
            data = carry + block if carry else block
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) < _MAX_LINE:
                carry = data  # no line ends here yet
                continue
            cut = cut or len(data)
            carry = data[cut:]
            self._block(data, cut, file)
            if self.progress is not None:
                self.progress.update(source.name, source.position(), source.size, stats)
        if carry:
            self._block(carry + b"\n", len(carry) + 1, file)
        no_event = (stats.lines - lines_before) - (self._candidates - candidates_before)
        stats.skipped[SKIP_NO_EVENT] += no_event
        if self.progress is not None:
            self.progress.update(source.name, source.position(), source.size, stats, True)
        clock = file.clock
        end = clock.last_ns if clock.last_ns is not None else source.base_ns
        self._count(file.conversion.end_all(end, "end of the replayed log"), file.emitter)

    def _block(self, data: bytes, end: int, file: _FileState) -> None:
        """The complete lines ``data[:end]``: only lines naming ``"name"`` are looked at."""
        stats = self.stats
        stats.lines += data.count(b"\n", 0, end)
        stats.bytes += end
        clock = file.clock
        pos = data.find(b'"name"', 0, end)
        while pos != -1:
            start = data.rfind(b"\n", 0, pos) + 1
            stop = data.find(b"\n", pos, end)
            stop = end if stop == -1 else stop
            line = data[start:stop]
            if b"{" in line:
                self._candidates += 1
                if header_time_ns(line, clock.year) is None:
                    before = header_line_before(data, start, clock.year)
                    if before is not None:
                        clock.pending = before
                self._line(line, file)
            pos = data.find(b'"name"', stop + 1, end) if stop < end else -1
        latest = header_line_before(data, end, clock.year)
        if latest is not None:
            clock.pending = latest  # for an event in the next block

    def _line(self, line: bytes, file: _FileState) -> None:
        stats = self.stats
        text = line.decode("utf-8", "replace")
        found, reason = find_events(text)
        if reason is not None:
            stats.skipped[reason] += 1
            return
        created = file.clock.time_for(line)
        for obj, _ in found:
            event = file.conversion.parse(obj, created)
            if event.kind is EventKind.UNPARSED:
                stats.skipped[SKIP_UNPARSED] += 1
                continue
            if event.time_ns != created:
                file.clock.observe(event.time_ns)  # the event carried its own timestamp
            if self.run_id is not None and event.run_id != self.run_id:
                stats.skipped[SKIP_OTHER_RUN] += 1
                continue
            stats.events[event.kind.value] += 1
            stats.run_ids[event.run_id] += 1
            self._count(file.conversion.convert(event), file.emitter)

    def _count(self, out: Output, emitter: Emitter) -> None:
        """Count what the conversion emitted; flush the exporters every ``flush_every``."""
        stats = self.stats
        n_spans = len(out.spans) if emitter.span_processor is not None else 0
        n_logs = len(out.logs) if emitter.logger is not None else 0
        stats.spans += n_spans
        stats.logs += n_logs
        self._since_flush += n_spans + n_logs
        if self.flush is not None and self._since_flush >= self.flush_every:
            self._since_flush = 0
            self.flush()  # back-pressure: the batch queues must never overflow


def source_resource(base: Resource, source: Source) -> Resource:
    """The span resource of one replayed file: one agent process, named after its log."""
    name = os.path.basename(source.name)
    instance = str(uuid.uuid5(uuid.NAMESPACE_URL, os.path.abspath(source.name)))
    return base.merge(
        Resource(
            {
                "service.instance.id": instance,
                "log.file.name": name,
                "log.file.path": source.name,
            }
        )
    )


def default_emitter_factory(logger: Any, span_processor: Any, resource: Resource) -> Callable:
    # exceptions go where the live bridge would put them
    signal = environment.env_exception_signal()

    def make(source: Source) -> Emitter:
        resource_of = source_resource(resource, source)
        return Emitter(logger, span_processor, resource_of, __version__, signal)

    return make


# --- export ---------------------------------------------------------------------------------


class ExportError(RuntimeError):
    """The telemetry could not be exported."""


class ExportProblems(logging.Handler):
    """The SDK reports export problems only by logging: keep the first, keep them off stderr."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.first = ""

    def emit(self, record: logging.LogRecord) -> None:
        if self.first:
            return
        args = record.args
        if isinstance(record.msg, str) and "export problem" in record.msg and args:
            detail = str(args[0] if isinstance(args, tuple) else args)  # elastic-otel's summary
        else:
            try:
                detail = record.getMessage()
            except Exception:
                detail = str(record.msg)
        self.first = (detail.strip().splitlines() or ["export failed"])[0]


@contextmanager
def capture_export_problems() -> Iterator[ExportProblems]:
    logger = logging.getLogger("opentelemetry")
    handler = ExportProblems()
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


class PipelineSink:
    """The environment's pipeline (:func:`elastic_otel.emit.pipeline.build_pipeline`) as a sink."""

    def __init__(self, pipeline: Pipeline, description: str) -> None:
        self.pipeline = pipeline
        self.description = description
        self.logger = pipeline.logger
        self.span_processor = pipeline.span_processor
        self.resource = pipeline.resource

    def flush(self, timeout_s: float) -> bool:
        return self.pipeline.flush(timeout_s)

    def shutdown(self, timeout_s: float) -> bool:
        return self.pipeline.shutdown(timeout_s)

    def failing(self) -> bool:
        """Exports failed and records are still waiting for the collector."""
        return self.pipeline.delivery.export_failed_attempts > 0 and self.pipeline.pending() > 0

    def delivered(self) -> int | None:
        return self.pipeline.delivery.exported if self.pipeline.owned else None


class FileSink:
    """Spans and logs into one new OTLP JSON file, through the SDK's batch processors."""

    def __init__(self, path: str) -> None:
        open(path, "w").close()  # a replay writes a new file
        self.description = path
        self.resource = build_resource()
        self._span_exporter = OtlpJsonFileSpanExporter(path)
        self._log_exporter = OtlpJsonFileLogExporter(path)
        self._provider = LoggerProvider(resource=self.resource, shutdown_on_exit=False)
        self._provider.add_log_record_processor(BatchLogRecordProcessor(self._log_exporter))
        self.logger = self._provider.get_logger("elastic_otel", __version__)
        self.span_processor = BatchSpanProcessor(self._span_exporter)

    def flush(self, timeout_s: float) -> bool:
        millis = int(timeout_s * 1000)
        spans_ok = self.span_processor.force_flush(millis)
        return bool(self._provider.force_flush(millis)) and spans_ok

    def shutdown(self, timeout_s: float) -> bool:
        ok = self.flush(timeout_s)
        self.span_processor.shutdown()
        self._provider.shutdown()
        return ok

    def failing(self) -> bool:
        return bool(self._span_exporter.failed or self._log_exporter.failed)

    def delivered(self) -> int | None:
        return self._span_exporter.exported + self._log_exporter.exported


def batch_queue_limit() -> int:
    """The smaller of the span and log batch queue sizes (``OTEL_BSP/BLRP_MAX_QUEUE_SIZE``)."""
    sizes = []
    for name in ("OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BLRP_MAX_QUEUE_SIZE"):
        raw = os.environ.get(name, "").strip()
        try:
            sizes.append(int(raw) if raw else 2048)
        except ValueError:
            sizes.append(2048)
    return max(1, min(sizes))


def replay_files(
    paths: list[str],
    sink: PipelineSink | FileSink,
    salt: str = "",
    run_id: str | None = None,
    progress: Progress | None = None,
    flush_timeout_s: float = 30.0,
) -> ReplayStats:
    """Replay ``paths`` into ``sink`` and shut it down; :class:`ExportError` if export fails.

    The sink is flushed whenever half a batch queue was emitted, so a replay faster than the
    exporter waits for it instead of overflowing the queues (which would drop records).
    """
    with capture_export_problems() as problems:

        def check(finished: bool) -> None:
            if sink.failing():
                raise ExportError(problems.first or "export failed")
            if not finished:
                raise ExportError(f"export did not finish within {flush_timeout_s:g}s")

        replayer = Replayer(
            default_emitter_factory(sink.logger, sink.span_processor, sink.resource),
            salt=salt,
            run_id=run_id,
            flush=lambda: check(sink.flush(flush_timeout_s)),
            flush_every=batch_queue_limit() // 2,
            progress=progress,
        )
        finished = False
        try:
            for path in paths:
                with open_source(path) as source:
                    replayer.replay(source)
            check(sink.flush(flush_timeout_s))
        finally:
            if progress is not None:
                progress.close()
            finished = sink.shutdown(flush_timeout_s)
        check(finished)
    return replayer.stats
