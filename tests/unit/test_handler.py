"""handler, event_thread, conversion: the queue, the one owner thread, exit, fork, counters.

A real SDK pipeline in memory behind the real handler: a ``LoggerProvider`` with a
``SimpleLogRecordProcessor`` and a ``SimpleSpanProcessor``, their in-memory exporters wrapped
in the bridge's own outage buffers, as :func:`elastic_otel.emit.pipeline.build_pipeline` wraps the
OTLP exporters. Events are real ones, captured from a torchrun job (tests/data), fed the way
torch feeds them: ``logger.info(event.serialize())`` on torch's event logger.

To hold the event thread at a known point, the log exporter can be closed like a gate: the
event thread then blocks inside an export, as it would on a slow collector with a synchronous
processor.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import select
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    InMemoryLogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from torch.distributed.elastic.events import Event, EventSource

from elastic_otel.bridge.event_thread import EventThread
from elastic_otel.bridge.handler import OtelHandler
from elastic_otel.config import environment
from elastic_otel.emit import counters
from elastic_otel.emit.counters import DeliveryCounters, EventCounters
from elastic_otel.emit.delivery import LogOutageBuffer, SpanOutageBuffer
from elastic_otel.emit.pipeline import Pipeline
from elastic_otel.integration import activation
from elastic_otel.integration.registration import Registration
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from tests.support.fixtures import captured_events

EVENTS = [payload for _, payload in captured_events("restart_node0.tsv")]
JOINED = 6
"""EVENTS[:JOINED]: the node joined round 0 and is a member (open spans); from then on every
keep-alive (EVENTS[KEEP_ALIVE]) releases exactly one log record."""
KEEP_ALIVE = 2
GATE_S = 10.0
"""How long a closed gate holds the event thread at most (a hung test fails instead of hanging)."""


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "") -> None:
    """Poll ``condition`` until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.002)


class GatedLogs(InMemoryLogRecordExporter):
    """In-memory log exporter that can hold the exporting thread (``gate.clear()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # an export call began
        self.threads: set[str] = set()  # names of the threads that exported
        self.on_export: Callable[[], None] | None = None
        self.shutdowns = 0

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        if self.on_export is not None:
            self.on_export()
        self.gate.wait(GATE_S)
        return super().export(batch)

    def shutdown(self) -> None:
        self.shutdowns += 1
        super().shutdown()


class Spans(InMemorySpanExporter):
    def __init__(self) -> None:
        super().__init__()
        self.shutdowns = 0

    def shutdown(self) -> None:
        self.shutdowns += 1
        super().shutdown()


class Memory:
    """A pipeline factory: a real SDK pipeline whose exporters keep everything in memory."""

    def __init__(self) -> None:
        self.logs, self.spans = GatedLogs(), Spans()
        self.builds = 0
        self.on_build: Callable[[], None] | None = None

    def __call__(self) -> Pipeline:
        self.builds += 1
        if self.on_build is not None:
            self.on_build()
        resource = Resource.create({"service.name": "handler-test"})
        delivery = DeliveryCounters()
        log_buffer = LogOutageBuffer(self.logs, delivery, "logs")
        span_buffer = SpanOutageBuffer(self.spans, delivery, "traces")
        provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        provider.add_log_record_processor(SimpleLogRecordProcessor(log_buffer))
        processor = SimpleSpanProcessor(span_buffer)
        return Pipeline(
            provider.get_logger("elastic_otel"),
            processor,
            resource,
            owned=True,
            delivery=delivery,
            buffers=[log_buffer, span_buffer],
            _closers=[processor.shutdown, provider.shutdown],
            _flushers=[processor.force_flush, provider.force_flush],
        )

    def span_names(self) -> list[str]:
        return [s.name for s in self.spans.get_finished_spans()]

    def log_count(self) -> int:
        return len(self.logs.get_finished_logs())


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Memory:
    # only what events cause: no open-span snapshots or stall reports on a timer
    monkeypatch.setenv(env.ELASTIC_OTEL_OPEN_SPAN_INTERVAL, "0")
    monkeypatch.setenv(env.ELASTIC_OTEL_STALL_AFTER, "0")
    return Memory()


@pytest.fixture
def handlers() -> Iterator[Callable[[Memory], OtelHandler]]:
    """Makes handlers on a pipeline factory; each is shut down after the test."""
    made: list[OtelHandler] = []

    def make(factory: Memory) -> OtelHandler:
        handler = OtelHandler(pipeline_factory=factory)
        made.append(handler)
        return handler

    yield make
    for handler in made:
        handler.shutdown()


def torch_logger(handler: OtelHandler) -> logging.Logger:
    """A logger set up like torch's event logger (``torchelastic-events-<dest>``)."""
    logger = logging.getLogger(f"torchelastic-events-test-{uuid.uuid4().hex[:8]}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger


def stats_balance(stats: dict[str, int]) -> int:
    """received minus everything it became: 0 when no event went unaccounted."""
    return stats["received"] - (
        stats["processed"] + stats["dropped_after_shutdown"] + stats["dropped_queue_full"]
    )


def elastic_warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "elastic_otel" and r.levelno >= logging.WARNING and text in r.getMessage()
    ]


