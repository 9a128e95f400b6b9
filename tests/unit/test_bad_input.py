"""Bad input: whatever reaches the handler becomes a correct record or one flagged record.

A flagged record carries ``torchelastic.unparsed`` true, ``torchelastic.parse_error`` (why)
and ``torchelastic.raw`` (the original text cut to ``ELASTIC_OTEL_RAW_LIMIT``, default 4096).
Never an exception out of ``emit``, never a dead event thread, never a traceback printed per
record, and the next valid event is still converted.

The corpus lives in ``tests/data/nasty/``, one case per file, named ``<expect>--<what>.<ext>``:
``expect`` is ``unparsed`` (must be flagged), ``event`` / ``rdzv`` (must parse as a torch
``Event`` / ``RdzvEvent``) or ``any`` (either is correct). ``.json`` and ``.txt`` files are
UTF-8 text handed over as ``str``; ``.bin`` files are handed over twice, as ``bytes`` and as
the ``str`` Python makes of them with ``surrogateescape`` (lone surrogates). Inputs that are
not text (``None``, objects, dataclasses), megabyte-sized ones and log calls with ``%`` args
are built below. Case-specific expectations are in ``CHECKS``.

Property tests (hypothesis) then run ``parse_event`` → ``logs.to_log`` → ``Emitter.emit_log``
→ OTLP protobuf encoding, and the trace model, on generated input.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from torch.distributed.elastic.events import Event, EventSource, RdzvEvent

from elastic_otel.bridge.handler import OtelHandler
from elastic_otel.emit.emitter import DEFAULT_VALUE_LIMIT, Emitter
from elastic_otel.model.logs import UNPARSED_EVENT_NAME, to_log
from elastic_otel.model.spans import SpanRecord
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import (
    DEFAULT_RAW_LIMIT,
    ElasticEvent,
    EventKind,
    parse_event,
)
from tests.support.helpers import attr
from tests.support.otlp_receiver import OtlpReceiver

NASTY = Path(__file__).parent.parent / "data" / "nasty"
LOGGER_NAME = "torchelastic-events-nasty"  # shaped like torch's torchelastic-events-<dest>
VALID_RUN = "valid-run"
MB = 1024 * 1024


def clean(text: str) -> str:
    """What reaches the wire for ``text``: lone surrogates replaced (emitter's documented rule)."""
    return text.encode("utf-8", "replace").decode("utf-8")


# --- the cases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    payload: Any
    expect: str  # "unparsed", "event", "rdzv" or "any"
    raw: str | None = None  # the text a flagged record must keep (before the raw limit)
    args: tuple = ()  # logging %-args, as in logger.info(payload, *args)


class Unprintable:
    """An object whose repr() and str() raise."""

    def __repr__(self) -> str:
        raise RuntimeError("repr refused")

    __str__ = __repr__


class SerializeRaises:
    def serialize(self) -> str:
        raise ValueError("cannot serialize")


class SerializeReturnsBytes:
    def serialize(self) -> bytes:
        return b'{"name": "x", "source": "AGENT"}'

    def __repr__(self) -> str:
        return "SerializeReturnsBytes()"


@dataclass
class FakeEvent:
    """torch's Event fields, with whatever types."""

    name: Any
    source: Any
    timestamp: Any = 0
    metadata: Any = field(default_factory=dict)


@dataclass
class FakeRdzvEvent:
    """torch's RdzvEvent fields, with whatever types."""

    name: Any
    run_id: Any
    message: Any
    hostname: Any
    pid: Any
    node_state: Any
    rank: Any = None
    local_id: Any = None


def event_dict(**kw: Any) -> dict:
    d: dict = {
        "name": "torchelastic.worker.status.SUCCEEDED",
        "source": "AGENT",
        "timestamp": 0,
        "metadata": {"run_id": "nasty-run", "state": "SUCCEEDED", "group_rank": 0},
    }
    return d | kw


def rdzv_dict(**kw: Any) -> dict:
    d: dict = {
        "name": "dynamic_rendezvous.py:DynamicRendezvousHandler._keep_alive",
        "run_id": "nasty-run",
        "message": "The node 'node-a_4242_0' has sent a keep-alive heartbeat to the rendezvous.",
        "hostname": "node-a",
        "pid": 4242,
        "node_state": "RUNNING",
        "master_endpoint": "",
        "rank": None,
        "local_id": 0,
        "error_trace": "",
    }
    return d | kw


def deeply_nested(levels: int) -> dict:
    d: dict = {}
    for _ in range(levels):
        d = {"d": d}
    return d


def corpus_cases() -> list[Case]:
    cases = []
    for path in sorted(NASTY.iterdir()):
        expect = path.name.split("--", 1)[0]
        data = path.read_bytes()
        if path.suffix == ".bin":
            cases.append(Case(f"{path.name}:bytes", data, expect, data.decode("utf-8", "replace")))
            text = data.decode("utf-8", "surrogateescape")
            cases.append(Case(f"{path.name}:surrogateescape-str", text, expect, text))
        else:
            text = data.decode("utf-8")
            cases.append(Case(path.name, text, expect, text))
    return cases


def built_cases() -> list[Case]:
    """Inputs that are not files: objects, huge messages, Python strings with surrogates."""
    recursive: list = []
    recursive.append(recursive)
    valid = json.dumps(event_dict())
    big_plain = "x" * MB
    big_json = "{" + "a" * MB
    huge_event = json.dumps(event_dict(metadata={"blob": "b" * (9 * MB)}))
    surrogate_event = json.dumps(event_dict(name="bad\ud800name"), ensure_ascii=False)
    return [
        Case("None", None, "unparsed", "None"),
        Case("object-unprintable", Unprintable(), "unparsed"),
        Case("object-serialize-raises", SerializeRaises(), "unparsed"),
        Case("object-serialize-returns-bytes", SerializeReturnsBytes(), "unparsed"),
        Case("object-exception", ValueError("boom"), "unparsed", "ValueError('boom')"),
        Case("int", 42, "unparsed", "42"),
        Case("float-nan", math.nan, "unparsed", "nan"),
        Case("list", [1, "two"], "unparsed", "[1, 'two']"),
        Case("set", {3}, "unparsed", "{3}"),
        Case("recursive-list", recursive, "unparsed", "[[...]]"),
        Case("bytearray-event", bytearray(valid.encode()), "event"),
        Case("dict-event", event_dict(), "event"),
        Case(
            "dict-non-string-keys",
            {1: 2, None: 3, ("t",): 4, "name": "n", "source": "AGENT", "metadata": {5: 6}},
            "any",
        ),
        Case("dict-100k-levels-deep-metadata", event_dict(metadata=deeply_nested(100_000)), "any"),
        Case(
            "dataclass-event-metadata-list",
            FakeEvent(name=1, source=["AGENT"], timestamp="yesterday", metadata=[("k", "v")]),
            "unparsed",
        ),
        Case(
            "dataclass-event-wrong-types",
            FakeEvent(
                name=b"bytes-name",
                source=3.5,
                timestamp=object(),
                metadata={"global_rank": "x", "obj": Unprintable(), "set": {1, 2}, 7: None},
            ),
            "event",
        ),
        Case(
            "dataclass-rdzv-wrong-types",
            FakeRdzvEvent(
                name=None,
                run_id=3,
                message=b"bytes message",
                hostname={"h": 1},
                pid="abc",
                node_state="BOGUS",
                rank=[],
                local_id=Unprintable(),
            ),
            "rdzv",
        ),
        Case(
            "torch-event-wrong-types",
            Event(name=5, source="ALIEN", timestamp="yesterday", metadata={"x": Unprintable()}),  # type: ignore[arg-type]
            "event",
        ),
        Case(
            "torch-rdzv-event-wrong-types",
            RdzvEvent(
                name="n",
                run_id="nasty-run",
                message="m",
                hostname="h",
                pid="abc",  # type: ignore[arg-type]
                node_state="BOGUS",  # type: ignore[arg-type]
                rank=[],  # type: ignore[arg-type]
                local_id="zero",  # type: ignore[arg-type]
            ),
            "rdzv",
        ),
        Case(
            "str-lone-surrogates",
            "\ud800 plain \udfff text",
            "unparsed",
            "\ud800 plain \udfff text",
        ),
        Case("str-surrogate-inside-valid-event", surrogate_event, "event"),
        Case("str-megabyte-plain-text", big_plain, "unparsed", big_plain),
        Case("str-megabyte-invalid-json", big_json, "unparsed", big_json),
        Case("str-over-input-limit-9mb-event", huge_event, "unparsed", huge_event),
        Case(
            "str-megabyte-metadata-value",
            json.dumps(event_dict(metadata={"blob": "m" * MB})),
            "event",
        ),
        Case("str-megabyte-rdzv-message", json.dumps(rdzv_dict(message="z" * MB)), "rdzv"),
        Case(
            "str-megabyte-failed-rdzv-message",
            json.dumps(rdzv_dict(node_state="FAILED", message="RendezvousError: " + "q" * MB)),
            "rdzv",
        ),
        Case("args-unprintable", "%s", "unparsed", args=(Unprintable(),)),
        Case("args-bad-format", "%d events", "unparsed", args=("many",)),
        Case("args-valid-event", "%s", "event", args=(valid,)),
    ]


CASES = corpus_cases() + built_cases()


def is_fallback_time(record: dict, window: tuple[int, int]) -> bool:
    """The record carries the time torch logged it (the event's own timestamp was unusable)."""
    return window[0] <= record["time_ns"] <= window[1]


# Expectations beyond "parsed or flagged", per case id. Each returns True when correct.
CHECKS: dict[str, Callable[[dict, tuple[int, int]], bool]] = {
    "event--source-alien.json": lambda r, w: attr(r, A.EVENT_SOURCE) == "ALIEN",
    "event--source-number.json": lambda r, w: attr(r, A.EVENT_SOURCE) == "7",
    "event--source-null.json": lambda r, w: attr(r, A.EVENT_SOURCE) == A.SOURCE_UNKNOWN,
    "event--name-number.json": lambda r, w: r["body"] == "42" == attr(r, A.EVENT_NAME),
    "event--timestamp-yesterday.json": is_fallback_time,
    "event--timestamp-negative.json": is_fallback_time,
    "event--timestamp-nan.json": is_fallback_time,
    "event--timestamp-bool.json": lambda r, w: (
        is_fallback_time(r, w) and attr(r, A.INVALID_PREFIX + "timestamp") == "True"
    ),
    "event--timestamp-list.json": is_fallback_time,
    "any--timestamp-huge.json": is_fallback_time,
    "any--timestamp-in-nanoseconds.json": is_fallback_time,
    "event--metadata-values-of-every-type.json": lambda r, w: (
        attr(r, "torchelastic.beyond_int64") == str(2**64)
        and attr(r, "torchelastic.an_int64_max") == 2**63 - 1
        and attr(r, "torchelastic.negative_huge") == str(-(10**40))
        and math.isnan(attr(r, "torchelastic.a_nan"))
        and attr(r, "torchelastic.a_list") == '[1, "two", null]'
        and attr(r, "torchelastic.") == "empty key"
        and attr(r, "torchelastic.a_null") is None
    ),
    "event--nested-metadata-invalid-json.json": lambda r, w: (
        attr(r, "torchelastic.metadata") == "{not json"
    ),
    "event--nested-metadata-number.json": lambda r, w: attr(r, "torchelastic.metadata") == 12.5,
    "event--nested-metadata-array-text.json": lambda r, w: (
        attr(r, "torchelastic.metadata") == "[1, 2]"
    ),
    "event--nested-metadata-non-dict-values.json": lambda r, w: (
        attr(r, A.WORKER_PID) is None
        and attr(r, A.INVALID_PREFIX + "worker_pid") == "x"
        and attr(r, A.EXIT_CODE) is None
    ),
    "event--older-torch-name-and-source-only.json": lambda r, w: (
        r["body"] == "torchelastic.worker.status.SUCCEEDED" and r["severity_text"] == "INFO"
    ),
    # Fields a newer torch adds to Event itself are kept, as they are for RdzvEvent.
    "event--newer-torch-extra-fields.json": lambda r, w: (
        attr(r, "torchelastic.severity") == "info"
        and attr(r, "torchelastic.schema_version") == 2
        and attr(r, "torchelastic.labels") == '{"team": "ml"}'
    ),
    "event--worker-status-wrong-types.json": lambda r, w: (
        attr(r, A.RANK) is None
        and attr(r, A.EXCEPTION_MESSAGE) == "123"
        and attr(r, A.INVALID_PREFIX + "global_rank") == "three"
        and attr(r, A.INVALID_PREFIX + "group_rank") == "[]"
        and attr(r, A.INVALID_PREFIX + "agent_restarts") == "many"
        and attr(r, A.INVALID_PREFIX + "duration_ms") == "slow"
        and attr(r, A.GLOBAL_RANK) is None
        and attr(r, A.DURATION_MS) is None
        and attr(r, "torchelastic.total_run_time") == "long"  # not read: kept as it came
    ),
    "event--worker-start-huge-ranks.json": lambda r, w: (
        attr(r, A.GLOBAL_RANK) is None
        and attr(r, A.INVALID_PREFIX + "global_rank") == "1e+30"
        and attr(r, A.INVALID_PREFIX + "group_rank") == str(10**25)
        and attr(r, A.INVALID_PREFIX + "agent_restarts") == str(10**30)
    ),
    "event--raw-error-invalid-json.json": lambda r, w: (
        attr(r, A.EXCEPTION_MESSAGE) == "{not json at all"
    ),
    "event--agent-step-duration-nan.json": lambda r, w: (
        attr(r, A.DURATION_MS) is None and attr(r, A.INVALID_PREFIX + "duration_ms") == "nan"
    ),
    "event--unicode-everywhere.json": lambda r, w: (
        r["body"] == "torchelastic.😀.événement.\u202eRTL\u0000nul"
        and attr(r, A.HOST_NAME) == "узел-1"
    ),
    "event--surrogate-escape-in-name.json": lambda r, w: r["body"] == "bad?name",
    "event--surrogate-escapes-in-metadata.json": lambda r, w: (
        attr(r, "torchelastic.key?") == "value?" and attr(r, A.HOST_NAME) == "host?"
    ),
    "event--invalid-utf8-in-name.bin:bytes": lambda r, w: r["body"] == "bad\ufffd\ufffd",
    "event--invalid-utf8-in-name.bin:surrogateescape-str": lambda r, w: r["body"] == "bad??",
    "rdzv--pid-abc.json": lambda r, w: (
        attr(r, A.PROCESS_PID) is None
        and attr(r, A.INVALID_PREFIX + "pid") == "abc"
        and attr(r, A.HOST_NAME) == "node-a"
    ),
    "rdzv--pid-float.json": lambda r, w: attr(r, A.PROCESS_PID) is None,
    "rdzv--rank-list.json": lambda r, w: attr(r, A.RANK) is None,
    "rdzv--rank-string.json": lambda r, w: attr(r, A.RANK) == 1,
    "rdzv--node-state-bogus.json": lambda r, w: (
        attr(r, A.NODE_STATE) == "BOGUS" and r["severity_text"] == "INFO"
    ),
    "rdzv--node-state-number.json": lambda r, w: attr(r, A.NODE_STATE) == "3",
    "rdzv--local-id-string.json": lambda r, w: attr(r, A.LOCAL_ID) is None,
    "rdzv--message-number.json": lambda r, w: r["body"] == "12345",
    "rdzv--message-null.json": lambda r, w: r["body"] == "",
    "rdzv--older-torch-missing-optional-fields.json": lambda r, w: (
        attr(r, A.RANK) is None and attr(r, A.LOCAL_ID) is None and attr(r, A.PROCESS_PID) == 4242
    ),
    "rdzv--newer-torch-extra-fields.json": lambda r, w: (
        attr(r, "torchelastic.attempt") == 3
        and attr(r, "torchelastic.backend") == "c10d"
        and attr(r, "torchelastic.timings") == '{"sync_ms": 1.5}'
    ),
    "rdzv--failed-error-trace-number.json": lambda r, w: (
        r["severity_text"] == "ERROR" and attr(r, A.EXCEPTION_TYPE) == "RendezvousClosedError"
    ),
    "rdzv--failed-message-without-type.json": lambda r, w: (
        r["severity_text"] == "ERROR" and attr(r, A.EXCEPTION_MESSAGE) == "something went wrong"
    ),
    "rdzv--joined-negative-numbers.json": lambda r, w: (
        (attr(r, A.ROUND), attr(r, A.RANK), attr(r, A.WORLD_SIZE)) == (-3, -5, -1)
    ),
    "rdzv--unicode-run-id.json": lambda r, w: (
        attr(r, A.RUN_ID) == "прогон-🚀" and attr(r, A.ROUND) == 2
    ),
    "rdzv--surrogate-escapes-in-message-and-host.json": lambda r, w: (
        attr(r, A.HOST_NAME) == "host?" and r["body"].endswith("heartbeat?")
    ),
    "rdzv--join-attempt-never-completed.json": lambda r, w: r["trace_id"] != "",
    "dataclass-rdzv-wrong-types": lambda r, w: (
        r["body"] == "b'bytes message'" and attr(r, A.PROCESS_PID) is None
    ),
    "torch-event-wrong-types": lambda r, w: (
        attr(r, A.EVENT_SOURCE) == "ALIEN" and is_fallback_time(r, w)
    ),
    "torch-rdzv-event-wrong-types": lambda r, w: (
        attr(r, A.NODE_STATE) == "BOGUS" and attr(r, A.RANK) is None
    ),
    "str-surrogate-inside-valid-event": lambda r, w: r["body"] == "bad?name",
    "str-megabyte-metadata-value": lambda r, w: (
        attr(r, "torchelastic.blob") == "m" * DEFAULT_VALUE_LIMIT
    ),
    "str-megabyte-rdzv-message": lambda r, w: r["body"] == "z" * DEFAULT_VALUE_LIMIT,
    "str-megabyte-failed-rdzv-message": lambda r, w: (
        attr(r, A.EXCEPTION_TYPE) == "RendezvousError"
        and attr(r, A.EXCEPTION_MESSAGE) == "q" * DEFAULT_VALUE_LIMIT
    ),
    "args-unprintable": lambda r, w: "%s" in attr(r, A.RAW),
    "args-bad-format": lambda r, w: "%d events" in attr(r, A.RAW) and "many" in attr(r, A.RAW),
}


def test_every_check_names_a_case() -> None:
    ids = {c.id for c in CASES}
    assert set(CHECKS) <= ids, set(CHECKS) - ids
    assert {c.expect for c in CASES} == {"unparsed", "event", "rdzv", "any"}
    assert len(list(NASTY.iterdir())) >= 80


# --- through the real handler ---------------------------------------------------------------


def valid_event() -> str:
    """An agent's RENDEZVOUS step: one log record and one span (the logs and traces path)."""
    return Event(
        "torchelastic.worker.status.RENDEZVOUS",
        EventSource.AGENT,
        metadata={"run_id": VALID_RUN, "state": "RENDEZVOUS", "duration_ms": 12.5, "role": "t"},
    ).serialize()


@contextmanager
def running_bridge(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[OtelHandler, logging.Logger]]:
    """A real OtelHandler exporting to ``receiver``, on a logger set up the way torch does."""
    for name, value in receiver.exporter_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OTEL_BLRP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("ELASTIC_OTEL_JOB_ID", "test-bad-input")
    handler = OtelHandler()
    logger = logging.getLogger(LOGGER_NAME)
    monkeypatch.setattr(logger, "propagate", False)
    monkeypatch.setattr(logger, "level", logging.INFO)
    # Only the bridge. pytest attaches its capture handler to every non-propagating logger
    # when a test phase starts, and that one would format (and choke on) the records the
    # bridge is meant to survive: use this inside the test body, after pytest did so.
    monkeypatch.setattr(logger, "handlers", [handler])
    try:
        yield handler, logger
    finally:
        handler.shutdown()


def no_traceback(capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    printed = [
        r
        for r in caplog.records
        if r.name != LOGGER_NAME and (r.exc_info or "Traceback" in r.getMessage())
    ]
    assert printed == [], [r.getMessage() for r in printed]


def split_valid(receiver: OtlpReceiver) -> tuple[list[dict], list[dict]]:
    logs = receiver.logs()
    valid = [r for r in logs if attr(r, A.RUN_ID) == VALID_RUN]
    return valid, [r for r in logs if r not in valid]


def check_valid(receiver: OtlpReceiver, valid_logs: list[dict], stats: dict) -> None:
    """The valid event after the bad one was converted as always: log and span."""
    assert len(valid_logs) == 1, f"the valid event's log did not arrive once ({stats})"
    (log,) = valid_logs
    assert log["event_name"] == "torchelastic.worker.status.RENDEZVOUS"
    assert attr(log, A.DURATION_MS) == 12.5 and attr(log, A.ROLE) == "t"
    spans = [s for s in receiver.spans() if attr(s, A.RUN_ID) == VALID_RUN]
    names = [s["name"] for s in spans]
    assert names == [A.SPAN_AGENT_RENDEZVOUS], f"the valid event's span: {names} ({stats})"
    assert (log["trace_id"], log["span_id"]) == (spans[0]["trace_id"], spans[0]["span_id"])
    assert spans[0]["end_ns"] - spans[0]["start_ns"] == 12_500_000


def check_flagged(record: dict, case: Case, limit: int) -> None:
    assert attr(record, A.UNPARSED) is True
    assert isinstance(attr(record, A.PARSE_ERROR), str) and attr(record, A.PARSE_ERROR)
    assert record["event_name"] == UNPARSED_EVENT_NAME
    assert record["severity_text"] == "WARN"
    raw = attr(record, A.RAW)
    assert isinstance(raw, str) and len(raw) <= limit
    if case.raw is not None:
        assert raw == clean(case.raw[:limit])
        if len(case.raw) > limit:
            assert attr(record, "torchelastic.raw_length") == len(case.raw)


def check_parsed(record: dict, case: Case) -> None:
    assert attr(record, A.UNPARSED) is None, attr(record, A.PARSE_ERROR)
    if case.expect == "rdzv":
        assert attr(record, A.EVENT_SOURCE) == A.SOURCE_RENDEZVOUS
        assert record["event_name"].startswith("torchelastic.rendezvous.")
    else:
        assert attr(record, A.EVENT_SOURCE) != A.SOURCE_RENDEZVOUS
        assert record["body"] == attr(record, A.EVENT_NAME)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_through_the_handler(
    case: Case,
    grpc_receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with running_bridge(grpc_receiver, monkeypatch) as (handler, logger):
        before = time.time_ns()
        logger.info(case.payload, *case.args)  # must not raise, whatever the payload
        window = (before, time.time_ns())
        logger.info(valid_event())
        handler.flush(5)
        event_thread = handler._event_thread
        assert event_thread is not None and event_thread.thread_alive, "event thread died"
        handler.shutdown()

    valid, others = split_valid(grpc_receiver)
    stats = handler.all_stats()
    assert len(others) == 1, f"{len(others)} records for one input ({stats}): {others!r:.2000}"
    check_valid(grpc_receiver, valid, stats)
    (record,) = others
    assert stats["received"] == stats["processed"] == 2, stats
    assert stats["internal_errors"] == 0, stats
    assert stats["pending_export"] == 0, stats
    flagged = attr(record, A.UNPARSED) is True
    assert stats["unparsed"] == int(flagged)
    if case.expect == "unparsed" or (case.expect == "any" and flagged):
        check_flagged(record, case, DEFAULT_RAW_LIMIT)
    else:
        check_parsed(record, case)
    if case.id in CHECKS and not (case.expect == "any" and flagged):
        assert CHECKS[case.id](record, window), f"{case.id}: {record!r:.3000}"
    no_traceback(capfd, caplog)


def test_raw_limit_is_configurable(
    grpc_receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``ELASTIC_OTEL_RAW_LIMIT`` bounds the kept text; the full length is recorded."""
    monkeypatch.setenv("ELASTIC_OTEL_RAW_LIMIT", "100")
    inputs = ["é" * 5000, b"\xff" * 300, "short", "[" * 100_000]
    with running_bridge(grpc_receiver, monkeypatch) as (handler, logger):
        for payload in inputs:
            logger.info(payload)
    assert handler.all_stats()["unparsed"] == len(inputs)
    raws = [attr(r, A.RAW) for r in grpc_receiver.logs()]
    assert raws == ["é" * 100, "\ufffd" * 100, "short", "[" * 100]
    lengths = [attr(r, "torchelastic.raw_length") for r in grpc_receiver.logs()]
    assert lengths == [5000, 300, None, 100_000]
    no_traceback(capfd, caplog)


# --- catastrophic backtracking: in a child process, so a hang cannot stall this one ---------

_PARSE_IN_CHILD = (
    "import sys; from elastic_otel.parsing.torch_events import parse_event; "
    "print(parse_event(sys.stdin.read(), 1).kind.value)"
)
_CHILD_LIMIT_S = 20.0
"""Generous: the child parses in well under a second; a regex backtracking in quadratic time
over these megabytes takes minutes, holding the GIL, i.e. freezing every thread of the job."""


def test_megabyte_messages_do_not_hang_the_parser(tmp_path: Path) -> None:
    """Messages that make the parser's regular expressions backtrack, parsed in child processes.

    The event thread holds the GIL while a regular expression runs, so a parse that takes
    minutes stalls torch's own threads too (including the one calling ``emit``).
    """
    inputs = {
        "failed-rdzv-message-of-error-words": json.dumps(
            rdzv_dict(node_state="FAILED", message="A" + "Error" * (MB // 5))
        ),
        "agent-traceback-whose-last-line-is-error-words": json.dumps(
            event_dict(
                name="torchelastic.worker.status.FAILED",
                metadata={"state": "FAILED", "raw_error": "Traceback\n" + "Error" * (MB // 5)},
            )
        ),
        "rdzv-message-repeating-has-joined-round": json.dumps(
            rdzv_dict(message="has joined round 1 of the rendezvous '" * (3 * MB // 38))
        ),
    }
    children = {}
    for name, text in inputs.items():  # all parse at once: one bound for the three
        (tmp_path / name).write_text(text)
        with (tmp_path / name).open() as stdin:
            children[name] = subprocess.Popen(
                [sys.executable, "-c", _PARSE_IN_CHILD],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
    hung, results = [], {}
    deadline = time.monotonic() + _CHILD_LIMIT_S
    for name, child in children.items():
        try:
            out, err = child.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results[name] = (child.returncode, out.strip(), err[-500:])
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            hung.append(name)
    assert hung == [], f"parse_event did not finish within {_CHILD_LIMIT_S} s for: {hung}"
    assert all(rc == 0 and out in ("RENDEZVOUS", "AGENT") for rc, out, _ in results.values()), (
        results
    )


# --- property tests: parse → log model → SDK record → OTLP protobuf -------------------------

CREATED_NS = 1_700_000_000_000_000_000
_RESOURCE = Resource({"service.name": "bad-input"})
_LOG_EXPORTER = InMemoryLogRecordExporter()
_SPAN_EXPORTER = InMemorySpanExporter()
_PROVIDER = LoggerProvider(resource=_RESOURCE, shutdown_on_exit=False)
_PROVIDER.add_log_record_processor(SimpleLogRecordProcessor(_LOG_EXPORTER))
EMITTER = Emitter(
    _PROVIDER.get_logger("elastic_otel"), SimpleSpanProcessor(_SPAN_EXPORTER), _RESOURCE
)
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    database=None,  # nothing written into the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def emit_and_encode_log(event: ElasticEvent, trace_id: int = 0, span_id: int = 0) -> Any:
    """One SDK log record for ``event``, encoded to OTLP protobuf with nothing dropped."""
    _LOG_EXPORTER.clear()
    EMITTER.emit_log(event, trace_id, span_id)
    records = _LOG_EXPORTER.get_finished_logs()
    assert len(records) == 1
    request = encode_logs(records)
    request.SerializeToString()
    (pb,) = request.resource_logs[0].scope_logs[0].log_records
    # the encoder logs and drops an attribute it cannot encode: none may be lost that way
    assert len(pb.attributes) == len(records[0].log_record.attributes)
    return pb


def convert(payload: object) -> Any:
    """parse_event → to_log → Emitter.emit_log → encode_logs, as the event thread does."""
    event = parse_event(payload, CREATED_NS)
    assert isinstance(event, ElasticEvent)
    model = to_log(event)
    assert isinstance(model.body, str) and isinstance(model.event_name, str)
    if event.kind is EventKind.UNPARSED:
        assert event.attributes[A.UNPARSED] is True
        assert len(event.attributes[A.RAW]) <= DEFAULT_RAW_LIMIT
        assert event.attributes[A.PARSE_ERROR]
    pb = emit_and_encode_log(event)
    assert 0 <= pb.time_unix_nano < 2**64
    return pb


_surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"])
_chars = st.one_of(st.characters(codec=None, exclude_categories=()), _surrogates)
texts = st.text(_chars, max_size=40)
huge_ints = st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30, -(10**40)])
numbers = st.one_of(st.integers(), huge_ints, st.floats(allow_nan=True, allow_infinity=True))
json_scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12,
)
wild = st.one_of(json_values, st.sampled_from(["", "None", "<NONE>", "{", "[1]", "-1", "0"]))

WORKER_STATES = ["START", "RENDEZVOUS", "ASSIGN_WORKER_RANKS", "SUCCEEDED", "FAILED", "TERMINATED"]
STATUS_NAMES = [f"torchelastic.worker.status.{s}" for s in WORKER_STATES]
RAW_ERRORS = [
    None,
    "",
    "<NONE>",
    'Traceback (most recent call last):\n  File "x"\nValueError: bad',
    json.dumps({"message": {"message": "RuntimeError: x", "extraInfo": {"py_callstack": "tb"}}}),
    json.dumps({"message": "<NONE>", "errorTraits": {"category": "c"}}),
    "{" + "[" * 3000,
    "NoneType: None",
]
TORCH_METADATA_KEYS: dict[str, st.SearchStrategy] = {
    "run_id": st.sampled_from(["job", "none", ""]),
    "global_rank": st.integers(-1, 4),
    "group_rank": st.integers(-1, 4),
    "state": st.sampled_from(WORKER_STATES),
    "role": st.sampled_from(["default", ""]),
    "hostname": st.sampled_from(["node-a", "node-b"]),
    "raw_error": st.sampled_from(RAW_ERRORS),
    "metadata": st.builds(json.dumps, st.dictionaries(texts, json_values, max_size=4)),
    "duration_ms": numbers,
    "agent_restarts": st.one_of(st.integers(0, 3), huge_ints),
    "rdzv_backend": st.sampled_from(["c10d", "etcd"]),
}


@st.composite
def metadata_dicts(draw: st.DrawFn) -> Any:
    md = {}
    for key, typical in TORCH_METADATA_KEYS.items():
        if draw(st.booleans()):
            md[key] = draw(st.one_of(typical, wild))
    md |= draw(st.dictionaries(texts, wild, max_size=3))
    return md


@st.composite
def event_dicts(draw: st.DrawFn) -> dict:
    """Shaped like Event.serialize(), every field of any type, some missing, some extra."""
    d: dict = {
        "name": draw(st.one_of(st.sampled_from(STATUS_NAMES), wild)),
        "source": draw(st.one_of(st.sampled_from(["AGENT", "WORKER", "ALIEN"]), wild)),
    }
    if draw(st.booleans()):
        d["timestamp"] = draw(st.one_of(st.integers(-(2**70), 2**70), numbers, wild))
    if draw(st.booleans()):
        d["metadata"] = draw(st.one_of(metadata_dicts(), wild))
    return d | draw(st.dictionaries(st.text(max_size=6), wild, max_size=2))


RDZV_TEMPLATES = [
    "The node '{n}' attempts to join the next round of the rendezvous '{r}'.",
    "The node '{n}' has joined round {a} of the rendezvous '{r}' as rank {b} in a world of "
    "size {c}.",
    "The node '{n}' added itself to the participants of round {a} of the rendezvous '{r}'. "
    "Pending sync.",
    "The node '{n}' added itself to the wait list of round {a} of the rendezvous '{r}'. "
    "Pending sync.",
    "The node '{n}' marked round {a} of the rendezvous '{r}' as complete. Pending sync.",
    "The node '{n}' has sent a keep-alive heartbeat to the rendezvous '{r}'.",
    "The node '{n}' updated its keep-alive heartbeat time for the rendezvous '{r}'.",
    "The node '{n}' has successfully synced its local changes with other nodes in the "
    "rendezvous '{r}'.",
    "The node '{n}' has closed the rendezvous '{r}'.",
    "The node '{n}' marked the rendezvous '{r}' as closed. Pending sync.",
    "The node '{n}' has failed to send a keep-alive heartbeat to the rendezvous '{r}' due to "
    "an error of type RendezvousTimeoutError.",
    "The node '{n}' has failed to shutdown the rendezvous '{r}' due to an error of type "
    "RendezvousConnectionError.",
    "RendezvousTimeoutError: ",
    "RendezvousClosedError: ",
    "{n}",
]
round_numbers = st.one_of(st.integers(-2, 4), huge_ints)


@st.composite
def rdzv_messages(draw: st.DrawFn) -> str:
    template = draw(st.sampled_from(RDZV_TEMPLATES))
    return template.format(
        n=draw(st.sampled_from(["a_1_0", "b_2_0", ""]) | texts),
        r=draw(st.sampled_from(["job", "none"]) | texts),
        a=draw(round_numbers),
        b=draw(round_numbers),
        c=draw(round_numbers),
    )


@st.composite
def rdzv_dicts(draw: st.DrawFn) -> dict:
    """Shaped like RdzvEvent.serialize(): torch's messages, plausible and wild field values."""
    host, pid, local_id = draw(st.sampled_from([("a", 1, 0), ("b", 2, 0), ("a", 1, None)]))
    d = {
        "name": draw(st.one_of(st.just("dynamic_rendezvous.py:x"), wild)),
        "run_id": draw(st.one_of(st.sampled_from(["job", "none", ""]), wild)),
        "message": draw(st.one_of(rdzv_messages(), wild)),
        "hostname": draw(st.one_of(st.just(host), wild)),
        "pid": draw(st.one_of(st.just(pid), numbers, wild)),
        "node_state": draw(
            st.one_of(st.sampled_from(["INIT", "RUNNING", "SUCCEEDED", "FAILED", "BOGUS"]), wild)
        ),
        "rank": draw(st.one_of(st.none(), st.integers(-1, 3), huge_ints, wild)),
        "local_id": draw(st.one_of(st.just(local_id), wild)),
        "error_trace": draw(st.one_of(st.just(""), texts, wild)),
    }
    for key in draw(st.sets(st.sampled_from(sorted(d)), max_size=2)):
        if key not in ("node_state", "run_id", "message"):
            del d[key]  # older torch versions
    return d | draw(st.dictionaries(st.text(max_size=6), wild, max_size=2))


def as_json(d: dict) -> str | None:
    try:
        return json.dumps(d)
    except (TypeError, ValueError):
        return None


@PROPERTY
@given(json_values)
def test_property_any_json_value(value: Any) -> None:
    convert(value)
    text = as_json(value)
    if text is not None:
        convert(text)
        convert(text.encode("utf-8", "surrogatepass"))


@PROPERTY
@given(event_dicts())
def test_property_event_shaped_dicts(d: dict) -> None:
    convert(d)
    text = as_json(d)
    if text is not None:
        convert(text)


@PROPERTY
@given(rdzv_dicts())
def test_property_rdzv_shaped_dicts(d: dict) -> None:
    convert(d)
    text = as_json(d)
    if text is not None:
        convert(text)


@PROPERTY
@given(
    st.one_of(
        texts,
        st.text(max_size=200),
        st.builds(lambda d, n: json.dumps(d)[:n], event_dicts(), st.integers(0, 200)),
    )
)
def test_property_random_text(text: str) -> None:
    convert(text)


@PROPERTY
@given(st.binary(max_size=300))
def test_property_random_bytes(data: bytes) -> None:
    convert(data)
    convert(data.decode("utf-8", "surrogateescape"))


# --- property tests: the trace model --------------------------------------------------------


@st.composite
def agent_events(draw: st.DrawFn) -> dict:
    """Agent and worker status events as torch builds them, with plausible and wild values."""
    state = draw(st.sampled_from(WORKER_STATES))
    md: dict = {"run_id": draw(st.sampled_from(["job", "none"])), "state": state}
    for key in ("global_rank", "group_rank", "agent_restarts", "duration_ms", "raw_error"):
        if draw(st.booleans()):
            md[key] = draw(st.one_of(TORCH_METADATA_KEYS[key], wild))
    return {
        "name": f"torchelastic.worker.status.{state}",
        "source": draw(st.sampled_from(["AGENT", "WORKER"])),
        "timestamp": draw(st.one_of(st.just(0), st.integers(-(2**66), 2**66), numbers)),
        "metadata": md,
    }


model_payloads = st.one_of(
    rdzv_dicts(),
    rdzv_dicts(),
    agent_events(),
    event_dicts(),
    json_values,
    texts,
)


@PROPERTY
@given(
    st.lists(model_payloads, max_size=40),
    st.sampled_from([1, 2, 10_000]),
    st.booleans(),
)
def test_property_trace_model_sequences(payloads: list, max_tracked: int, error: bool) -> None:
    """Random (often malformed) event sequences: never raises, every event logged once, every
    span ended once, and everything encodes to OTLP."""
    model = TraceModel(salt="s", max_tracked=max_tracked, event_limit=8)
    events = [parse_event(p, CREATED_NS + i * 1_000_000) for i, p in enumerate(payloads)]
    spans: list[SpanRecord] = []
    logs: list[tuple[ElasticEvent, int, int]] = []
    for event in events:
        out = model.process(event)
        spans += out.spans
        logs += out.logs
    final = model.close_all(CREATED_NS + 10**12, "process exit", error)
    spans += final.spans
    logs += final.logs

    assert model.tracked == 0
    again = model.close_all(CREATED_NS + 2 * 10**12, "again")
    assert again.spans == [] and again.logs == []
    ids = [s.span_id for s in spans]
    assert len(ids) == len(set(ids)), "a span was ended twice"
    assert all(s.parent_span_id in (0, *ids) for s in spans), "a parent span never ended"
    assert all(s.trace_id and s.end_ns >= s.start_ns for s in spans)
    # Each event logged once; an event the model restates (torch's SUCCEEDED after a failed
    # run is exported as the FAILED it was) is a copy, which keeps the original's ``extra``.
    assert Counter(id(e.extra) for e, _, _ in logs) == Counter(id(e.extra) for e in events)

    _SPAN_EXPORTER.clear()
    for span in spans:
        EMITTER.emit_span(span)
    finished = _SPAN_EXPORTER.get_finished_spans()
    assert len(finished) == len(spans)
    if finished:
        request = encode_spans(finished)
        request.SerializeToString()
        encoded = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
        by_id = {s.context.span_id: s for s in finished}
        for pb in encoded:
            sdk = by_id[int.from_bytes(pb.span_id, "big")]
            assert len(pb.attributes) == len(sdk.attributes), pb.name
            assert [len(e.attributes) for e in pb.events] == [len(e.attributes) for e in sdk.events]
            assert [len(lk.attributes) for lk in pb.links] == [
                len(lk.attributes) for lk in sdk.links
            ]
    for event, trace_id, span_id in logs:
        emit_and_encode_log(event, trace_id, span_id)


# --- a bad field loses only itself --------------------------------------------------------------
# The convention (elastic_otel/parsing/torch_events.py): a typed field present but unusable
# is left out of the event and its typed attribute, and its text is kept as
# torchelastic.invalid.<field>.

# Text that looks numeric to str.isdigit(), to int() or to a person, but is no ASCII decimal.
odd_numbers = st.one_of(
    st.sampled_from(
        ["²", "٣", "--5", "+-1", " 7 ", "\u20037\t", "1e3", "0x10", "1_000", "", " ", "9" * 40]
    ),
    st.text(alphabet=st.sampled_from("0123456789²³٣\u06f7+- _.e"), max_size=12),
    st.text(st.characters(categories=["Nd", "No", "Nl", "Zs"]), min_size=1, max_size=6),
    texts,
    numbers,
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=1),
)


def expected_int(value: Any) -> int | None:
    """What an int64 field should read as (an oracle written apart from parsing._opt_int)."""
    if type(value) is int:
        return value if -(2**63) <= value < 2**63 else None
    if type(value) is float:
        return expected_int(int(value)) if math.isfinite(value) and value == int(value) else None
    if type(value) is str:
        text = value.strip()
        digits = text[1:] if text[:1] in ("+", "-") else text
        if 0 < len(digits) < 20 and all("0" <= c <= "9" for c in digits):
            return expected_int(int(text))
    return None


def expected_duration(value: Any) -> float | None:
    ok = type(value) in (int, float) and 0 <= value <= 100 * 24 * 3600 * 1000
    return float(value) if ok else None


def expected_time(value: Any, created_ns: int) -> int:
    ok = type(value) in (int, float) and 0 < value < 9_000_000_000_000
    return int(value * 1_000_000) if ok else created_ns


def assert_absent_or_flagged(event: ElasticEvent, key: str, value: Any, usable: bool) -> None:
    """Usable: not flagged. Unusable: flagged with its text, unless it was null (absent)."""
    flagged = event.attributes.get(A.INVALID_PREFIX + key)
    if usable or value is None:
        assert flagged is None, (key, value, flagged)
    else:
        assert isinstance(flagged, str) and len(flagged) <= 256, (key, value, flagged)
        if isinstance(value, str):
            assert flagged == value[:256]  # the text as it came


def through_json_and_as_dict(payload: dict) -> list[dict | str]:
    """The JSON torch logs and the dict an object parses as (no JSON for lone surrogates)."""
    text = as_json(payload)
    out: list[dict | str] = [payload]
    if text is not None:
        out.append(text)
    return out


GOOD_JOIN = {
    "name": "dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous",
    "run_id": "job",
    "message": "The node 'a_1_0' has joined round 3 of the rendezvous 'job' as rank 1 in a "
    "world of size 2.",
    "hostname": "a",
    "pid": 1,
    "node_state": "RUNNING",
    "master_endpoint": "10.0.0.1:29400",
    "rank": 1,
    "local_id": 0,
    "error_trace": "",
}
RDZV_INT_FIELDS = ("pid", "local_id", "rank")


@PROPERTY
@given(st.dictionaries(st.sampled_from(RDZV_INT_FIELDS), odd_numbers, min_size=1))
def test_property_bad_rendezvous_fields_lose_only_themselves(bad: dict[str, Any]) -> None:
    for payload in through_json_and_as_dict(GOOD_JOIN | bad):
        event = parse_event(payload, 1)
        assert event.kind is EventKind.RENDEZVOUS, event.attributes
        # the good fields, and what torch's message says, are intact
        assert event.action is not None and event.action.value == "joined"
        assert (event.round, event.world_size, event.hostname, event.run_id) == (3, 2, "a", "job")
        assert event.attributes[A.MASTER_ENDPOINT] == "10.0.0.1:29400"
        assert event.attributes[A.NODE_STATE] == "RUNNING"
        # a value that went through JSON is compared as it came back
        got = payload if isinstance(payload, dict) else json.loads(payload)
        for key in RDZV_INT_FIELDS:
            value = got[key]
            expected = expected_int(value)
            parsed = {"pid": event.pid, "local_id": event.local_id, "rank": event.rank}[key]
            if key == "rank" and expected is None:
                assert parsed == 1  # no usable rank field: the rank in torch's message
            else:
                assert parsed == expected, (key, value)
            attr_key = {"pid": A.PROCESS_PID, "local_id": A.LOCAL_ID, "rank": A.RANK}[key]
            assert event.attributes.get(attr_key) == parsed
            assert_absent_or_flagged(event, key, value, expected is not None)


GOOD_WORKER_METADATA = {
    "run_id": "job",
    "global_rank": 1,
    "group_rank": 0,
    "worker_id": "5",
    "role": "default",
    "hostname": "a",
    "state": "FAILED",
    "total_run_time": 3,
    "rdzv_backend": "c10d",
    "raw_error": 'Traceback (most recent call last):\n  File "x"\nValueError: bad',
    "metadata": json.dumps({"exit_code": [1], "worker_pid": [5]}),
    "agent_restarts": 0,
    "duration_ms": 12.5,
}
AGENT_INT_FIELDS = ("global_rank", "group_rank", "agent_restarts", "worker_pid")


@PROPERTY
@given(
    st.sampled_from(["AGENT", "WORKER"]),
    st.dictionaries(
        st.sampled_from([*AGENT_INT_FIELDS, "duration_ms", "timestamp"]),
        st.one_of(odd_numbers, st.integers(-(2**66), 2**66), st.none()),
        min_size=1,
    ),
)
def test_property_bad_agent_fields_lose_only_themselves(source: str, bad: dict[str, Any]) -> None:
    metadata = dict(GOOD_WORKER_METADATA)
    nested: dict[str, Any] = {"exit_code": [1], "worker_pid": [5]}
    for key, value in bad.items():
        if key == "worker_pid":
            nested[key] = [value]  # torch wraps per-worker values in a one-element list
        elif key != "timestamp":
            metadata[key] = value
    metadata["metadata"] = json.dumps(nested)
    payload = {
        "name": "torchelastic.worker.status.FAILED",
        "source": source,
        "timestamp": bad.get("timestamp", 0),
        "metadata": metadata,
    }
    for sent in through_json_and_as_dict(payload):
        event = parse_event(sent, CREATED_NS)
        assert event.kind is (EventKind.WORKER if source == "WORKER" else EventKind.AGENT)
        # the good fields are intact
        assert (event.state, event.run_id, event.role, event.hostname) == (
            "FAILED",
            "job",
            "default",
            "a",
        )
        assert event.error is not None and event.error.type == "ValueError"
        a = event.attributes
        assert (a[A.EXIT_CODE], a[A.WORKER_ID], a[A.RDZV_BACKEND]) == (1, "5", "c10d")
        got = sent if isinstance(sent, dict) else json.loads(sent)
        md, inner = got["metadata"], json.loads(got["metadata"]["metadata"])
        values = {k: md[k] for k in AGENT_INT_FIELDS if k != "worker_pid"}
        values["worker_pid"] = inner["worker_pid"][0]
        parsed = {
            "global_rank": event.global_rank,
            "group_rank": event.group_rank,
            "agent_restarts": event.agent_restarts,
            "worker_pid": event.pid,
        }
        for key, value in values.items():
            expected = expected_int(value)
            assert parsed[key] == expected, (key, value)
            assert a.get(A.NS + key) == expected, (key, value)  # typed, or not there at all
            assert_absent_or_flagged(event, key, value, expected is not None)
        assert a.get(A.RANK) == event.group_rank
        duration = expected_duration(md["duration_ms"])
        assert event.duration_ms == duration == a.get(A.DURATION_MS)
        assert_absent_or_flagged(event, "duration_ms", md["duration_ms"], duration is not None)
        ts = got["timestamp"]
        assert event.time_ns == expected_time(ts, CREATED_NS)
        usable_ts = event.time_ns != CREATED_NS or (type(ts) in (int, float) and ts == 0)
        assert_absent_or_flagged(event, "timestamp", ts, usable_ts)
        emit_and_encode_log(event)  # and what is left reaches the wire, nothing dropped


def test_a_number_past_pythons_digit_limit_is_a_bad_field_not_bad_json() -> None:
    # json.loads refuses ints of more than sys.get_int_max_str_digits() (4300) digits.
    digits = "7" * 5000
    text = json.dumps(GOOD_JOIN | {"pid": 0}).replace('"pid": 0', f'"pid": {digits}')
    event = parse_event(text, 1)
    assert event.kind is EventKind.RENDEZVOUS and event.pid is None and event.rank == 1
    assert event.attributes[A.INVALID_PREFIX + "pid"] == digits[:256]
    # in the agent's nested metadata JSON too: the other per-worker values are kept
    nested = f'{{"worker_pid": [{digits}], "exit_code": [1]}}'
    payload = {"name": "torchelastic.worker.status.FAILED", "source": "WORKER"}
    event_thread = parse_event(json.dumps(payload | {"metadata": {"metadata": nested}}), 1)
    assert event_thread.kind is EventKind.WORKER and event_thread.pid is None
    assert event_thread.attributes[A.EXIT_CODE] == 1
    assert event_thread.attributes[A.INVALID_PREFIX + "worker_pid"] == digits[:256]


def rdzv_object(**changes: Any) -> FakeRdzvEvent:
    """GOOD_JOIN as an object with torch's RdzvEvent fields, some of them changed."""
    names = FakeRdzvEvent.__dataclass_fields__
    return FakeRdzvEvent(**{k: v for k, v in (GOOD_JOIN | changes).items() if k in names})


class Color(Enum):
    RED = Unprintable()


class Level(IntEnum):
    HIGH = 7


@pytest.mark.parametrize(
    ("field", "value", "parsed", "flagged"),
    [
        ("pid", b"12", None, "b'12'"),
        ("pid", bytearray(b"1"), None, "bytearray(b'1')"),
        ("pid", Level.HIGH, 7, None),
        ("local_id", Color.RED, None, "<unrepresentable Unprintable: RuntimeError>"),
        ("pid", Unprintable(), None, "<unrepresentable Unprintable: RuntimeError>"),
        ("pid", -0.0, 0, None),
        ("pid", float("-inf"), None, "-inf"),
    ],
)
def test_python_values_in_an_event_object_lose_only_their_field(
    field: str, value: Any, parsed: int | None, flagged: str | None
) -> None:
    """``get_logging_handler(...).info(event)`` hands over objects: their fields can be
    anything Python has."""
    event = parse_event(rdzv_object(**{field: value}), 1)
    assert event.kind is EventKind.RENDEZVOUS and event.hostname == "a"
    assert getattr(event, field) == parsed and type(getattr(event, field)) is type(parsed)
    assert event.attributes.get(A.INVALID_PREFIX + field) == flagged


def test_an_enum_whose_value_cannot_be_printed_is_text() -> None:
    event = parse_event(rdzv_object(run_id=Color.RED), 1)
    assert event.kind is EventKind.RENDEZVOUS and event.pid == 1
    assert event.run_id == "<unrepresentable Unprintable: RuntimeError>"
