"""The test OTLP receiver is real: the OpenTelemetry SDK's own exporters talk to it."""

from __future__ import annotations

import gzip
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tests.support.otlp_receiver import (
    REQUESTS_CA_ENV_VARS,
    OtlpReceiver,
    decode_any_value,
    free_port,
    make_self_signed_cert,
)

PROTOCOLS = ["grpc", "http"]
RESOURCE = Resource.create({"service.name": "otlp-receiver-test", "host.rank": 3})
AUTH = {"authorization": "Bearer s3cret"}


def span_exporter(rx: OtlpReceiver, **kwargs: Any) -> Any:
    """The SDK's own span exporter for ``rx``'s protocol, with explicit arguments."""
    if rx.protocol == "grpc":
        if rx.tls:
            kwargs.setdefault("credentials", grpc.ssl_channel_credentials(rx.tls_cert_pem))
        else:
            kwargs.setdefault("insecure", True)
        return GrpcSpanExporter(endpoint=rx.endpoint, **kwargs)
    if rx.tls:
        kwargs.setdefault("certificate_file", rx.cert_file)
    return HttpSpanExporter(endpoint=rx.signal_endpoint("traces"), **kwargs)


def log_exporter(rx: OtlpReceiver, **kwargs: Any) -> Any:
    if rx.protocol == "grpc":
        return GrpcLogExporter(endpoint=rx.endpoint, insecure=True, **kwargs)
    return HttpLogExporter(endpoint=rx.signal_endpoint("logs"), **kwargs)


def metric_exporter(rx: OtlpReceiver, **kwargs: Any) -> Any:
    if rx.protocol == "grpc":
        return GrpcMetricExporter(endpoint=rx.endpoint, insecure=True, **kwargs)
    return HttpMetricExporter(endpoint=rx.signal_endpoint("metrics"), **kwargs)


