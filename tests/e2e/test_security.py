"""Security: headers reach the collector and are never shown or exported; TLS with the
collector's CA and with a wrong one; attribute values are bounded."""

from __future__ import annotations

import subprocess
import sys

import pytest
from torch.distributed.elastic.events import Event, EventSource

from elastic_otel.names import attributes as A
from tests.support.jobs import job_env, seqs, use_receiver
from tests.support.otlp_receiver import OtlpReceiver, free_port, make_self_signed_cert

SECRET = "s3cr3t-t0ken-value"


def test_headers_are_sent_but_never_shown_or_exported(grpc_receiver, tmp_path) -> None:
    script = tmp_path / "rec.py"
    script.write_text(
        "import elastic_otel\n"
        "from torch.distributed.elastic import events\n"
        "elastic_otel.register()\n"
        "events.record(events.Event('e', events.EventSource.AGENT, 0, {'seq': 1}), 'otel')\n"
    )
    headers = {
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{SECRET}",
        "SOME_OTHER_SECRET": SECRET,
    }
    ok = subprocess.run(
        [sys.executable, str(script)],
        env=job_env(grpc_receiver, tmp_path, **headers),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0
    grpc_receiver.wait_for_logs(1)
    sent = [h.get("authorization") for h in grpc_receiver.request_headers]
    assert f"Bearer {SECRET}" in sent, "the header reaches the collector"
    exported = repr(grpc_receiver.logs()) + repr(grpc_receiver.spans())
    assert SECRET not in exported, "no header or other environment variable is exported"
    dead = subprocess.run(
        [sys.executable, str(script)],
        env=job_env(
            None, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}", **headers
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dead.returncode == 0
    assert SECRET not in dead.stdout + dead.stderr
    assert "Traceback" not in dead.stderr


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_tls_with_custom_ca_and_wrong_ca(protocol: str, tmp_path, monkeypatch) -> None:
    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override the exporter's certificate:
    # clear them so OTEL_EXPORTER_OTLP_CERTIFICATE is what is tested (see README).
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    script = tmp_path / "rec.py"
    script.write_text(
        "import elastic_otel\n"
        "from torch.distributed.elastic import events\n"
        "elastic_otel.register()\n"
        "events.record(events.Event('e', events.EventSource.AGENT, 0, {'seq': 7}), 'otel')\n"
    )
    with OtlpReceiver(protocol, tls=make_self_signed_cert("localhost")) as receiver:
        env = job_env(receiver, tmp_path, **receiver.exporter_env())
        good = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
        )
        assert good.returncode == 0, good.stderr
        assert seqs(receiver.wait_until(lambda: seqs(receiver) and receiver)) == {7: 1}

        wrong_ca = tmp_path / "other-ca.pem"
        wrong_ca.write_bytes(make_self_signed_cert("localhost")[0])
        env.update(OTEL_EXPORTER_OTLP_CERTIFICATE=str(wrong_ca), OTEL_EXPORTER_OTLP_TIMEOUT="2")
        bad = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
        )
        assert bad.returncode == 0
        assert "Traceback" not in bad.stderr
        lines = [line for line in bad.stderr.splitlines() if "elastic-otel" in line]
        assert len(lines) == 1 and "export problem" in lines[0], bad.stderr[-2000:]
        assert seqs(receiver) == {7: 1}, "nothing accepted from the untrusted client"


def test_attribute_length_limit(monkeypatch, grpc_receiver: OtlpReceiver, make_logger) -> None:
    use_receiver(monkeypatch, grpc_receiver, OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT="64")
    logger, _ = make_logger()
    trace = "Traceback (most recent call last):\n" + "  frame\n" * 100_000 + "ValueError: x\n"
    logger.info(
        Event(
            "torchelastic.worker.status.FAILED",
            EventSource.AGENT,
            0,
            {"run_id": "r", "state": "FAILED", "raw_error": trace},
        ).serialize()
    )
    (log,) = grpc_receiver.wait_for_logs(1)
    assert len(log["attributes"][A.EXCEPTION_STACKTRACE]) == 64
    (span,) = grpc_receiver.wait_for_spans(1)
    exc = next(e for e in span["events"] if e["name"] == "exception")
    assert len(exc["attributes"][A.EXCEPTION_STACKTRACE]) == 64


def test_default_attribute_length_is_bounded(monkeypatch, grpc_receiver, make_logger) -> None:
    use_receiver(monkeypatch, grpc_receiver)
    logger, _ = make_logger()
    logger.info(Event("big", EventSource.AGENT, 0, {"blob": "x" * 2_000_000}).serialize())
    (log,) = grpc_receiver.wait_for_logs(1)
    assert len(log["attributes"]["torchelastic.blob"]) == 16384
