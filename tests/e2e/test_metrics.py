"""torchelastic's metrics as OpenTelemetry metrics, at a real OTLP receiver."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.distributed.elastic import metrics as torch_metrics
from torch.distributed.elastic.metrics import api as torch_metrics_api

from elastic_otel.emit import bridge_health as bridge_metrics
from elastic_otel.emit import counters
from elastic_otel.integration import torch_metrics as metrics
from elastic_otel.names import attributes as A
from tests.support.jobs import job_env, start_agent
from tests.support.otlp_receiver import OtlpReceiver, free_port

# A worker whose first attempt runs until the test lets it fail, the second until the test
# releases it: each attempt outlives a periodic export, whatever the machine's load.
WORKER = """\
import os, pathlib, sys, time
d = pathlib.Path(os.environ["METRICS_TEST_DIR"])
first = not (d / "failed-once").exists()
if first:
    (d / "failed-once").write_text("x")
deadline = time.monotonic() + 60
while not (d / ("fail" if first else "release")).exists() and time.monotonic() < deadline:
    time.sleep(0.1)
sys.exit(3 if first else 0)
"""


def latest(points: list[dict], name: str) -> dict:
    found = [p for p in points if p["name"] == name]
    assert found, f"no {name} in {sorted({p['name'] for p in points})}"
    return max(found, key=lambda p: p["time_ns"])


@pytest.mark.e2e
def test_torchrun_job_metrics(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    """A job with a restart: counters, gauges and histograms arrive, during the job and after."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run_id = f"metrics-{uuid.uuid4().hex[:6]}"
    env = job_env(grpc_receiver, tmp_path, METRICS_TEST_DIR=str(tmp_path))
    agent = start_agent(
        env,
        free_port(),
        run_id,
        nnodes="1",
        extra_args=("--max-restarts=1",),
        backend="c10d",  # the plain backend: metrics come with --event-log-handler otel alone
        script=script,
    )
    try:
        # exported periodically (OTEL_METRIC_EXPORT_INTERVAL=1000) while the first attempt runs
        grpc_receiver.wait_for_metrics(
            1, timeout=60, where=lambda p: p["name"] == "torchelastic.workers.healthy"
        )
        grpc_receiver.wait_for_metrics(
            1,
            timeout=30,
            where=lambda p: (
                p["name"] == "torchelastic.workers.remaining_restarts" and p["value"] == 1
            ),
        )
        assert agent.proc.poll() is None, "metrics arrived during the job"
    finally:
        (tmp_path / "fail").write_text("go")
        (tmp_path / "release").write_text("go")
    rc, out = agent.wait()
    assert rc == 0, out[-3000:]
    points = grpc_receiver.wait_for_metrics(
        1, where=lambda p: p["name"] == "torchelastic.workers.run_total"
    )
    points = grpc_receiver.metrics()

    run_total = latest(points, "torchelastic.workers.run_total")
    assert run_total["type"] == "sum" and run_total["is_monotonic"] and run_total["value"] == 1
    assert run_total["attributes"] == {
        A.ROLE: "default",
        A.METRIC_GROUP: "torchelastic",
        A.RUN_ID: run_id,
    }
    assert latest(points, "torchelastic.workers.run_success_with_retries")["value"] == 1
    assert latest(points, "torchelastic.workers.run_success_no_retries")["value"] == 0
    assert latest(points, "torchelastic.workers.failed")["value"] == 1
    restarts = latest(points, "torchelastic.workers.remaining_restarts")
    assert restarts["type"] == "gauge" and restarts["value"] == 0
    assert {p["value"] for p in points if p["name"] == restarts["name"]} >= {0, 1}
    flakiness = latest(points, "torchelastic.workers.flakiness")
    assert (flakiness["type"], flakiness["unit"], flakiness["value"]) == ("gauge", "%", 50)
    # @prof: success counters and duration histograms of the agent's steps
    rdzv = latest(points, "torchelastic.simpleelasticagent._rendezvous.duration")
    assert rdzv["type"] == "histogram" and rdzv["unit"] == "ms" and rdzv["count"] == 2
    assert latest(points, "torchelastic.simpleelasticagent._restart_workers.success")["value"] == 1
    assert latest(points, "torchelastic.simpleelasticagent._rendezvous.success")["value"] == 2
    assert {p["resource"]["service.name"] for p in points} == {"torchelastic"}
    assert {p["scope"] for p in points} == {"elastic_otel"}
    # the bridge's own health next to them: events seen, nothing dropped
    received = latest(points, "elastic_otel.events.received")
    assert received["type"] == "sum" and received["is_monotonic"] and received["value"] > 0
    drops = {
        p["attributes"][bridge_metrics.REASON]: p["value"]
        for p in sorted(points, key=lambda p: p["time_ns"])
        if p["name"] == "elastic_otel.dropped"
    }
    assert drops == dict.fromkeys(counters.DROP_REASONS, 0)


# --- in this process -------------------------------------------------------------------------