def finished_spans(n: int = 1, name: str = "work") -> list[ReadableSpan]:
    """Make ``n`` finished SDK spans to hand to an exporter's ``export()`` directly."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("direct")
    for i in range(n):
        with tracer.start_as_current_span(f"{name}-{i}"):
            pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def refused(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(params=PROTOCOLS)
def rx(request: pytest.FixtureRequest) -> Iterator[OtlpReceiver]:
    with OtlpReceiver(request.param) as receiver:
        yield receiver


@pytest.fixture(scope="module")
def self_signed() -> tuple[bytes, bytes]:
    return make_self_signed_cert()


@pytest.fixture
def cert(self_signed: tuple[bytes, bytes], monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, bytes]:
    """The test cert; also unsets the CA-bundle variables that make requests ignore it."""
    for name in REQUESTS_CA_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    return self_signed


# ---- signals --------------------------------------------------------------------------------


def test_spans_roundtrip(rx: OtlpReceiver) -> None:
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(span_exporter(rx, headers=AUTH)))
    tracer = provider.get_tracer("rx.scope", "1.2.3")
    with tracer.start_as_current_span("linked") as linked:
        pass
    link = Link(linked.get_span_context(), {"link.kind": "restart"})
    with tracer.start_as_current_span("parent", kind=SpanKind.SERVER, links=[link]) as parent:
        parent.set_attributes(
            {"s": "x", "b": True, "i": 7, "f": 1.5, "ls": ["a", "b"], "li": [1, 2]}
        )
        parent.add_event("rendezvous", {"round": 2})
        parent.set_status(Status(StatusCode.ERROR, "worker died"))
        with tracer.start_as_current_span("child"):
            pass
    provider.shutdown()

    spans = {s["name"]: s for s in rx.wait_for_spans(3, timeout=5)}
    p, c = spans["parent"], spans["child"]
    ctx = parent.get_span_context()
    assert p["trace_id"] == f"{ctx.trace_id:032x}" and p["span_id"] == f"{ctx.span_id:016x}"
    assert p["parent_span_id"] == "" and c["parent_span_id"] == p["span_id"]
    assert c["trace_id"] == p["trace_id"]
    assert p["kind"] == 2  # proto SPAN_KIND_SERVER (SDK's SpanKind.SERVER is 1)
    assert c["kind"] == 1  # proto SPAN_KIND_INTERNAL
    assert p["attributes"] == {
        "s": "x", "b": True, "i": 7, "f": 1.5, "ls": ["a", "b"], "li": [1, 2]
    }  # fmt: skip
    assert [(e["name"], e["attributes"]) for e in p["events"]] == [("rendezvous", {"round": 2})]
    assert p["events"][0]["time_ns"] >= p["start_ns"]
    assert p["links"] == [
        {
            "trace_id": spans["linked"]["trace_id"],
            "span_id": spans["linked"]["span_id"],
            "attributes": {"link.kind": "restart"},
        }
    ]
    assert (p["status_code"], p["status_message"]) == ("ERROR", "worker died")
    assert c["status_code"] == "UNSET"
    assert p["end_ns"] >= p["start_ns"] > 0
    assert p["resource"]["service.name"] == "otlp-receiver-test"
    assert p["resource"]["host.rank"] == 3
    assert p["scope"] == "rx.scope" and p["scope_version"] == "1.2.3"

    assert len(rx.requests["traces"]) == 3  # SimpleSpanProcessor: one request per span
    assert rx.requests["logs"] == [] and rx.logs() == []
    headers = rx.request_headers
    assert len(headers) == 3 and all(h["authorization"] == "Bearer s3cret" for h in headers)
    assert rx.request_headers_for("traces") == headers
    assert rx.attempts == {"traces": 3, "logs": 0, "metrics": 0}


def test_logs_roundtrip(rx: OtlpReceiver) -> None:
    provider = LoggerProvider(resource=RESOURCE)
    provider.add_log_record_processor(SimpleLogRecordProcessor(log_exporter(rx)))
    logger = provider.get_logger("rx.logs")
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("around") as span:
        logger.emit(
            timestamp=1_700_000_000_123_456_789,
            severity_number=SeverityNumber.WARN,
            severity_text="WARN",
            body={"msg": "worker restarted", "ranks": [0, 1]},
            attributes={"restart_count": 2, "group": "g0"},
            event_name="torchelastic.worker.restart",
        )
    logger.emit(body="plain", severity_number=SeverityNumber.INFO)
    provider.shutdown()

    first, second = rx.wait_for_logs(2, timeout=5)
    ctx = span.get_span_context()
    assert first["trace_id"] == f"{ctx.trace_id:032x}"
    assert first["span_id"] == f"{ctx.span_id:016x}"
    assert first["event_name"] == "torchelastic.worker.restart"
    assert first["severity_number"] == SeverityNumber.WARN.value
    assert first["severity_text"] == "WARN"
    assert first["body"] == {"msg": "worker restarted", "ranks": [0, 1]}
    assert first["attributes"] == {"restart_count": 2, "group": "g0"}
    assert first["time_ns"] == 1_700_000_000_123_456_789 and first["observed_time_ns"] > 0
    assert second["time_ns"] == 0  # the SDK leaves time unset unless given; observed is set
    assert first["resource"]["service.name"] == "otlp-receiver-test"
    assert first["scope"] == "rx.logs"
    assert second["body"] == "plain"
    assert (second["event_name"], second["trace_id"], second["span_id"]) == ("", "", "")


def test_metrics_roundtrip(rx: OtlpReceiver) -> None:
    reader = PeriodicExportingMetricReader(metric_exporter(rx), export_interval_millis=3_600_000)
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    meter = provider.get_meter("rx.metrics")
    restarts = meter.create_counter("restarts", unit="1", description="worker restarts")
    latency = meter.create_histogram("rdzv.latency", unit="s")
    restarts.add(3, {"group": "a"})
    restarts.add(2, {"group": "a"})
    restarts.add(1, {"group": "b"})
    latency.record(0.5)
    latency.record(20.0)
    assert provider.force_flush(5_000)

    points = rx.wait_for_metrics(3, timeout=5)
    provider.shutdown()
    counters = {p["attributes"]["group"]: p for p in points if p["name"] == "restarts"}
    assert counters["a"]["value"] == 5 and counters["b"]["value"] == 1
    a = counters["a"]
    assert (a["type"], a["unit"], a["description"]) == ("sum", "1", "worker restarts")
    assert a["is_monotonic"] is True and a["temporality"] == "CUMULATIVE"
    assert a["resource"]["service.name"] == "otlp-receiver-test" and a["scope"] == "rx.metrics"
    (hist,) = [p for p in points if p["name"] == "rdzv.latency"]
    assert hist["type"] == "histogram" and hist["unit"] == "s"
    assert (hist["count"], hist["sum"], hist["min"], hist["max"]) == (2, 20.5, 0.5, 20.0)
    assert sum(hist["bucket_counts"]) == 2
    assert len(hist["bucket_counts"]) == len(hist["explicit_bounds"]) + 1
    assert hist["attributes"] == {}


def test_any_value_decoding() -> None:
    value = AnyValue(
        kvlist_value=KeyValueList(
            values=[
                KeyValue(key="bytes", value=AnyValue(bytes_value=b"\x00\xff")),
                KeyValue(key="double", value=AnyValue(double_value=0.25)),
                KeyValue(
                    key="array",
                    value=AnyValue(
                        array_value=ArrayValue(
                            values=[AnyValue(int_value=-1), AnyValue(bool_value=False), AnyValue()]
                        )
                    ),
                ),
            ]
        )
    )
    assert decode_any_value(value) == {
        "bytes": b"\x00\xff",
        "double": 0.25,
        "array": [-1, False, None],
    }
    assert decode_any_value(AnyValue()) is None


# ---- transport details ----------------------------------------------------------------------


@pytest.mark.parametrize("compression", [HttpCompression.Gzip, HttpCompression.Deflate])
def test_http_compression(compression: HttpCompression) -> None:
    with OtlpReceiver("http") as rx:
        exporter = HttpSpanExporter(endpoint=rx.signal_endpoint("traces"), compression=compression)
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        assert rx.spans()[0]["name"] == "work-0"
        assert rx.request_headers[0]["content-encoding"] == compression.value
        exporter.shutdown()


def test_grpc_compression() -> None:
    with OtlpReceiver("grpc") as rx:
        exporter = span_exporter(rx, compression=grpc.Compression.Gzip)
        assert exporter.export(finished_spans(2)) is SpanExportResult.SUCCESS
        assert [s["name"] for s in rx.spans()] == ["work-0", "work-1"]
        exporter.shutdown()


def test_http_protocol_errors() -> None:
    with OtlpReceiver("http") as rx:
        body = ExportTraceServiceRequest().SerializeToString()

        def post(path: str, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
            req = urllib.request.Request(rx.endpoint + path, data=data, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    return resp.status, resp.read()
            except urllib.error.HTTPError as err:
                return err.code, err.read()

        proto = {"Content-Type": "application/x-protobuf"}
        status, reply = post(
            "/v1/traces", gzip.compress(body), {**proto, "Content-Encoding": "gzip"}
        )
        assert status == 200
        assert ExportTraceServiceResponse.FromString(reply) == ExportTraceServiceResponse()
        assert post("/v1/traces", body, {"Content-Type": "application/json"})[0] == 415
        assert post("/v1/nope", body, proto)[0] == 404
        assert post("/v1/traces", b"\xff\xff\xff", proto)[0] == 400
        assert len(rx.requests["traces"]) == 1


# ---- TLS ------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tls(protocol: str, cert: tuple[bytes, bytes]) -> None:
    with OtlpReceiver(protocol, tls=cert) as rx:
        assert rx.endpoint.startswith("https://127.0.0.1:")
        assert rx.cert_file is not None and rx.tls_cert_pem == cert[0]
        with open(rx.cert_file, "rb") as f:
            assert f.read() == cert[0]
        exporter = span_exporter(rx)
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        assert rx.wait_for_spans(1)[0]["name"] == "work-0"
        exporter.shutdown()

        # A client that does not trust the certificate gets nothing through.
        if protocol == "grpc":
            untrusting = GrpcSpanExporter(
                endpoint=rx.endpoint, credentials=grpc.ssl_channel_credentials(), timeout=0.5
            )
        else:
            untrusting = HttpSpanExporter(endpoint=rx.signal_endpoint("traces"), timeout=0.5)
        assert untrusting.export(finished_spans()) is SpanExportResult.FAILURE
        untrusting.shutdown()
        assert len(rx.spans()) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_env_vars_drive_exporters(
    protocol: str, cert: tuple[bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``exporter_env()`` (base endpoint + CA file) is enough for argument-less exporters."""
    with OtlpReceiver(protocol, tls=cert) as rx:
        for name, value in rx.exporter_env().items():
            monkeypatch.setenv(name, value)
        exporter = GrpcLogExporter() if protocol == "grpc" else HttpLogExporter()
        provider = LoggerProvider(resource=RESOURCE)
        provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
        provider.get_logger("env").emit(body="via env", event_name="env.event")
        provider.shutdown()
        (log,) = rx.wait_for_logs(1, timeout=5)
        assert (log["body"], log["event_name"]) == ("via env", "env.event")


