"""``opentelemetry-instrument torchrun ...``: the bridge on the auto-instrumentation's providers."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from tests.support.jobs import LIGHT, ROOT, TORCHRUN, TRAIN, job_env
from tests.support.otlp_receiver import OtlpReceiver, free_port

INSTRUMENT = shutil.which("opentelemetry-instrument", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(
    INSTRUMENT is None, reason="opentelemetry-instrumentation (the test extra) is not installed"
)


def instrumented_env(receiver: OtlpReceiver, tmp_path: Path, **extra: str) -> dict[str, str]:
    return job_env(
        receiver,
        tmp_path,
        OTEL_SERVICE_NAME="auto-svc",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_LOGS_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        **extra,
    )


def run_instrumented(env: dict[str, str], *torchrun_args: str, script: Path = TRAIN) -> None:
    cmd = [
        str(INSTRUMENT),
        TORCHRUN,
        "--nnodes=1",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        f"--rdzv-id=auto-{uuid.uuid4().hex[:6]}",
        "--monitor-interval=0.5",
        *torchrun_args,
        str(script),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def assert_auto_resource(items: list[dict]) -> None:
    assert items
    for item in items:
        assert item["resource"]["service.name"] == "auto-svc"
        assert "telemetry.auto.version" in item["resource"], "the auto-instrumentation's resource"


def test_entry_point() -> None:
    (ep,) = entry_points(group="opentelemetry_instrumentor", name="torchelastic")
    from elastic_otel.integration.instrumentor import ElasticOtelInstrumentor

    assert ep.load() is ElasticOtelInstrumentor
    assert list(ElasticOtelInstrumentor().instrumentation_dependencies()) == ["torch >= 2.4"]


@pytest.mark.e2e
def test_job_exports_once_on_the_auto_instrumentation_providers(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    run_instrumented(instrumented_env(grpc_receiver, tmp_path), "--event-log-handler", "otel")
    spans = grpc_receiver.wait_for_spans(6)
    # the bridge's, and the training script's own (elastic_otel.start_worker_telemetry keeps
    # the auto-instrumentation's providers of the workers)
    assert A.INSTRUMENTATION_SCOPE in {s["scope"] for s in spans}
    assert {s["scope"] for s in spans} <= {A.INSTRUMENTATION_SCOPE, "elastic_otel.demo_train"}
    assert max(Counter(s["span_id"] for s in spans).values()) == 1, "no span exported twice"
    names = Counter(s["name"] for s in spans)
    assert names[A.SPAN_RDZV_JOIN] == names[A.SPAN_RDZV_MEMBER] == names["agent.run"] == 1
    assert names[A.SPAN_WORKER] == 2
    assert_auto_resource(spans)

    logs = grpc_receiver.logs()
    assert_auto_resource(logs)
    joined = [r for r in logs if r["event_name"] == "torchelastic.rendezvous.joined"]
    assert len(joined) == 1, "no log record exported twice"
    succeeded = [
        r["attributes"][A.GLOBAL_RANK]
        for r in logs
        if r["body"] == "torchelastic.worker.status.SUCCEEDED"
        and r["attributes"][A.EVENT_SOURCE] == "WORKER"
    ]
    # each worker's success twice: when the agent saw it, and torch's event after the barrier
    assert sorted(succeeded) == [0, 0, 1, 1], "each worker's events exported once"
    observed = [r for r in logs if r["attributes"].get(A.OBSERVED_BY) == "monitor_workers"]
    assert sorted(r["attributes"][A.GLOBAL_RANK] for r in observed) == [0, 1]

    points = grpc_receiver.wait_for_metrics(
        1, where=lambda p: p["name"] == "torchelastic.workers.run_total"
    )
    assert_auto_resource(grpc_receiver.metrics())
    assert points[-1]["value"] == 1


@pytest.mark.e2e
def test_instrument_activates_without_event_log_handler(
    grpc_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """opentelemetry-instrument is the request: rendezvous spans and metrics, no agent events."""
    run_instrumented(instrumented_env(grpc_receiver, tmp_path), script=LIGHT)  # no training
    grpc_receiver.wait_for_spans(1, where=lambda s: s["name"] == A.SPAN_RDZV_MEMBER)
    grpc_receiver.wait_for_metrics(1, where=lambda p: p["name"] == "torchelastic.workers.run_total")
    assert not [s for s in grpc_receiver.spans() if s["name"] == A.SPAN_WORKER]
    assert_auto_resource(grpc_receiver.spans())


def test_disabled_instrumentation_leaves_torch_alone(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import torch.distributed.elastic.rendezvous
        from torch.distributed.elastic.events import handlers
        from elastic_otel.bridge import handler
        routed = handlers._log_handlers["dynamic_rendezvous"] is handler.current_handler()
        print("routed", routed)
        """
    )
    outputs = []
    for disabled in ("", "torchelastic"):
        env = job_env(
            None,
            tmp_path,
            OTEL_TRACES_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
            OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled,
        )
        done = subprocess.run(
            [str(INSTRUMENT), sys.executable, "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(done.stdout.strip())
    assert outputs == ["routed True", "routed False"]
