"""Where one event's CPU goes: the bridge's stages timed one by one, single-threaded.

No threads and no network: each stage runs over the whole mixed stream in a loop
(best of ``repeat`` passes, µs per event), fed with the previous stage's output:

* ``parse``: ``parsing.parse_event`` (JSON text → ``ElasticEvent``);
* ``model``: ``TraceModel.process`` (fresh model per pass: spans and logs to emit);
* ``emit log`` / ``emit span``: ``Emitter.emit_log`` / ``emit_span`` made as the pipeline makes
  it (``Pipeline.emitter``): log records onto a list where its export queues would be, spans
  into an SDK span processor that only collects (the queues' own append is left out);
* ``encode logs`` / ``encode spans``: the OTLP exporters' protobuf translation
  (``encode_logs`` / ``encode_spans`` on batches of 512, as the batch processors hand them)
  plus ``SerializeToString``;
* for comparison, OpenTelemetry's ``LoggingHandler.emit`` and the encoding of its records.

Also: how many attributes the bridge's records carry, and what ``Resource.__hash__`` (called
by the SDK's encoders once per record) costs. Uses the package's internal modules; if their
names change this section fails and says so, the others are unaffected.

Renders its part of section 3 of BENCHMARKS.md (:func:`render`).
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import common
from benchmarks.format import number as _f
from benchmarks.format import table as _table

MODULE = "benchmarks.stages"
BATCH = 512


def _best(fn: Callable[[], Any], n: int, repeat: int) -> float:
    """Best-of-``repeat`` µs per item of ``fn()`` handling ``n`` items."""
    best = float("inf")
    for _ in range(repeat):
        common.settle()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best / max(1, n) * 1e6


def _batches(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i : i + BATCH] for i in range(0, len(items), BATCH)]


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """Child: time every stage over ``events`` events of the mixed stream."""
    common.pin(common.measured_cpu())
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk._logs import (
        LoggerProvider,
        LoggingHandler,
        LogRecordLimits,
        LogRecordProcessor,
    )
    from opentelemetry.sdk.trace import SpanProcessor

    from benchmarks import events as ev
    from elastic_otel.emit.pipeline import Pipeline, build_resource
    from elastic_otel.model.trace_model import TraceModel
    from elastic_otel.parsing.torch_events import parse_event

    class Collect(LogRecordProcessor, SpanProcessor):  # type: ignore[misc]
        def __init__(self) -> None:
            self.items: list[Any] = []

        def on_emit(self, log_record: Any) -> None:
            self.items.append(log_record)

        def on_end(self, span: Any) -> None:
            self.items.append(span)

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            pass

        def shutdown(self) -> None:
            pass

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    n, repeat = config["events"], config["repeat"]
    payloads = ev.serialize(ev.mixed_objects(n))
    created = [time.time_ns()] * n
    out: dict[str, Any] = {"events": n, "us_per_event": {}, "per_item": {}}
    us = out["us_per_event"]

    def parse_all() -> list[Any]:
        return [parse_event(p, c) for p, c in zip(payloads, created, strict=True)]

    us["parse"] = _best(parse_all, n, repeat)
    parsed = parse_all()

    def run_model() -> list[Any]:
        model = TraceModel(salt="benchmark")
        return [model.process(e) for e in parsed]

    us["model"] = _best(run_model, n, repeat)
    outputs = run_model()
    logs = [entry for o in outputs for entry in o.logs]
    spans = [s for o in outputs for s in o.spans]

    resource = build_resource()
    log_sink, span_sink = Collect(), Collect()
    limits = LogRecordLimits()
    provider = LoggerProvider(resource=resource, shutdown_on_exit=False, log_record_limits=limits)
    pipeline = Pipeline(
        provider.get_logger("elastic_otel", "bench"),
        span_sink,
        resource,
        owned=True,
        log_sinks=[log_sink.items.append],
        log_limits=limits,
    )
    emitter = pipeline.emitter("bench", True, None)

    def emit_logs() -> None:
        log_sink.items.clear()
        for event, trace_id, span_id in logs:
            emitter.emit_log(event, trace_id, span_id)

    def emit_spans() -> None:
        span_sink.items.clear()
        for span in spans:
            emitter.emit_span(span)

    us["emit log"] = _best(emit_logs, n, repeat)
    us["emit span"] = _best(emit_spans, n, repeat)
    emit_logs()
    emit_spans()
    log_records, span_records = list(log_sink.items), list(span_sink.items)
    out["per_item"]["emit log (per log)"] = us["emit log"] * n / max(1, len(log_records))
    out["per_item"]["emit span (per span)"] = us["emit span"] * n / max(1, len(span_records))

    def encode(fn: Callable[[Any], Any], records: list[Any]) -> Callable[[], None]:
        return lambda: [fn(batch).SerializeToString() for batch in _batches(records)]

    us["encode logs"] = _best(encode(encode_logs, log_records), n, repeat)
    us["encode spans"] = _best(encode(encode_spans, span_records), n, repeat)
    out["per_item"]["encode (per log)"] = us["encode logs"] * n / max(1, len(log_records))
    out["per_item"]["encode (per span)"] = us["encode spans"] * n / max(1, len(span_records))
    out["logs_per_event"] = len(log_records) / n
    out["spans_per_event"] = len(span_records) / n
    out["attributes_per_log"] = sum(len(r.log_record.attributes) for r in log_records) / max(
        1, len(log_records)
    )
    out["attributes_per_span"] = sum(len(s.attributes) for s in span_records) / max(
        1, len(span_records)
    )
    out["events_per_span"] = sum(len(s.events) for s in span_records) / max(1, len(span_records))
    out["resource_attributes"] = len(resource.attributes)
    hashes = 10_000
    out["per_item"]["Resource.__hash__ (per record)"] = _best(
        lambda: [hash(resource) for _ in range(hashes)], hashes, repeat
    )
    us["total (worker + exporters)"] = sum(us.values())

    # OpenTelemetry's LoggingHandler on the same payloads, for comparison.
    sdk_sink = Collect()
    sdk_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    sdk_provider.add_log_record_processor(sdk_sink)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        handler = LoggingHandler(logger_provider=sdk_provider)
    maker = logging.getLogger("torchelastic-events-bench")
    records = [
        maker.makeRecord(maker.name, logging.INFO, __file__, 1, p, None, None) for p in payloads
    ]

    def sdk_emit() -> None:
        sdk_sink.items.clear()
        for r in records:
            handler.emit(r)

    sdk = out["logging_handler_us_per_event"] = {}
    sdk["emit (caller thread)"] = _best(sdk_emit, n, repeat)
    sdk_emit()
    sdk_records = list(sdk_sink.items)
    sdk["encode logs"] = _best(encode(encode_logs, sdk_records), n, repeat)
    sdk["total"] = sdk["emit (caller thread)"] + sdk["encode logs"]
    out["logging_handler_attributes_per_log"] = sum(
        len(r.log_record.attributes) for r in sdk_records
    ) / max(1, len(sdk_records))
    return out


def run(quick: bool) -> dict[str, Any]:
    config = {"events": 200 if quick else 10_000, "repeat": 1 if quick else 3}
    return common.run_child(MODULE, config, common.clean_env({"ELASTIC_OTEL_JOB_ID": "bench"}))


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


def render(st: dict[str, Any]) -> list[str]:
    """Section 3's part "Where one event's CPU goes", from :func:`run`'s results."""
    us = st["us_per_event"]
    total = us.get("total (worker + exporters)") or 1.0
    lines = [
        "### Where one event's CPU goes",
        "",
        f"Each stage of the bridge timed alone, single-threaded, over {st['events']:,} events "
        "of the same stream (best of several passes; `benchmarks/stages.py`). Per event: "
        f"{st['logs_per_event']:.2f} log records and {st['spans_per_event']:.2f} spans; "
        f"{st['attributes_per_log']:.1f} attributes per log record, "
        f"{st['attributes_per_span']:.1f} per span, {st['events_per_span']:.2f} span events "
        f"per span; the resource has {st['resource_attributes']} attributes. The sum is the "
        "CPU one event costs on the worker and exporter threads; 10,000 events/s on one core "
        "leaves 100 µs, for these and the caller's and the threads' hand-offs together.",
        "",
    ]
    lines += _table(
        ["stage", "µs per event", "share"],
        (
            (name, _f(v), f"{100 * v / total:.0f} %" if "total" not in name else "")
            for name, v in us.items()
        ),
    )
    lines += _table(["per record", "µs"], ((k, _f(v)) for k, v in st["per_item"].items()))
    sdk = st["logging_handler_us_per_event"]
    lines += [
        "OpenTelemetry's `LoggingHandler` on the same payloads (record = the JSON text as body, "
        f"{st['logging_handler_attributes_per_log']:.0f} attributes): "
        f"`emit` {_f(sdk['emit (caller thread)'])} µs on the caller's thread, encoding "
        f"{_f(sdk['encode logs'])} µs, in all {_f(sdk['total'])} µs per event.",
        "",
    ]
    return lines


if __name__ == "__main__":
    common.child_main(sys.argv[1:], measure)
