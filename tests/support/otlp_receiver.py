"""A real, in-process OTLP receiver for tests.

``OtlpReceiver`` listens on 127.0.0.1 and speaks OTLP over gRPC (a grpcio server implementing
the collector's TraceService, LogsService and MetricsService) or over HTTP/protobuf (a threaded
``http.server`` serving ``POST /v1/traces``, ``/v1/logs`` and ``/v1/metrics``). It decodes every
accepted export into plain dicts (see ``spans()``, ``logs()`` and ``metrics()``) and can play a
slow collector (``delay_s``), a failing one (``fail_with``), a TLS one (``tls``) or an outage
(``stop()`` then ``restart()`` on the same port).

Usage::

    with OtlpReceiver("http") as rx:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = rx.endpoint
        ...
        logs = rx.wait_for_logs(1, timeout=5)
"""

from __future__ import annotations

import contextlib
import datetime
import gzip
import ipaddress
import os
import select
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError, Message
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status as RpcStatus
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = [
    "REQUESTS_CA_ENV_VARS",
    "SIGNALS",
    "OtlpReceiver",
    "decode_any_value",
    "decode_logs",
    "decode_metrics",
    "decode_spans",
    "free_port",
    "make_self_signed_cert",
]

T = TypeVar("T")
Headers = dict[str, Any]
Item = dict[str, Any]

LOCALHOST = "127.0.0.1"
# requests lets these override a Session's ``verify``, so when one is set the OTLP/HTTP
# exporters silently ignore ``certificate_file`` / OTEL_EXPORTER_OTLP_CERTIFICATE. Unset them
# (e.g. ``monkeypatch.delenv``) in tests that talk HTTPS to a TLS receiver.
REQUESTS_CA_ENV_VARS: tuple[str, ...] = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
SIGNALS: tuple[str, ...] = ("traces", "logs", "metrics")

_REQUEST_TYPES: dict[str, type[Message]] = {
    "traces": trace_service_pb2.ExportTraceServiceRequest,
    "logs": logs_service_pb2.ExportLogsServiceRequest,
    "metrics": metrics_service_pb2.ExportMetricsServiceRequest,
}
_RESPONSE_TYPES: dict[str, type[Message]] = {
    "traces": trace_service_pb2.ExportTraceServiceResponse,
    "logs": logs_service_pb2.ExportLogsServiceResponse,
    "metrics": metrics_service_pb2.ExportMetricsServiceResponse,
}
_HTTP_PATHS = {f"/v1/{signal}": signal for signal in SIGNALS}
_STATUS_NAMES = {0: "UNSET", 1: "OK", 2: "ERROR"}
_TEMPORALITY_NAMES = {0: "UNSPECIFIED", 1: "DELTA", 2: "CUMULATIVE"}

