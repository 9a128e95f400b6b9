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
  node before it: the time the others waited for it alone;
* **stalls**, from the logs: the ``torchelastic.stalled`` reports of a round, joined across
  nodes (:func:`stalls`). Each node sees only its own ranks: the one whose waiting ranks wait
  for a local rank names it (``torchelastic.stalled.ranks``), the others only say that their
  ranks wait. One stall is every node's latest report of waits that overlap in time; the rank
  named by any node is the one waited for, with the innermost frame of each rank from the
  workers' stack records (``elastic_otel.agent.worker_stacks``). Waits of the agents (join,
  exit barrier, stopping workers) are joined the same way, per kind;
* **stragglers**, from the logs: the ``torchelastic.straggler`` reports of a round
  (:func:`stragglers`). Each node scores only its own ranks; one straggler is a rank's
  consecutive reports (its window count growing), beside the round's nodes that named none.

Unions, not sums: nodes join and run side by side, and the wall clock is what a job pays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from elastic_otel.model.stalls import STALL_EVENT_NAME, TRAINING
from elastic_otel.model.stragglers import STRAGGLER_EVENT_NAME
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import WORKER_STACKS_EVENT, WorkerState

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
    last_words: str = ""  # a root cause's last lines of stderr (torchelastic.last_words)

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
        return sorted(rest, key=lambda w: (w.end_ns, rank_key(w.global_rank)))

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
class StallReport:
    """One node's report of a wait (a ``torchelastic.stalled`` record): its latest of a stall."""

    node: str
    kind: str  # torchelastic.stalled.in
    time_ns: int
    seconds: float
    waited_for: tuple[int, ...] = ()  # local global ranks its waiting ranks wait for
    waiting: tuple[int, ...] = ()  # its global ranks waiting inside the collective
    collective: str = ""
    number: int | None = None  # which collective of the job (1: the first)
    frame: str = ""  # innermost frame of the first rank waited for
    run_id: str = ""
    trace_id: str = ""
    silent: str = ""  # the round's nodes whose rendezvous keep-alives it saw stop
    silent_self: bool = False  # the silent node is itself: it reached no rendezvous store

    @property
    def start_ns(self) -> int:
        """When the wait began: no progress since (the report's time minus its seconds)."""
        return self.time_ns - round(self.seconds * 1e9)


@dataclass
class RankStack:
    """A worker's stacks as its agent took them (``elastic_otel.agent.worker_stacks``)."""

    global_rank: int
    node: str
    frame: str  # innermost frame of its main thread
    stacks: str  # faulthandler's dump of all its threads
    reason: str  # training, stall, before_stop
    time_ns: int


@dataclass
class Stall:
    """One stall of a round, joined across nodes: every node's latest report of it."""

    kind: str  # torchelastic.stalled.in (training, rendezvous.join, ...)
    run_id: str
    trace_id: str
    reports: list[StallReport]  # one per node, in order of node
    round: int | None = None
    stacks: dict[int, RankStack] = field(default_factory=dict)  # by global rank
    suspects: list[str] = field(default_factory=list)  # nodes none of whose ranks wait

    @property
    def start_ns(self) -> int:
        return min(r.start_ns for r in self.reports)

    @property
    def end_ns(self) -> int:
        """Its latest report: it lasted at least until then."""
        return max(r.time_ns for r in self.reports)

    @property
    def seconds(self) -> float:
        return max(r.seconds for r in self.reports)

    @property
    def waited_for(self) -> list[tuple[int, str]]:
        """(global rank, node) of the ranks any node names as waited for, by rank."""
        named = {rank: r.node for r in self.reports for rank in r.waited_for}
        return sorted(named.items())

    @property
    def waiting(self) -> list[tuple[int, str]]:
        """(global rank, node) of the ranks waiting inside the collective, by rank."""
        found = {rank: r.node for r in self.reports for rank in r.waiting}
        return sorted(found.items())

    @property
    def collective(self) -> tuple[str, int | None]:
        """The collective the ranks wait in and its number: the latest any node reports."""
        known = [r for r in self.reports if r.collective]
        if not known:
            return "", None
        latest = max(known, key=lambda r: r.number or 0)
        return latest.collective, latest.number

    def frame(self, rank: int) -> str:
        """The innermost frame of ``rank``: from its stacks, else as a report names it."""
        stack = self.stacks.get(rank)
        if stack is not None and stack.frame:
            return stack.frame
        for r in self.reports:
            if r.waited_for and r.waited_for[0] == rank and r.frame:
                return r.frame
        return ""


