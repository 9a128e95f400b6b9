"""Registration with torch, zero-code activation, start-up cost, providers, recursion.

Each case runs in a fresh interpreter: torch's destination registry and its cached
destination loggers are process-wide state.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from tests.support.jobs import job_env
from tests.support.otlp_receiver import OtlpReceiver, free_port


def run_py(code: str, env: dict[str, str], timeout: float = 120) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object on its last line."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_start_up_imports_neither_torch_nor_the_sdk(tmp_path: Path) -> None:
    env = job_env(None, tmp_path)
    plain = run_py(
        """
        import json, sys
        print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in
                                ('torch', 'elastic_otel', 'opentelemetry'))))
    """,
        env,
    )
    assert plain == []
    # importing torch elastic registers the destination but builds nothing yet
    lazy = run_py(
        """
        import json, sys
        import torch.distributed.elastic.rendezvous
        from torch.distributed.elastic.events import handlers
        print(json.dumps({"otel": type(handlers._log_handlers.get("otel")).__name__,
                          "rdzv": type(handlers._log_handlers["dynamic_rendezvous"]).__name__,
                          "sdk": any(m.startswith("opentelemetry.sdk") for m in sys.modules)}))
    """,
        env,
    )
    assert lazy == {"otel": "OtelHandler", "rdzv": "NullHandler", "sdk": False}


def test_package_works_without_torch(tmp_path: Path) -> None:
    result = run_py(
        """
        import json, sys
        sys.modules["torch"] = None  # any import of torch now fails
        import elastic_otel
        from elastic_otel.parsing.torch_events import parse_event
        from elastic_otel.model.logs import to_log
        from elastic_otel.model.trace_model import TraceModel
        from elastic_otel.emit import emitter
        from elastic_otel.emit import pipeline  # the SDK side needs no torch either
        ev = parse_event('{"name": "torchelastic.worker.status.START", "source": "WORKER",'
                         ' "timestamp": 0, "metadata": {"run_id": "r", "global_rank": 0,'
                         ' "state": "START", "metadata": "{}"}}', 1)
        out = TraceModel().process(ev)
        print(json.dumps({"body": to_log(ev).body, "logs": len(out.logs),
                          "version": elastic_otel.__version__}))
    """,
        job_env(None, tmp_path),
    )
    assert result["body"] == "torchelastic.worker.status.START" and result["logs"] == 1


def test_register_is_idempotent_thread_safe_and_routes_rendezvous(tmp_path: Path) -> None:
    env = job_env(None, tmp_path, OTEL_TRACES_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    result = run_py(
        """
        import json, threading
        import elastic_otel
        from torch.distributed.elastic import events
        from torch.distributed.elastic.events import handlers
        got = []
        threads = [threading.Thread(target=lambda: got.append(elastic_otel.register()))
                   for _ in range(8)]
        [t.start() for t in threads]; [t.join() for t in threads]
        bridge = events.get_logging_handler("otel")
        events.record(events.Event("e", events.EventSource.AGENT), "otel")
        events.construct_and_record_rdzv_event(run_id="r", message="m",
                                               node_state=events.NodeState.INIT)
        elastic_otel.flush(5)
        print(json.dumps({"same": all(h is bridge for h in got),
                          "rdzv": handlers._log_handlers["dynamic_rendezvous"] is bridge,
                          "received": elastic_otel.stats()["processed"]}))
    """,
        env,
    )
    assert result == {"same": True, "rdzv": True, "received": 2}


def test_existing_rendezvous_handler_keeps_receiving_and_switch_off(tmp_path: Path) -> None:
    code = """
        import json, logging
        import elastic_otel
        from torch.distributed.elastic import events
        from torch.distributed.elastic.events import handlers
        class Keep(logging.Handler):
            def __init__(self): super().__init__(); self.got = []
            def emit(self, record): self.got.append(record.msg)
        mine = Keep()
        handlers._log_handlers["dynamic_rendezvous"] = mine
        elastic_otel.register()
        events.construct_and_record_rdzv_event(run_id="r", message="m",
                                               node_state=events.NodeState.INIT)
        elastic_otel.flush(5)
        print(json.dumps({"mine": len(mine.got), "bridge": elastic_otel.stats()["processed"],
                          "kept": handlers._log_handlers["dynamic_rendezvous"] is mine}))
    """
    env = job_env(None, tmp_path, OTEL_TRACES_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    assert run_py(code, env) == {"mine": 1, "bridge": 1, "kept": True}
    env["ELASTIC_OTEL_RDZV_EVENTS"] = "false"
    assert run_py(code, env) == {"mine": 1, "bridge": 0, "kept": True}


def test_documented_handler_info_usage(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    run_py(
        """
        import json
        import elastic_otel
        from torch.distributed.elastic import events
        elastic_otel.register()
        event = events.Event("test_event", events.EventSource.WORKER, metadata={"k": 1})
        events.get_logging_handler(destination="otel").info(event)
        print(json.dumps({}))
    """,
        job_env(grpc_receiver, tmp_path),
    )
    (log,) = grpc_receiver.wait_for_logs(1)
    assert log["body"] == "test_event"
    assert log["attributes"]["torchelastic.k"] == 1
    assert log["attributes"][A.EVENT_SOURCE] == "WORKER"


def test_application_providers_are_used(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    """When the application installed SDK providers, the bridge exports through them."""
    run_py(
        f"""
        import json
        from opentelemetry import trace, _logs
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        res = Resource({{"service.name": "my-app"}})
        tp = TracerProvider(resource=res)
        tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter("{grpc_receiver.endpoint}",
                                                                  insecure=True)))
        trace.set_tracer_provider(tp)
        lp = LoggerProvider(resource=res)
        lp.add_log_record_processor(BatchLogRecordProcessor(
            OTLPLogExporter("{grpc_receiver.endpoint}", insecure=True)))
        _logs.set_logger_provider(lp)
        import elastic_otel
        from torch.distributed.elastic import events
        elastic_otel.register()
        events.record(events.Event("torchelastic.worker.status.FAILED",
                                   events.EventSource.WORKER, 0,
                                   {{"run_id": "r", "global_rank": 0, "state": "FAILED"}}),
                      "otel")
        elastic_otel.flush(5)
        print(json.dumps({{}}))
    """,
        job_env(None, tmp_path),
    )  # no OTEL_EXPORTER_* at all: only the app's providers
    (log,) = grpc_receiver.wait_for_logs(1)
    (span,) = grpc_receiver.wait_for_spans(1)
    assert log["resource"]["service.name"] == span["resource"]["service.name"] == "my-app"
    assert span["name"] == A.SPAN_WORKER and span["status_code"] == "ERROR"
    assert log["span_id"] == span["span_id"]


@pytest.mark.parametrize("exporter", ["console", "none"])
def test_exporter_selection_from_environment(exporter: str, tmp_path: Path) -> None:
    env = job_env(None, tmp_path, OTEL_TRACES_EXPORTER=exporter, OTEL_LOGS_EXPORTER=exporter)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import elastic_otel
        from torch.distributed.elastic import events
        elastic_otel.register()
        events.record(events.Event("hello.console", events.EventSource.AGENT), "otel")
    """),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert ("hello.console" in done.stdout) is (exporter == "console")


