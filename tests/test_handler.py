"""handler, event_worker, conversion: the queue, the one owner thread, exit, fork, counters.

A real SDK pipeline in memory (in-memory exporters stand where OTLP would) behind the real
handler; real events captured from a torchrun job.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import pytest
from conftest import captured_events
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from elastic_otel import activation, counters
from elastic_otel import attributes as A
from elastic_otel import environment_variables as env
from elastic_otel.handler import OtelHandler
from elastic_otel.pipeline import Pipeline

EVENTS = [payload for _, payload in captured_events("restart_node0.tsv")]


class Memory:
    """A pipeline whose exporters are in memory."""

    def __init__(self) -> None:
        self.logs, self.spans = InMemoryLogRecordExporter(), InMemorySpanExporter()
        self.shut_down = False

    def __call__(self) -> Pipeline:
        resource = Resource.create({"service.name": "handler-test"})
        provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        processor = SimpleSpanProcessor(self.spans)
        pipeline = Pipeline(provider.get_logger("elastic_otel"), processor, resource, owned=False)
        pipeline._flushers.append(provider.force_flush)

        def mark() -> bool:
            self.shut_down = True
            return True

        pipeline._flushers.append(mark)
        return pipeline

    def span_names(self) -> list[str]:
        return [s.name for s in self.spans.get_finished_spans()]


@pytest.fixture
def memory() -> Memory:
    return Memory()


def test_emit_only_queues_flush_processes_and_exports(memory: Memory) -> None:
    handler = OtelHandler(memory)
    try:
        for payload in EVENTS:
            handler.info(payload)
        assert handler.flush(10)
        stats = handler.all_stats()
        assert set(stats) == set(counters.ALL_KEYS)
        assert stats["received"] == stats["processed"] == len(EVENTS)
        assert len(memory.logs.get_finished_logs()) == len(EVENTS)
        assert "rendezvous.join" in memory.span_names()
    finally:
        handler.shutdown()


def test_shutdown_racing_new_events_never_races_the_model(memory: Memory) -> None:
    """torch's keep-alive thread records during exit: the model has one owner, whatever comes."""
    handler = OtelHandler(memory)
    for payload in EVENTS[:6]:  # a node joins and is a member: open spans
        handler.info(payload)
    stop = threading.Event()

    def keep_recording() -> None:
        while not stop.is_set():
            handler.info(EVENTS[2])  # keep-alives

    threads = [threading.Thread(target=keep_recording) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    handler.shutdown()
    time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    stats = handler.all_stats()
    assert stats["internal_errors"] == 0
    assert stats["received"] == (
        stats["processed"] + stats["dropped_after_shutdown"] + stats["dropped_queue_full"]
    )
    assert stats["dropped_after_shutdown"] > 0  # recorded after the close: counted
    ended = {s.name: s for s in memory.spans.get_finished_spans()}
    assert ended["rendezvous.member"].attributes[A.END_REASON] == "process exit"
    assert memory.shut_down  # the pipeline was flushed after the model closed
    processed = stats["processed"]
    handler.info(EVENTS[2])
    assert handler.all_stats()["processed"] == processed  # never processed after shutdown


def test_a_failure_while_ending_spans_does_not_skip_the_pipeline_shutdown(
    memory: Memory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    handler = OtelHandler(memory)
    for payload in EVENTS[:6]:
        handler.info(payload)
    handler.flush(10)
    exported = len(memory.logs.get_finished_logs())
    worker = handler._worker
    assert worker is not None

    def broken(*_args: object) -> None:
        raise RuntimeError("model broke")

    monkeypatch.setattr(worker.sink, "close", broken)
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        handler.shutdown()
    assert handler.all_stats()["internal_errors"] == 1
    assert len([r for r in caplog.records if r.exc_info]) == 1
    assert memory.shut_down and len(memory.logs.get_finished_logs()) == exported


def test_queue_bound_drops_and_counts_without_blocking(
    memory: Memory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(env.ELASTIC_OTEL_QUEUE_SIZE, "10")
    release = threading.Event()
    handler = OtelHandler(memory)
    handler.start()
    worker = handler._worker
    assert worker is not None
    real_process = worker.sink.process

    def slow(payload: object, created: float) -> None:
        release.wait(10)
        real_process(payload, created)

    monkeypatch.setattr(worker.sink, "process", slow)
    try:
        with caplog.at_level(logging.WARNING, logger="elastic_otel"):
            started = time.monotonic()
            for _ in range(100):
                handler.info(EVENTS[0])
            assert time.monotonic() - started < 5  # never waited for the blocked worker
        stats = handler.all_stats()
        assert stats["dropped_queue_full"] >= 100 - 11  # 10 queued, maybe 1 being processed
        assert len([r for r in caplog.records if "queue full" in r.getMessage()]) == 1
    finally:
        release.set()
        handler.shutdown()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_counts_from_zero_with_its_own_worker(memory: Memory) -> None:
    handler = OtelHandler(memory)
    try:
        for payload in EVENTS[:5]:
            handler.info(payload)
        handler.flush(10)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            try:
                before = handler.all_stats()["received"]
                handler.info(EVENTS[0])
                handler.flush(10)
                after = handler.all_stats()
                os.write(
                    write, json.dumps([before, after["received"], after["processed"]]).encode()
                )
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            before, received, processed = json.loads(pipe.read())
        os.waitpid(pid, 0)
        assert (before, received, processed) == (0, 1, 1)
        assert handler.all_stats()["received"] == 5  # the parent's own count is untouched
    finally:
        handler.shutdown()


def test_records_the_bridge_causes_do_not_loop_back(memory: Memory) -> None:
    handler = OtelHandler(memory)
    sdk_logger = logging.getLogger("opentelemetry.test-loop")
    sdk_logger.addHandler(handler)
    original = memory.logs.export

    def noisy_export(batch: object) -> object:
        sdk_logger.warning("exporter says something")  # on the bridge's own thread
        return original(batch)  # type: ignore[arg-type]

    memory.logs.export = noisy_export  # type: ignore[method-assign]
    try:
        handler.info(EVENTS[0])
        handler.flush(10)
        assert handler.all_stats()["received"] == 1
    finally:
        sdk_logger.removeHandler(handler)
        handler.shutdown()


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("true", True),
        ("ON", True),
        ("1", True),
        ("Yes", True),
        ("false", False),
        ("0", False),
        ("off", False),
        ("NO", False),
        ("", None),
    ],
)
def test_one_parser_for_every_flag(
    raw: str, value: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELASTIC_OTEL_TRACES", raw)
    assert env.env_switch("ELASTIC_OTEL_TRACES") is value
    assert env.env_flag("ELASTIC_OTEL_TRACES", True) is (True if value is None else value)


def test_an_unrecognised_flag_is_unset_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(env.ELASTIC_OTEL_ENABLED, "garbage")
    monkeypatch.setattr(env, "_warned_flags", set())
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        monkeypatch.setenv(env.PET_EVENT_LOG_HANDLER, "otel")
        monkeypatch.setattr("sys.argv", ["script.py"])
        assert activation.requested()  # unset: decided by the event log handler
        monkeypatch.setenv(env.PET_EVENT_LOG_HANDLER, "console")
        assert not activation.requested()
    warnings = [r for r in caplog.records if "ELASTIC_OTEL_ENABLED" in r.getMessage()]
    assert len(warnings) == 1