class Collecting(torch_metrics.MetricHandler):
    """A user's own handler: it must keep receiving what it was configured for."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, float]] = []

    def emit(self, metric_data: torch_metrics.MetricData) -> None:
        self.seen.append((metric_data.group_name, metric_data.name, metric_data.value))


@torch_metrics.prof(group="mygroup")
def flaky_step() -> None:
    raise ValueError("boom")


@pytest.fixture
def meter_provider(grpc_receiver: OtlpReceiver) -> Iterator[object]:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    exporter = OTLPMetricExporter(endpoint=grpc_receiver.endpoint, insecure=True)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    yield provider
    metrics.uninstall()
    metrics.set_run_id("")
    provider.shutdown()


def test_survives_initialize_metrics_and_user_handlers(
    grpc_receiver: OtlpReceiver, meter_provider: object
) -> None:
    original = torch_metrics_api.getStream
    assert metrics.install(meter_provider) is not None
    assert metrics.install(meter_provider) is metrics.installed_handler(), "idempotent"
    metrics.set_run_id("run-42")
    # what the launcher does after the bridge is installed, and a user's own handler
    torch_metrics.initialize_metrics(torch_metrics.MetricsConfig())
    user = Collecting()
    torch_metrics.configure(user, "torchelastic")
    torch_metrics.configure(torch_metrics.NullMetricHandler())

    torch_metrics.put_metric("workers.trainer.remaining_restarts", 3)
    with pytest.raises(ValueError):
        flaky_step()
    torch_metrics.put_metric("custom level", 7, "mygroup")
    assert metrics.flush(10)

    points = grpc_receiver.wait_for_metrics(4)
    restarts = latest(points, "torchelastic.workers.remaining_restarts")
    assert restarts["value"] == 3
    assert restarts["attributes"] == {
        A.ROLE: "trainer",
        A.METRIC_GROUP: "torchelastic",
        A.RUN_ID: "run-42",
    }
    failure = latest(points, "torchelastic.test_metrics.flaky_step.failure")
    assert failure["type"] == "sum" and failure["value"] == 1
    assert failure["attributes"][A.METRIC_GROUP] == "mygroup"
    duration = latest(points, "torchelastic.test_metrics.flaky_step.duration")
    assert duration["type"] == "histogram" and duration["unit"] == "ms"
    assert latest(points, "torchelastic.custom_level")["type"] == "gauge"
    assert user.seen == [("torchelastic", "workers.trainer.remaining_restarts", 3)]

    metrics.uninstall()
    assert torch_metrics_api.getStream is original and torch_metrics.getStream is original
    before = len(grpc_receiver.metrics())
    torch_metrics.put_metric("workers.trainer.remaining_restarts", 2)
    assert len(user.seen) == 2
    time.sleep(0.2)
    assert len(grpc_receiver.metrics()) == before


def test_metrics_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTIC_OTEL_METRICS", "false")
    original = torch_metrics_api.getStream
    assert metrics.install() is None
    assert torch_metrics_api.getStream is original


@pytest.mark.parametrize(
    ("name", "group", "expected"),
    [
        (
            "workers.default.remaining_restarts",
            "torchelastic",
            ("torchelastic.workers.remaining_restarts", "gauge", "1", {A.ROLE: "default"}),
        ),
        (
            "workers.team.a.run_success_no_retries",
            "torchelastic",
            ("torchelastic.workers.run_success_no_retries", "counter", "1", {A.ROLE: "team.a"}),
        ),
        (
            "workers.x.healthy",
            "torchelastic",
            ("torchelastic.workers.healthy", "counter", "1", {A.ROLE: "x"}),
        ),
        (
            "SimpleElasticAgent._rendezvous.duration.ms",
            "torchelastic",
            ("torchelastic.simpleelasticagent._rendezvous.duration", "histogram", "ms", {}),
        ),
        (
            "LocalElasticAgent._start_workers.failure",
            "agent",
            ("torchelastic.localelasticagent._start_workers.failure", "counter", "1", {}),
        ),
        ("queue depth", "mine", ("torchelastic.queue_depth", "gauge", "1", {})),
    ],
)
def test_classify(name: str, group: str, expected: tuple) -> None:
    otel_name, kind, unit, attrs = metrics.classify(name, group)
    want_name, want_kind, want_unit, want_attrs = expected
    assert (otel_name, kind, unit) == (want_name, want_kind, want_unit)
    assert attrs == {A.METRIC_GROUP: group, **want_attrs}


def test_bridge_drops_are_metrics(
    monkeypatch: pytest.MonkeyPatch, grpc_receiver: OtlpReceiver, meter_provider, make_logger
) -> None:
    """Records dropped during a collector outage show as ``elastic_otel.dropped`` points."""
    from torch.distributed.elastic.events import Event, EventSource

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("ELASTIC_OTEL_RETRY_QUEUE_SIZE", "20")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # the exporter's own retries give up
    monkeypatch.setenv("OTEL_BLRP_SCHEDULE_DELAY", "50")
    logger, handler = make_logger()
    try:
        deadline = time.monotonic() + 30
        while handler.all_stats()["dropped_collector_outage"] == 0:
            assert time.monotonic() < deadline, handler.all_stats()
            for i in range(50):
                logger.info(Event(f"user.{i}", EventSource.AGENT, 0, {"run_id": "r"}).serialize())
            time.sleep(0.2)
        # read before the collection: drops go on while it runs, so the exported count is at
        # least this (read after, it could be more than the point collected before it)
        expected = handler.all_stats()["dropped_collector_outage"]
        bridge_metrics.observe(meter_provider.get_meter("elastic_otel"), read=handler.all_stats)
        meter_provider.force_flush()
    finally:
        handler.shutdown()
    points = grpc_receiver.wait_for_metrics(1, where=lambda p: p["name"] == "elastic_otel.dropped")
    outage = [p for p in points if p["attributes"][bridge_metrics.REASON] == "collector_outage"]
    assert outage and outage[-1]["value"] >= expected > 0
    pending = latest(grpc_receiver.metrics(), "elastic_otel.export.pending")
    assert pending["unit"] == "{record}" and 0 <= pending["value"] <= 20  # bounded backlog
