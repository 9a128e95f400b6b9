"""A per-round, per-node timeline of an elastic job, from the bridge's spans and logs.

Each rendezvous round lists its nodes (``host.name`` + ``process.pid`` + ``local_id`` of the
``rendezvous.join`` / ``rendezvous.member`` spans) in join order, with when they started to
join, how long they waited, their rank and the world size, and below each node its workers
(``worker`` spans: global rank, final state, exit code, error). Below a round that failed, its
root cause across nodes: the earliest worker that failed on its own (global rank, host, error
type, exit code, OOM kill, message), then, each with its delay after it, the workers on any
node that died of it (peer failures, workers their agent stopped) and any other worker that
failed on its own (an independent failure); :func:`~elastic_otel.cli.timeline.summary.failures`
is the analysis. A round whose training hung lists its stalls, joined across nodes from their
``torchelastic.stalled`` reports (:func:`~elastic_otel.cli.timeline.summary.stalls`): the rank
waited for, on which node and in which frame, the ranks that wait for it, and the innermost
frame of every rank whose stacks were taken; the agents' own waits (join, exit barrier,
stopping workers) in a line each. A round with a straggler lists it from its node's
``torchelastic.straggler`` reports (:func:`~elastic_otel.cli.timeline.summary.stragglers`): its
score, lateness per collective, the share of the time its peers wait, the process group, and
the round's nodes that named none. Each node's recovery into a round (``agent.recovery`` and its
phases) is kept on the node's row, for the HTML page to draw. Without rendezvous spans (a
replayed ``console`` log has none) rounds fall back to the traces the agents' events produced,
and nodes to the emitting process. Above the rounds, a summary per run says where the job's
time went, what each failure and job restart cost, what stalled and who straggled
(:mod:`elastic_otel.cli.timeline.summary`).

:func:`build_timeline` builds the model, :func:`render_text` the terminal table;
:mod:`elastic_otel.cli.timeline.html` renders the same model as one HTML page.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from elastic_otel.cli.otlp_json_reader import OtlpJsonError, decode_line
from elastic_otel.cli.timeline.goodput import AttemptGoodput, goodput_lines, goodput_records
from elastic_otel.cli.timeline.summary import (
    Failure,
    Recovery,
    RunSummary,
    Stall,
    Straggler,
    as_int,
    consequence_text,
    error_message,
    frame_lines,
    instance_id,
    node_name,
    rank_key,
    render_summary,
    root_cause_line,
    source_event_name,
    stall_line,
    stalls,
    straggler_line,
    straggler_when,
    stragglers,
    summarize,
    with_last_words,
    with_logged_exceptions,
)
from elastic_otel.model.goodput import describe
from elastic_otel.model.snapshots import HEARTBEAT
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import STATUS_PREFIX, WorkerState

Item = dict[str, Any]

FAILURE_STATES = frozenset(
    {WorkerState.FAILED.value, WorkerState.UNHEALTHY.value, WorkerState.PEER_FAILED.value}
)
LOST = "LOST"
"""Worker states drawn as failures (``REPLACED`` counts too when its span has ERROR status)."""

_AGENT_STEPS = frozenset({A.SPAN_AGENT_RENDEZVOUS, A.SPAN_AGENT_ASSIGN_RANKS})
# What a node row shows; a recovery's phases and the training scripts' spans are summarized.
_ROW_SPANS = _AGENT_STEPS | {A.SPAN_WORKER, A.SPAN_AGENT_RUN}
_ERROR_SEVERITY = 17


@dataclass
class Bar:
    """One span on the time axis."""

    name: str
    start_ns: int
    end_ns: int
    status: str = "UNSET"
    detail: str = ""


@dataclass
class WorkerRow:
    global_rank: int | None
    local_rank: int | None
    state: str
    start_ns: int
    end_ns: int
    exit_code: int | None = None
    message: str = ""
    error: bool = False
    restarts: int | None = None
    pid: int | None = None
    span_id: str = ""
    trace_id: str = ""

    @property
    def failed(self) -> bool:
        return self.error or self.state in FAILURE_STATES or self.state == LOST


@dataclass
class NodeRow:
    key: tuple
    label: str
    host: str = ""
    pid: int | None = None
    rank: int | None = None
    world_size: int | None = None
    join: Bar | None = None
    member: Bar | None = None
    steps: list[Bar] = field(default_factory=list)
    workers: list[WorkerRow] = field(default_factory=list)
    agent_state: str = ""
    agent_end_ns: int | None = None
    agent_message: str = ""
    lost_ns: int | None = None  # its process was lost; last heard at this time
    recoveries: list[Recovery] = field(default_factory=list)  # its agent's, into this round

    @property
    def first_ns(self) -> int:
        starts = [b.start_ns for b in (self.join, self.member) if b is not None]
        starts += [w.start_ns for w in self.workers] + [s.start_ns for s in self.steps]
        return min(starts) if starts else 0

    @property
    def join_failed(self) -> bool:
        return self.join is not None and self.join.status == "ERROR"


@dataclass
class LostProgress:
    """The progress a failure of the round lost (a restart redoes it), on the node that
    reported it."""

    node: str
    start_ns: int
    end_ns: int
    text: str


@dataclass
class Round:
    run_id: str
    number: int | None
    label: str
    nodes: list[NodeRow] = field(default_factory=list)
    world_size: int | None = None
    restart_note: str = ""  # why this round exists: a restart after a failure, a new member
    outcome: str = ""
    failure: Failure | None = None  # its root cause and the failures that followed it
    stalls: list[Stall] = field(default_factory=list)  # training stalls, agents' waits
    stragglers: list[Straggler] = field(default_factory=list)
    lost: list[LostProgress] = field(default_factory=list)  # progress its failure lost

    @property
    def start_ns(self) -> int:
        return min((n.first_ns for n in self.nodes), default=0)

    @property
    def failed(self) -> bool:
        return any(
            n.join_failed or n.lost_ns is not None or any(w.failed for w in n.workers)
            for n in self.nodes
        )


@dataclass
class ErrorNote:
    time_ns: int
    where: str
    message: str


@dataclass
class Timeline:
    rounds: list[Round]
    t0_ns: int
    t1_ns: int
    errors: list[ErrorNote] = field(default_factory=list)
    runs: list[RunSummary] = field(default_factory=list)
    goodput: list[AttemptGoodput] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        """Every node label, in order of first appearance."""
        return list(dict.fromkeys(n.label for r in self.rounds for n in r.nodes))

    @property
    def run_ids(self) -> list[str]:
        return list(dict.fromkeys(r.run_id for r in self.rounds))


# --- building -------------------------------------------------------------------------------


def build_timeline(spans: Iterable[Item], logs: Iterable[Item] = ()) -> Timeline:
    """Group spans and logs by round and node (as
    :func:`~elastic_otel.cli.otlp_json_reader.read_otlp_json` returns them)."""
    spans, logs = in_round_traces(list(spans), list(logs))
    spans += lost_spans(spans, logs)
    spans = with_last_words(with_logged_exceptions(spans, logs), logs)
    spans = [_with_resource_identity(s) for s in spans]
    builder = _Builder()
    rdzv = [s for s in spans if s["name"] in (A.SPAN_RDZV_JOIN, A.SPAN_RDZV_MEMBER)]
    for span in sorted(rdzv, key=lambda s: s["start_ns"]):
        builder.add_rendezvous(span)
    recoveries = {s["span_id"] for s in spans if s["name"] == A.SPAN_AGENT_RECOVERY}
    others = [s for s in spans if s["name"] in _ROW_SPANS and s["parent_span_id"] not in recoveries]
    for span in sorted(others, key=lambda s: s["start_ns"]):
        builder.add_agent_span(span)
    runs = summarize(spans)
    # After the agents' spans: a round's label comes from its workers, not from a recovery.
    recovery_of = {r.span_id: r for run in runs for r in run.recoveries}
    for span in spans:
        if span["span_id"] in recovery_of and span["name"] == A.SPAN_AGENT_RECOVERY:
            builder.add_recovery(span, recovery_of[span["span_id"]])
    rounds = builder.finish()
    failures = {f.trace_id: f for run in runs for f in run.failures}
    for rnd in rounds:
        traces = {w.trace_id for n in rnd.nodes for w in n.workers}
        rnd.failure = next((failures[t] for t in sorted(traces) if t in failures), None)
    _add_stalls_and_stragglers(spans, logs, builder, rounds, runs)
    times = [s["start_ns"] for s in spans] + [s["end_ns"] for s in spans]
    times += [r["time_ns"] for r in logs if r.get("time_ns")]
    times = [t for t in times if t]
    timeline = Timeline(rounds, min(times, default=0), max(times, default=0))
    timeline.errors = _errors(logs, builder)
    timeline.runs = runs
    timeline.goodput = goodput_records(logs)
    _add_lost_progress(timeline, builder)
    return timeline


def _add_lost_progress(timeline: Timeline, builder: _Builder) -> None:
    """Mark each failure's lost progress on the round (trace) its summary record is in."""
    for item in timeline.goodput:
        lost = item.breakdown.lost_ns
        if lost is None:
            continue
        for rnd in timeline.rounds:
            traces = {w.trace_id for n in rnd.nodes for w in n.workers}
            if item.trace_id in traces:
                node = builder.span_node.get(item.span_id, "")
                text = f"attempt {item.attempt}: {describe(item.breakdown)}"
                rnd.lost.append(LostProgress(node, lost[0], lost[1], text))
                break