# --- the queue -----------------------------------------------------------------------------------


def test_emit_only_queues_the_worker_processes_and_flush_exports(
    memory: Memory, handlers: Callable[[Memory], OtelHandler]
) -> None:
    handler = handlers(memory)
    logger = torch_logger(handler)
    memory.logs.gate.clear()  # the collector is slow: an export holds the event thread
    started = time.monotonic()
    for payload in EVENTS:
        logger.info(payload)
    elapsed = time.monotonic() - started
    assert elapsed < GATE_S / 2  # the caller never waited for an export
    # nothing is out yet: the event thread is (at most) blocked in its first export
    assert memory.log_count() == 0 and memory.span_names() == []
    assert handler.all_stats()["processed"] < len(EVENTS)
    memory.logs.gate.set()
    assert handler.flush(10)
    stats = handler.all_stats()
    assert set(stats) == set(counters.ALL_KEYS)
    assert all(isinstance(v, int) for v in stats.values())
    assert stats["received"] == stats["processed"] == len(EVENTS)
    assert memory.log_count() == len(EVENTS)  # one log record per event
    assert {"rendezvous.join", "rendezvous.member", "worker", "agent.run"} <= set(
        memory.span_names()
    )
    assert stats["exported"] == memory.log_count() + len(memory.span_names())
    assert stats["internal_errors"] == stats["dropped_queue_full"] == 0
    assert memory.logs.threads == {"elastic-otel"}  # exported on the event_thread, never the caller


def test_the_event_thread_has_its_name_in_the_kernel(
    memory: Memory, handlers: Callable[[Memory], OtelHandler]
) -> None:
    """``top -H`` and ``ps -T`` show the kernel's name of a thread, not Python's."""
    handler = handlers(memory)
    handler.start()
    event_thread = handler._event_thread
    assert event_thread is not None and event_thread._thread is not None
    comm = Path(f"/proc/self/task/{event_thread._thread.native_id}/comm")
    wait_until(lambda: comm.read_text().strip() == "elastic-otel", what="the kernel's name")


def test_torch_event_objects_are_accepted_by_info(
    memory: Memory, handlers: Callable[[Memory], OtelHandler]
) -> None:
    """torch documents ``get_logging_handler(dest).info(event)`` with an Event object."""
    handler = handlers(memory)
    event = Event(
        "torchelastic.worker.status.SUCCEEDED",
        EventSource.AGENT,
        metadata={"run_id": "job-obj", "group_rank": 0, "state": "SUCCEEDED"},
    )
    handler.info(event)
    assert handler.flush(10)
    assert handler.all_stats()["processed"] == 1 and handler.all_stats()["unparsed"] == 0
    [log] = memory.logs.get_finished_logs()
    assert log.log_record.attributes is not None
    assert "torchelastic.worker.status.SUCCEEDED" in json.dumps(
        [log.log_record.event_name, log.log_record.body, dict(log.log_record.attributes)]
    )


