"""What each run of a job cost: the per-run summary ``elastic-otel timeline`` prints first.

Per run id, from the bridge's spans (and the training scripts' ``worker.first_step``):

* **wall**: first span start to last span end;
* **rendezvous**: time any node spent joining (the union of the ``rendezvous.join`` spans;
  ``agent.rendezvous`` where there are none);
* **workers ran**: the union of the ``worker`` spans;
* **restarts**: one per ``agent.recovery`` span, with its cause, its phases (its child spans),
  how long after the failure the agent noticed it, and, when the training script marks its
  first step, when training resumed: the latest ``worker.first_step`` end in the recovery's
  trace (the round it led to);
* **hold-ups**: per round with several nodes, the last node to join and how long after the
  node before it: the time the others waited for it alone.

Unions, not sums: nodes join and run side by side, and the wall clock is what a job pays.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from elastic_otel.names import attributes as A

Item = dict[str, Any]


@dataclass
class Recovery:
    node: str
    start_ns: int
    end_ns: int
    cause: str
    phases: list[tuple[str, int]]  # (phase name, duration ns), in order
    detection_ms: float | None = None
    resumed_ns: int | None = None  # recovery start to the first training step after it

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def lost_ns(self) -> int:
        """What it cost: until training resumed when known, else until the workers ran."""
        return self.resumed_ns if self.resumed_ns is not None else self.duration_ns


@dataclass
class HoldUp:
    round: int | None
    node: str  # the last node to join
    held_ns: int  # its join start minus the one before it


@dataclass
class RunSummary:
    run_id: str
    start_ns: int
    end_ns: int
    rendezvous_ns: int
    workers_ns: int
    recoveries: list[Recovery] = field(default_factory=list)
    hold_ups: list[HoldUp] = field(default_factory=list)

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def lost_ns(self) -> int:
        """Wall time lost to restarts (nodes recover side by side: a union, not a sum)."""
        return union_ns(
            {"start_ns": r.start_ns, "end_ns": r.start_ns + r.lost_ns} for r in self.recoveries
        )


def summarize(spans: Iterable[Item]) -> list[RunSummary]:
    """One summary per run id, in order of first appearance."""
    spans = list(spans)
    by_id = {s["span_id"]: s for s in spans}
    labels = {  # the process of a span → its node, as its rendezvous spans name it
        instance_id(s): node_label(s) for s in spans if s["name"] == A.SPAN_RDZV_JOIN
    }
    labels.pop("", None)
    runs: dict[str, list[Item]] = {}
    for span in spans:
        run_id = _run_id(span, by_id)
        if run_id is not None:
            runs.setdefault(run_id, []).append(span)
    return [_summary(run_id, members, spans, labels) for run_id, members in runs.items()]


def _run_id(span: Item, by_id: dict[str, Item]) -> str | None:
    run_id = span["attributes"].get(A.RUN_ID)
    if run_id is None and span["name"] == A.SPAN_WORKER_FIRST_STEP:
        parent = by_id.get(span["parent_span_id"])  # a training script's span: its worker's
        run_id = parent["attributes"].get(A.RUN_ID) if parent else None
    return None if run_id is None else str(run_id)


def _summary(
    run_id: str, spans: list[Item], everything: list[Item], labels: dict[str, str]
) -> RunSummary:
    def named(name: str) -> list[Item]:
        return [s for s in spans if s["name"] == name]

    joins = named(A.SPAN_RDZV_JOIN) or named(A.SPAN_AGENT_RENDEZVOUS)
    summary = RunSummary(
        run_id,
        min(s["start_ns"] for s in spans),
        max(s["end_ns"] for s in spans),
        union_ns(joins),
        union_ns(named(A.SPAN_WORKER)),
    )
    first_steps = named(A.SPAN_WORKER_FIRST_STEP)
    for span in sorted(named(A.SPAN_AGENT_RECOVERY), key=lambda s: s["start_ns"]):
        children = [s for s in everything if s["parent_span_id"] == span["span_id"]]
        children.sort(key=lambda s: s["start_ns"])
        attrs = span["attributes"]
        detection = attrs.get(A.RECOVERY_DETECTION_MS)
        resumed = [
            s["end_ns"]
            for s in first_steps
            if s["trace_id"] == span["trace_id"] and s["end_ns"] > span["start_ns"]
        ]
        summary.recoveries.append(
            Recovery(
                labels.get(instance_id(span)) or node_label(span),
                span["start_ns"],
                span["end_ns"],
                str(attrs.get(A.RECOVERY_CAUSE, "") or "unknown"),
                [(c["name"].removeprefix("agent."), c["end_ns"] - c["start_ns"]) for c in children],
                float(detection) if isinstance(detection, int | float) else None,
                max(resumed) - span["start_ns"] if resumed else None,
            )
        )
    rounds: dict[Any, list[Item]] = {}
    for join in named(A.SPAN_RDZV_JOIN):
        rounds.setdefault(join["attributes"].get(A.ROUND), []).append(join)
    for number, joins_of_round in rounds.items():
        if len(joins_of_round) < 2:
            continue
        joins_of_round.sort(key=lambda s: s["start_ns"])
        last, before = joins_of_round[-1], joins_of_round[-2]
        held = last["start_ns"] - before["start_ns"]
        summary.hold_ups.append(
            HoldUp(number if isinstance(number, int) else None, node_label(last), held)
        )
    summary.hold_ups.sort(key=lambda h: (h.round is None, h.round or 0))
    return summary


def union_ns(spans: Iterable[Item]) -> int:
    """Nanoseconds covered by at least one of ``spans``."""
    total, end = 0, None
    for span in sorted(spans, key=lambda s: s["start_ns"]):
        start, stop = span["start_ns"], span["end_ns"]
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def instance_id(span: Item) -> str:
    """The process that emitted ``span`` (its resource's ``service.instance.id``)."""
    return str(span.get("resource", {}).get("service.instance.id", ""))


def node_name(host: object, pid: object, local_id: int | None = None) -> str:
    """How the timeline names a node: ``host pid N`` (``/local_id`` when not 0)."""
    label = f"{host or '?'} pid {pid}" if pid is not None else str(host or "?")
    return f"{label}/{local_id}" if local_id else label


def node_label(span: Item) -> str:
    attrs, resource = span["attributes"], span.get("resource", {})
    host = attrs.get(A.HOST_NAME) or resource.get(A.HOST_NAME)
    return node_name(host, attrs.get(A.PROCESS_PID, resource.get(A.PROCESS_PID)))


def render_summary(summaries: list[RunSummary], rel: Any) -> list[str]:
    """Text lines of the summaries; ``rel`` formats a time relative to the timeline's start."""

    def s(ns: int) -> str:
        return f"{ns / 1e9:.3f}s"

    lines: list[str] = []
    for run in summaries:
        n = len(run.recoveries)
        lost = f" · {n} restart{'s' if n > 1 else ''} cost {s(run.lost_ns)}" if n else ""
        lines += [
            f"SUMMARY · run {run.run_id} · wall {s(run.wall_ns)} · in rendezvous "
            f"{s(run.rendezvous_ns)} · workers ran {s(run.workers_ns)}{lost}"
        ]
        for r in run.recoveries:
            phases = ", ".join(f"{name} {s(ns)}" for name, ns in r.phases)
            text = f"  restart at {rel(r.start_ns)} on {r.node}: {r.cause}, {s(r.duration_ns)}"
            if r.detection_ms is not None:
                text += f" (noticed {r.detection_ms / 1000:.1f}s after the failure)"
            if phases:
                text += f": {phases}"
            if r.resumed_ns is not None:
                text += f"; training resumed after {s(r.resumed_ns)}"
            lines.append(text)
        for h in run.hold_ups:
            label = "round ?" if h.round is None else f"round {h.round}"
            lines.append(f"  {label}: last to join {h.node}, {s(h.held_ns)} after the node before")
    return lines