def in_round_traces(spans: list[Item], logs: list[Item]) -> tuple[list[Item], list[Item]]:
    """Both trace layouts as one picture: in a large round each node's spans have a trace of
    their own (docs/trace-model.md, "Large jobs"); here they, and their logs, take the round's
    trace id again, found on the member span's link back to it. The round's own copies of
    root-cause failures (``worker.failure``) are left out: their ``worker`` spans are here."""
    round_of: dict[str, str] = {}
    for span in spans:
        if span["name"] != A.SPAN_RDZV_MEMBER:
            continue
        for link in span.get("links", ()):
            if link.get("attributes", {}).get(A.LINK_KIND) == A.LINK_ROUND:
                round_of[span["trace_id"]] = link["trace_id"]
    spans = [s for s in spans if s["name"] != A.SPAN_WORKER_FAILURE]
    if not round_of:
        return spans, logs

    def moved(item: Item) -> Item:
        trace = round_of.get(item.get("trace_id", ""))
        return item if trace is None else {**item, "trace_id": trace}

    return [moved(s) for s in spans], [moved(r) for r in logs]


def _with_resource_identity(span: Item) -> Item:
    """The node's host and pid, which the bridge leaves to the resource when they are the
    resource's (``elastic_otel.emit.emitter``), back among the span's attributes."""
    attributes, resource = span["attributes"], span.get("resource") or {}
    missing = {
        key: resource[key]
        for key in (A.HOST_NAME, A.PROCESS_PID)
        if key not in attributes and key in resource
    }
    return {**span, "attributes": {**attributes, **missing}} if missing else span


