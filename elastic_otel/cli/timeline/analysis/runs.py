"""What each run of a job cost and what broke it (:class:`RunSummary`), per run id, from the
bridge's spans and the training scripts' ``worker.first_step``: its wall time, time in
rendezvous and workers' time, its failures, the job-level restarts they led to with each node's
recovery and what the restart cost, and the nodes that held a round up. Unions, not sums: nodes
join and run side by side, and the wall clock is what a job pays.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from elastic_otel.cli.timeline.analysis.failures import Failure, failures
from elastic_otel.cli.timeline.analysis.items import Item, instance_id, node_label, union_ns
from elastic_otel.cli.timeline.analysis.slowdowns import LinkFinding, Slowdown
from elastic_otel.cli.timeline.analysis.stalls import Stall
from elastic_otel.cli.timeline.analysis.stragglers import StragglerSpell
from elastic_otel.model.stalls import TRAINING
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import WorkerState


@dataclass
class NodeRecovery:
    """One node's recovery into a round: its ``agent.recovery`` span and its phases."""

    node: str
    start_ns: int
    end_ns: int
    cause: str
    phases: list[tuple[str, int]]  # (phase name, duration ns), in order
    detection_ms: float | None = None
    resumed_ns: int | None = None  # recovery start to the first training step after it
    phase_times: list[tuple[str, int, int]] = field(default_factory=list)  # name, start, end
    span_id: str = ""
    trace_id: str = ""
    links: list[str] = field(default_factory=list)  # span ids it links to (failed workers)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class Restart:
    """One job-level restart: every node's recovery into the same round (the same trace)."""

    trace_id: str
    round: int | None  # the round it led to
    recoveries: list[NodeRecovery]
    failure: Failure | None = None
    resumed_at_ns: int | None = None  # the latest first training step after it

    @property
    def start_ns(self) -> int:
        start = min(r.start_ns for r in self.recoveries)
        return min(start, self.failure.time_ns) if self.failure is not None else start

    @property
    def end_ns(self) -> int:
        return max(r.end_ns for r in self.recoveries)

    @property
    def cost_ns(self) -> int:
        """From the failure (or the first node noticing) to training resumed, when known,
        else to the last node's workers running."""
        return max(self.end_ns, self.resumed_at_ns or 0) - self.start_ns

    @property
    def cause(self) -> str:
        causes = [r.cause for r in self.recoveries]
        return A.CAUSE_WORKER_FAILURE if A.CAUSE_WORKER_FAILURE in causes else causes[0]


@dataclass
class HoldUp:
    round: int | None
    node: str  # the last node to join
    held_ns: int  # its join start minus the one before it


