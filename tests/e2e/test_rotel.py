"""Wire compatibility with a collector we did not write: the bridge → rotel → our receiver.

rotel (an OTLP collector in Rust, shipped as a PyPI wheel) receives the bridge's export over
OTLP/gRPC and over OTLP/HTTP and forwards it to the test's receiver; what arrives must be
what the bridge's model produced for the same torch events.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_otel.model.trace_ids import trace_id_for
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.parsing.torch_events import parse_event
from tests.support.fixtures import DATA, captured_events
from tests.support.jobs import job_env
from tests.support.otlp_receiver import OtlpReceiver, free_port

rotel = pytest.importorskip("rotel")
AGENT = Path(rotel.__file__).with_name("rotel-agent")
SALT = "rotel-test"


@pytest.fixture
def rotel_to(tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(receiver: OtlpReceiver) -> tuple[int, int]:
        grpc_port, http_port = free_port(), free_port()
        cmd = [
            str(AGENT),
            "start",
            "--otlp-grpc-endpoint",
            f"127.0.0.1:{grpc_port}",
            "--otlp-http-endpoint",
            f"127.0.0.1:{http_port}",
            "--exporter",
            "otlp",
            "--otlp-exporter-endpoint",
            receiver.endpoint,
            "--otlp-exporter-protocol",
            "grpc",
            "--batch-timeout",
            "100ms",
            "--pid-file",
            str(tmp_path / "rotel.pid"),
        ]
        log = open(tmp_path / "rotel.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        _wait_listening(grpc_port, proc, tmp_path / "rotel.log")
        _wait_listening(http_port, proc, tmp_path / "rotel.log")
        return grpc_port, http_port

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_listening(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"rotel exited: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"rotel did not listen on {port}: {log.read_text()[-2000:]}")


REPLAY = textwrap.dedent("""
    import logging, sys
    import elastic_otel
    bridge = elastic_otel.register()
    for line in open(sys.argv[1]):
        created, _, payload = line.rstrip("\\n").partition("\\t")
        record = logging.LogRecord("torchelastic-events-otel", logging.INFO, "", 0,
                                   payload, None, None)
        record.created = float(created)
        bridge.handle(record)
""")


def expected(name: str) -> tuple[Counter, Counter]:
    """Span (name, trace id, attributes) and log (body, trace id) the model makes itself."""
    model = TraceModel(salt=SALT)
    spans, logs = [], []
    for created, payload in captured_events(name):
        out = model.process(parse_event(payload, int(created * 1e9)))
        spans += out.spans
        logs += out.logs
    out = model.close_all(0, "process exit")
    spans += out.spans
    logs += out.logs
    span_keys = Counter(
        (
            s.name,
            f"{s.trace_id:032x}",
            s.attributes.get("torchelastic.round"),
            s.attributes.get("torchelastic.global_rank"),
            s.status,
        )
        for s in spans
    )
    log_keys = Counter((ev.body, f"{t:032x}" if t else "") for ev, t, _ in logs)
    return span_keys, log_keys


def _replay(env: dict[str, str], receiver: OtlpReceiver) -> tuple:
    """Replay the captured job through a bridge in a process of its own; (spans and logs
    expected, spans and logs received), once all arrived."""
    done = subprocess.run(
        [sys.executable, "-c", REPLAY, str(DATA / "restart_node0.tsv")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    want_spans, want_logs = expected("restart_node0.tsv")
    spans = receiver.wait_for_spans(sum(want_spans.values()), timeout=20)
    logs = receiver.wait_for_logs(sum(want_logs.values()), timeout=20)
    return want_spans, want_logs, spans, logs


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_bridge_through_rotel_arrives_intact(protocol: str, rotel_to, tmp_path: Path) -> None:
    with OtlpReceiver("grpc") as receiver:
        grpc_port, http_port = rotel_to(receiver)
        port = grpc_port if protocol == "grpc" else http_port
        env = job_env(
            None,
            tmp_path,
            ELASTIC_OTEL_JOB_ID=SALT,
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
            OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
            # Both compare the events' recorded times with now: on a replay of a days-old
            # recording their first tick reports every open span, which the model does not.
            ELASTIC_OTEL_STALL_AFTER="0",
            ELASTIC_OTEL_OPEN_SPAN_INTERVAL="0",
        )
        want_spans, want_logs, spans, logs = _replay(env, receiver)

    got_spans = Counter(
        (
            s["name"],
            s["trace_id"],
            s["attributes"].get("torchelastic.round"),
            s["attributes"].get("torchelastic.global_rank"),
            s["status_code"],
        )
        for s in spans
    )
    assert got_spans == want_spans
    assert Counter((r["body"], r["trace_id"]) for r in logs) == want_logs
    # ids, parents, links and resource survive the hop
    by_id = {s["span_id"]: s for s in spans}
    for s in spans:
        if s["parent_span_id"]:
            assert by_id[s["parent_span_id"]]["trace_id"] == s["trace_id"]
        for link in s["links"]:
            assert link["span_id"] in by_id
        assert s["resource"]["service.name"] == "torchelastic"
    linked = [r for r in logs if r["span_id"]]
    assert linked and all(r["span_id"] in by_id for r in linked)
    assert {r["trace_id"] for r in linked} <= {
        f"{trace_id_for(SALT, 'job-cap', n):032x}" for n in (0, 1)
    }
    worker_failed = [s for s in spans if s["name"] == "worker" and s["status_code"] == "ERROR"]
    assert worker_failed and all(s["status_message"] for s in worker_failed)


@pytest.mark.parametrize(
    ("setting", "encodings"), [(None, {"gzip"}), ("none", {None}), ("gzip", {"gzip"})]
)
def test_exports_are_gzip_unless_the_user_chose(
    setting: str | None, encodings: set[str | None], tmp_path: Path
) -> None:
    """Requests of 512 records are about 280 KB; rotel stalls 40 ms on each one over 64 KB
    (a flow-control window), which held the bridge under 10,000 events a second into it.
    gzip cuts them tenfold; ``OTEL_EXPORTER_OTLP_COMPRESSION`` still decides where it is set."""
    extra = {"OTEL_EXPORTER_OTLP_COMPRESSION": setting} if setting else {}
    with OtlpReceiver("http") as receiver:
        env = job_env(
            receiver,
            tmp_path,
            ELASTIC_OTEL_JOB_ID=SALT,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            ELASTIC_OTEL_STALL_AFTER="0",
            ELASTIC_OTEL_OPEN_SPAN_INTERVAL="0",
            **extra,
        )
        _replay(env, receiver)
        sent = receiver.request_headers
    assert {h.get("content-encoding") for h in sent} == encodings, sent