def _add_stalls_and_stragglers(
    spans: list[Item],
    logs: list[Item],
    builder: _Builder,
    rounds: list[Round],
    runs: list[RunSummary],
) -> None:
    """Join the stall and straggler reports per round and hand each to its round and its run.
    A report is on its node's span; without one (no rendezvous spans) its process names it."""
    by_instance = {
        instance_id(s): builder.span_node[s["span_id"]]
        for s in spans
        if s["span_id"] in builder.span_node and instance_id(s)
    }
    traces = {t: builder.rounds[key] for t, key in builder.trace_round.items()}
    traces.update({key[2]: rnd for key, rnd in builder.rounds.items() if key[1] == "trace"})
    numbers = {t: rnd.number for t, rnd in traces.items() if rnd.number is not None}
    nodes = {t: [n.label for n in rnd.nodes] for t, rnd in traces.items()}

    def node_of(record: Item) -> str:
        label = builder.span_node.get(str(record.get("span_id", "")))
        label = label or by_instance.get(instance_id(record))
        if label:
            return label
        host = record.get("attributes", {}).get(A.HOST_NAME)
        host = host or record.get("resource", {}).get(A.HOST_NAME)
        return str(host or "?")

    by_run = {run.run_id: run for run in runs}
    shown = {id(rnd) for rnd in rounds}
    found: dict[str, list[Stall] | list[Straggler]] = {
        "stalls": stalls(logs, node_of, numbers, nodes),
        "stragglers": stragglers(logs, node_of, numbers, nodes),
    }
    for field_name, reports in found.items():  # each on its round (when shown) and its run
        for report in reports:
            rnd = traces.get(report.trace_id)
            if rnd is not None and id(rnd) in shown:
                getattr(rnd, field_name).append(report)
            run = by_run.get(report.run_id)
            if run is not None:
                getattr(run, field_name).append(report)