@dataclass
class StragglerReport:
    """One node's ``torchelastic.straggler`` record: a local rank its local peers wait for."""

    node: str
    rank: int
    time_ns: int
    score: float
    lateness_s: float | None = None  # mean seconds per collective after the fastest local peer
    interval_s: float | None = None  # mean seconds between collectives of the group
    waited_share: float | None = None  # share of that interval its local peers wait for it
    waiting: tuple[int, ...] = ()  # its local peers
    windows: int | None = None  # consecutive windows it has been the node's straggler
    group: str = ""  # the process group
    run_id: str = ""
    trace_id: str = ""


@dataclass
class Straggler:
    """One rank straggling in a round: its node's consecutive reports of it."""

    rank: int
    node: str
    run_id: str
    trace_id: str
    reports: list[StragglerReport]  # in order of time
    round: int | None = None
    quiet: list[str] = field(default_factory=list)  # the round's nodes that named no straggler

    @property
    def start_ns(self) -> int:
        """Its first report (it straggled for some windows before)."""
        return self.reports[0].time_ns

    @property
    def end_ns(self) -> int:
        return self.reports[-1].time_ns

    @property
    def latest(self) -> StragglerReport:
        return self.reports[-1]

    @property
    def lowest(self) -> float:
        return min(r.score for r in self.reports)

    @property
    def waiting(self) -> list[tuple[int, str]]:
        """(global rank, node) of the local peers that wait for it."""
        return [(rank, self.node) for rank in sorted({p for r in self.reports for p in r.waiting})]


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
    stalls: list[Stall] = field(default_factory=list)  # training stalls and agents' waits
    stragglers: list[Straggler] = field(default_factory=list)

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
        roots.sort(key=lambda w: (w.end_ns, rank_key(w.global_rank)))
        consequences.sort(key=lambda w: (w.end_ns, rank_key(w.global_rank)))
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
        global_rank=as_int(attrs.get(A.GLOBAL_RANK)),
        host=_host(span) or node or "?",
        state=state or "?",
        kind=str(kind),
        end_ns=span["end_ns"],
        span_id=span["span_id"],
        error_type=error_type,
        exit_code=as_int(exit_code),
        oom=attrs.get(A.OOM_KILL) is True,
        message=message,
        node=node,
        last_words=str(attrs.get(A.LAST_WORDS, "") or ""),
    )


def _host(span: Item) -> str:
    host = span["attributes"].get(A.HOST_NAME) or span.get("resource", {}).get(A.HOST_NAME)
    return str(host or "")


def with_logged_exceptions(spans: list[Item], logs: Iterable[Item]) -> list[Item]:
    """``spans``, each with its exception however it was exported: an ``exception`` span event,
    or (``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN=logs``) a log record with the event name
    ``exception`` in the span's context, which becomes that span's ``exception`` event here."""
    logged: dict[str, Item] = {}
    for record in logs:
        if record.get("event_name") == A.EXCEPTION_EVENT and record.get("span_id"):
            logged.setdefault(str(record["span_id"]), record)
    if not logged:
        return spans
    out = []
    for span in spans:
        found = logged.get(span["span_id"])
        events = span.get("events", ())
        if found is not None and not any(e["name"] == A.EXCEPTION_EVENT for e in events):
            attributes = found.get("attributes", {})
            exception = {k: v for k, v in attributes.items() if k.startswith("exception.")}
            event = {"name": A.EXCEPTION_EVENT, "time_ns": found.get("time_ns", 0)}
            span = {**span, "events": [*events, {**event, "attributes": exception}]}
        out.append(span)
    return out


