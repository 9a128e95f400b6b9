"""Exceptions as the semantic conventions record them, under each value of
``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN``, as a collector receives them.

A real job's events (tests/data/restart_node0.tsv: round 0 joined, both workers started) and
torch's FAILED event of global rank 1 with its error file, fed the way torch feeds them through
the real bridge handler, exported over OTLP/gRPC to a real receiver and to an OTLP JSON file
that ``elastic-otel timeline`` reads back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_otel.cli.otlp_json_reader import read_otlp_json
from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from elastic_otel.names.torch_names import STATUS_PREFIX
from tests.support.fixtures import captured_events
from tests.support.jobs import use_receiver
from tests.support.otlp_receiver import OtlpReceiver

EVENTS = [payload for _, payload in captured_events("restart_node0.tsv")]
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/job/train.py", line 74, in main\n'
    "    loss = step(batch)\n"
    '  File "/job/train.py", line 51, in step\n'
    '    raise RuntimeError(f"the loss is NaN\\n{where}")\n'
    "RuntimeError: the loss is NaN\n"
    "at step 3, batch 17\n"
)
MESSAGE = "the loss is NaN\nat step 3, batch 17"
"""Two lines: a span's status message keeps the first, the exception all of it."""
SEVERITY_ERROR = 17


def _failed_rank_1() -> tuple[list[str], str]:
    """The job's events up to both workers' START, and torch's FAILED of global rank 1 (its
    START's fields, the error file its ``@record`` wrote, exit code 1)."""
    starts = [i for i, p in enumerate(EVENTS) if json.loads(p)["name"] == STATUS_PREFIX + "START"]
    start = json.loads(EVENTS[starts[1]])
    assert start["metadata"]["global_rank"] == 1
    failed = dict(start, name=STATUS_PREFIX + "FAILED", timestamp=0)
    error_file = {
        "message": {
            "message": f"RuntimeError: {MESSAGE}",
            "extraInfo": {"py_callstack": TRACEBACK, "timestamp": "1795303445"},
        }
    }
    nested = json.loads(start["metadata"]["metadata"])
    nested["exit_code"] = [1]
    failed["metadata"] = dict(
        start["metadata"],
        state="FAILED",
        raw_error=json.dumps(error_file),
        metadata=json.dumps(nested),
    )
    return EVENTS[: starts[1] + 1], json.dumps(failed)


@pytest.fixture(params=[None, env.EXCEPTIONS_AS_LOGS, env.EXCEPTIONS_AS_LOGS_AND_SPAN_EVENTS])
def exported(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    grpc_receiver: OtlpReceiver,
    make_logger,
    tmp_path: Path,
) -> tuple[str | None, list[dict], list[dict], Path]:
    """(opt-in value, spans, log records at the receiver, the OTLP JSON file)."""
    signal = request.param
    out = tmp_path / "job.jsonl"
    extra = {
        "OTEL_TRACES_EXPORTER": "otlp,elastic_otel_file",
        "OTEL_LOGS_EXPORTER": "otlp,elastic_otel_file",
        env.ELASTIC_OTEL_OTLP_JSON_FILE: str(out),
    }
    if signal is not None:
        extra[env.OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN] = signal
    use_receiver(monkeypatch, grpc_receiver, **extra)
    logger, handler = make_logger()
    before, failed = _failed_rank_1()
    for payload in [*before, failed]:
        logger.info(payload)
    assert handler.flush(10)
    workers = grpc_receiver.wait_for_spans(
        1, where=lambda s: s["name"] == A.SPAN_WORKER and s["attributes"].get(A.STATE) == "FAILED"
    )
    logs = grpc_receiver.wait_for_logs(
        1, where=lambda r: r["attributes"].get(A.EVENT_NAME) == STATUS_PREFIX + "FAILED"
    )
    return signal, workers, logs, out


def test_the_failure_is_one_log_record_in_its_span_with_the_exception(exported) -> None:
    signal, (worker,), (record,), _ = exported
    attrs = record["attributes"]
    assert attrs[A.EXCEPTION_TYPE] == "RuntimeError"
    assert attrs[A.EXCEPTION_MESSAGE] == MESSAGE
    assert attrs[A.EXCEPTION_STACKTRACE] == TRACEBACK
    assert (record["trace_id"], record["span_id"]) == (worker["trace_id"], worker["span_id"])
    assert record["severity_number"] == SEVERITY_ERROR and record["severity_text"] == "ERROR"
    if signal is None:  # the default: the record keeps torch's event name
        assert record["event_name"] == STATUS_PREFIX + "FAILED"
    else:  # an exception's log record, as the conventions name it
        assert record["event_name"] == A.EXCEPTION_EVENT


def test_the_span_event_is_there_unless_exceptions_go_to_logs_only(exported) -> None:
    signal, (worker,), _, _ = exported
    assert worker["status_code"] == "ERROR"
    events = [e for e in worker["events"] if e["name"] == A.EXCEPTION_EVENT]
    if signal == env.EXCEPTIONS_AS_LOGS:
        assert events == []
    else:
        (event,) = events
        assert event["attributes"][A.EXCEPTION_TYPE] == "RuntimeError"
        assert event["attributes"][A.EXCEPTION_MESSAGE] == MESSAGE


def test_the_timeline_reads_the_exception_either_way(exported) -> None:
    _, _, _, out = exported
    timeline = build_timeline(*read_otlp_json(out))
    rows = [w for r in timeline.rounds for n in r.nodes for w in n.workers]
    (failed,) = [w for w in rows if w.global_rank == 1 and w.state == "FAILED"]
    assert failed.message == f"RuntimeError: {MESSAGE}"  # the exception's, not the status's
    [run] = timeline.runs
    [failure] = run.failures
    assert failure.root is not None and failure.root.message == MESSAGE
    # the record's body is the whole traceback: its ERRORS line names torch's event instead
    assert [e.message for e in timeline.errors] == [f"FAILED: RuntimeError: {MESSAGE}"]
