"""Replay and the live bridge share one conversion: the same events give the same records.

The events two agents of a real job recorded are handed, once, to a live bridge handler per
agent, as torch hands them (a log record created when the event was recorded), and once to
``elastic-otel replay`` as the agents' log files. Both export over OTLP to real receivers; what
arrives must be the same spans and log records, down to times, ids, attributes, events, links
and which span each record belongs to. Only the spans still open at the end (an agent's log cut
short) differ, in their end time: the live bridge ends them when it shuts down, replay at the
log's last event.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from elastic_otel.bridge.handler import OtelHandler
from elastic_otel.cli import main
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from tests.support.fixtures import captured_events
from tests.support.otlp_receiver import OtlpReceiver

AGENTS = ("restart_node0.tsv", "restart_node1.tsv")
SALT = "replay-seam"
END = "end of the replayed log"  # how replay ends what is still open; the live side is told so


def iso_header(created_ns: int) -> str:
    """An ISO 8601 UTC time with nanoseconds (as ``kubectl logs --timestamps`` writes), exact."""
    seconds, nanos = divmod(created_ns, 1_000_000_000)
    t = dt.datetime.fromtimestamp(seconds, dt.timezone.utc)
    return f"{t:%Y-%m-%dT%H:%M:%S}.{nanos:09d}Z"


def export_to(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in receiver.exporter_env().items():
        monkeypatch.setenv(name, value)


def recorded(name: str, share: float) -> list[tuple[float, str]]:
    """The first ``share`` of an agent's recorded (created, JSON) events."""
    events = captured_events(name)
    return events[: round(len(events) * share)]


def live(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch, share: float) -> None:
    """Each agent's events through a bridge handler of its own, as torch's logger calls it."""
    export_to(receiver, monkeypatch)
    for name in AGENTS:
        handler = OtelHandler()
        try:
            for created, payload in recorded(name, share):
                record = logging.LogRecord("torchelastic", logging.INFO, "", 0, payload, None, None)
                record.created = created
                handler.handle(record)
        finally:
            handler.shutdown(END)


def replayed(
    tmp_path: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch, share: float
) -> None:
    """Each agent's events as its log file, replayed."""
    export_to(receiver, monkeypatch)
    files = []
    for name in AGENTS:
        lines = [
            f"{iso_header(int(created * 1e9))} {payload}"
            for created, payload in recorded(name, share)
        ]
        files.append(tmp_path / f"{name}.log")
        files[-1].write_text("\n".join(lines) + "\n")
    assert main(["replay", *map(str, files), "--job-id", SALT]) == 0


def identity(span: dict) -> tuple:
    """What tells a span apart without its random id (its end may be when the bridge stopped)."""
    attrs = sorted((k, repr(v)) for k, v in span["attributes"].items())
    return span["name"], span["trace_id"], span["start_ns"], tuple(attrs)


def normalised(spans: list[dict], logs: list[dict]) -> tuple[Counter, Counter, int]:
    """Spans and log records with span ids replaced by the identity of the span they name;
    and how many spans were ended by the end of the input."""
    by_id = {s["span_id"]: identity(s) for s in spans}
    assert len(set(by_id.values())) == len(spans), "two spans look alike: compare more"

    def ref(span_id: str) -> Any:
        return by_id.get(span_id, "not exported") if span_id.strip("0") else None

    story: Counter[tuple] = Counter()
    ended_by_input = 0
    for s in spans:
        at_end = s["attributes"].get(A.END_REASON) == END
        ended_by_input += at_end
        story[
            (
                identity(s),
                None if at_end else s["end_ns"],
                s["status_code"],
                s["status_message"],
                s["kind"],
                ref(s["parent_span_id"]),
                tuple((e["name"], e["time_ns"], repr(e["attributes"])) for e in s["events"]),
                tuple(
                    (link["trace_id"], ref(link["span_id"]), repr(link["attributes"]))
                    for link in s["links"]
                ),
            )
        ] += 1
    records = Counter(
        (
            r["time_ns"],
            r["observed_time_ns"],
            r["severity_number"],
            r["severity_text"],
            repr(r["body"]),
            repr(sorted(r["attributes"].items())),
            r["event_name"],
            r["trace_id"],
            ref(r["span_id"]),
        )
        for r in logs
    )
    return story, records, ended_by_input


@pytest.mark.parametrize("share", [1.0, 0.6], ids=["whole job", "logs cut short"])
def test_replay_and_the_live_bridge_export_the_same_records(
    share: float,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    grpc_receiver: OtlpReceiver,
    http_receiver: OtlpReceiver,
) -> None:
    monkeypatch.setenv(env.ELASTIC_OTEL_JOB_ID, SALT)  # the live trace ids' salt: replay's --job-id
    monkeypatch.setenv(env.ELASTIC_OTEL_STALL_AFTER, "0")  # recorded waits are not stalls now
    monkeypatch.setenv(env.ELASTIC_OTEL_OPEN_SPAN_INTERVAL, "0")  # nor open-span snapshots
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_BLRP_SCHEDULE_DELAY", "50")

    live(grpc_receiver, monkeypatch, share)
    replayed(tmp_path, http_receiver, monkeypatch, share)

    live_spans, live_logs = grpc_receiver.spans(), grpc_receiver.logs()
    spans, logs = http_receiver.spans(), http_receiver.logs()
    events = sum(len(recorded(name, share)) for name in AGENTS)
    assert len(live_logs) == len(logs) == events
    assert len(live_spans) == len(spans)

    live_story, live_records, live_at_end = normalised(live_spans, live_logs)
    story, records, at_end = normalised(spans, logs)
    assert story == live_story
    assert records == live_records
    names = {s["name"] for s in spans}
    assert {A.SPAN_RDZV_JOIN, A.SPAN_RDZV_MEMBER, A.SPAN_WORKER} <= names
    assert at_end == live_at_end
    assert (at_end > 0) is (share < 1)  # what the end of the input ended is compared too
