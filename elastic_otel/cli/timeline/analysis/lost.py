"""Spans whose process never ended them (a lost node or worker), rebuilt from the open-span
snapshots the bridge logs (``partial.event`` = ``heartbeat``, :mod:`elastic_otel.model.snapshots`),
so that the timeline shows them to when their process was last heard of."""

from __future__ import annotations

from elastic_otel.cli.otlp_json_reader import OtlpJsonError, decode_line
from elastic_otel.cli.timeline.analysis.items import Item, instance_id
from elastic_otel.cli.timeline.analysis.timeline import LOST
from elastic_otel.model.snapshots import HEARTBEAT
from elastic_otel.names import attributes as A


def lost_spans(spans: list[Item], logs: list[Item]) -> list[Item]:
    """Spans known only from open-span snapshots: their process never ended them. Each is its
    latest snapshot, ended at the time its process was last heard of (its latest record of any
    kind) and marked ``torchelastic.lost``."""
    # By span id: a recovery's snapshots carry the trace of the round it left, its end the next.
    final = {s["span_id"] for s in spans}
    latest: dict[tuple[str, str], tuple[int, Item]] = {}
    heard: dict[str, int] = {}
    for s in spans:
        instance = instance_id(s)
        heard[instance] = max(heard.get(instance, 0), s["end_ns"])
    for record in logs:
        instance = str(record["resource"].get("service.instance.id", ""))
        heard[instance] = max(heard.get(instance, 0), record["time_ns"])
        if record["attributes"].get(A.PARTIAL_EVENT) != HEARTBEAT:
            continue
        body = record["body"]
        try:
            snapshot, _ = decode_line(body) if isinstance(body, str) else ([], [])
        except OtlpJsonError:
            continue  # a snapshot someone else wrote differently: not ours to show
        for span in snapshot:
            key = (span["trace_id"], span["span_id"])
            if span["span_id"] not in final and record["time_ns"] >= latest.get(key, (0, span))[0]:
                latest[key] = (record["time_ns"], span)
    lost = []
    for snapshot_ns, span in latest.values():
        last_heard = max(heard.get(instance_id(span), 0), snapshot_ns)
        attrs = {**span["attributes"], A.LOST: True}
        if span["name"] == A.SPAN_WORKER:
            attrs[A.STATE] = LOST
        lost.append({**span, "end_ns": last_heard, "attributes": attrs})
    return lost
