"""torchelastic 0.2's event API (the real ``torchelastic`` package) into the bridge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from tests.support.jobs import job_env, run_script
from tests.support.otlp_receiver import OtlpReceiver

pytest.importorskip("torchelastic.events", reason="torchelastic==0.2.1 is in the test extra")


def by_name(logs: list[dict]) -> dict[str, dict]:
    return {r["event_name"]: r for r in logs}


def test_record_and_record_event(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    """``record`` and ``record_event`` become log records and spans; other types stay out."""
    out = run_script(
        """
        import sys
        import elastic_otel
        from torchelastic import events

        events.configure(elastic_otel.OtelEventHandler(), event_type="torchelastic")
        common = {"run_id": "legacy-1", "role": "trainer", "group_rank": 1, "hostname": "h1"}
        events.record(
            "torchelastic.worker.status.START",
            metadata={**common, "global_rank": 3, "state": "START"},
        )
        events.record_event(
            events.Event(
                "torchelastic.worker.status.FAILED",
                "torchelastic",
                {
                    **common,
                    "global_rank": 3,
                    "state": "FAILED",
                    "source": "WORKER",
                    "raw_error": "Traceback...\\nValueError: bad batch",
                },
                timestamp=1700000000123,
            )
        )
        events.record("checkpoint.saved", metadata={"step": 10, "shards": [1, 2]})
        events.record("elsewhere", event_type="not-configured")
        print("torch imported:", "torch" in sys.modules)
        elastic_otel.flush()
        """,
        job_env(grpc_receiver, tmp_path),
    )
    assert "torch imported: False" in out, "the 0.2 path needs neither torch nor its import"
    logs = grpc_receiver.wait_for_logs(3)
    assert len(logs) == 3, [r["event_name"] for r in logs]
    records = by_name(logs)
    assert set(records) == {
        "torchelastic.worker.status.START",
        "torchelastic.worker.status.FAILED",
        "checkpoint.saved",
    }
    assert {r["attributes"][A.EVENT_TYPE] for r in logs} == {"torchelastic"}

    failed = records["torchelastic.worker.status.FAILED"]
    assert failed["severity_text"] == "ERROR"
    assert failed["time_ns"] == 1_700_000_000_123_000_000, "the event's own timestamp (ms)"
    attrs = failed["attributes"]
    assert attrs[A.EVENT_SOURCE] == "WORKER" and attrs[A.GLOBAL_RANK] == 3
    assert (attrs[A.RUN_ID], attrs[A.ROLE], attrs[A.RANK]) == ("legacy-1", "trainer", 1)
    assert (attrs[A.EXCEPTION_TYPE], attrs[A.EXCEPTION_MESSAGE]) == ("ValueError", "bad batch")
    assert records["torchelastic.worker.status.START"]["attributes"][A.EVENT_SOURCE] == "AGENT"

    saved = records["checkpoint.saved"]["attributes"]
    assert saved[A.EVENT_SOURCE] == "UNKNOWN"
    assert (saved["torchelastic.step"], json.loads(saved["torchelastic.shards"])) == (10, [1, 2])

    # START ... FAILED of global rank 3: one worker span, in ERROR, that the logs point at
    (worker,) = grpc_receiver.wait_for_spans(1, where=lambda s: s["name"] == A.SPAN_WORKER)
    assert worker["status_code"] == "ERROR"
    assert worker["attributes"][A.GLOBAL_RANK] == 3
    assert worker["attributes"][A.RUN_ID] == "legacy-1"
    assert failed["span_id"] == worker["span_id"]


def test_same_records_as_torch_events(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    """One event through torchelastic 0.2's API and through torch's: the same log record."""
    run_script(
        """
        import elastic_otel
        from torch.distributed.elastic import events as torch_events
        from torchelastic import events as te_events

        from elastic_otel.integration.torchelastic_events import configure

        elastic_otel.register(route_rendezvous=False)
        metadata = {
            "run_id": "same-1", "role": "default", "group_rank": 0, "global_rank": 0,
            "state": "SUCCEEDED", "agent_restarts": 0, "rdzv_backend": "static",
            "metadata": '{"exit_code": [0], "worker_pid": [4242]}',
        }
        name = "torchelastic.worker.status.SUCCEEDED"
        torch_events.record(
            torch_events.Event(name, torch_events.EventSource.WORKER, metadata=metadata),
            destination="otel",
        )
        handler = configure("torchelastic")
        te_events.record(name, metadata={**metadata, "source": "WORKER"})
        elastic_otel.flush()
        """,
        job_env(grpc_receiver, tmp_path),
    )
    torch_log, te_log = grpc_receiver.wait_for_logs(2)
    te_attrs = dict(te_log["attributes"])
    assert te_attrs.pop(A.EVENT_TYPE) == "torchelastic"
    assert te_attrs == torch_log["attributes"]
    assert torch_log["attributes"][A.WORKER_PID] == 4242
    for key in ("event_name", "body", "severity_text", "resource", "scope"):
        assert te_log[key] == torch_log[key], key


def test_handler_is_exported_lazily_and_is_an_event_handler() -> None:
    out = run_script(
        """
        import sys
        import elastic_otel
        loaded = "elastic_otel.integration.torchelastic_events" in sys.modules
        from torchelastic.events import EventHandler
        handler = elastic_otel.OtelEventHandler()
        print(loaded, isinstance(handler, EventHandler), "OtelEventHandler" in elastic_otel.__all__)
        """,
        {},
    )
    assert out.split() == ["False", "True", "True"]