def test_past_the_queue_bound_events_are_dropped_counted_and_warned_once(
    memory: Memory,
    handlers: Callable[[Memory], OtelHandler],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(env.ELASTIC_OTEL_QUEUE_SIZE, "10")
    handler = handlers(memory)
    logger = torch_logger(handler)
    for payload in EVENTS[:JOINED]:
        logger.info(payload)
    assert handler.flush(10)
    memory.logs.gate.clear()
    memory.logs.entered.clear()
    logger.info(EVENTS[KEEP_ALIVE])
    assert memory.logs.entered.wait(10)  # the event thread took it and is stuck exporting it
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        started = time.monotonic()
        for _ in range(100):
            logger.info(EVENTS[KEEP_ALIVE])  # nothing raises into the caller
        elapsed = time.monotonic() - started
    assert elapsed < GATE_S / 2  # never waited for the blocked event thread
    stats = handler.all_stats()
    assert stats["dropped_queue_full"] == 90  # 10 queued behind the one being exported
    warnings = elastic_warnings(caplog, "queue full")
    assert len(warnings) == 1 and env.ELASTIC_OTEL_QUEUE_SIZE in warnings[0].getMessage()
    memory.logs.gate.set()
    assert handler.flush(10)
    stats = handler.all_stats()
    assert stats["received"] == JOINED + 101
    assert stats["processed"] == JOINED + 11 and stats_balance(stats) == 0
    assert memory.log_count() == JOINED + 11  # the queued ones got out, the dropped did not


# --- exit ----------------------------------------------------------------------------------------


def test_shutdown_processes_what_is_queued_then_ends_the_open_spans(
    memory: Memory, handlers: Callable[[Memory], OtelHandler]
) -> None:
    handler = handlers(memory)
    for payload in EVENTS[:JOINED]:
        handler.info(payload)
    handler.shutdown()  # at once: the events are (most likely) still queued
    stats = handler.all_stats()
    assert stats["processed"] == JOINED and stats["dropped_after_shutdown"] == 0
    assert memory.log_count() == JOINED
    ended = {s.name: s for s in memory.spans.get_finished_spans()}
    assert ended["rendezvous.member"].attributes is not None
    assert ended["rendezvous.member"].attributes[A.END_REASON] == "process exit"
    assert memory.logs.shutdowns == 1 and memory.spans.shutdowns == 1


def test_events_racing_the_exit_are_processed_or_counted_never_raced(
    memory: Memory, handlers: Callable[[Memory], OtelHandler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's keep-alive thread records during exit: the model has one owner, whatever comes.

    The threads record at a pace the event thread keeps up with (torch records a few events a
    second; a flood that outpaces the event thread is the next test's subject)."""
    monkeypatch.setenv(env.ELASTIC_OTEL_EXIT_TIMEOUT, "10")  # a slow machine is not a failure
    handler = handlers(memory)
    for payload in EVENTS[:JOINED]:  # a node joins and is a member: open spans
        handler.info(payload)
    assert handler.flush(10)
    stop = threading.Event()
    errors: list[BaseException] = []

    def keep_recording() -> None:
        try:
            while not stop.is_set():
                handler.info(EVENTS[KEEP_ALIVE])
                time.sleep(0.0005)
        except BaseException as e:  # pragma: no cover - the assertion below reports it
            errors.append(e)

    threads = [threading.Thread(target=keep_recording) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: handler.all_stats()["processed"] > JOINED + 50, what="processing")
        exiting = threading.Thread(target=handler.shutdown)
        exiting.start()
        exiting.join(30)
        assert not exiting.is_alive()
        wait_until(lambda: handler.all_stats()["dropped_after_shutdown"] > 0, what="late events")
    finally:
        stop.set()
        for t in threads:
            t.join()
    event_thread = handler._event_thread
    assert event_thread is not None
    wait_until(lambda: not event_thread.thread_alive, what="the event thread to end")
    stats = handler.all_stats()
    assert errors == [] and stats["internal_errors"] == 0
    assert stats_balance(stats) == 0, stats
    # the open spans were ended by the close, on the event_thread, and exported
    ended = {s.name: s for s in memory.spans.get_finished_spans()}
    assert ended["rendezvous.member"].attributes is not None
    assert ended["rendezvous.member"].attributes[A.END_REASON] == "process exit"
    # every processed event's log record reached the exporters before they were shut down
    assert memory.log_count() == stats["processed"]
    assert memory.logs.shutdowns == 1 and memory.spans.shutdowns == 1
    processed, late = stats["processed"], stats["dropped_after_shutdown"]
    handler.info(EVENTS[KEEP_ALIVE])
    after = handler.all_stats()
    assert (after["processed"], after["dropped_after_shutdown"]) == (processed, late + 1)


def test_a_steady_stream_of_events_does_not_hold_up_the_close(
    memory: Memory, handlers: Callable[[Memory], OtelHandler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env.ELASTIC_OTEL_EXIT_TIMEOUT, "2")
    handler = handlers(memory)
    for payload in EVENTS[:JOINED]:
        handler.info(payload)
    assert handler.flush(10)
    event_thread = handler._event_thread
    assert event_thread is not None
    memory.logs.gate.clear()
    memory.logs.entered.clear()
    handler.info(EVENTS[KEEP_ALIVE])  # 1: the event thread takes it and is held in its export
    assert memory.logs.entered.wait(10)
    handler.info(EVENTS[KEEP_ALIVE])  # 2: queued behind it
    exiting = threading.Thread(target=handler.shutdown)
    exiting.start()
    wait_until(lambda: len(event_thread._calls) == 1, what="the close request")
    # from now on one more event is recorded for each the event thread exports: never an empty queue
    refill, acked, done = threading.Event(), threading.Event(), threading.Event()

    def feeder() -> None:
        while refill.wait(10) and not done.is_set():
            refill.clear()
            handler.info(EVENTS[KEEP_ALIVE])
            acked.set()

    def on_export() -> None:  # on the event thread
        acked.clear()
        refill.set()
        acked.wait(10)

    feeding = threading.Thread(target=feeder)
    feeding.start()
    memory.logs.on_export = on_export
    memory.logs.gate.set()
    try:
        exiting.join(30)
        processed = handler.all_stats()["processed"]
    finally:
        done.set()
        refill.set()
        feeding.join(10)
    assert processed <= JOINED + 2  # what was queued when the close was asked for, no more
    ended = {s.name: s for s in memory.spans.get_finished_spans()}
    assert ended["rendezvous.member"].attributes is not None
    assert ended["rendezvous.member"].attributes[A.END_REASON] == "process exit"


def test_an_event_whose_put_straddles_the_close_is_still_counted(
    memory: Memory, handlers: Callable[[Memory], OtelHandler]
) -> None:
    handler = handlers(memory)
    for payload in EVENTS[:JOINED]:
        handler.info(payload)
    assert handler.flush(10)
    event_thread = handler._event_thread
    assert event_thread is not None
    closed = event_thread._closed
    checked, resume = threading.Event(), threading.Event()

    class PreemptedAfterTheCheck:
        """The late thread loses the CPU right after it saw "not closed" (as any thread may)."""

        def __init__(self) -> None:
            self.paused = False

        def is_set(self) -> bool:
            result = closed.is_set()
            if threading.current_thread().name == "late" and not self.paused:
                self.paused = True
                checked.set()
                resume.wait(10)
            return result

        def __getattr__(self, name: str) -> object:
            return getattr(closed, name)

    event_thread._closed = PreemptedAfterTheCheck()  # type: ignore[assignment]
    late = threading.Thread(target=handler.info, args=(EVENTS[KEEP_ALIVE],), name="late")
    late.start()
    assert checked.wait(10)
    handler.shutdown()
    wait_until(lambda: not event_thread.thread_alive, what="the event thread to end")
    resume.set()
    late.join(10)
    assert stats_balance(handler.all_stats()) == 0, handler.all_stats()


def test_events_after_a_shutdown_before_any_event_are_never_processed(
    memory: Memory, handlers: Callable[[Memory], OtelHandler]
) -> None:
    handler = handlers(memory)
    handler.shutdown()
    handler.info(EVENTS[0])
    try:
        handler.flush(1)
        event_thread = handler._event_thread
        if event_thread is not None:  # give a event_thread, if one was started, the time to process
            wait_until(lambda: not event_thread._queue, what="the queue to empty")
        stats = handler.all_stats()
        assert (stats["processed"], stats["dropped_after_shutdown"]) == (0, 1)
        assert memory.builds == 0  # no pipeline built after exit
    finally:
        if handler._event_thread is not None:
            handler._event_thread.stop()


def test_a_failure_ending_the_spans_is_counted_and_the_pipeline_still_shuts_down(
    memory: Memory,
    handlers: Callable[[Memory], OtelHandler],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler = handlers(memory)
    for payload in EVENTS[:JOINED]:
        handler.info(payload)
    assert handler.flush(10)
    logs_before, spans_before = memory.log_count(), memory.span_names()
    assert logs_before == JOINED and "rendezvous.join" in spans_before
    event_thread = handler._event_thread
    assert event_thread is not None

    def broken(*_args: object) -> None:
        raise RuntimeError("model broke")

    monkeypatch.setattr(event_thread.sink.model, "close_all", broken)  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        handler.shutdown()  # never raises
    assert handler.all_stats()["internal_errors"] == 1
    warnings = [r for r in caplog.records if r.name == "elastic_otel"]
    assert len(warnings) == 1 and "failed to end open spans" in warnings[0].getMessage()
    assert warnings[0].exc_info is not None and "model broke" in caplog.text
    # the pipeline was still flushed and shut down: what was exported before is there
    assert memory.logs.shutdowns == 1 and memory.spans.shutdowns == 1
    assert memory.log_count() == logs_before and memory.span_names() == spans_before
    handler.info(EVENTS[KEEP_ALIVE])
    assert handler.all_stats()["dropped_after_shutdown"] == 1  # closed all the same


# --- fork ----------------------------------------------------------------------------------------


def _child_report(handler: OtelHandler, factory: Memory) -> dict[str, object]:
    """Runs in the forked child: its counters, and an event processed by its own event_thread."""
    before = handler.all_stats()
    handler.info(EVENTS[0])
    # no flush: only an event thread of the child's own can process it
    deadline = time.monotonic() + 10
    while handler.all_stats()["processed"] < 1 and time.monotonic() < deadline:
        time.sleep(0.002)
    event_thread = handler._event_thread
    return {
        "before": before,
        "after": handler.all_stats(),
        "worker_alive": event_thread is not None and event_thread.thread_alive,
        "builds": factory.builds,
    }


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_counts_from_zero_with_its_own_worker(
    memory: Memory, handlers: Callable[[Memory], OtelHandler]
) -> None:
    handler = handlers(memory)
    for payload in EVENTS[:5]:
        handler.info(payload)
    assert handler.flush(10)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 0
        try:
            report = _child_report(handler, memory)
        except BaseException as e:
            report, code = {"error": repr(e)}, 1
        try:
            os.write(write, json.dumps(report).encode())
        finally:
            os._exit(code)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 30)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the forked child did not report within 30 s")
        chunks = []
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    report = json.loads(b"".join(chunks))
    assert "error" not in report, report
    assert report["before"] == dict.fromkeys(counters.ALL_KEYS, 0)  # nothing of the parent's
    after = report["after"]
    assert (after["received"], after["processed"]) == (1, 1)
    assert report["worker_alive"] and report["builds"] == 2  # its own event thread and pipeline
    # the parent is untouched and still works
    assert handler.all_stats()["received"] == 5
    handler.info(EVENTS[5])
    assert handler.flush(10) and handler.all_stats()["processed"] == 6


# --- re-entry ------------------------------------------------------------------------------------


def test_records_the_bridge_itself_causes_do_not_loop_back(
    memory: Memory, handlers: Callable[[Memory], OtelHandler]
) -> None:
    """An exporter (or the SDK) logging to a logger the handler is attached to, on the bridge's
    own threads: the event_thread, and the thread that builds the pipeline."""
    handler = handlers(memory)
    logger = torch_logger(handler)
    said: list[str] = []

    def say(what: str) -> None:
        said.append(what)
        logger.warning("%s says something", what)

    memory.on_build = lambda: say("pipeline set-up")
    memory.logs.on_export = lambda: say("exporter")
    for payload in EVENTS[:JOINED]:
        logger.info(payload)
    assert handler.flush(5)  # no feedback loop to wait out
    assert said.count("pipeline set-up") == 1 and said.count("exporter") >= 1
    stats = handler.all_stats()
    assert stats["received"] == stats["processed"] == JOINED
    assert memory.log_count() == JOINED  # no log record of the exporter's own warnings


# --- flags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("Yes", True),
        ("on", True),
        (" On ", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("OFF", False),
        ("", None),
        ("  ", None),
    ],
)
def test_one_parser_for_every_flag(
    raw: str, value: bool | None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(environment, "_warned_flags", set())
    monkeypatch.setenv(env.ELASTIC_OTEL_TRACES, raw)
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        assert environment.env_switch(env.ELASTIC_OTEL_TRACES) is value
        assert environment.env_flag(env.ELASTIC_OTEL_TRACES, True) is (
            True if value is None else value
        )
        assert environment.env_flag(env.ELASTIC_OTEL_TRACES, False) is (
            False if value is None else value
        )
    assert elastic_warnings(caplog, env.ELASTIC_OTEL_TRACES) == []


def test_an_unrecognised_flag_is_unset_with_one_warning_per_variable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(environment, "_warned_flags", set())
    monkeypatch.setenv(env.ELASTIC_OTEL_TRACES, "garbage")
    monkeypatch.setenv(env.ELASTIC_OTEL_METRICS, "enabled")
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        for _ in range(3):
            assert environment.env_switch(env.ELASTIC_OTEL_TRACES) is None
            assert environment.env_flag(env.ELASTIC_OTEL_TRACES, True) is True
            assert environment.env_flag(env.ELASTIC_OTEL_TRACES, False) is False
            assert environment.env_flag(env.ELASTIC_OTEL_METRICS, True) is True
    traces = elastic_warnings(caplog, env.ELASTIC_OTEL_TRACES)
    assert len(traces) == 1 and "garbage" in traces[0].getMessage()
    assert len(elastic_warnings(caplog, env.ELASTIC_OTEL_METRICS)) == 1


@pytest.mark.parametrize(
    ("enabled", "pet", "argv", "expected"),
    [
        ("garbage", "otel", ["script.py"], True),  # unset: torchrun's handler decides
        ("garbage", "console", ["script.py"], False),
        ("garbage", None, ["torchrun", "--event-log-handler", "otel", "train.py"], True),
        ("garbage", None, ["torchrun", "--event-log-handler=console", "train.py"], False),
        ("false", "otel", ["script.py"], False),  # what an explicit value would do instead
        ("true", "console", ["script.py"], True),
    ],
)
def test_activation_treats_an_unrecognised_enabled_flag_as_unset(
    enabled: str,
    pet: str | None,
    argv: list[str],
    expected: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(environment, "_warned_flags", set())
    monkeypatch.setenv(env.ELASTIC_OTEL_ENABLED, enabled)
    if pet is not None:
        monkeypatch.setenv(env.PET_EVENT_LOG_HANDLER, pet)
    monkeypatch.setattr("sys.argv", argv)
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        assert activation.requested() is expected
        assert activation.requested() is expected
    warned = elastic_warnings(caplog, env.ELASTIC_OTEL_ENABLED)
    assert len(warned) == (1 if enabled == "garbage" else 0)


def test_activation_lets_torchs_events_through_under_loglevel_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``LOGLEVEL=WARNING`` (TorchX's): torch makes a destination's logger at WARNING, which would
    drop torch's events (INFO) before the bridge. Activation lowers that logger alone to INFO; a
    handler that shares it gets what it got before (a WARNING, not the INFO event); uninstalling
    puts torch's level back and the handler's filters away. torch's real logger and registry,
    for a destination of this test's own."""
    from torch.distributed.elastic import events
    from torch.distributed.elastic.events import handlers as torch_handlers

    destination = f"test-{uuid.uuid4().hex[:6]}"
    console = logging.StreamHandler(io.StringIO())  # in place of torch's process-wide console
    bridge = OtelHandler(pipeline_factory=lambda: None)
    monkeypatch.setenv("LOGLEVEL", "WARNING")
    monkeypatch.setitem(torch_handlers._log_handlers, destination, console)
    logger = events._get_or_create_logger(destination)  # torch's: at WARNING, with the console
    logger.addHandler(bridge)  # as registration does for a logger torch made already
    registration = Registration(bridge)
    try:
        assert logger.level == logging.WARNING
        registration._admit_events(destination)
        events.record(Event("admitted", EventSource.AGENT), destination)
        logger.warning("a warning")
        assert logger.level == logging.INFO
        assert bridge.counters.received == 2
        assert console.stream.getvalue() == "a warning\n"
        registration.uninstall()
        assert logger.level == logging.WARNING and console.filters == []
    finally:
        logger.removeHandler(bridge)
        bridge.shutdown()
        events._events_loggers.pop(destination, None)


class _TimedSink:
    """A sink that notes when each event and each tick reached it."""

    def __init__(self) -> None:
        self.processed: list[float] = []
        self.ticks: list[float] = []

    def process(self, payload: object, created: float) -> None:
        self.processed.append(time.monotonic())

    def close(self, reason: str, error: bool) -> None:
        pass

    def tick(self, now_ns: int) -> None:
        self.ticks.append(time.monotonic())


def test_an_idle_event_thread_sleeps_and_the_next_event_wakes_it() -> None:
    """An agent between events costs a wake a second, not twenty; an event after a quiet
    spell is not held until that second is up."""
    sink = _TimedSink()
    events = EventThread(sink, EventCounters(), 100)
    events.start()
    try:
        events.put("first", time.time())
        wait_until(lambda: bool(sink.processed), what="the first event")
        time.sleep(0.2)  # the poll after it found nothing: asleep from now on
        before = len(sink.ticks)
        time.sleep(2.5)
        assert len(sink.ticks) - before <= 4  # polling every 50 ms: 50 ticks
        ticked = len(sink.ticks)
        wait_until(lambda: len(sink.ticks) > ticked, what="a tick")  # a second's sleep begins
        sent = time.monotonic()
        events.put("second", time.time())
        wait_until(lambda: len(sink.processed) == 2, what="the second event")
        assert sink.processed[1] - sent < 0.5
    finally:
        events.close("test", False, 5.0)
        events.stop()


def test_a_descriptor_watched_before_the_event_thread_runs_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The signal wakeup fd is watched right after the thread starts, often before its loop
    does: a thread slow to get going (here by 0.3 s) must still poll it."""
    import socket

    import elastic_otel.bridge.event_thread as event_thread

    name = event_thread.name_native_thread
    monkeypatch.setattr(event_thread, "name_native_thread", lambda n: (time.sleep(0.3), name(n)))
    events = EventThread(_TimedSink(), EventCounters(), 100)
    events.start()
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    read: list[bytes] = []
    try:
        assert events.watch_fd(reader.fileno(), lambda: read.append(reader.recv(64)) is None)
        writer.send(b"\x02")
        wait_until(lambda: read == [b"\x02"], what="the descriptor read")
    finally:
        events.close("test", False, 5.0)
        events.stop()
        reader.close()
        writer.close()


def test_the_event_thread_runs_tasks_when_due_and_reads_watched_descriptors() -> None:
    """One thread serves the agent's periodic work (worker output, the training watch) and
    the signal wakeup fd beside the events: each task runs when it said it is due, a
    descriptor's reader when it can be read, and a call made from a task runs at once."""
    import socket

    sink = _TimedSink()
    events = EventThread(sink, EventCounters(), 100)
    events.start()
    runs: list[tuple[float, bool]] = []
    called: list[bool] = []

    class Every200ms:
        def run(self) -> float | None:
            runs.append((time.monotonic(), events.on_thread()))
            if len(runs) == 2:
                events.call(lambda: called.append(events.on_thread()), 1.0)
            return 0.2 if len(runs) < 5 else None  # then done: not run again

    reader, writer = socket.socketpair()
    reader.setblocking(False)
    read: list[bytes] = []

    def on_readable() -> bool:
        data = reader.recv(64)
        read.append(data)
        return bool(data)

    try:
        assert events.schedule(Every200ms())
        assert events.watch_fd(reader.fileno(), on_readable)
        wait_until(lambda: len(runs) == 5, what="five runs")
        times = [t for t, _ in runs]
        assert all(0.15 < b - a < 0.6 for a, b in itertools.pairwise(times))
        assert all(on for _, on in runs) and called == [True]
        time.sleep(0.5)
        assert len(runs) == 5  # it said it was done
        writer.send(b"\x0f")
        wait_until(lambda: read == [b"\x0f"], what="the descriptor read")
        writer.close()  # its end: read once more, then no longer watched
        wait_until(lambda: read == [b"\x0f", b""], what="the descriptor's end")
    finally:
        events.close("test", False, 5.0)
        events.stop()
        reader.close()
    assert not events.schedule(Every200ms())  # stopped: nothing would run it
