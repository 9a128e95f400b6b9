"""What each run of a job cost and what broke it: the summary ``elastic-otel timeline`` prints
first, and the failure analysis the rounds share.

Per run id, from the bridge's spans (and the training scripts' ``worker.first_step``):

* **wall**: first span start to last span end;
* **rendezvous**: time any node spent joining (the union of the ``rendezvous.join`` spans;
  ``agent.rendezvous`` where there are none);
* **workers ran**: the union of the ``worker`` spans;
* **failures**: per attempt (the ``worker`` spans of one trace: one round, across nodes), the
  root cause, the earliest worker that failed on its own (``torchelastic.failure.kind`` =
  ``root_cause``; in exports from before that attribute, an ERROR ``FAILED`` worker) by span
  end, with the other root causes as independent failures and the workers that died of it
  (``peer_failure``, ``stopped``) as consequences, each with its delay after the root cause;
* **restarts**: one per job-level restart, not per node: the ``agent.recovery`` spans of one
  trace (the round they lead to) are one restart, tied to the failure their links point at (else
  the latest one before it). Its cost runs from the earliest recovery start, or the root cause's
  failure when earlier, to the latest recovery end, or to training resumed when the training
  script marks its first step (the latest ``worker.first_step`` end in that trace). Each node's
  recovery keeps its phases (its child spans) and how long after the failure it noticed it;
* **hold-ups**: per round with several nodes, the last node to join and how long after the
  node before it: the time the others waited for it alone.

Unions, not sums: nodes join and run side by side, and the wall clock is what a job pays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import WorkerState

Item = dict[str, Any]
Rel = Callable[[int], str]

_KINDS = frozenset({A.KIND_ROOT_CAUSE, A.KIND_PEER_FAILURE, A.KIND_STOPPED})


@dataclass
class WorkerEnd:
    """A worker that did not succeed, as the failure analysis sees it."""

    global_rank: int | None
    host: str  # where it ran: host.name, or the node label when agents share the host
    state: str
    kind: str  # a torchelastic.failure.kind value
    end_ns: int
    span_id: str = ""
    error_type: str = ""
    exit_code: int | None = None
    oom: bool = False
    message: str = ""
    node: str = ""  # its agent's node label, where rendezvous spans name it

    @property
    def rank(self) -> str:
        return "?" if self.global_rank is None else str(self.global_rank)


@dataclass
class Failure:
    """What failed in one attempt (the worker spans of one trace), across nodes."""

    trace_id: str
    round: int | None
    roots: list[WorkerEnd]  # failed on their own, earliest first: the first is the root cause
    consequences: list[WorkerEnd]  # died of it (peer failures, stopped), by end time

    @property
    def root(self) -> WorkerEnd | None:
        return self.roots[0] if self.roots else None

    @property
    def time_ns(self) -> int:
        """When the attempt broke: the root cause's end (else the first consequence's)."""
        first = self.root or min(self.consequences, key=lambda w: w.end_ns)
        return first.end_ns

    def delay_ns(self, worker: WorkerEnd) -> int:
        return worker.end_ns - self.time_ns

    def after_root(self) -> list[WorkerEnd]:
        """Everything but the root cause, in order of end: the other roots, the consequences."""
        rest = self.roots[1:] + self.consequences
        return sorted(rest, key=lambda w: (w.end_ns, _rank_key(w.global_rank)))

    def span_ids(self) -> set[str]:
        return {w.span_id for w in self.roots + self.consequences if w.span_id}


@dataclass
class Recovery:
    """One node's ``agent.recovery``."""

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
    recoveries: list[Recovery]
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
    run_id: str
    start_ns: int
    end_ns: int
    rendezvous_ns: int
    workers_ns: int
    restarts: list[Restart] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    hold_ups: list[HoldUp] = field(default_factory=list)
    job_failed: bool = False  # an agent.run of the run ended FAILED

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def recoveries(self) -> list[Recovery]:
        """Every node's recovery, in order of start."""
        found = [r for restart in self.restarts for r in restart.recoveries]
        return sorted(found, key=lambda r: r.start_ns)

    @property
    def lost_ns(self) -> int:
        """Wall time lost to restarts (a union: restarts could overlap in odd inputs)."""
        return union_ns(
            {"start_ns": r.start_ns, "end_ns": r.start_ns + r.cost_ns} for r in self.restarts
        )


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
    by_trace: dict[str, list[Recovery]] = {}
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
) -> Recovery:
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
    return Recovery(
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


# --- the failure analysis -------------------------------------------------------------------


def failures(
    workers: Iterable[Item],
    labels: dict[str, str] | None = None,
    rounds: dict[str, int] | None = None,
) -> list[Failure]:
    """Per attempt (trace) with a worker that failed, its root cause and consequences, in
    order of time. An attempt whose workers were only stopped (a membership change) is none."""
    labels = labels or {}
    by_trace: dict[str, list[WorkerEnd]] = {}
    nodes_on: dict[str, set[str]] = {}  # host → the nodes (agent processes) seen on it
    for span in workers:
        end = worker_end(span, labels)
        node = labels.get(instance_id(span))
        if node:
            nodes_on.setdefault(_host(span) or node, set()).add(node)
        if end is not None:
            by_trace.setdefault(span["trace_id"], []).append(end)
    for end in (end for ends in by_trace.values() for end in ends):
        if end.node and len(nodes_on.get(end.host, ())) > 1:
            end.host = end.node  # agents sharing a host (the demo): name the process too
    found = []
    for trace_id, ends in by_trace.items():
        roots = [w for w in ends if w.kind == A.KIND_ROOT_CAUSE]
        consequences = [w for w in ends if w.kind != A.KIND_ROOT_CAUSE]
        if not roots and all(w.kind == A.KIND_STOPPED for w in consequences):
            continue
        roots.sort(key=lambda w: (w.end_ns, _rank_key(w.global_rank)))
        consequences.sort(key=lambda w: (w.end_ns, _rank_key(w.global_rank)))
        found.append(Failure(trace_id, (rounds or {}).get(trace_id), roots, consequences))
    found.sort(key=lambda f: f.time_ns)
    return found


def worker_end(span: Item, labels: dict[str, str]) -> WorkerEnd | None:
    """``span`` (a ``worker`` span) as a failure or a consequence of one; ``None`` when it is
    neither (it succeeded, still runs, or was restarted for a membership change)."""
    attrs = span["attributes"]
    state = str(attrs.get(A.STATE, ""))
    kind = attrs.get(A.FAILURE_KIND)
    if kind is None:  # an export from before failure kinds: what the state and status say
        if state == WorkerState.FAILED.value and span["status_code"] == "ERROR":
            kind = A.KIND_ROOT_CAUSE
        elif state == WorkerState.PEER_FAILED.value:
            kind = A.KIND_PEER_FAILURE
        elif state == WorkerState.STOPPED.value:
            kind = A.KIND_STOPPED
    if kind not in _KINDS:
        return None
    error_type = str(attrs.get(A.ERROR_TYPE, "") or _exception_type(span))
    message = error_message(span) or str(attrs.get(A.END_REASON, "") or span["status_message"])
    if error_type and message.startswith(f"{error_type}: "):
        message = message[len(error_type) + 2 :]
    elif message == error_type:
        message = ""
    exit_code = attrs.get(A.PROCESS_EXIT_CODE, attrs.get(A.EXIT_CODE))
    node = labels.get(instance_id(span), "")
    return WorkerEnd(
        global_rank=_int(attrs.get(A.GLOBAL_RANK)),
        host=_host(span) or node or "?",
        state=state or "?",
        kind=str(kind),
        end_ns=span["end_ns"],
        span_id=span["span_id"],
        error_type=error_type,
        exit_code=_int(exit_code),
        oom=attrs.get(A.OOM_KILL) is True,
        message=message,
        node=node,
    )


def _host(span: Item) -> str:
    host = span["attributes"].get(A.HOST_NAME) or span.get("resource", {}).get(A.HOST_NAME)
    return str(host or "")


def error_message(span: Item) -> str:
    """A span's error: its ``exception`` event (``type: message``), else its ERROR status."""
    for event in span.get("events", ()):
        if event["name"] == "exception":
            a = event["attributes"]
            kind, msg = str(a.get(A.EXCEPTION_TYPE, "")), str(a.get(A.EXCEPTION_MESSAGE, ""))
            if kind or msg:
                return f"{kind}: {msg}" if kind and msg else kind or msg
    if span["status_code"] == "ERROR":
        return str(span.get("status_message", ""))
    return ""


def _exception_type(span: Item) -> str:
    for event in span.get("events", ()):
        if event["name"] == "exception":
            return str(event["attributes"].get(A.EXCEPTION_TYPE, ""))
    return ""


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _rank_key(rank: int | None) -> int:
    return rank if rank is not None else 1 << 30


# --- helpers the timeline shares ------------------------------------------------------------


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


# --- text -----------------------------------------------------------------------------------


def seconds(ns: int) -> str:
    return f"{ns / 1e9:.3f}s"


def delay(ns: int) -> str:
    """A delay after the root cause, signed: error files date a failure to the second."""
    return f"{'-' if ns < 0 else '+'}{abs(ns) / 1e9:.3f}s"


def cause_text(worker: WorkerEnd) -> str:
    """``global rank 1 SIGKILL on node-a``."""
    what = f" {worker.error_type}" if worker.error_type else ""
    return f"global rank {worker.rank}{what} on {worker.host}"


def cause_facts(worker: WorkerEnd) -> list[str]:
    """What else is known of a root cause: ``exit code -9``, the OOM killer."""
    facts = [] if worker.exit_code is None else [f"exit code {worker.exit_code}"]
    if worker.oom and "oom" not in worker.message.lower():  # the bridge's message may say so
        facts.append("OOM kill")
    return facts


def root_cause_line(worker: WorkerEnd) -> str:
    """``global rank 1 SIGKILL on node-a (exit code -9): killed by SIGKILL``."""
    facts = cause_facts(worker)
    text = cause_text(worker) + (f" ({', '.join(facts)})" if facts else "")
    return f"{text}: {worker.message}" if worker.message else text


def consequence_text(failure: Failure, worker: WorkerEnd) -> str:
    """``+0.800s rank 2 on node-b PEER_FAILED: Connection closed by peer``; another root cause
    (an independent failure) says so."""
    when = delay(failure.delay_ns(worker)) if failure.root is not None else ""
    if worker.kind == A.KIND_ROOT_CAUSE:
        text = f"also failed on its own: {root_cause_line(worker)}"
    else:
        text = f"rank {worker.rank} on {worker.host} {worker.state}"
        text += f": {worker.message}" if worker.message else ""
    return f"{when} {text}".strip()


def failure_text(failure: Failure) -> str:
    """``1 failure: global rank 1 SIGKILL on node-a``; several root causes are all named."""
    if failure.root is None:
        n = len(failure.consequences)
        return f"no root cause seen, {n} worker{'s' if n > 1 else ''} ended after a peer's failure"
    n = len(failure.roots)
    names = [cause_text(failure.roots[0])]
    names += [f"{cause_text(w)} ({delay(failure.delay_ns(w))})" for w in failure.roots[1:]]
    return f"{n} failure{'s' if n > 1 else ''}: {', '.join(names)}"


def restart_reason(restart: Restart) -> str:
    """Why the job restarted: its failure (:func:`failure_text`), else its recoveries' cause."""
    if restart.failure is not None:
        return failure_text(restart.failure)
    if restart.cause == A.CAUSE_MEMBERSHIP_CHANGE:
        return "membership change"
    if restart.cause == A.CAUSE_WORKER_FAILURE:
        return "worker failure"  # one its recoveries do not point at, nor any seen before
    return f"cause {restart.cause}"


def restart_text(restart: Restart) -> str:
    """``1 failure: global rank 1 SIGKILL on node-a → restart, cost 4.200s``."""
    return f"{restart_reason(restart)} → restart, cost {seconds(restart.cost_ns)}"


def recovery_text(r: Recovery) -> str:
    """One node's recovery: cause, duration, detection, phases, training resumed."""
    text = f"{r.cause}, {seconds(r.duration_ns)}"
    if r.detection_ms is not None:
        text += f" (noticed {r.detection_ms / 1000:.1f}s after the failure)"
    phases = ", ".join(f"{name} {seconds(ns)}" for name, ns in r.phases)
    if phases:
        text += f": {phases}"
    if r.resumed_ns is not None:
        text += f"; training resumed after {seconds(r.resumed_ns)}"
    return text


def run_heading(run: RunSummary) -> str:
    n = len(run.restarts)
    lost = f" · {n} restart{'s' if n > 1 else ''} cost {seconds(run.lost_ns)}" if n else ""
    return (
        f"SUMMARY · run {run.run_id} · wall {seconds(run.wall_ns)} · in rendezvous "
        f"{seconds(run.rendezvous_ns)} · workers ran {seconds(run.workers_ns)}{lost}"
    )


def happenings(run: RunSummary) -> list[tuple[Failure | None, Restart | None]]:
    """The run's failures and restarts in order of time, each restart beside its failure."""
    restarted = {id(r.failure): r for r in run.restarts if r.failure is not None}
    items: list[tuple[Failure | None, Restart | None]] = [
        (f, restarted.get(id(f))) for f in run.failures
    ]
    items += [(None, r) for r in run.restarts if r.failure is None]

    def when(item: tuple[Failure | None, Restart | None]) -> int:
        failure, restart = item
        return failure.time_ns if failure is not None else restart.start_ns if restart else 0

    return sorted(items, key=when)


def ending_text(run: RunSummary, failure: Failure) -> str:
    """What followed a failure no restart recovered from."""
    last = failure is run.failures[-1]
    return "job failed" if run.job_failed and last else "no restart"


def render_summary(summaries: list[RunSummary], rel: Rel) -> list[str]:
    """Text lines of the summaries; ``rel`` formats a time relative to the timeline's start."""
    lines: list[str] = []
    for run in summaries:
        lines.append(run_heading(run))
        for failure, restart in happenings(run):
            if failure is not None:
                where = f" in round {failure.round}" if failure.round is not None else ""
                head = f"  at {rel(failure.time_ns)}{where} · "
                if restart is not None:
                    lines.append(head + restart_text(restart))
                else:
                    lines.append(f"{head}{failure_text(failure)} → {ending_text(run, failure)}")
            elif restart is not None:
                lines.append(f"  at {rel(restart.start_ns)} · {restart_text(restart)}")
            for r in restart.recoveries if restart is not None else ():
                lines.append(f"    recovery on {r.node} at {rel(r.start_ns)}: {recovery_text(r)}")
        for h in run.hold_ups:
            label = "round ?" if h.round is None else f"round {h.round}"
            lines.append(
                f"  {label}: last to join {h.node}, {seconds(h.held_ns)} after the node before"
            )
    return lines