# ---- outages, failures, slowness ------------------------------------------------------------


def test_stop_and_restart_on_same_port(rx: OtlpReceiver) -> None:
    exporter = span_exporter(rx, timeout=0.5)
    assert exporter.export(finished_spans(name="before")) is SpanExportResult.SUCCESS
    port = rx.port

    rx.stop()
    assert not rx.running and refused(port)
    assert exporter.export(finished_spans(name="during")) is SpanExportResult.FAILURE

    rx.restart()
    assert rx.port == port and not refused(port)
    exporter_2 = span_exporter(rx)  # the original exporter may be backing off; both must work
    assert exporter_2.export(finished_spans(name="after")) is SpanExportResult.SUCCESS
    names = [s["name"] for s in rx.wait_for_spans(2, timeout=5)]
    assert names == ["before-0", "after-0"]
    exporter.shutdown()
    exporter_2.shutdown()

    rx.close()
    assert refused(port)


def test_stop_then_restart_same_exporter(rx: OtlpReceiver) -> None:
    """One long-lived exporter survives a collector outage (the torchrun agent's case)."""
    exporter = span_exporter(rx, timeout=5)
    assert exporter.export(finished_spans(name="a")) is SpanExportResult.SUCCESS
    rx.restart()
    assert exporter.export(finished_spans(name="b")) is SpanExportResult.SUCCESS
    assert [s["name"] for s in rx.spans()] == ["a-0", "b-0"]
    exporter.shutdown()