# Named failure modes: gRPC status code and the HTTP status an OTLP/HTTP collector would use.
_FAILURES: dict[str, tuple[grpc.StatusCode, int]] = {
    "unavailable": (grpc.StatusCode.UNAVAILABLE, 503),
    "resource_exhausted": (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    "deadline_exceeded": (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
    "internal": (grpc.StatusCode.INTERNAL, 500),
    "invalid_argument": (grpc.StatusCode.INVALID_ARGUMENT, 400),
    "unauthenticated": (grpc.StatusCode.UNAUTHENTICATED, 401),
    "permission_denied": (grpc.StatusCode.PERMISSION_DENIED, 403),
}
_HTTP_TO_GRPC = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.UNAVAILABLE,
}
FailWith = str | int | grpc.StatusCode


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def free_port(host: str = LOCALHOST) -> int:
    """Return a TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def make_self_signed_cert(hostname: str = "localhost") -> tuple[bytes, bytes]:
    """Make a self-signed server certificate, returning ``(cert_pem, key_pem)``.

    The certificate is its own CA (so the cert PEM doubles as the client's trust file) and has
    subject alternative names for ``hostname``, ``localhost``, 127.0.0.1 and ::1. Uses
    ``cryptography`` and falls back to the ``openssl`` command line when it is not installed.
    """
    try:
        return _self_signed_cryptography(hostname)
    except ImportError:
        return _self_signed_openssl(hostname)


def _self_signed_cryptography(hostname: str) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    dns_names = dict.fromkeys([hostname, "localhost"])
    san = x509.SubjectAlternativeName(
        [x509.DNSName(n) for n in dns_names]
        + [
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]
    )
    now = datetime.datetime.now(datetime.timezone.utc)
    public_key = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(public_key), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert_pem, key_pem


def _self_signed_openssl(hostname: str) -> tuple[bytes, bytes]:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("make_self_signed_cert needs the cryptography package or openssl")
    san = f"DNS:{hostname},DNS:localhost,IP:127.0.0.1,IP:::1"
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "2", "-subj", f"/CN={hostname}", "-keyout", key_path,
             "-out", cert_path, "-addext", f"subjectAltName={san}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,digitalSignature,keyAgreement,keyCertSign,cRLSign",
             "-addext", "extendedKeyUsage=serverAuth,clientAuth"],
            check=True,
            capture_output=True,
        )  # fmt: skip
        with open(cert_path, "rb") as c, open(key_path, "rb") as k:
            return c.read(), k.read()


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


def decode_any_value(value: AnyValue) -> Any:
    """Turn an OTLP ``AnyValue`` into the matching plain Python value (unset -> None)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [decode_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return bytes(value.bytes_value)
    return getattr(value, kind)


def decode_attributes(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    """Turn repeated OTLP ``KeyValue`` into a dict."""
    return {kv.key: decode_any_value(kv.value) for kv in attributes}


def _optional(msg: Message, field: str) -> Any:
    return getattr(msg, field) if msg.HasField(field) else None


def decode_spans(request: trace_service_pb2.ExportTraceServiceRequest) -> list[Item]:
    """Flatten an ``ExportTraceServiceRequest`` into one dict per span."""
    out: list[Item] = []
    for resource_spans in request.resource_spans:
        resource = decode_attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    {
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "trace_state": span.trace_state,
                        "flags": span.flags,
                        "name": span.name,
                        "kind": int(span.kind),
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "attributes": decode_attributes(span.attributes),
                        "events": [
                            {
                                "name": event.name,
                                "time_ns": event.time_unix_nano,
                                "attributes": decode_attributes(event.attributes),
                            }
                            for event in span.events
                        ],
                        "links": [
                            {
                                "trace_id": link.trace_id.hex(),
                                "span_id": link.span_id.hex(),
                                "attributes": decode_attributes(link.attributes),
                            }
                            for link in span.links
                        ],
                        "status_code": _STATUS_NAMES.get(span.status.code, str(span.status.code)),
                        "status_message": span.status.message,
                        "resource": resource,
                        "scope": scope_spans.scope.name,
                        "scope_version": scope_spans.scope.version,
                    }
                )
    return out


def decode_logs(request: logs_service_pb2.ExportLogsServiceRequest) -> list[Item]:
    """Flatten an ``ExportLogsServiceRequest`` into one dict per log record."""
    out: list[Item] = []
    for resource_logs in request.resource_logs:
        resource = decode_attributes(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                out.append(
                    {
                        "time_ns": record.time_unix_nano,
                        "observed_time_ns": record.observed_time_unix_nano,
                        "severity_number": int(record.severity_number),
                        "severity_text": record.severity_text,
                        "body": decode_any_value(record.body),
                        "attributes": decode_attributes(record.attributes),
                        "trace_id": record.trace_id.hex(),
                        "span_id": record.span_id.hex(),
                        "flags": record.flags,
                        "event_name": record.event_name,
                        "resource": resource,
                        "scope": scope_logs.scope.name,
                        "scope_version": scope_logs.scope.version,
                    }
                )
    return out


def _number_value(point: Message) -> int | float | None:
    kind = point.WhichOneof("value")
    return None if kind is None else getattr(point, kind)


def _metric_point(metric: Message, kind: str, point: Message, common: Item) -> Item:
    item: Item = {
        "name": metric.name,
        "description": metric.description,
        "unit": metric.unit,
        "type": kind,
        "attributes": decode_attributes(point.attributes),
        "start_ns": point.start_time_unix_nano,
        "time_ns": point.time_unix_nano,
        **common,
    }
    data = getattr(metric, kind)
    if kind in ("sum", "gauge"):
        item["value"] = _number_value(point)
    else:
        item["count"] = point.count
        item["sum"] = point.sum if kind == "summary" else _optional(point, "sum")
    if kind == "sum":
        item["is_monotonic"] = data.is_monotonic
    if kind in ("sum", "histogram", "exponential_histogram"):
        item["temporality"] = _TEMPORALITY_NAMES.get(data.aggregation_temporality, "UNSPECIFIED")
    if kind == "histogram":
        item["bucket_counts"] = list(point.bucket_counts)
        item["explicit_bounds"] = list(point.explicit_bounds)
    if kind in ("histogram", "exponential_histogram"):
        item["min"] = _optional(point, "min")
        item["max"] = _optional(point, "max")
    if kind != "summary":
        item["exemplars"] = [
            {
                "trace_id": e.trace_id.hex(),
                "span_id": e.span_id.hex(),
                "value": _number_value(e),
                "time_ns": e.time_unix_nano,
            }
            for e in point.exemplars
        ]
    if kind == "exponential_histogram":
        item["scale"] = point.scale
        item["zero_count"] = point.zero_count
        for side in ("positive", "negative"):
            buckets = getattr(point, side)
            item[side] = {"offset": buckets.offset, "bucket_counts": list(buckets.bucket_counts)}
    if kind == "summary":
        item["quantiles"] = [
            {"quantile": q.quantile, "value": q.value} for q in point.quantile_values
        ]
    return item


def decode_metrics(request: metrics_service_pb2.ExportMetricsServiceRequest) -> list[Item]:
    """Flatten an ``ExportMetricsServiceRequest`` into one dict per data point."""
    out: list[Item] = []
    for resource_metrics in request.resource_metrics:
        resource = decode_attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            common = {"resource": resource, "scope": scope_metrics.scope.name}
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                for point in getattr(metric, kind).data_points:
                    out.append(_metric_point(metric, kind, point, common))
    return out


_DECODERS: dict[str, Callable[[Any], list[Item]]] = {
    "traces": decode_spans,
    "logs": decode_logs,
    "metrics": decode_metrics,
}


# --------------------------------------------------------------------------------------------
# Receiver
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Failure:
    grpc_code: grpc.StatusCode
    http_status: int
    message: str
    retry_after_s: float | None


class _Aborted(Exception):
    """The export was cut short (receiver stopped, or the client gave up during the delay)."""


def _resolve_failure(fail_with: FailWith) -> tuple[grpc.StatusCode, int]:
    if isinstance(fail_with, grpc.StatusCode):
        for code, http_status in _FAILURES.values():
            if code is fail_with:
                return code, http_status
        return fail_with, 500
    if isinstance(fail_with, int):
        return _HTTP_TO_GRPC.get(fail_with, grpc.StatusCode.UNKNOWN), fail_with
    try:
        return _FAILURES[fail_with.lower()]
    except KeyError:
        raise ValueError(f"unknown fail_with {fail_with!r}; use one of {sorted(_FAILURES)}, "
                         "an HTTP status int or a grpc.StatusCode") from None  # fmt: skip


def _pem(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


class OtlpReceiver:
    """In-process OTLP collector stand-in (gRPC or HTTP/protobuf, optional TLS).

    Args:
        protocol: ``"grpc"`` or ``"http"`` (``"http/protobuf"`` is accepted too).
        port: port to listen on; 0 picks a free one at the first ``start()`` and keeps it.
        tls: ``(cert_pem, key_pem)``; when given the receiver only speaks TLS and the cert is
            written to ``cert_file`` for clients (e.g. ``OTEL_EXPORTER_OTLP_CERTIFICATE``).
        delay_s: sleep this long in every export call (a slow collector). An export whose
            client gave up meanwhile (deadline/timeout) is not recorded.
        fail_with: reject exports: a name (``"unavailable"`` -> gRPC UNAVAILABLE / HTTP 503,
            ``"resource_exhausted"`` -> 429, ``"internal"`` -> 500, ...), an HTTP status int or
            a ``grpc.StatusCode``. Rejected exports are counted in ``attempts`` only.
        fail_times: with ``fail_with``, reject only this many exports, then accept again.
        retry_after_s: with ``fail_with``, ask the client to retry after this long (gRPC
            ``RetryInfo`` trailer / HTTP ``Retry-After``), which keeps retry tests fast.

    All accessors are thread-safe and return snapshots.
    """

    def __init__(
        self,
        protocol: str = "grpc",
        port: int = 0,
        tls: tuple[bytes | str, bytes | str] | None = None,
        delay_s: float = 0.0,
        fail_with: FailWith | None = None,
        *,
        fail_times: int | None = None,
        retry_after_s: float | None = None,
        host: str = LOCALHOST,
    ) -> None:
        protocol = protocol.lower()
        if protocol == "http/protobuf":
            protocol = "http"
        if protocol not in ("grpc", "http"):
            raise ValueError(f"protocol must be 'grpc' or 'http', not {protocol!r}")
        self.protocol = protocol
        self.host = host
        self.delay_s = delay_s
        self._port = port
        self._cond = threading.Condition(threading.RLock())
        self._generation = 0
        self._failure: _Failure | None = None
        self._fail_times: int | None = None
        if fail_with is not None:
            self.set_failure(fail_with, times=fail_times, retry_after_s=retry_after_s)
        self._tls = (_pem(tls[0]), _pem(tls[1])) if tls is not None else None
        self._tmpdir: str | None = None
        self._cert_file: str | None = None
        self._ssl_context: ssl.SSLContext | None = None
        if self._tls is not None:
            self._setup_tls_files()
        self._grpc_server: grpc.Server | None = None
        self._grpc_executor: ThreadPoolExecutor | None = None
        self._http_server: _HttpServer | None = None
        self._http_thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self.clear()

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> OtlpReceiver:
        """Start listening (on ``port``, or on a free port the first time if it is 0)."""
        if self.running:
            raise RuntimeError("receiver already running")
        self._stop_event = threading.Event()
        if self.protocol == "grpc":
            self._start_grpc()
        else:
            self._start_http()
        return self

    def stop(self) -> None:
        """Stop listening and drop open connections; clients then get connection refused.

        In-flight exports (e.g. sleeping in ``delay_s``) are aborted without being recorded.
        """
        self._stop_event.set()
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=None).wait(5)
            self._grpc_server = None
        if self._grpc_executor is not None:
            self._grpc_executor.shutdown(wait=False, cancel_futures=True)
            self._grpc_executor = None
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
            self._http_server.close_connections()
            self._http_server = None
        if self._http_thread is not None:
            self._http_thread.join(5)
            self._http_thread = None

    def restart(self) -> OtlpReceiver:
        """Stop if running, then listen again on the same port (collector outage over)."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop and delete the temporary TLS files."""
        self.stop()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> OtlpReceiver:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<OtlpReceiver {self.protocol} {self.host}:{self._port} tls={self.tls} {state}>"

    # ---- addresses ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._grpc_server is not None or self._http_server is not None

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("port not chosen yet: call start() first")
        return self._port

    @property
    def tls(self) -> bool:
        return self._tls is not None

    @property
    def tls_cert_pem(self) -> bytes | None:
        """The server certificate PEM (e.g. for ``grpc.ssl_channel_credentials``), if TLS."""
        return self._tls[0] if self._tls is not None else None

    @property
    def cert_file(self) -> str | None:
        """Path of the server certificate PEM (the trust file for clients), if TLS."""
        return self._cert_file

    @property
    def endpoint(self) -> str:
        """``http(s)://127.0.0.1:PORT``: the gRPC target / the HTTP base URL.

        Fits ``OTEL_EXPORTER_OTLP_ENDPOINT`` for both protocols and the ``endpoint=`` argument
        of the gRPC exporters. The HTTP exporters' ``endpoint=`` argument wants the full URL
        (see ``signal_endpoint``).
        """
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def signal_endpoint(self, signal: str) -> str:
        """Endpoint for one signal's exporter: ``endpoint + /v1/<signal>`` for HTTP."""
        if signal not in SIGNALS:
            raise ValueError(f"signal must be one of {SIGNALS}")
        return self.endpoint if self.protocol == "grpc" else f"{self.endpoint}/v1/{signal}"

    def exporter_env(self) -> dict[str, str]:
        """``OTEL_EXPORTER_OTLP_*`` variables pointing a (child process's) SDK here.

        For HTTP + TLS also make sure ``REQUESTS_CA_ENV_VARS`` are unset in that environment.
        """
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc" if self.protocol == "grpc" else "http/protobuf",
        }
        if self._cert_file is not None:
            env["OTEL_EXPORTER_OTLP_CERTIFICATE"] = self._cert_file
        return env

    # ---- behaviour knobs ------------------------------------------------------------------

    def set_failure(
        self,
        fail_with: FailWith | None,
        *,
        times: int | None = None,
        retry_after_s: float | None = None,
        message: str = "rejected by test OtlpReceiver",
    ) -> None:
        """Reject the next ``times`` exports (all if None) as ``fail_with``; None heals."""
        with self._cond:
            if fail_with is None:
                self._failure, self._fail_times = None, None
                return
            code, http_status = _resolve_failure(fail_with)
            self._failure = _Failure(code, http_status, message, retry_after_s)
            self._fail_times = times

    # ---- received data --------------------------------------------------------------------

    def clear(self) -> None:
        """Forget everything received so far."""
        with self._cond:
            self._items: dict[str, list[Item]] = {s: [] for s in SIGNALS}
            self._requests: dict[str, list[Message]] = {s: [] for s in SIGNALS}
            self._headers: list[Headers] = []
            self._headers_by_signal: dict[str, list[Headers]] = {s: [] for s in SIGNALS}
            self._attempts: dict[str, int] = dict.fromkeys(SIGNALS, 0)
            self._dropped: dict[str, int] = dict.fromkeys(SIGNALS, 0)
            self._generation += 1
            self._cond.notify_all()

    def spans(self) -> list[Item]:
        """All spans received, one dict each, in arrival order."""
        with self._cond:
            return list(self._items["traces"])

    def logs(self) -> list[Item]:
        """All log records received, one dict each, in arrival order."""
        with self._cond:
            return list(self._items["logs"])

    def metrics(self) -> list[Item]:
        """All metric data points received, one dict per data point, in arrival order."""
        with self._cond:
            return list(self._items["metrics"])

    @property
    def requests(self) -> dict[str, list[Message]]:
        """Accepted raw ``Export*ServiceRequest`` messages per signal."""
        with self._cond:
            return {s: list(v) for s, v in self._requests.items()}

    @property
    def request_headers(self) -> list[Headers]:
        """Headers (HTTP, lower-cased names) / metadata (gRPC) of every accepted export."""
        with self._cond:
            return [dict(h) for h in self._headers]

    def request_headers_for(self, signal: str) -> list[Headers]:
        """``request_headers`` of one signal, parallel to ``requests[signal]``."""
        with self._cond:
            return [dict(h) for h in self._headers_by_signal[signal]]

    @property
    def attempts(self) -> dict[str, int]:
        """Export calls that reached the receiver per signal, rejected/aborted ones included."""
        with self._cond:
            return dict(self._attempts)

    @property
    def dropped(self) -> dict[str, int]:
        """Exports not recorded because the client gave up (deadline) during ``delay_s``."""
        with self._cond:
            return dict(self._dropped)

    # ---- waiting --------------------------------------------------------------------------

    def wait_until(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Return ``fn()`` as soon as it is truthy; raise ``TimeoutError`` after ``timeout``.

        ``fn`` runs without the receiver's lock held, so it may flush exporters.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                generation = self._generation
            result = fn()
            if result:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"condition not met within {timeout}s; {self._summary()}")
            with self._cond:
                if self._generation == generation:
                    self._cond.wait(min(remaining, 0.05))

    wait_for = wait_until

    def _wait_items(
        self,
        signal: str,
        n: int,
        timeout: float,
        where: Callable[[Item], bool] | None,
    ) -> list[Item]:
        def matching() -> list[Item]:
            with self._cond:
                items = self._items[signal]
                return [i for i in items if where is None or where(i)]

        if n <= 0:
            return matching()

        def enough() -> list[Item] | None:
            found = matching()
            return found if len(found) >= n else None

        try:
            return self.wait_until(enough, timeout)
        except TimeoutError:
            got = len(matching())
            raise TimeoutError(
                f"waited {timeout}s for {n} matching {signal} items, got {got}; {self._summary()}"
            ) from None

    def wait_for_spans(
        self, n: int = 1, timeout: float = 10.0, where: Callable[[Item], bool] | None = None
    ) -> list[Item]:
        """Wait until ``n`` spans (matching ``where``) arrived; return all matching spans."""
        return self._wait_items("traces", n, timeout, where)

    def wait_for_logs(
        self, n: int = 1, timeout: float = 10.0, where: Callable[[Item], bool] | None = None
    ) -> list[Item]:
        """Wait until ``n`` log records (matching ``where``) arrived; return all matching."""
        return self._wait_items("logs", n, timeout, where)

    def wait_for_metrics(
        self, n: int = 1, timeout: float = 10.0, where: Callable[[Item], bool] | None = None
    ) -> list[Item]:
        """Wait until ``n`` metric data points (matching ``where``) arrived; return all."""
        return self._wait_items("metrics", n, timeout, where)

    def _summary(self) -> str:
        with self._cond:
            counts = {s: len(v) for s, v in self._items.items()}
            names = sorted({i["name"] for i in self._items["traces"] + self._items["metrics"]})
            # what the bridge said that matters most, so that a timeout in CI explains itself
            warnings = [
                f"{i['event_name']}: {str(i['body'])[:300]}"
                for i in self._items["logs"]
                if i.get("severity_number", 0) >= 13
            ][-12:]
            return (
                f"received {counts}, attempts {self._attempts}, dropped {self._dropped}, "
                f"span/metric names {names[:20]}, last WARN+ log records {warnings}"
            )

    # ---- core -----------------------------------------------------------------------------

    def _handle(
        self,
        signal: str,
        request: Message,
        headers: Headers,
        stop_event: threading.Event,
        alive: Callable[[], bool],
    ) -> _Failure | None:
        """Apply delay/failure, then record. Returns the failure to send, if any."""
        with self._cond:
            self._attempts[signal] += 1
            self._generation += 1
            self._cond.notify_all()
        if self.delay_s > 0:
            stop_event.wait(self.delay_s)
        if stop_event.is_set():
            raise _Aborted("receiver stopped")
        with self._cond:
            failure = self._failure
            if failure is not None and self._fail_times is not None:
                self._fail_times -= 1
                if self._fail_times <= 0:
                    self._failure, self._fail_times = None, None
        if failure is not None:
            return failure
        if not alive():
            with self._cond:
                self._dropped[signal] += 1
            raise _Aborted("client went away")
        items = _DECODERS[signal](request)
        with self._cond:
            self._requests[signal].append(request)
            self._headers.append(headers)
            self._headers_by_signal[signal].append(headers)
            self._items[signal].extend(items)
            self._generation += 1
            self._cond.notify_all()
        return None

    # ---- TLS ------------------------------------------------------------------------------

    def _setup_tls_files(self) -> None:
        assert self._tls is not None
        cert_pem, key_pem = self._tls
        self._tmpdir = tempfile.mkdtemp(prefix="otlp-receiver-")
        weakref.finalize(self, shutil.rmtree, self._tmpdir, True)
        self._cert_file = os.path.join(self._tmpdir, "cert.pem")
        key_file = os.path.join(self._tmpdir, "key.pem")
        with open(self._cert_file, "wb") as f:
            f.write(cert_pem)
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        if self.protocol == "http":
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self._cert_file, key_file)
            self._ssl_context = ctx
        os.unlink(key_file)

    # ---- gRPC -----------------------------------------------------------------------------

    def _start_grpc(self) -> None:
        stop_event = self._stop_event
        executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="otlp-rx-grpc")
        # so_reuseport=0: restart() must really get the old port back, not share it.
        server = grpc.server(executor, options=[("grpc.so_reuseport", 0)])
        servicers = (
            (trace_service_pb2_grpc.TraceServiceServicer,
             trace_service_pb2_grpc.add_TraceServiceServicer_to_server, "traces"),
            (logs_service_pb2_grpc.LogsServiceServicer,
             logs_service_pb2_grpc.add_LogsServiceServicer_to_server, "logs"),
            (metrics_service_pb2_grpc.MetricsServiceServicer,
             metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server, "metrics"),
        )  # fmt: skip
        for base, add, signal in servicers:
            add(self._make_servicer(base, signal, stop_event), server)
        address = f"{self.host}:{self._port}"
        if self._tls is not None:
            cert_pem, key_pem = self._tls
            creds = grpc.ssl_server_credentials([(key_pem, cert_pem)])
            port = server.add_secure_port(address, creds)
        else:
            port = server.add_insecure_port(address)
        if not port:
            executor.shutdown(wait=False)
            raise OSError(f"gRPC receiver could not bind {address}")
        self._port = port
        server.start()
        self._grpc_server, self._grpc_executor = server, executor

    def _make_servicer(self, base: type, signal: str, stop_event: threading.Event) -> Any:
        receiver = self

        class _Servicer(base):  # type: ignore[misc, valid-type]
            def Export(self, request: Message, context: grpc.ServicerContext) -> Message:
                return receiver._grpc_export(signal, request, context, stop_event)

        return _Servicer()

    def _grpc_export(
        self,
        signal: str,
        request: Message,
        context: grpc.ServicerContext,
        stop_event: threading.Event,
    ) -> Message:
        headers: Headers = {md.key: md.value for md in context.invocation_metadata()}
        try:
            failure = self._handle(signal, request, headers, stop_event, context.is_active)
        except _Aborted as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise  # not reached: abort() raises
        if failure is not None:
            if failure.retry_after_s is not None:
                delay = Duration()
                delay.FromNanoseconds(int(failure.retry_after_s * 1e9))
                info = RetryInfo(retry_delay=delay)
                context.set_trailing_metadata(
                    (("google.rpc.retryinfo-bin", info.SerializeToString()),)
                )
            context.abort(failure.grpc_code, failure.message)
        return _RESPONSE_TYPES[signal]()

    # ---- HTTP -----------------------------------------------------------------------------

    def _start_http(self) -> None:
        server = _HttpServer((self.host, self._port), self, self._stop_event, self._ssl_context)
        self._port = int(server.server_address[1])
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"otlp-rx-http-{self._port}",
            daemon=True,
        )
        thread.start()
        self._http_server, self._http_thread = server, thread