def lost_spans(spans: list[Item], logs: list[Item]) -> list[Item]:
    """Spans known only from open-span snapshots (``partial.event`` = ``heartbeat``): their
    process never ended them. Each is its latest snapshot, ended at the time its process was
    last heard of (its latest record of any kind) and marked ``torchelastic.lost``."""
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


class _Builder:
    def __init__(self) -> None:
        self.rounds: dict[tuple, Round] = {}
        self.nodes: dict[tuple, dict[tuple, NodeRow]] = {}  # round key -> node key -> row
        self.member_of: dict[str, tuple[tuple, tuple]] = {}  # span id -> (round, node)
        self.trace_round: dict[str, tuple] = {}
        self.instance_node: dict[str, tuple] = {}  # service.instance.id -> node key
        self.span_node: dict[str, str] = {}  # span id -> node label (for logs)

    def _row(self, round_key: tuple, node_key: tuple, label: str) -> NodeRow:
        rows = self.nodes.setdefault(round_key, {})
        row = rows.get(node_key)
        if row is None:
            row = rows[node_key] = NodeRow(node_key, label)
        return row

    def _round(self, key: tuple, run_id: str, number: int | None, label: str) -> Round:
        rnd = self.rounds.get(key)
        if rnd is None:
            rnd = self.rounds[key] = Round(run_id, number, label)
        return rnd

    def add_rendezvous(self, span: Item) -> None:
        attrs = span["attributes"]
        run_id = str(attrs.get(A.RUN_ID, ""))
        number = as_int(attrs.get(A.ROUND))
        round_key = (run_id, "round", number)
        rnd = self._round(round_key, run_id, number, f"round {number}")
        host = str(attrs.get(A.HOST_NAME, ""))
        pid = as_int(attrs.get(A.PROCESS_PID))
        local_id = as_int(attrs.get(A.LOCAL_ID))
        node_key = (run_id, host, pid, local_id)
        row = self._row(round_key, node_key, node_name(host, pid, local_id))
        row.host, row.pid = host, pid
        bar = Bar(span["name"], span["start_ns"], span["end_ns"], span["status_code"])
        if attrs.get(A.LOST):
            row.lost_ns = max(row.lost_ns or 0, span["end_ns"])
        if span["name"] == A.SPAN_RDZV_JOIN:
            bar.detail = span["status_message"] or str(attrs.get(A.END_REASON, ""))
            row.join = bar
        else:
            bar.detail = str(attrs.get(A.END_REASON, ""))
            row.member = bar
            self.member_of[span["span_id"]] = (round_key, node_key)
        if attrs.get(A.RANK) is not None:
            row.rank = as_int(attrs.get(A.RANK))
        if attrs.get(A.WORLD_SIZE) is not None:
            row.world_size = as_int(attrs.get(A.WORLD_SIZE))
            rnd.world_size = row.world_size
        self.trace_round.setdefault(span["trace_id"], round_key)
        instance = instance_id(span)
        if instance:
            self.instance_node[instance] = node_key
        self.span_node[span["span_id"]] = row.label

    def add_agent_span(self, span: Item) -> None:
        attrs = span["attributes"]
        run_id = str(attrs.get(A.RUN_ID, ""))
        found = self.member_of.get(span["parent_span_id"])
        if found is not None:
            round_key, node_key = found
            row = self.nodes[round_key][node_key]
        else:
            row = self._unparented_row(span, run_id)
        self.span_node[span["span_id"]] = row.label
        name = span["name"]
        if name == A.SPAN_WORKER:
            row.workers.append(_worker(span))
        elif name in _AGENT_STEPS:
            row.steps.append(Bar(name, span["start_ns"], span["end_ns"], span["status_code"]))
        elif name == "agent.run":
            row.agent_state = str(attrs.get(A.STATE, "")) or span["status_code"]
            row.agent_end_ns = span["end_ns"]
            row.agent_message = error_message(span)
        if row.rank is None and attrs.get(A.RANK) is not None:
            row.rank = as_int(attrs.get(A.RANK))

    def add_recovery(self, span: Item, recovery: Recovery) -> None:
        """On the row of its node in the round it leads to (its trace's): by process, not by
        rank, since a restart may hand the node another rank."""
        round_key = self.trace_round.get(span["trace_id"])
        node_key = self.instance_node.get(instance_id(span))
        rows = self.nodes.get(round_key, {}) if round_key is not None else {}
        row = rows.get(node_key) if node_key is not None else None
        if row is None:
            row = self._unparented_row(span, str(span["attributes"].get(A.RUN_ID, "")))
        row.recoveries.append(recovery)

    def _unparented_row(self, span: Item, run_id: str) -> NodeRow:
        """agent.run, or spans of a source without rendezvous events."""
        attrs = span["attributes"]
        instance = instance_id(span)
        round_key = self.trace_round.get(span["trace_id"])
        if round_key is None:
            restarts = as_int(attrs.get(A.AGENT_RESTARTS))
            round_key = (run_id, "trace", span["trace_id"])
            label = f"restart {restarts}" if restarts is not None else "no rendezvous"
            self._round(round_key, run_id, None, label)
        rank = as_int(attrs.get(A.RANK))
        rows = self.nodes.get(round_key, {})
        node_key = self.instance_node.get(instance)
        mine = rows.get(node_key) if node_key is not None else None
        if mine is not None and (rank is None or mine.rank in (None, rank)):
            return mine
        same_rank = [row for row in rows.values() if rank is not None and row.rank == rank]
        if len(same_rank) == 1:
            return same_rank[0]
        host = str(attrs.get(A.HOST_NAME, "")) or str(span["resource"].get(A.HOST_NAME, ""))
        source = str(span["resource"].get("log.file.name", ""))
        node_key = (run_id, host, instance or source)
        short = instance if len(instance) <= 20 else instance[:8]
        label = f"{host} {source}" if source else f"{host} agent {short}"
        return self._row(round_key, node_key, label.strip())

    def finish(self) -> list[Round]:
        rounds = []
        for key, rnd in self.rounds.items():
            rnd.nodes = sorted(self.nodes.get(key, {}).values(), key=lambda n: n.first_ns)
            for node in rnd.nodes:
                node.workers.sort(key=lambda w: (w.start_ns, rank_key(w.global_rank)))
            if rnd.nodes:
                rounds.append(rnd)
        rounds.sort(key=lambda r: (r.start_ns, r.run_id))
        _annotate(rounds)
        return rounds