def with_last_words(spans: list[Item], logs: Iterable[Item]) -> list[Item]:
    """``spans``, a worker span with the ``torchelastic.last_words`` of the log record in its
    context (the root cause's ``FAILED`` record) unless it has them itself."""
    words: dict[str, Any] = {}
    for record in logs:
        value = record.get("attributes", {}).get(A.LAST_WORDS)
        if value and record.get("span_id"):
            words[str(record["span_id"])] = value
    if not words:
        return spans
    return [
        {**s, "attributes": {**s["attributes"], A.LAST_WORDS: words[s["span_id"]]}}
        if s["span_id"] in words and not s["attributes"].get(A.LAST_WORDS)
        else s
        for s in spans
    ]


def source_event_name(record: Item) -> str:
    """A log record's event name, torch's for an exception's record (named ``exception`` under
    ``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN``; torch's name is in ``torchelastic.event.name``)."""
    name = str(record.get("event_name", "") or "")
    if name == A.EXCEPTION_EVENT:
        return str(record.get("attributes", {}).get(A.EVENT_NAME, "") or name)
    return name


def error_message(span: Item) -> str:
    """A span's error: its ``exception`` event (``type: message``), else its ERROR status."""
    for event in span.get("events", ()):
        if event["name"] == A.EXCEPTION_EVENT:
            a = event["attributes"]
            kind, msg = str(a.get(A.EXCEPTION_TYPE, "")), str(a.get(A.EXCEPTION_MESSAGE, ""))
            if kind or msg:
                return f"{kind}: {msg}" if kind and msg else kind or msg
    if span["status_code"] == "ERROR":
        return str(span.get("status_message", ""))
    return ""


def _exception_type(span: Item) -> str:
    for event in span.get("events", ()):
        if event["name"] == A.EXCEPTION_EVENT:
            return str(event["attributes"].get(A.EXCEPTION_TYPE, ""))
    return ""