@dataclass
class RunSummary:
    """One run:

    * **wall**: first span start to last span end;
    * **rendezvous**: time any node spent joining (the union of the ``rendezvous.join`` spans;
      ``agent.rendezvous`` where there are none);
    * **workers ran**: the union of the ``worker`` spans;
    * **failures**: per attempt, its root cause and consequences (:mod:`.failures`);
    * **restarts**: one per job-level restart, not per node: the ``agent.recovery`` spans of
      one trace (the round they lead to) are one restart, tied to the failure their links point
      at (else the latest one before it). Its cost runs from the earliest recovery start, or
      the root cause's failure when earlier, to the latest recovery end, or to training resumed
      when the training script marks its first step (the latest ``worker.first_step`` end in
      that trace). Each node's recovery keeps its phases (its child spans) and how long after
      the failure it noticed it;
    * **hold-ups**: per round with several nodes, the last node to join and how long after the
      node before it: the time the others waited for it alone;
    * **stalls**, **stragglers**, **slowdowns** and slow **links**, from the logs
      (:mod:`.stalls`, :mod:`.stragglers`, :mod:`.slowdowns`), which
      :func:`~elastic_otel.cli.timeline.analysis.build.build_timeline` adds.
    """

    run_id: str
    start_ns: int
    end_ns: int
    rendezvous_ns: int
    workers_ns: int
    restarts: list[Restart] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    hold_ups: list[HoldUp] = field(default_factory=list)
    job_failed: bool = False  # an agent.run of the run ended FAILED
    stalls: list[Stall] = field(default_factory=list)  # training stalls and agents' waits
    stragglers: list[StragglerSpell] = field(default_factory=list)
    slowdowns: list[Slowdown] = field(default_factory=list)
    links: list[LinkFinding] = field(default_factory=list)

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def recoveries(self) -> list[NodeRecovery]:
        """Every node's recovery, in order of start."""
        found = [r for restart in self.restarts for r in restart.recoveries]
        return sorted(found, key=lambda r: r.start_ns)

    @property
    def lost_ns(self) -> int:
        """Wall time lost to restarts (a union: restarts could overlap in odd inputs)."""
        return union_ns(
            {"start_ns": r.start_ns, "end_ns": r.start_ns + r.cost_ns} for r in self.restarts
        )

    @property
    def training_stalls(self) -> list[Stall]:
        return [s for s in self.stalls if s.kind == TRAINING]

    @property
    def agent_waits(self) -> list[Stall]:
        """The agents' stalled waits (join, exit barrier, stopping workers), in order."""
        return [s for s in self.stalls if s.kind != TRAINING]

    @property
    def straggling_ranks(self) -> set[tuple[str, int]]:
        """(node, global rank) of every rank that straggled."""
        return {(s.node, s.rank) for s in self.stragglers}

    def happenings(self) -> list[tuple[Failure | None, Restart | None]]:
        """The run's failures and restarts in order of time, each restart beside its failure."""
        restarted = {id(r.failure): r for r in self.restarts if r.failure is not None}
        items: list[tuple[Failure | None, Restart | None]] = [
            (f, restarted.get(id(f))) for f in self.failures
        ]
        items += [(None, r) for r in self.restarts if r.failure is None]

        def when(item: tuple[Failure | None, Restart | None]) -> int:
            failure, restart = item
            return failure.time_ns if failure is not None else restart.start_ns if restart else 0

        return sorted(items, key=when)

    def ended_the_job(self, failure: Failure) -> bool:
        """Whether ``failure``, one no restart recovered from, is the one the job failed of."""
        return self.job_failed and failure is self.failures[-1]


def summarize(spans: Iterable[Item]) -> list[RunSummary]:
    """One summary per run id, in order of first appearance."""
    spans = list(spans)
    by_id = {s["span_id"]: s for s in spans}
    labels = {  # the process of a span → its node, as its rendezvous spans name it
        instance_id(s): node_label(s) for s in spans if s["name"] == A.SPAN_RDZV_JOIN
    }
    labels.pop("", None)
    rounds = {  # trace → the rendezvous round it is the trace of
        s["trace_id"]: s["attributes"][A.ROUND]
        for s in spans
        if s["name"] in (A.SPAN_RDZV_JOIN, A.SPAN_RDZV_MEMBER)
        and isinstance(s["attributes"].get(A.ROUND), int)
    }
    runs: dict[str, list[Item]] = {}
    for span in spans:
        run_id = _run_id(span, by_id)
        if run_id is not None:
            runs.setdefault(run_id, []).append(span)
    return [_summary(run_id, members, spans, labels, rounds) for run_id, members in runs.items()]


def _run_id(span: Item, by_id: dict[str, Item]) -> str | None:
    run_id = span["attributes"].get(A.RUN_ID)
    if run_id is None and span["name"] == A.SPAN_WORKER_FIRST_STEP:
        parent = by_id.get(span["parent_span_id"])  # a training script's span: its worker's
        run_id = parent["attributes"].get(A.RUN_ID) if parent else None
    return None if run_id is None else str(run_id)