def test_sdk_disabled_records_nothing_and_costs_nothing(tmp_path: Path) -> None:
    result = run_py(
        """
        import json, sys
        import elastic_otel
        from torch.distributed.elastic import events
        elastic_otel.register()
        events.record(events.Event("e", events.EventSource.AGENT), "otel")
        elastic_otel.flush(2)
        print(json.dumps({"processed": elastic_otel.stats()["processed"],
                          "exported": elastic_otel.stats()["exported"]}))
    """,
        job_env(
            None,
            tmp_path,
            OTEL_SDK_DISABLED="true",
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}",
        ),
    )
    assert result == {"processed": 1, "exported": 0}


def test_bridge_on_the_root_logger_does_not_recurse(tmp_path: Path) -> None:
    """Exporter warnings logged while exporting must not feed back into the bridge."""
    result = run_py(
        """
        import json, logging, time
        import elastic_otel
        from torch.distributed.elastic import events
        bridge = elastic_otel.register()
        logging.getLogger().addHandler(bridge)   # a user attaching it everywhere
        for i in range(20):
            events.record(events.Event(f"e{i}", events.EventSource.AGENT), "otel")
        time.sleep(3)                              # exports fail and warn meanwhile
        s = elastic_otel.stats()
        print(json.dumps({"received": s["received"], "errors": s["internal_errors"]}))
    """,
        job_env(
            None,
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}",
            OTEL_BLRP_SCHEDULE_DELAY="100",
        ),
    )
    assert result["errors"] == 0
    assert 20 <= result["received"] <= 25  # the events, plus at most a few foreign warnings