def as_int(value: Any) -> int | None:
    """An attribute value as an int (``None``: absent, a bool, or not a number)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def rank_key(rank: int | None) -> int:
    """Sort key of a global rank; an unknown one last."""
    return rank if rank is not None else 1 << 30


# --- stalls ---------------------------------------------------------------------------------


def stalls(
    logs: Iterable[Item],
    node_of: Callable[[Item], str],
    rounds: dict[str, int] | None = None,
    round_nodes: dict[str, list[str]] | None = None,
) -> list[Stall]:
    """The stalls the ``torchelastic.stalled`` records report, joined per round (trace) and
    kind across nodes, in order of start. ``node_of`` names a record's node; ``rounds`` maps a
    trace to its round number, ``round_nodes`` to its nodes (to point at the nodes none of
    whose ranks wait, when no node names the rank waited for)."""
    rounds, round_nodes = rounds or {}, round_nodes or {}
    by_node: dict[tuple[str, str, str, str], list[StallReport]] = {}
    stacks: dict[tuple[str, int], list[RankStack]] = {}
    for record in logs:
        attrs = record.get("attributes", {})
        name = record.get("event_name") or attrs.get(A.EVENT_NAME)
        if name == STALL_EVENT_NAME:
            report = _stall_report(record, node_of)
            if report is not None:
                key = (report.run_id, report.trace_id, report.kind, report.node)
                by_node.setdefault(key, []).append(report)
        elif name == WORKER_STACKS_EVENT:
            stack = _rank_stack(record, node_of)
            if stack is not None:
                stacks.setdefault((str(record.get("trace_id", "")), stack.global_rank), []).append(
                    stack
                )
    latest: dict[tuple[str, str, str], list[StallReport]] = {}
    for (run_id, trace_id, kind, _), reports in by_node.items():
        latest.setdefault((run_id, trace_id, kind), []).extend(_latest_per_stall(reports))
    found = []
    for (run_id, trace_id, kind), reports in latest.items():
        for group in _overlapping(reports):
            stall = Stall(kind, run_id, trace_id, group, rounds.get(trace_id))
            if kind == TRAINING:
                stall.stacks = _stacks_of(stall, stacks)
                if not stall.waited_for:
                    waiting = {r.node for r in group if r.waiting}
                    stall.suspects = [n for n in round_nodes.get(trace_id, []) if n not in waiting]
            found.append(stall)
    found.sort(key=lambda s: (s.start_ns, s.kind != TRAINING, s.kind))
    return found


def _stall_report(record: Item, node_of: Callable[[Item], str]) -> StallReport | None:
    attrs = record.get("attributes", {})
    seconds = attrs.get(A.STALLED_SECONDS)
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return None
    return StallReport(
        node=node_of(record),
        kind=str(attrs.get(A.STALLED_IN, "") or "?"),
        time_ns=int(record.get("time_ns", 0)),
        seconds=float(seconds),
        waited_for=_ranks(attrs.get(A.STALLED_RANKS)),
        waiting=_ranks(attrs.get(A.STALLED_WAITING)),
        collective=str(attrs.get(A.STALLED_COLLECTIVE, "") or ""),
        number=as_int(attrs.get(A.STALLED_COLLECTIVE_NUMBER)),
        frame=str(attrs.get(A.STACK_FRAME, "") or ""),
        run_id=str(attrs.get(A.RUN_ID, "") or ""),
        trace_id=str(record.get("trace_id", "") or ""),
        silent=str(attrs.get(A.STALLED_SILENT_NODES, "") or ""),
        silent_self=attrs.get(A.STALLED_SILENT_SELF) is True,
    )


def _rank_stack(record: Item, node_of: Callable[[Item], str]) -> RankStack | None:
    attrs = record.get("attributes", {})
    rank = as_int(attrs.get(A.GLOBAL_RANK))
    if rank is None:
        return None
    return RankStack(
        global_rank=rank,
        node=node_of(record),
        frame=str(attrs.get(A.STACK_FRAME, "") or ""),
        stacks=str(record.get("body", "") or ""),
        reason=str(attrs.get(A.STACKS_REASON, "") or ""),
        time_ns=int(record.get("time_ns", 0)),
    )


def _ranks(value: Any) -> tuple[int, ...]:
    """``[0, 2]`` (an int array), or ``"0,2"`` (exports from before the arrays) → ``(0, 2)``;
    what is not a rank is left out."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list | tuple):
        ranks = (as_int(part) for part in value)
    else:
        ranks = (as_int(part.strip()) for part in str(value or "").split(","))
    return tuple(sorted({r for r in ranks if r is not None}))


def _latest_per_stall(reports: list[StallReport]) -> list[StallReport]:
    """One node's reports of one kind → the latest of each stall. A report repeats the stall
    before it unless its wait began after that one's time: progress came in between."""
    reports = sorted(reports, key=lambda r: r.time_ns)
    out: list[StallReport] = []
    for report in reports:
        if out and report.start_ns <= out[-1].time_ns:
            out[-1] = report
        else:
            out.append(report)
    return out


def _overlapping(reports: list[StallReport]) -> list[list[StallReport]]:
    """Nodes' stalls that overlap in time are one (each node once), ordered by node."""
    groups: list[list[StallReport]] = []
    end = 0
    for report in sorted(reports, key=lambda r: (r.start_ns, r.node)):
        group = groups[-1] if groups else None
        if (
            group is not None
            and report.start_ns <= end
            and report.node not in {r.node for r in group}
        ):
            group.append(report)
            end = max(end, report.time_ns)
        else:
            groups.append([report])
            end = report.time_ns
    return [sorted(group, key=lambda r: r.node) for group in groups]


def _stacks_of(
    stall: Stall, stacks: dict[tuple[str, int], list[RankStack]]
) -> dict[int, RankStack]:
    """Per rank of the stall's round: its latest stacks taken while the stall was reported,
    else the first taken after (its agent's ``before_stop``)."""
    out = {}
    for (trace_id, rank), taken in stacks.items():
        if trace_id != stall.trace_id:
            continue
        during = [s for s in taken if stall.start_ns <= s.time_ns <= stall.end_ns]
        after = [s for s in taken if s.time_ns > stall.end_ns]
        if during:
            out[rank] = max(during, key=lambda s: s.time_ns)
        elif after:
            out[rank] = min(after, key=lambda s: s.time_ns)
    return dict(sorted(out.items()))


