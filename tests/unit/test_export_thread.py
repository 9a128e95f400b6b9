"""The one export thread (``emit/export_thread.py``): what a user sees of it.

Logs, spans and metrics reach a real OTLP/gRPC receiver through one thread named
``elastic-otel-export`` and no thread of the SDK's batch processors or periodic reader exists; a
queue that holds a batch is exported at once, a full one drops new records and counts them in
the bridge's stats; a flush exports everything, a shutdown counts what it could not, and a
forked child never exports its parent's queue.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from elastic_otel.bridge.handler import OtelHandler
from elastic_otel.config.settings import Settings
from elastic_otel.emit import counters as C
from elastic_otel.emit.export_gate import ExportGate
from elastic_otel.emit.export_queue import BatchSettings
from elastic_otel.emit.export_thread import THREAD_NAME
from elastic_otel.emit.pipeline import Pipeline, build_pipeline
from tests.support.otlp_receiver import OtlpReceiver

LONG_DELAY = "60000"  # ms: no export is due by time during a test


def _use(monkeypatch: pytest.MonkeyPatch, rx: OtlpReceiver, **env: str) -> None:
    for name, value in {**rx.exporter_env(), "OTEL_METRICS_EXPORTER": "none", **env}.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def pipelines() -> Iterator[Callable[[ExportGate | None], Pipeline]]:
    """Pipelines built from the environment now, each shut down after the test."""
    made: list[Pipeline] = []

    def build(gate: ExportGate | None = None) -> Pipeline:
        pipeline = build_pipeline("test", Settings.from_environment(), gate)
        assert pipeline is not None
        made.append(pipeline)
        return pipeline

    yield build
    for pipeline in made:
        pipeline.shutdown(2.0)


def _end_spans(pipeline: Pipeline, n: int, prefix: str = "span") -> None:
    assert pipeline.span_processor is not None
    provider = TracerProvider(resource=pipeline.resource, shutdown_on_exit=False)
    provider.add_span_processor(pipeline.span_processor)
    tracer = provider.get_tracer("test")
    for i in range(n):
        tracer.start_span(f"{prefix}-{i}").end()


def _emit_logs(logger: Any, n: int) -> None:
    for i in range(n):
        logger.emit(body=f"log-{i}")


def _settle(rx: OtlpReceiver, seconds: float = 0.4) -> tuple[int, int]:
    time.sleep(seconds)
    return len(rx.spans()), len(rx.logs())


SCRIPT = textwrap.dedent(
    """
    import json, pathlib, sys, threading
    from opentelemetry.sdk.trace import TracerProvider
    from elastic_otel.bridge.process import bridge_process
    from elastic_otel.emit.pipeline import build_meter_provider, build_pipeline, build_resource

    gate = bridge_process().export_gate  # as the handler and torchelastic's metrics use it
    pipeline = build_pipeline("test", gate=gate)
    meters = build_meter_provider(build_resource(), gate)
    meters.get_meter("test").create_counter("test.count").add(3)
    pipeline.logger.emit(body="one log")
    tracer = TracerProvider(resource=pipeline.resource, shutdown_on_exit=False)
    tracer.add_span_processor(pipeline.span_processor)
    tracer.get_tracer("test").start_span("one span").end()
    print(json.dumps(sorted(t.name for t in threading.enumerate())), flush=True)
    tasks = pathlib.Path("/proc/self/task")
    print(json.dumps(sorted((t / "comm").read_text().strip() for t in tasks.iterdir())), flush=True)
    sys.stdin.readline()  # the test has seen the records arrive
    ok = pipeline.shutdown(5.0)
    meters.shutdown()
    for thread in threading.enumerate():  # it ends on its own once its last job is gone
        if thread.name == "elastic-otel-export":
            thread.join(5.0)
    print(json.dumps([ok, sorted(t.name for t in threading.enumerate())]), flush=True)
    """
)


def test_every_signal_goes_through_one_export_thread(grpc_receiver: OtlpReceiver) -> None:
    env = {
        **os.environ,
        **grpc_receiver.exporter_env(),
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_BLRP_SCHEDULE_DELAY": "50",
        "OTEL_METRIC_EXPORT_INTERVAL": "100",
    }
    with subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        threads = json.loads(proc.stdout.readline())
        kernel_names = json.loads(proc.stdout.readline())
        # Before any flush or shutdown: the thread sent them, each signal when it was due.
        assert grpc_receiver.wait_for_logs(1)[0]["body"] == "one log"
        assert grpc_receiver.wait_for_spans(1)[0]["name"] == "one span"
        assert "test.count" in {m["name"] for m in grpc_receiver.wait_for_metrics(1)}
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        ok, after = json.loads(proc.stdout.readline())
        assert proc.wait(30) == 0
    assert threads.count(THREAD_NAME) == 1, threads
    assert kernel_names.count(THREAD_NAME[:15]) == 1, kernel_names  # what top -H shows
    assert [t for t in threads if t.startswith(("OtelBatch", "OtelPeriodic"))] == []
    assert ok and THREAD_NAME not in after  # it ends with the last exporter's shutdown


def test_a_full_batch_wakes_the_thread(
    grpc_receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
    pipelines: Callable[[ExportGate | None], Pipeline],
) -> None:
    _use(
        monkeypatch,
        grpc_receiver,
        OTEL_BSP_SCHEDULE_DELAY=LONG_DELAY,
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="10",
    )
    pipeline = pipelines(None)
    _end_spans(pipeline, 9)
    assert _settle(grpc_receiver)[0] == 0  # below a batch, and not due yet
    _end_spans(pipeline, 1, "tenth")
    assert len(grpc_receiver.wait_for_spans(10, timeout=5)) == 10
    _end_spans(pipeline, 5, "more")
    assert _settle(grpc_receiver)[0] == 10
    assert pipeline.shutdown(5.0)  # exports what is left
    assert len(grpc_receiver.spans()) == 15


def test_a_full_queue_drops_new_records_counted_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with OtlpReceiver("grpc", delay_s=0.3) as slow:  # the thread waits on it meanwhile
        _use(
            monkeypatch,
            slow,
            OTEL_BLRP_SCHEDULE_DELAY=LONG_DELAY,
            OTEL_BLRP_MAX_QUEUE_SIZE="20",
            OTEL_BLRP_MAX_EXPORT_BATCH_SIZE="20",
        )
        handler = OtelHandler(settings=Settings.from_environment())  # as elastic_otel.stats()
        try:
            handler.start()
            with caplog.at_level(logging.WARNING, logger="elastic_otel"):
                _emit_logs(handler.output_logger(), 100)
            assert handler.flush(10.0)
            stats = handler.all_stats()
            assert stats[C.DROPPED_SDK_QUEUE] > 0
            assert stats[C.DROPPED_SDK_QUEUE] + stats["exported"] == 100, stats
            assert len(slow.wait_for_logs(stats["exported"])) == stats["exported"]
        finally:
            handler.shutdown()
    warned = [r for r in caplog.records if "export queue is full" in r.getMessage()]
    assert len(warned) == 1 and "OTEL_BLRP_MAX_QUEUE_SIZE" in warned[0].getMessage()


def test_flush_exports_everything_queued(
    grpc_receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
    pipelines: Callable[[ExportGate | None], Pipeline],
) -> None:
    _use(
        monkeypatch,
        grpc_receiver,
        OTEL_BSP_SCHEDULE_DELAY=LONG_DELAY,
        OTEL_BLRP_SCHEDULE_DELAY=LONG_DELAY,
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="16",
    )
    pipeline = pipelines(None)
    _end_spans(pipeline, 15)
    _emit_logs(pipeline.logger, 300)
    assert _settle(grpc_receiver) == (0, 0)
    assert pipeline.flush(5.0)
    assert (len(grpc_receiver.spans()), len(grpc_receiver.logs())) == (15, 300)
    assert pipeline.counters()["exported"] == 315


def test_shutdown_counts_what_is_left_once_and_what_comes_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with OtlpReceiver("grpc", delay_s=2.0) as slow:
        _use(
            monkeypatch,
            slow,
            OTEL_BLRP_SCHEDULE_DELAY=LONG_DELAY,
            OTEL_BLRP_MAX_EXPORT_BATCH_SIZE="10",
            OTEL_TRACES_EXPORTER="none",
        )
        gate = ExportGate()
        pipeline = build_pipeline("test", Settings.from_environment(), gate)
        assert pipeline is not None
        _emit_logs(pipeline.logger, 35)  # 10 go out at once and wait on the collector
        time.sleep(0.3)
        assert not pipeline.shutdown(0.5)  # gave up on them
        stats = pipeline.counters()
        assert stats["lost_at_exit"] >= 25  # still queued: taken and counted
        pipeline.logger.emit(body="too late")
        assert pipeline.counters()[C.DROPPED_SDK_QUEUE] == 1
        thread = gate.export_thread()
        deadline = time.monotonic() + 10
        while thread.alive or pipeline.counters()["lost_at_exit"] + stats["exported"] < 35:
            assert time.monotonic() < deadline, pipeline.counters()
            time.sleep(0.05)
        stats = pipeline.counters()
        assert stats["lost_at_exit"] + stats["exported"] == 35, stats  # each counted once


def test_a_forked_child_does_not_export_its_parents_queue(
    grpc_receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
    pipelines: Callable[[ExportGate | None], Pipeline],
) -> None:
    _use(monkeypatch, grpc_receiver, OTEL_BSP_SCHEDULE_DELAY=LONG_DELAY)
    pipeline = pipelines(ExportGate())
    _end_spans(pipeline, 20)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without any exit handler
        try:
            import threading

            started = time.monotonic()
            flushed = pipeline.flush(2.0)
            _end_spans(pipeline, 1, "child")
            report = {
                "threads": [t.name for t in threading.enumerate()],
                "flushed": flushed,
                "flush_s": time.monotonic() - started,
                "dropped": pipeline.counters()[C.DROPPED_SDK_QUEUE],
            }
            os.write(write, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert THREAD_NAME not in report["threads"]
    assert report["flush_s"] < 1.0 and report["dropped"] == 1
    assert _settle(grpc_receiver)[0] == 0  # nothing from the child
    assert pipeline.flush(5.0)  # the parent's queue is whole, and still the parent's
    names = sorted(s["name"] for s in grpc_receiver.wait_for_spans(20))
    assert names == sorted(f"span-{i}" for i in range(20))


def test_queues_are_sized_like_the_bridges_unless_the_user_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert BatchSettings.from_environment("traces", 65536).max_queue_size == 65536
    assert BatchSettings.from_environment("logs").delay_s == 1.0
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "nonsense")
    spans = BatchSettings.from_environment("traces", 65536)
    assert (spans.max_queue_size, spans.batch_size, spans.delay_s) == (100, 100, 5.0)