def test_transient_failure_is_retried(rx: OtlpReceiver) -> None:
    rx.set_failure("unavailable", times=1, retry_after_s=0.05)
    exporter = span_exporter(rx, timeout=5)
    assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
    assert rx.attempts["traces"] == 2
    assert len(rx.spans()) == 1 and len(rx.requests["traces"]) == 1

    rx.set_failure("invalid_argument")  # permanent: no retry, nothing stored
    assert exporter.export(finished_spans()) is SpanExportResult.FAILURE
    assert rx.attempts["traces"] == 3 and len(rx.spans()) == 1

    rx.set_failure(None)
    assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
    assert len(rx.spans()) == 2
    exporter.shutdown()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fail_with_constructor_option(protocol: str) -> None:
    with OtlpReceiver(protocol, fail_with="unavailable") as rx:
        exporter = span_exporter(rx, timeout=0.3)
        assert exporter.export(finished_spans()) is SpanExportResult.FAILURE
        assert rx.attempts["traces"] >= 1 and rx.spans() == []
        exporter.shutdown()


def test_slow_collector(rx: OtlpReceiver) -> None:
    rx.delay_s = 0.6
    exporter = span_exporter(rx, timeout=0.2)
    assert exporter.export(finished_spans()) is SpanExportResult.FAILURE
    rx.wait_until(lambda: rx.dropped["traces"] >= 1, timeout=5)
    assert rx.spans() == []

    rx.delay_s = 0.1
    patient = span_exporter(rx, timeout=5)
    assert patient.export(finished_spans()) is SpanExportResult.SUCCESS
    assert len(rx.spans()) == 1
    exporter.shutdown()
    patient.shutdown()


# ---- API odds and ends ----------------------------------------------------------------------


def test_wait_helpers_and_clear() -> None:
    with OtlpReceiver("http", port=free_port()) as rx:
        with pytest.raises(TimeoutError, match="1 matching traces items, got 0"):
            rx.wait_for_spans(1, timeout=0.1)
        exporter = span_exporter(rx)
        exporter.export(finished_spans(3))
        assert len(rx.wait_for_spans(1, where=lambda s: s["name"] == "work-1")) == 1
        assert rx.wait_until(lambda: len(rx.spans()) == 3, timeout=1)
        rx.clear()
        assert rx.spans() == [] and rx.requests["traces"] == [] and rx.request_headers == []
        exporter.shutdown()


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        OtlpReceiver("thrift")
    with pytest.raises(ValueError):
        OtlpReceiver("grpc", fail_with="nope")
    assert OtlpReceiver("http/protobuf").protocol == "http"
    with pytest.raises(RuntimeError):
        _ = OtlpReceiver("grpc").endpoint  # port 0 is only chosen at start()
