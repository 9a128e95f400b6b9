"""delivery: the outage buffer and the export-warning filter, with a fake exporter and clock.

The unit under test wraps an exporter, so a scripted exporter (it answers what the test says
and records what it was given) stands where the network would; time is a number the test
moves. The real exporters against a real receiver are tested in tests/test_reliability.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from elastic_otel.counters import DeliveryCounters
from elastic_otel.delivery import ExportWarnings, SpanOutageBuffer


class ScriptedExporter(SpanExporter):
    """Answers SUCCESS, FAILURE, or raises, as told; records every batch it was given."""

    def __init__(self) -> None:
        self.answer = "SUCCESS"
        self.batches: list[list[int]] = []
        self.shutdowns = 0

    def export(self, spans: Sequence[int]) -> SpanExportResult:  # type: ignore[override]
        self.batches.append(list(spans))
        if self.answer == "RAISE":
            raise ValueError("cannot encode")
        return SpanExportResult[self.answer]

    def shutdown(self) -> None:
        self.shutdowns += 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup() -> tuple[SpanOutageBuffer, ScriptedExporter, Clock, DeliveryCounters]:
    exporter, clock, counters = ScriptedExporter(), Clock(), DeliveryCounters()
    buffer = SpanOutageBuffer(exporter, counters, "traces", max_items=10, clock=clock)
    return buffer, exporter, clock, counters


def test_success_passes_through(setup: tuple) -> None:
    buffer, exporter, _, counters = setup
    assert buffer.export([1, 2]) is SpanExportResult.SUCCESS
    assert exporter.batches == [[1, 2]] and counters.exported == 2 and buffer.pending == 0


def test_an_outage_holds_batches_without_network_calls_and_resends_oldest_first(
    setup: tuple,
) -> None:
    buffer, exporter, clock, counters = setup
    exporter.answer = "FAILURE"
    assert buffer.export([1, 2]) is SpanExportResult.FAILURE
    assert counters.export_failed_attempts == 1 and buffer.pending == 2
    # during the back-off: held, no call, and the SDK is told all is well (it would only log)
    assert buffer.export([3]) is SpanExportResult.SUCCESS
    assert exporter.batches == [[1, 2]] and buffer.pending == 3
    clock.now += 1.01
    exporter.answer = "SUCCESS"
    assert buffer.export([4]) is SpanExportResult.SUCCESS
    assert exporter.batches[-1] == [1, 2, 3, 4] and buffer.pending == 0
    assert counters.exported == 4


def test_back_off_doubles_to_30_seconds_and_resets_after_a_success(setup: tuple) -> None:
    buffer, exporter, clock, _ = setup
    exporter.answer = "FAILURE"
    buffer.export([1])
    waits = []
    for _ in range(7):
        calls = len(exporter.batches)
        step = 0.0
        while len(exporter.batches) == calls:
            step += 0.5
            clock.now += 0.5
            buffer.export([])
        waits.append(step)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    exporter.answer = "SUCCESS"
    clock.now += 30
    buffer.export([2])
    exporter.answer = "FAILURE"
    buffer.export([3])
    calls = len(exporter.batches)
    clock.now += 1.01
    buffer.export([])
    assert len(exporter.batches) == calls + 1  # back to a 1 s back-off


def test_past_the_bound_the_oldest_are_dropped_counted_and_warned_once(
    setup: tuple, caplog: pytest.LogCaptureFixture
) -> None:
    buffer, exporter, _, counters = setup
    exporter.answer = "FAILURE"
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        buffer.export(list(range(8)))
        buffer.export(list(range(8, 16)))  # held: 16 > 10
        buffer.export(list(range(16, 20)))
    assert counters.dropped_collector_outage == 10 and buffer.pending == 10
    warnings = [r for r in caplog.records if "dropping the oldest" in r.getMessage()]
    assert len(warnings) == 1


def test_a_large_batch_is_not_cut_while_the_collector_answers(setup: tuple) -> None:
    buffer, exporter, _, counters = setup
    assert buffer.export(list(range(25))) is SpanExportResult.SUCCESS  # 25 > max_items 10
    assert sum(map(len, exporter.batches)) == 25 and counters.dropped_collector_outage == 0


def test_an_unencodable_chunk_is_dropped_and_the_rest_goes_out(
    setup: tuple, caplog: pytest.LogCaptureFixture
) -> None:
    buffer, exporter, _, counters = setup
    exporter.answer = "RAISE"
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        buffer.export([1, 2])
    assert counters.dropped_invalid == 2 and buffer.pending == 0
    assert any("rejected" in r.getMessage() for r in caplog.records)
    exporter.answer = "SUCCESS"
    buffer.export([3])
    assert exporter.batches[-1] == [3] and counters.exported == 1


def test_force_flush_ignores_the_back_off(setup: tuple) -> None:
    buffer, exporter, _, _ = setup
    exporter.answer = "FAILURE"
    buffer.export([1])
    exporter.answer = "SUCCESS"
    assert buffer.force_flush()
    assert exporter.batches[-1] == [1] and buffer.pending == 0


def test_exit_with_the_collector_down(setup: tuple) -> None:
    buffer, exporter, _, counters = setup
    buffer.interrupt()
    assert buffer.export([1, 2, 3]) is SpanExportResult.FAILURE
    assert counters.lost_at_exit == 3
    buffer.shutdown()
    assert exporter.shutdowns == 1  # interrupt closed it; not closed twice


def _record(msg: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("opentelemetry.exporter", level, __file__, 1, msg, (), None)


def test_first_export_warning_is_one_scrubbed_line_the_rest_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cr3t-token")
    warnings = ExportWarnings()
    first = _record("Failed to export to collector: Bearer s3cr3t-token rejected\nTraceback ...")
    first.exc_info = (ValueError, ValueError("x"), None)
    assert warnings.filter(first)
    message = first.getMessage()
    assert "s3cr3t" not in message and "***" in message and "\n" not in message
    assert first.exc_info is None and message.startswith("elastic-otel: telemetry export")
    assert not warnings.filter(_record("again"))
    assert not warnings.filter(_record("Queue full, dropping"))
    assert (warnings.suppressed, warnings.queue_full, warnings.seen) == (2, 1, 3)
    debug = _record("detail", logging.DEBUG)
    assert warnings.filter(debug) and debug.getMessage() == "detail"