def _annotate(rounds: list[Round]) -> None:
    """Say how each round ended and why the next one began."""
    previous: dict[str, Round] = {}
    for rnd in rounds:
        before = previous.get(rnd.run_id)
        if before is not None:
            restarts = max((w.restarts or 0 for n in rnd.nodes for w in n.workers), default=0)
            if before.failed:
                rnd.restart_note = f"RESTART after a failure (agent restarts: {restarts})"
            else:
                rnd.restart_note = "RE-RENDEZVOUS: membership changed"
        previous[rnd.run_id] = rnd
        rnd.outcome = _outcome(rnd)


def _outcome(rnd: Round) -> str:
    states = [w.state for n in rnd.nodes for w in n.workers]
    agents = [n.agent_state for n in rnd.nodes if n.agent_state]
    parts = []
    lost = sum(n.lost_ns is not None for n in rnd.nodes)
    if lost:
        parts.append(f"{lost} node{'s' if lost > 1 else ''} lost")
    if any(n.join_failed for n in rnd.nodes):
        parts.append("rendezvous failed")
    if any(w.failed and w.state != LOST for n in rnd.nodes for w in n.workers):
        parts.append("worker failure")
        if "REPLACED" in states:
            parts.append("worker group restarted")
    elif "RESTARTED" in states:
        parts.append("workers restarted for a membership change")
    if "FAILED" in agents:
        parts.append("job failed")
    elif agents and all(a == "SUCCEEDED" for a in agents):
        parts.append("job succeeded")
    elif not parts and states and all(s == "SUCCEEDED" for s in states):
        parts.append("workers succeeded")
    return ": ".join(parts)