def test_unregister_puts_back_everything_register_changed_and_register_works_again(
    tmp_path: Path,
) -> None:
    """torch's registry, the rendezvous logger and its level, ``getStream`` in both torch
    modules, every wrapped agent method and the metrics' exit step: as before register(), twice
    over. Under ``LOGLEVEL=WARNING``, at which torch makes its event loggers drop its events: the
    bridge lowers their level while registered (events flow) and puts torch's back."""
    result = run_py(
        """
        import json, logging
        from torch.distributed.elastic import events
        from torch.distributed.elastic import metrics as torch_metrics
        from torch.distributed.elastic.metrics import api as torch_metrics_api
        from torch.distributed.elastic.events import handlers
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
        import elastic_otel
        from elastic_otel.bridge.process import bridge_process
        from elastic_otel.integration import torch_metrics as metrics

        # torch's rendezvous logger exists (cached with its NullHandler) before register()
        # (record_rdzv_event: construct_and_record_rdzv_event skips a NullHandler destination)
        events.record_rdzv_event(events.RdzvEvent("n", "r", "m", "h", 1, events.NodeState.INIT))
        METHODS = [(LocalElasticAgent, "_monitor_workers"), (LocalElasticAgent, "_stop_workers"),
                   (LocalElasticAgent, "_start_workers"),
                   (LocalElasticAgent, "_setup_local_watchdog"),
                   (SimpleElasticAgent, "_exit_barrier"), (SimpleElasticAgent, "_restart_workers")]

        def state():
            return {
                "registry": dict(handlers._log_handlers),
                "rdzv_logger": list(logging.getLogger(
                    "torchelastic-events-dynamic_rendezvous").handlers),
                "rdzv_level": logging.getLogger("torchelastic-events-dynamic_rendezvous").level,
                "getStream": (torch_metrics.getStream, torch_metrics_api.getStream),
                "agent": [cls.__dict__[name] for cls, name in METHODS],
                "metrics_exit": [
                    s
                    for s in bridge_process().exit_path.steps()
                    if s.startswith("torchelastic")
                ],
            }

        def changed(before, after):
            return sorted(k for k in before if before[k] != after[k])

        # importing torch's agent loaded the torchrun.handlers entry points, which registered
        # the otel destination: undo that first, so that "before" is torch without the bridge
        elastic_otel.unregister()
        before = state()
        assert "otel" not in before["registry"]
        rounds = []
        for _ in range(2):
            handler = elastic_otel.register()
            registered = state()
            events.record(events.Event("e", events.EventSource.AGENT), "otel")
            events.construct_and_record_rdzv_event(run_id="r", message="m",
                                                   node_state=events.NodeState.INIT)
            torch_metrics.put_metric("workers.default.remaining_restarts", 1)
            elastic_otel.flush(5)
            rounds.append({
                "changed": changed(before, registered),
                "routed": registered["registry"]["dynamic_rendezvous"] is handler
                          and handler in registered["rdzv_logger"],
                "metrics": metrics.installed_handler() is not None,
                "processed": elastic_otel.stats()["processed"],
                "same_handler": handler is elastic_otel.get_handler(),
                "otel_level": logging.getLogger("torchelastic-events-otel").level,
            })
            elastic_otel.unregister()
            rounds[-1]["left_changed"] = changed(before, state())
            rounds[-1]["otel_level_after"] = logging.getLogger("torchelastic-events-otel").level
            rounds[-1]["metrics_after"] = metrics.installed_handler() is not None
        print(json.dumps(rounds))
    """,
        job_env(
            None,
            tmp_path,
            OTEL_TRACES_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
            ELASTIC_OTEL_AGENT_INSTRUMENTATION="true",
            LOGLEVEL="WARNING",
        ),
    )
    everything = ["agent", "getStream", "metrics_exit", "rdzv_level", "rdzv_logger", "registry"]
    assert len(result) == 2
    for i, round_ in enumerate(result):
        assert round_["changed"] == everything
        assert round_["routed"] and round_["metrics"] and round_["same_handler"]
        assert round_["left_changed"] == [], "unregister() left something behind"
        assert not round_["metrics_after"]
        assert round_["processed"] == 2 * (i + 1), "events flow again after re-register()"
        assert (round_["otel_level"], round_["otel_level_after"]) == (20, 30)  # INFO, WARNING