# --- stragglers -----------------------------------------------------------------------------


def stragglers(
    logs: Iterable[Item],
    node_of: Callable[[Item], str],
    rounds: dict[str, int] | None = None,
    round_nodes: dict[str, list[str]] | None = None,
) -> list[Straggler]:
    """The stragglers the ``torchelastic.straggler`` records report, per round (trace) and
    rank, in order of first report. A rank's reports are one straggler while its window count
    grows; a count that starts again is a new one. ``round_nodes`` names each round's nodes (to
    say which named none)."""
    rounds, round_nodes = rounds or {}, round_nodes or {}
    by_rank: dict[tuple[str, str, str, int], list[StragglerReport]] = {}
    for record in logs:
        attrs = record.get("attributes", {})
        if (record.get("event_name") or attrs.get(A.EVENT_NAME)) != STRAGGLER_EVENT_NAME:
            continue
        report = _straggler_report(record, node_of)
        if report is not None:
            key = (report.run_id, report.trace_id, report.node, report.rank)
            by_rank.setdefault(key, []).append(report)
    named: dict[str, set[str]] = {}
    for _, trace_id, node, _ in by_rank:
        named.setdefault(trace_id, set()).add(node)
    found = []
    for (run_id, trace_id, node, rank), reports in by_rank.items():
        quiet = [n for n in round_nodes.get(trace_id, []) if n not in named[trace_id]]
        for spell in _spells(sorted(reports, key=lambda r: r.time_ns)):
            found.append(
                Straggler(rank, node, run_id, trace_id, spell, rounds.get(trace_id), quiet)
            )
    found.sort(key=lambda s: (s.start_ns, s.rank))
    return found