def _summary(
    run_id: str,
    spans: list[Item],
    everything: list[Item],
    labels: dict[str, str],
    rounds: dict[str, int],
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
    summary.failures = failures(named(A.SPAN_WORKER), labels, rounds)
    summary.job_failed = any(
        s["attributes"].get(A.STATE) == WorkerState.FAILED.value for s in named(A.SPAN_AGENT_RUN)
    )
    first_steps = named(A.SPAN_WORKER_FIRST_STEP)
    by_trace: dict[str, list[NodeRecovery]] = {}
    for span in sorted(named(A.SPAN_AGENT_RECOVERY), key=lambda s: s["start_ns"]):
        recovery = _recovery(span, everything, labels, first_steps)
        by_trace.setdefault(span["trace_id"], []).append(recovery)
    claimed: set[int] = set()
    for trace_id, recoveries in by_trace.items():
        restart = Restart(trace_id, rounds.get(trace_id), recoveries)
        resumed = [
            s["end_ns"]
            for s in first_steps
            if s["trace_id"] == trace_id and s["end_ns"] > restart.start_ns
        ]
        restart.resumed_at_ns = max(resumed) if resumed else None
        restart.failure = _failure_of(restart, summary.failures, claimed)
        if restart.failure is not None:
            claimed.add(id(restart.failure))
        summary.restarts.append(restart)
    summary.restarts.sort(key=lambda r: r.start_ns)
    summary.hold_ups = _hold_ups(named(A.SPAN_RDZV_JOIN))
    return summary


def _recovery(
    span: Item, everything: list[Item], labels: dict[str, str], first_steps: list[Item]
) -> NodeRecovery:
    children = [s for s in everything if s["parent_span_id"] == span["span_id"]]
    children.sort(key=lambda s: s["start_ns"])
    attrs = span["attributes"]
    detection = attrs.get(A.RECOVERY_DETECTION_MS)
    resumed = [
        s["end_ns"]
        for s in first_steps
        if s["trace_id"] == span["trace_id"] and s["end_ns"] > span["start_ns"]
    ]
    phases = [(c["name"].removeprefix("agent."), c["start_ns"], c["end_ns"]) for c in children]
    return NodeRecovery(
        labels.get(instance_id(span)) or node_label(span),
        span["start_ns"],
        span["end_ns"],
        str(attrs.get(A.RECOVERY_CAUSE, "") or "unknown"),
        [(name, end - start) for name, start, end in phases],
        float(detection) if isinstance(detection, int | float) else None,
        max(resumed) - span["start_ns"] if resumed else None,
        phases,
        span["span_id"],
        span["trace_id"],
        [link["span_id"] for link in span.get("links", ())],
    )


def _failure_of(restart: Restart, found: list[Failure], claimed: set[int]) -> Failure | None:
    """The failure a restart recovers from: the one its recoveries link to, else the latest
    one not yet taken that broke before it (exports without links)."""
    linked = {span_id for r in restart.recoveries for span_id in r.links}
    for failure in found:
        if linked & failure.span_ids():
            return failure
    if A.CAUSE_WORKER_FAILURE not in (r.cause for r in restart.recoveries):
        return None
    start = min(r.start_ns for r in restart.recoveries)
    before = [
        f
        for f in found
        if id(f) not in claimed and f.trace_id != restart.trace_id and f.time_ns <= start
    ]
    return max(before, key=lambda f: f.time_ns) if before else None


def _hold_ups(joins: list[Item]) -> list[HoldUp]:
    rounds: dict[Any, list[Item]] = {}
    for join in joins:
        rounds.setdefault(join["attributes"].get(A.ROUND), []).append(join)
    hold_ups = []
    for number, joins_of_round in rounds.items():
        if len(joins_of_round) < 2:
            continue
        joins_of_round.sort(key=lambda s: s["start_ns"])
        last, before = joins_of_round[-1], joins_of_round[-2]
        held = last["start_ns"] - before["start_ns"]
        hold_ups.append(HoldUp(number if isinstance(number, int) else None, node_label(last), held))
    hold_ups.sort(key=lambda h: (h.round is None, h.round or 0))
    return hold_ups
