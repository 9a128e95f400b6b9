"""Spans into rounds and node rows: each rendezvous round lists its nodes (``host.name`` +
``process.pid`` + ``local_id`` of the ``rendezvous.join`` / ``rendezvous.member`` spans) and
below each node its agent's steps, its workers (``worker`` spans) and its recoveries into the
round. Without rendezvous spans (a replayed ``console`` log has none) rounds fall back to the
traces the agents' events produced, and nodes to the emitting process.
"""

from __future__ import annotations

from elastic_otel.cli.timeline.analysis.items import (
    Item,
    as_int,
    error_message,
    instance_id,
    node_name,
    rank_key,
)
from elastic_otel.cli.timeline.analysis.runs import NodeRecovery
from elastic_otel.cli.timeline.analysis.timeline import (
    AFTER_FAILURE,
    AFTER_MEMBERSHIP_CHANGE,
    LOST,
    Bar,
    NodeRow,
    Round,
    RoundOutcome,
    WorkerRow,
)
from elastic_otel.names import attributes as A

AGENT_STEPS = frozenset({A.SPAN_AGENT_RENDEZVOUS, A.SPAN_AGENT_ASSIGN_RANKS})
ROW_SPANS = AGENT_STEPS | {A.SPAN_WORKER, A.SPAN_AGENT_RUN}
"""What a node row shows; a recovery's phases and the training scripts' spans are summarized."""


class RoundBuilder:
    """Rounds and their node rows, span by span: the rendezvous spans first, then the agents'
    (a row is found by its member span, else by its process), then the recoveries."""

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
            row.workers.append(worker_row(span))
        elif name in AGENT_STEPS:
            row.steps.append(Bar(name, span["start_ns"], span["end_ns"], span["status_code"]))
        elif name == "agent.run":
            row.agent_state = str(attrs.get(A.STATE, "")) or span["status_code"]
            row.agent_end_ns = span["end_ns"]
            row.agent_message = error_message(span)
        if row.rank is None and attrs.get(A.RANK) is not None:
            row.rank = as_int(attrs.get(A.RANK))

    def add_recovery(self, span: Item, recovery: NodeRecovery) -> None:
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
        """The rounds with nodes, in order of start, each saying how it began and ended."""
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
            rnd.agent_restarts = restarts
            rnd.began_after = AFTER_FAILURE if before.failed else AFTER_MEMBERSHIP_CHANGE
        previous[rnd.run_id] = rnd
        rnd.outcome = _outcome(rnd)


def _outcome(rnd: Round) -> RoundOutcome:
    states = [w.state for n in rnd.nodes for w in n.workers]
    agents = [n.agent_state for n in rnd.nodes if n.agent_state]
    out = RoundOutcome()
    out.lost_nodes = sum(n.lost_ns is not None for n in rnd.nodes)
    out.rendezvous_failed = any(n.join_failed for n in rnd.nodes)
    out.worker_failure = any(w.failed and w.state != LOST for n in rnd.nodes for w in n.workers)
    out.group_restarted = out.worker_failure and "REPLACED" in states
    out.membership_restart = not out.worker_failure and "RESTARTED" in states
    out.job_failed = "FAILED" in agents
    out.job_succeeded = (
        not out.job_failed and bool(agents) and all(a == "SUCCEEDED" for a in agents)
    )
    said = out.lost_nodes or out.rendezvous_failed or out.worker_failure or out.membership_restart
    out.workers_succeeded = (
        not (out.job_failed or out.job_succeeded or said)
        and bool(states)
        and all(s == "SUCCEEDED" for s in states)
    )
    return out


def worker_row(span: Item) -> WorkerRow:
    """A ``worker`` span as its row: its ranks, final state, times, exit code and error."""
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
