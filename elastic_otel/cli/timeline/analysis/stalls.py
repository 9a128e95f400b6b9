"""Stalls, from the ``torchelastic.stalled`` reports of a round joined across nodes (each
node sees only its own ranks), with the innermost frame of each rank from the workers' stack
records (``elastic_otel.agent.worker_stacks``); the agents' waits (join, exit barrier, stopping
workers) are joined the same way, per kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from elastic_otel.cli.timeline.analysis.failures import StalledRank
from elastic_otel.cli.timeline.analysis.items import Item, as_int, as_ranks, node_name
from elastic_otel.model.stalls import STALL_EVENT_NAME, STARTUP, TRAINING
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import WORKER_STACKS_EVENT


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
    remote_node: str = ""  # the node of ``waited_for`` when other nodes named them (its label)
    phase: str = ""  # torchelastic.stalled.phase: STARTUP before training began

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
    """One stall of a round, joined across nodes: every node's latest report of waits that
    overlap in time. The node whose waiting ranks wait for a local rank names it
    (``torchelastic.stalled.ranks``), the others only say that their ranks wait: the rank named
    by any node is the one waited for."""

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
    def phase(self) -> str:
        """STARTUP for a training stall before training began (any node said so: in
        ``init_process_group`` or before the first collective), else its kind."""
        if self.kind == TRAINING and any(r.phase == STARTUP for r in self.reports):
            return STARTUP
        return self.kind

    @property
    def end_ns(self) -> int:
        """Its latest report: it lasted at least until then."""
        return max(r.time_ns for r in self.reports)

    @property
    def seconds(self) -> float:
        return max(r.seconds for r in self.reports)

    @property
    def waited_for(self) -> list[tuple[int, str]]:
        """(global rank, node) of the ranks any node names as waited for, by rank: the node
        that has them (a node that learnt them from another says which node that is)."""
        named = {rank: r.remote_node or r.node for r in self.reports for rank in r.waited_for}
        named.update(
            {rank: r.node for r in self.reports if not r.remote_node for rank in r.waited_for}
        )
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

    def frames(self) -> list[tuple[int, str, str, bool]]:
        """(global rank, node, innermost frame, waited for) per rank with a frame: the ranks
        waited for first."""
        named = dict(self.waited_for)
        nodes = {**{rank: s.node for rank, s in self.stacks.items()}, **dict(self.waiting), **named}
        ranks = sorted(set(self.stacks) | set(named), key=lambda r: (r not in named, r))
        out = []
        for rank in ranks:
            frame = self.frame(rank)
            if frame:
                out.append((rank, nodes.get(rank, "?"), frame, rank in named))
        return out


def stalled_root(stall: Stall) -> StalledRank | None:
    """A training stall's first rank waited for as a root cause: its node, line, how long."""
    if stall.kind != TRAINING or not stall.waited_for:
        return None
    rank, node = stall.waited_for[0]
    collective, number = stall.collective
    return StalledRank(
        global_rank=rank,
        node=node,
        frame=stall.frame(rank),
        seconds=stall.seconds,
        start_ns=stall.start_ns,
        collective=f"{collective} #{number}" if collective and number else collective,
        waiting=[(r, n) for r, n in stall.waiting if r != rank],
    )


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
        waited_for=as_ranks(attrs.get(A.STALLED_RANKS)),
        waiting=as_ranks(attrs.get(A.STALLED_WAITING)),
        collective=str(attrs.get(A.STALLED_COLLECTIVE, "") or ""),
        number=as_int(attrs.get(A.STALLED_COLLECTIVE_NUMBER)),
        frame=str(attrs.get(A.STACK_FRAME, "") or ""),
        run_id=str(attrs.get(A.RUN_ID, "") or ""),
        trace_id=str(record.get("trace_id", "") or ""),
        silent=str(attrs.get(A.STALLED_SILENT_NODES, "") or ""),
        silent_self=attrs.get(A.STALLED_SILENT_SELF) is True,
        remote_node=_remote_node(attrs),
        phase=str(attrs.get(A.STALLED_PHASE, "") or ""),
    )


def _remote_node(attrs: Item) -> str:
    """How the timeline names the node(s) another node said have the ranks waited for."""
    hosts = attrs.get(A.STALLED_REMOTE_HOST)
    if not isinstance(hosts, str) or not hosts:
        return ""
    found = attrs.get(A.STALLED_REMOTE_PIDS)
    pids = [as_int(p) for p in found] if isinstance(found, list | tuple) else []
    names = hosts.split(", ")
    if len(pids) != len(names) or None in pids:
        return hosts
    return ", ".join(node_name(host, pid) for host, pid in zip(names, pids, strict=True))


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