def _straggler_report(record: Item, node_of: Callable[[Item], str]) -> StragglerReport | None:
    attrs = record.get("attributes", {})
    rank, score = as_int(attrs.get(A.STRAGGLER_RANK)), _number(attrs.get(A.STRAGGLER_SCORE))
    if rank is None or score is None:
        return None
    return StragglerReport(
        node=node_of(record),
        rank=rank,
        time_ns=int(record.get("time_ns", 0)),
        score=score,
        lateness_s=_number(attrs.get(A.STRAGGLER_LATENESS)),
        interval_s=_number(attrs.get(A.STRAGGLER_INTERVAL)),
        waited_share=_number(attrs.get(A.STRAGGLER_WAITED_SHARE)),
        waiting=_ranks(attrs.get(A.STRAGGLER_WAITING)),
        windows=as_int(attrs.get(A.STRAGGLER_WINDOWS)),
        group=str(attrs.get(A.STRAGGLER_PROCESS_GROUP, "") or ""),
        run_id=str(attrs.get(A.RUN_ID, "") or ""),
        trace_id=str(record.get("trace_id", "") or ""),
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _spells(reports: list[StragglerReport]) -> list[list[StragglerReport]]:
    """A rank's reports, in order of time → its straggling spells: a report whose window
    count does not exceed the one before began anew (the rank kept up in between)."""
    spells: list[list[StragglerReport]] = []
    for report in reports:
        before = spells[-1][-1] if spells else None
        if (
            before is not None
            and report.windows is not None
            and before.windows is not None
            and report.windows > before.windows
        ):
            spells[-1].append(report)
        else:
            spells.append([report])
    return spells


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


def _global_ranks(n: int) -> str:
    return "global rank" if n == 1 else "global ranks"


def ranks_text(ranks: list[tuple[int, str]]) -> str:
    """``0 (node-a), 2, 3 (node-b)``: global ranks in order, each node named after its last."""
    parts: list[str] = []
    run: list[str] = []
    for i, (rank, node) in enumerate(ranks):
        run.append(str(rank))
        if i + 1 == len(ranks) or ranks[i + 1][1] != node:
            parts.append(f"{', '.join(run)} ({node})")
            run = []
    return ", ".join(parts)


def stall_what(stall: Stall) -> str:
    """``62 s in all_reduce #4``; ``62 s in training`` when no rank is in a collective;
    ``120 s in rendezvous.join`` for an agent's wait."""
    collective, number = stall.collective
    what = f"{collective} #{number}" if collective and number else collective or stall.kind
    return f"{stall.seconds:.0f} s in {what}"


def waited_for_text(stall: Stall, detail: bool = True) -> str:
    """``waiting for global rank 1 on node-a (in hang at train.py:18)``; without ``detail``
    neither node nor frame. With no rank named, the nodes none of whose ranks wait."""
    named = stall.waited_for
    if named:
        items = []
        for rank, node in named:
            frame = stall.frame(rank) if detail else ""
            text = f"{rank} on {node}" if detail else str(rank)
            items.append(f"{text} (in {frame})" if frame else text)
        return f"waiting for {_global_ranks(len(named))} {', '.join(items)}"
    if stall.suspects:
        return f"waiting for a rank on {', '.join(stall.suspects)}, where no rank waits in it"
    if stall.waiting:
        return "waiting for a rank no node names"
    return ""


def stall_text(stall: Stall) -> str:
    """A stall in the run summary: ``62 s in all_reduce #4, waiting for global rank 1``; an
    agent's wait: ``120 s in rendezvous.join on node-b``."""
    if stall.kind != TRAINING:
        return f"{stall_what(stall)} on {', '.join(r.node for r in stall.reports)}"
    waited = waited_for_text(stall, detail=False)
    return f"{stall_what(stall)}, {waited}" if waited else stall_what(stall)


def stall_line(stall: Stall) -> str:
    """A stall below its round: ``STALLED 62 s in all_reduce #4 (training): waiting for
    global rank 1 on node-a (in hang at train.py:18); global ranks 0 (node-a), 2, 3 (node-b)
    wait in it``. An agent's wait: ``STALLED in rendezvous.join: node-b 120 s, node-c 118 s``."""
    if stall.kind != TRAINING:
        nodes = ", ".join(f"{r.node} {r.seconds:.0f} s" for r in stall.reports)
        return f"STALLED in {stall.kind}: {nodes}"
    head = f"STALLED {stall_what(stall)}"
    if stall.collective[0]:
        head += f" ({stall.kind})"
    parts = [waited_for_text(stall)]
    waiting = stall.waiting
    if waiting:
        verb = "waits" if len(waiting) == 1 else "wait"
        parts.append(f"{_global_ranks(len(waiting))} {ranks_text(waiting)} {verb} in it")
    else:
        parts.append("no rank is in a collective")
    parts += [silence_text(r) for r in stall.reports if r.silent]
    return f"{head}: {'; '.join(p for p in parts if p)}"


def silence_text(report: StallReport) -> str:
    """What one node saw of the rendezvous keep-alives: ``node-b's keep-alives stopped (seen
    by node-a)``, or ``node-b reached no rendezvous store``."""
    if report.silent_self:
        return f"{report.node} reached no rendezvous store (its link may be cut)"
    return f"keep-alives stopped: {report.silent} (seen by {report.node})"


def frame_lines(stall: Stall) -> list[tuple[int, str, str, bool]]:
    """(global rank, node, innermost frame, waited for) per rank with a frame: the ranks waited
    for first."""
    named = dict(stall.waited_for)
    nodes = {**{rank: s.node for rank, s in stall.stacks.items()}, **dict(stall.waiting), **named}
    ranks = sorted(set(stall.stacks) | set(named), key=lambda r: (r not in named, r))
    out = []
    for rank in ranks:
        frame = stall.frame(rank)
        if frame:
            out.append((rank, nodes.get(rank, "?"), frame, rank in named))
    return out


def stall_when(stall: Stall, rel: Rel) -> str:
    """``round 0, from +1.249s``."""
    where = f"round {stall.round}, " if stall.round is not None else ""
    return f"{where}from {rel(stall.start_ns)}"


def stall_summary_lines(run: RunSummary, rel: Rel) -> list[str]:
    """``1 stall: 62 s in all_reduce #4, waiting for global rank 1 (round 0, from +1.249s)``,
    then the agents' waits."""
    training = [s for s in run.stalls if s.kind == TRAINING]
    lines = []
    if training:
        n = len(training)
        items = "; ".join(f"{stall_text(s)} ({stall_when(s, rel)})" for s in training)
        lines.append(f"  {n} stall{'s' if n > 1 else ''}: {items}")
    for stall in run.stalls:
        if stall.kind != TRAINING:
            lines.append(f"  also stalled: {stall_text(stall)} ({stall_when(stall, rel)})")
    return lines


def straggler_text(straggler: Straggler) -> str:
    """``global rank 1 on node-a, score 0.02, 0.300 s late per collective of process group 0,
    its peers wait 98 % of the time``."""
    r = straggler.latest
    parts = [f"global rank {straggler.rank} on {straggler.node}", f"score {r.score:.2f}"]
    if r.lateness_s is not None:
        of = f" of process group {r.group}" if r.group else ""
        parts.append(f"{r.lateness_s:.3f} s late per collective{of}")
    if r.waited_share is not None:
        parts.append(f"its peers wait {r.waited_share * 100:.0f} % of the time")
    return ", ".join(parts)


def straggler_line(straggler: Straggler) -> str:
    """A straggler below its round: ``STRAGGLER global rank 1 on node-a: score 0.02 (lowest
    0.01) over 13 windows; each collective of process group 0 0.300 s after its fastest local
    peer (one every 0.306 s); global rank 0 (node-a) waits 98 % of that time for it``."""
    r = straggler.latest
    head = f"STRAGGLER global rank {straggler.rank} on {straggler.node}: score {r.score:.2f}"
    if straggler.lowest < r.score:
        head += f" (lowest {straggler.lowest:.2f})"
    if r.windows is not None:
        head += f" over {r.windows} window{'s' if r.windows > 1 else ''}"
    parts = [head]
    if r.lateness_s is not None:
        of = f" of process group {r.group}" if r.group else ""
        every = f" (one every {r.interval_s:.3f} s)" if r.interval_s is not None else ""
        parts.append(
            f"each collective{of} {r.lateness_s:.3f} s after its fastest local peer{every}"
        )
    waiting = straggler.waiting
    if waiting and r.waited_share is not None:
        verb = "waits" if len(waiting) == 1 else "wait"
        parts.append(
            f"{_global_ranks(len(waiting))} {ranks_text(waiting)} {verb} "
            f"{r.waited_share * 100:.0f} % of that time for it"
        )
    return "; ".join(parts)


def straggler_when(straggler: Straggler, rel: Rel) -> str:
    """``round 0, reported +32.000s to +92.000s`` (``at`` for a single report)."""
    where = f"round {straggler.round}, " if straggler.round is not None else ""
    if len(straggler.reports) == 1:
        return f"{where}reported at {rel(straggler.start_ns)}"
    return f"{where}reported {rel(straggler.start_ns)} to {rel(straggler.end_ns)}"


def straggler_summary_lines(run: RunSummary, rel: Rel) -> list[str]:
    """``1 straggler: global rank 1 on node-a, score 0.02, ... (round 0, reported ...)``."""
    if not run.stragglers:
        return []
    n = len(run.stragglers)
    items = "; ".join(f"{straggler_text(s)} ({straggler_when(s, rel)})" for s in run.stragglers)
    return [f"  {n} straggler{'s' if n > 1 else ''}: {items}"]


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
        lines += stall_summary_lines(run, rel)
        lines += straggler_summary_lines(run, rel)
        for h in run.hold_ups:
            label = "round ?" if h.round is None else f"round {h.round}"
            lines.append(
                f"  {label}: last to join {h.node}, {seconds(h.held_ns)} after the node before"
            )
    return lines