def _worker(span: Item) -> WorkerRow:
    attrs = span["attributes"]
    state = str(attrs.get(A.STATE, "")) or "RUNNING"
    if state == "START":
        state = "RUNNING"
    return WorkerRow(
        global_rank=as_int(attrs.get(A.GLOBAL_RANK)),
        local_rank=as_int(attrs.get(A.LOCAL_RANK)),
        state=state,
        start_ns=span["start_ns"],
        end_ns=span["end_ns"],
        exit_code=as_int(attrs.get(A.EXIT_CODE)),
        message=error_message(span) or str(attrs.get(A.END_REASON, "")),
        error=span["status_code"] == "ERROR",
        restarts=as_int(attrs.get(A.AGENT_RESTARTS)),
        pid=as_int(attrs.get(A.WORKER_PID)),
        span_id=span["span_id"],
        trace_id=span["trace_id"],
    )


def _errors(logs: list[Item], builder: _Builder) -> list[ErrorNote]:
    notes = []
    for record in logs:
        if record.get("severity_number", 0) < _ERROR_SEVERITY:
            continue
        attrs = record.get("attributes", {})
        where = builder.span_node.get(record.get("span_id", "")) or str(attrs.get(A.HOST_NAME, ""))
        source = attrs.get(A.EVENT_SOURCE)
        if source == A.SOURCE_WORKER and attrs.get(A.GLOBAL_RANK) is not None:
            where += f" worker rank {attrs[A.GLOBAL_RANK]}"
        elif source == A.SOURCE_AGENT:
            where += " agent"
        message = str(record.get("body", ""))
        if "\n" in message:  # a worker's whole traceback: its exception below says it in a line
            message = source_event_name(record) or message.strip().splitlines()[-1]
        if message.startswith(STATUS_PREFIX):
            message = message[len(STATUS_PREFIX) :]
        error = ": ".join(
            str(attrs[k]) for k in (A.EXCEPTION_TYPE, A.EXCEPTION_MESSAGE) if k in attrs
        )
        notes.append(
            ErrorNote(record.get("time_ns", 0), where, f"{message}: {error}" if error else message)
        )
    notes.sort(key=lambda n: n.time_ns)
    return notes


# --- terminal rendering ---------------------------------------------------------------------

# (header, right-aligned); the unnamed column marks failures (x) and restarted workers (~).
_COLUMNS = (
    ("NODE", False),
    ("RANK", True),
    ("JOIN AT", True),
    ("WAIT", True),
    ("", False),
    ("WORKER", False),
    ("STATE", False),
    ("START", True),
    ("END", True),
    ("EXIT", True),
    ("DETAIL", False),
)
_RED, _YELLOW, _GREEN, _BOLD, _RESET = "\033[31m", "\033[33m", "\033[32m", "\033[1m", "\033[0m"


