"""delivery: the outage buffer and the export-warning filter, with a fake exporter and clock.

The unit under test wraps an exporter, so a scripted exporter (it answers what the test says
and records what it was given) stands where the network would; time is a number the test
moves. Records are real SDK objects (``ReadableSpan``, ``ReadableLogRecord``), and the fake
is a real ``SpanExporter`` or ``LogRecordExporter``: the result the SDK gets back must be the
enum of that exporter type. The real exporters against a real receiver are tested in
tests/e2e/test_reliability.py.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry._logs import LogRecord
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from elastic_otel.emit.counters import DeliveryCounters
from elastic_otel.emit.delivery import (
    _CHUNK,
    ExportWarnings,
    LogOutageBuffer,
    OutageBuffer,
    SpanOutageBuffer,
)

_RESOURCE = Resource.create({"service.name": "delivery-test"})


def _name(record: Any) -> str:
    if isinstance(record, ReadableSpan):
        return record.name
    return str(record.log_record.body)


class _Script:
    """What the fake exporter answers and what it saw (shared by the span and log fakes)."""

    def __init__(self) -> None:
        self.answer = "SUCCESS"  # SUCCESS, FAILURE or RAISE, once ``script`` is used up
        self.script: deque[str] = deque()  # answers for the next calls, in order
        self.poison: set[str] = set()  # a batch holding one of these raises (unencodable)
        self.on_export: Callable[[], None] | None = None
        self.batches: list[list[str]] = []
        self.answers: list[str] = []  # what each call answered
        self.shutdowns = 0
        self.flushes = 0

    def _answer(self, batch: Sequence[Any]) -> str:
        names = [_name(r) for r in batch]
        self.batches.append(names)
        if self.on_export is not None:
            self.on_export()
        answer = self.script.popleft() if self.script else self.answer
        if self.poison.intersection(names):
            answer = "RAISE"
        self.answers.append(answer)
        if answer == "RAISE":
            raise ValueError("cannot encode this record")
        return answer

    @property
    def sent(self) -> list[str]:
        """Every record name the exporter was given, in order."""
        return [name for batch in self.batches for name in batch]

    @property
    def delivered(self) -> list[str]:
        """Every record name of the calls that answered SUCCESS, in order."""
        ok = zip(self.batches, self.answers, strict=True)
        return [name for batch, answer in ok if answer == "SUCCESS" for name in batch]

    def shutdown(self) -> None:
        self.shutdowns += 1

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.flushes += 1
        return True


class FakeSpanExporter(_Script, SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult[self._answer(spans)]


class FakeLogExporter(_Script, LogRecordExporter):
    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        return LogRecordExportResult[self._answer(batch)]


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    buffer: OutageBuffer
    exporter: _Script
    clock: Clock
    counters: DeliveryCounters
    result: Any  # SpanExportResult or LogRecordExportResult
    kind: str

    def records(self, start: int, stop: int) -> list[Any]:
        if self.kind == "spans":
            return [ReadableSpan(name=f"r{i}", resource=_RESOURCE) for i in range(start, stop)]
        return [ReadableLogRecord(LogRecord(body=f"r{i}"), _RESOURCE) for i in range(start, stop)]

    def export(self, start: int, stop: int) -> Any:
        return self.buffer.export(self.records(start, stop))


def names(start: int, stop: int) -> list[str]:
    return [f"r{i}" for i in range(start, stop)]


def _harness(kind: str, max_items: int = 10) -> Harness:
    clock, counters = Clock(), DeliveryCounters()
    if kind == "spans":
        span_exporter = FakeSpanExporter()
        buffer: OutageBuffer = SpanOutageBuffer(
            span_exporter, counters, "traces", max_items=max_items, clock=clock
        )
        return Harness(buffer, span_exporter, clock, counters, SpanExportResult, kind)
    log_exporter = FakeLogExporter()
    buffer = LogOutageBuffer(log_exporter, counters, "logs", max_items=max_items, clock=clock)
    return Harness(buffer, log_exporter, clock, counters, LogRecordExportResult, kind)


@pytest.fixture(params=["spans", "logs"])
def h(request: pytest.FixtureRequest) -> Harness:
    return _harness(request.param)


@pytest.fixture
def elastic_warnings(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        yield caplog


def _bridge_warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "elastic_otel" and r.levelno >= logging.WARNING and text in r.getMessage()
    ]


# --- the outage buffer ---------------------------------------------------------------------------


def test_success_passes_through_with_the_exporters_own_result_type(h: Harness) -> None:
    result = h.export(0, 2)
    assert result is h.result.SUCCESS  # SpanExportResult for spans, LogRecordExportResult for logs
    assert h.exporter.batches == [names(0, 2)]
    assert h.counters.exported == 2 and h.buffer.pending == 0
    assert h.counters.export_failed_attempts == 0


def test_a_failure_holds_later_batches_without_network_calls_and_resends_oldest_first(
    h: Harness,
) -> None:
    h.exporter.answer = "FAILURE"
    assert h.export(0, 2) is h.result.FAILURE
    assert h.counters.export_failed_attempts == 1 and h.buffer.pending == 2
    # during the back-off: held without a call, and the SDK is told all is well (it would only
    # log a failure, and its batch processor would drop the batch)
    h.clock.now += 0.5
    assert h.export(2, 3) is h.result.SUCCESS
    h.clock.now += 0.4
    assert h.export(3, 5) is h.result.SUCCESS
    assert h.exporter.batches == [names(0, 2)] and h.buffer.pending == 5
    assert h.counters.exported == 0 and h.counters.export_failed_attempts == 1
    h.clock.now += 0.1  # 1 s after the failure: the collector is probed again
    h.exporter.answer = "SUCCESS"
    assert h.export(5, 6) is h.result.SUCCESS
    assert h.exporter.batches[1:] == [names(0, 6)]  # the backlog first, in order, then the new
    assert h.buffer.pending == 0 and h.counters.exported == 6


def test_a_backlog_of_many_chunks_goes_out_once_each_in_order_across_failures(
    h: Harness,
) -> None:
    total = 2 * _CHUNK + 100
    h = _harness(h.kind, max_items=10 * _CHUNK)
    h.exporter.answer = "FAILURE"
    h.export(0, 100)
    h.export(100, total)  # held: back-off
    assert h.buffer.pending == total
    # the collector comes back, takes one chunk, fails on the next
    h.exporter.script.extend(["SUCCESS", "FAILURE"])
    h.exporter.answer = "SUCCESS"
    h.clock.now += 1
    assert h.export(total, total + 1) is h.result.FAILURE
    assert h.counters.exported == _CHUNK and h.buffer.pending == total + 1 - _CHUNK
    h.clock.now += 2  # the second back-off is 2 s
    assert h.export(total + 1, total + 2) is h.result.SUCCESS
    assert h.exporter.answers == ["FAILURE", "SUCCESS", "FAILURE", "SUCCESS", "SUCCESS"]
    assert h.exporter.delivered == names(0, total + 2)  # each record once, oldest first
    assert h.counters.exported == total + 2 and h.buffer.pending == 0


def test_back_off_doubles_up_to_30_seconds_and_resets_after_a_success(h: Harness) -> None:
    h.exporter.answer = "FAILURE"
    h.export(0, 1)
    waits = []
    for _ in range(7):
        calls = len(h.exporter.batches)
        waited = 0.0
        while len(h.exporter.batches) == calls:
            assert waited < 60, "no retry within a minute"
            waited += 0.5
            h.clock.now += 0.5
            h.buffer.export([])
        waits.append(waited)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    h.exporter.answer = "SUCCESS"
    h.clock.now += 30
    h.export(1, 2)
    assert h.buffer.pending == 0
    h.exporter.answer = "FAILURE"
    h.export(2, 3)
    calls = len(h.exporter.batches)
    h.clock.now += 0.9
    h.buffer.export([])
    assert len(h.exporter.batches) == calls  # still backing off...
    h.clock.now += 0.1
    h.buffer.export([])
    assert len(h.exporter.batches) == calls + 1  # ...for 1 s again, not 30 s


def test_past_the_bound_the_oldest_are_dropped_counted_and_warned_once(
    h: Harness, elastic_warnings: pytest.LogCaptureFixture
) -> None:
    h.exporter.answer = "FAILURE"
    h.export(0, 8)
    h.export(8, 16)  # held: 16 > max_items 10
    h.export(16, 20)
    assert h.counters.dropped_collector_outage == 10 and h.buffer.pending == 10
    warnings = _bridge_warnings(elastic_warnings, "dropping the oldest")
    assert len(warnings) == 1 and "10" in warnings[0]
    h.exporter.answer = "SUCCESS"
    h.clock.now += 1
    h.buffer.export([])
    assert h.exporter.batches[-1] == names(10, 20)  # the newest ten survived, in order
    assert h.counters.exported == 10 and h.counters.dropped_collector_outage == 10


def test_a_batch_larger_than_the_bound_is_not_cut_while_the_collector_answers(
    h: Harness, elastic_warnings: pytest.LogCaptureFixture
) -> None:
    assert h.export(0, 25) is h.result.SUCCESS  # 25 > max_items 10
    assert h.exporter.sent == names(0, 25)
    assert h.counters.exported == 25 and h.counters.dropped_collector_outage == 0
    assert not _bridge_warnings(elastic_warnings, "dropping")
    # the same batch during an outage is held up to the bound only
    h.exporter.answer = "FAILURE"
    assert h.export(25, 50) is h.result.FAILURE
    assert h.buffer.pending == 10 and h.counters.dropped_collector_outage == 15


def test_a_chunk_the_exporter_raises_on_is_dropped_and_the_records_behind_it_go_out(
    h: Harness, elastic_warnings: pytest.LogCaptureFixture
) -> None:
    total = _CHUNK + 88
    h = _harness(h.kind, max_items=10 * _CHUNK)
    h.exporter.answer = "FAILURE"
    h.export(0, 1)
    h.export(1, total)  # held behind the failure
    h.exporter.answer = "SUCCESS"
    h.exporter.poison = {"r3"}  # in the first chunk of the backlog
    h.clock.now += 1
    assert h.export(total, total + 2) is h.result.SUCCESS
    assert h.counters.dropped_invalid == _CHUNK  # the chunk holding the poison
    assert h.exporter.batches[-1] == names(_CHUNK, total + 2)  # the rest, in order
    assert h.counters.exported == total + 2 - _CHUNK and h.buffer.pending == 0
    warnings = _bridge_warnings(elastic_warnings, "rejected")
    assert len(warnings) == 1 and "ValueError" in warnings[0]
    # not an outage: no back-off, the next batch goes straight out; a second rejection is
    # counted without another warning
    h.export(total + 2, total + 3)
    assert h.exporter.batches[-1] == names(total + 2, total + 3)
    h.exporter.poison = {f"r{total + 3}"}
    h.export(total + 3, total + 4)
    assert h.counters.dropped_invalid == _CHUNK + 1
    assert len(_bridge_warnings(elastic_warnings, "rejected")) == 1


def test_force_flush_ignores_the_back_off(h: Harness) -> None:
    h.exporter.answer = "FAILURE"
    h.export(0, 2)
    assert not h.buffer.force_flush()  # still down: not everything got out
    assert h.buffer.pending == 2 and len(h.exporter.batches) == 2  # tried despite the back-off
    h.exporter.answer = "SUCCESS"
    assert h.buffer.force_flush()  # the clock never moved
    assert h.exporter.batches[-1] == names(0, 2) and h.buffer.pending == 0
    assert h.exporter.flushes == 2  # the exporter's own flush ran too


def test_after_interrupt_exports_count_as_lost_at_exit(h: Harness) -> None:
    h.buffer.interrupt()
    assert h.exporter.shutdowns == 1  # the exporter is closed at once
    assert h.export(0, 3) is h.result.FAILURE
    assert h.counters.lost_at_exit == 3 and h.exporter.batches == []
    h.buffer.shutdown()
    assert h.exporter.shutdowns == 1  # not shut down twice


def test_an_export_cut_short_by_interrupt_is_lost_at_exit_not_invalid(h: Harness) -> None:
    def closed_under_the_export() -> None:
        h.buffer.interrupt()
        raise RuntimeError("channel closed")

    h.exporter.on_export = closed_under_the_export
    h.export(0, 4)
    assert h.counters.lost_at_exit == 4 and h.counters.dropped_invalid == 0


def test_shutdown_without_interrupt_shuts_the_exporter_down(h: Harness) -> None:
    h.buffer.shutdown()
    assert h.exporter.shutdowns == 1


# --- the export-warning filter -------------------------------------------------------------------


@pytest.fixture
def otel_logger(
    caplog: pytest.LogCaptureFixture,
) -> Iterator[tuple[logging.Logger, ExportWarnings]]:
    """A fresh OTel-like logger with a fresh filter, captured at DEBUG."""
    logger = logging.getLogger(f"opentelemetry.test.{uuid.uuid4().hex[:8]}")
    warnings = ExportWarnings()
    logger.addFilter(warnings)
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        yield logger, warnings
    logger.removeFilter(warnings)


def _failing_export() -> BaseException:
    try:
        raise ConnectionError("StatusCode.UNAVAILABLE")
    except ConnectionError as e:
        return e


def test_the_first_export_warning_is_one_concise_scrubbed_line(
    otel_logger: tuple[logging.Logger, ExportWarnings],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cr3t-token")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-api-key=k3y%2Fval, x=ab")
    logger, warnings = otel_logger
    logger.warning(
        "Failed to export span batch, headers %s, key %s, short %s\nsecond line s3cr3t",
        "Bearer s3cr3t-token",  # the decoded value, as the exporter holds it
        "k3y%2Fval",  # the raw (URL-encoded) value
        "ab",  # values under 4 characters are not treated as secrets
        exc_info=_failing_export(),
    )
    [record] = caplog.records
    message = record.getMessage()
    assert message.startswith("elastic-otel: telemetry export problem: Failed to export span")
    assert "s3cr3t" not in caplog.text and "k3y" not in caplog.text
    assert message.count("***") == 2 and "short ab" in message
    assert "Traceback" not in caplog.text and "second line" not in caplog.text
    assert "\n" not in message and record.exc_info is None
    assert "further errors are only counted" in message
    assert (warnings.reported, warnings.seen, warnings.suppressed) == (True, 1, 0)


def test_a_tls_problem_gets_a_certificate_hint(
    otel_logger: tuple[logging.Logger, ExportWarnings], caplog: pytest.LogCaptureFixture
) -> None:
    logger, _ = otel_logger
    logger.error("SSL handshake failed: certificate verify failed")
    assert "check OTEL_EXPORTER_OTLP_CERTIFICATE" in caplog.records[0].getMessage()


def test_later_export_warnings_are_counted_not_printed(
    otel_logger: tuple[logging.Logger, ExportWarnings], caplog: pytest.LogCaptureFixture
) -> None:
    logger, warnings = otel_logger
    logger.warning("Transient error StatusCode.UNAVAILABLE, retrying in %ss.", 1)
    logger.warning("Transient error StatusCode.UNAVAILABLE, retrying in %ss.", 2)
    logger.error("Failed to export batch", exc_info=_failing_export())
    logger.warning("Queue full, dropping %s.", "span")  # an application's batch processor
    logger.info("exporter detail %d", 7)
    logger.debug("more detail")
    shown = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len([s for s in shown if s[0] >= logging.WARNING]) == 1
    assert shown[1:] == [(logging.INFO, "exporter detail 7"), (logging.DEBUG, "more detail")]
    assert (warnings.seen, warnings.suppressed) == (4, 3)