class _HttpServer(ThreadingHTTPServer):
    """Threaded HTTP server that tracks connections so ``stop()`` can cut them."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        receiver: OtlpReceiver,
        stop_event: threading.Event,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.receiver = receiver
        self.stop_event = stop_event
        self.ssl_context = ssl_context
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _OtlpHttpHandler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        if self.ssl_context is not None:
            # Handshake later, in the connection's own thread (see _OtlpHttpHandler.setup).
            sock = self.ssl_context.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
        with self._connections_lock:
            self._connections.add(sock)
        return sock, addr

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
            self._connections.clear()
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Connection-level errors (resets, failed handshakes) are expected; stay quiet."""


class _OtlpHttpHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30.0  # idle keep-alive connections are closed after this
    server: _HttpServer

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(5.0)
            self.request.do_handshake()
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reply(
        self,
        status: int,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _reply_error(self, status: int, code: grpc.StatusCode, message: str) -> None:
        body = RpcStatus(code=code.value[0], message=message).SerializeToString()
        self._reply(status, body)

    def _client_alive(self) -> bool:
        # After a complete request the client sends nothing until it has our answer, so a
        # readable socket means it closed (timed out) or reset the connection.
        sock = self.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return True
            if isinstance(sock, ssl.SSLSocket):
                return False
            return sock.recv(1, socket.MSG_PEEK) != b""
        except (OSError, ValueError):
            return False

    def do_GET(self) -> None:
        self._read_body()
        self._reply_error(405, grpc.StatusCode.UNIMPLEMENTED, "only POST is supported")

    do_PUT = do_GET

    def do_POST(self) -> None:
        body = self._read_body()
        signal = _HTTP_PATHS.get(self.path.split("?", 1)[0].rstrip("/"))
        if signal is None:
            self._reply_error(404, grpc.StatusCode.UNIMPLEMENTED, f"unknown path {self.path}")
            return
        content_type = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/x-protobuf":
            msg = f"unsupported Content-Type {content_type!r}: only application/x-protobuf"
            self._reply_error(415, grpc.StatusCode.INVALID_ARGUMENT, msg)
            return
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            elif encoding not in ("", "identity"):
                raise ValueError(f"unsupported Content-Encoding {encoding!r}")
            request = _REQUEST_TYPES[signal].FromString(body)
        except (OSError, EOFError, ValueError, zlib.error, DecodeError) as exc:
            self._reply_error(400, grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc}")
            return
        headers: Headers = {name.lower(): value for name, value in self.headers.items()}
        try:
            failure = self.server.receiver._handle(
                signal, request, headers, self.server.stop_event, self._client_alive
            )
        except _Aborted:
            self.close_connection = True
            return
        if failure is None:
            self._reply(200, _RESPONSE_TYPES[signal]().SerializeToString())
            return
        extra = {}
        if failure.retry_after_s is not None:
            extra["Retry-After"] = f"{failure.retry_after_s:g}"
        body = RpcStatus(code=failure.grpc_code.value[0], message=failure.message)
        self._reply(failure.http_status, body.SerializeToString(), extra)