def use_color(stream: Any = None) -> bool:
    """Colour when writing to a terminal and ``NO_COLOR`` is unset."""
    stream = sys.stdout if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def render_text(timeline: Timeline, color: bool = False) -> str:
    """The timeline as aligned plain-text tables, one per round, times relative to the start."""
    if not timeline.rounds:
        return "no rendezvous, agent or worker spans found\n"
    t0 = timeline.t0_ns

    def rel(ns: int | None) -> str:
        return "" if ns is None else f"+{(ns - t0) / 1e9:.3f}s"

    def paint(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if color and text else text

    def count(n: int, what: str) -> str:
        return f"{n} {what}" if n == 1 else f"{n} {what}s"

    runs = ", ".join(timeline.run_ids)
    started = dt.datetime.fromtimestamp(t0 / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    n_workers = sum(len(n.workers) for r in timeline.rounds for n in r.nodes)
    lines = [
        f"elastic-otel timeline: run {runs}: {count(len(timeline.rounds), 'round')}, "
        f"{count(len(timeline.nodes), 'node')}, {count(n_workers, 'worker run')}, "
        f"{(timeline.t1_ns - t0) / 1e9:.3f}s from {started[:-3]} UTC",
    ]
    if timeline.runs:
        lines += ["", *render_summary(timeline.runs, rel)]
    if timeline.goodput:
        lines += [
            paint(line, _BOLD) if line.startswith("GOODPUT") else line
            for line in goodput_lines(timeline.goodput)
        ]
    for rnd in timeline.rounds:
        head = [rnd.label.upper(), f"run {rnd.run_id}"]
        if rnd.world_size is not None:
            head.append(f"world size {rnd.world_size}")
        head.append(count(len(rnd.nodes), "node"))
        if rnd.restart_note:
            head.append(paint(rnd.restart_note, _YELLOW))
        if rnd.outcome:
            code = _RED if rnd.failed else _GREEN
            head.append(paint(rnd.outcome, code))
        lines += ["", paint(" · ".join(head[:1]), _BOLD) + " · " + " · ".join(head[1:])]
        rows: list[tuple[tuple[str, ...], str]] = []
        for node in rnd.nodes:
            join = node.join
            wait = f"{(join.end_ns - join.start_ns) / 1e9:.3f}s" if join else ""
            detail = _node_detail(node, rel)
            state = "JOIN FAILED" if node.join_failed else ("joined" if node.member else "")
            if node.lost_ns is not None:
                state = LOST
            end = node.member.end_ns if node.member else (join.end_ns if join else None)
            rank = "" if node.rank is None else str(node.rank)
            cells = (
                node.label,
                rank,
                rel(join.start_ns) if join else "",
                wait,
                "x" if node.join_failed else "",
                "",
                state,
                "",
                rel(end),
                "",
                detail,
            )
            rows.append((cells, _RED if node.join_failed or node.lost_ns is not None else ""))
            for w in node.workers:
                rank_label = "?" if w.global_rank is None else str(w.global_rank)
                cells = (
                    "",
                    "",
                    "",
                    "",
                    "x" if w.failed else ("~" if w.state == "RESTARTED" else ""),
                    f"rank {rank_label}",
                    w.state,
                    rel(w.start_ns),
                    rel(w.end_ns),
                    "" if w.exit_code is None else str(w.exit_code),
                    w.message,
                )
                code = _RED if w.failed else (_YELLOW if w.state == "RESTARTED" else "")
                rows.append((cells, code))
        lines += ["  " + line for line in _table(rows, paint)]
        if rnd.stalls:
            lines += ["", *("  " + line for s in rnd.stalls for line in stall_lines(s, rel, paint))]
        if rnd.stragglers:
            lines += [
                "",
                *("  " + line for s in rnd.stragglers for line in straggler_lines(s, rel, paint)),
            ]
        if rnd.failure is not None:
            lines += ["", *("  " + line for line in failure_lines(rnd.failure, rel, paint))]
        for lost in rnd.lost:
            lines.append(
                f"  LOST PROGRESS {rel(lost.start_ns)} → {rel(lost.end_ns)} on {lost.node}: "
                f"{lost.text}"
            )
    if timeline.errors:
        lines += ["", paint("ERRORS", _BOLD)]
        for note in timeline.errors:
            lines.append(f"  {rel(note.time_ns)}  {note.where}: {paint(note.message, _RED)}")
    return "\n".join(lines) + "\n"


def failure_lines(failure: Failure, rel: Any, paint: Any = lambda text, code: text) -> list[str]:
    """A failed round's root cause, then what followed it on every node, by delay."""
    root = failure.root
    if root is None:
        lines = [paint("ROOT CAUSE not seen: no worker failed on its own; these ended after", _RED)]
        rest = failure.consequences
    else:
        lines = [paint(f"ROOT CAUSE at {rel(root.end_ns)}: {root_cause_line(root)}", _RED)]
        if root.last_words:
            lines.append("  last words (stderr):")
            lines += [f"    | {line}" for line in root.last_words.splitlines()]
        rest = failure.after_root()
    for worker in rest:
        when = "" if root is not None else f"at {rel(worker.end_ns)} "
        text = f"  {when}{consequence_text(failure, worker)}"
        lines.append(paint(text, _RED) if worker.kind == A.KIND_ROOT_CAUSE else text)
    return lines


def stall_lines(stall: Stall, rel: Any, paint: Any = lambda text, code: text) -> list[str]:
    """A stall, from its start to its latest report, then the innermost frame of each rank."""
    when = f" · from {rel(stall.start_ns)}, last reported at {rel(stall.end_ns)}"
    lines = [paint(stall_line(stall), _YELLOW) + when]
    for rank, node, frame, waited in frame_lines(stall):
        text = f"  global rank {rank} on {node}: {frame}"
        lines.append(paint(text + "  (waited for)", _YELLOW) if waited else text)
    return lines


def straggler_lines(
    straggler: Straggler, rel: Any, paint: Any = lambda text, code: text
) -> list[str]:
    """A straggler with when it was reported, then the round's nodes that named none."""
    lines = [paint(straggler_line(straggler), _YELLOW) + f" · {straggler_when(straggler, rel)}"]
    if straggler.quiet:
        lines.append(f"  no straggler named by {', '.join(straggler.quiet)}")
    return lines


def _node_detail(node: NodeRow, rel: Any) -> str:
    parts = []
    if node.lost_ns is not None:
        parts.append(f"LOST: never ended its spans; last heard at {rel(node.lost_ns)}")
    elif node.join_failed and node.join is not None:
        parts.append(node.join.detail or "rendezvous failed")
    elif node.member is not None and node.member.detail:
        parts.append(f"left the round: {node.member.detail}")
    if node.agent_state:
        text = f"agent {node.agent_state} at {rel(node.agent_end_ns)}"
        if node.agent_message:
            text += f" ({node.agent_message})"
        parts.append(text)
    return "; ".join(parts)


def _table(rows: list[tuple[tuple[str, ...], str]], paint: Any) -> list[str]:
    headers = tuple(name for name, _ in _COLUMNS)
    widths = [len(h) for h in headers]
    for cells, _ in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]

    def fmt(cells: tuple[str, ...]) -> str:
        out = []
        for cell, width, (_, right) in zip(cells, widths, _COLUMNS, strict=True):
            out.append(cell.rjust(width) if right else cell.ljust(width))
        return "  ".join(out).rstrip()

    lines = [fmt(headers)]
    for cells, code in rows:
        line = fmt(cells)
        lines.append(paint(line, code) if code else line)
    return lines
