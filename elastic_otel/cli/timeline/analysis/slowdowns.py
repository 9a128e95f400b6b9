"""Slowdowns and slow links, from the ``torchelastic.slowdown`` and ``torchelastic.link`` records
of a round.

Every node measures a process group's collectives against the job's own baseline, so a slow
link or fabric is reported by each node alike: one slowdown is every node's reports of it
(re-reported each window, ended by an ``SLOWDOWN_ENDED`` record) that overlap in time, with the
nodes that saw it. Node 0 names the link, node or fabric for the round; every node's own
evidence (scope ``local``) is kept beside it, the latest of each node.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from elastic_otel.cli.timeline.analysis.items import Item, as_int, as_number
from elastic_otel.names import attributes as A

LOCAL = "local"
"""``torchelastic.link.scope`` of a node's own evidence; the other scopes are node 0's finding."""


@dataclass
class SlowdownReport:
    """One node's ``torchelastic.slowdown`` record."""

    node: str
    time_ns: int
    group: str  # the process group
    ended: bool  # its SLOWDOWN_ENDED record: the figures are the whole slowdown's
    began_ns: int | None  # the change point (None: unreadable)
    seconds: float  # how long it has lasted (ended: lasted)
    interval_before_s: float | None = None
    interval_now_s: float | None = None
    ratio: float | None = None
    inside_before_s: float | None = None
    inside_now_s: float | None = None
    inside_ratio: float | None = None
    part: str = ""  # communication, compute
    alike: bool | None = None
    basis: str = ""  # timed, sampled
    lost_s: float | None = None
    collectives: int | None = None
    reports: int | None = None
    run_id: str = ""
    trace_id: str = ""

    @property
    def start_ns(self) -> int:
        """When it began: the change point, else the report's time less its length."""
        return (
            self.began_ns if self.began_ns is not None else self.time_ns - round(self.seconds * 1e9)
        )


@dataclass
class NodeSlowdown:
    """One node's reports of one slowdown, in order of time."""

    node: str
    reports: list[SlowdownReport]

    @property
    def latest(self) -> SlowdownReport:
        return self.reports[-1]

    @property
    def ended(self) -> bool:
        return self.latest.ended

    @property
    def start_ns(self) -> int:
        return min(r.start_ns for r in self.reports)

    @property
    def end_ns(self) -> int:
        return self.latest.time_ns


@dataclass
class Slowdown:
    """One slowdown of a process group in a round, joined across the nodes that saw it."""

    group: str
    run_id: str
    trace_id: str
    nodes: list[NodeSlowdown]  # one per node that reported it, by node
    round: int | None = None
    quiet: list[str] = field(default_factory=list)  # the round's nodes that reported none

    @property
    def start_ns(self) -> int:
        return min(n.start_ns for n in self.nodes)

    @property
    def end_ns(self) -> int:
        """Its latest report: it lasted at least until then (its end, once ended)."""
        return max(n.end_ns for n in self.nodes)

    @property
    def ended(self) -> bool:
        """Every node that saw it said it ended."""
        return all(n.ended for n in self.nodes)

    @property
    def latest(self) -> SlowdownReport:
        """The report that says the most: an end record (what it cost in all) before a report
        while it lasted, then the latest, then the longest."""
        return max((n.latest for n in self.nodes), key=lambda r: (r.ended, r.time_ns, r.seconds))

    @property
    def seen_by(self) -> list[str]:
        return [n.node for n in self.nodes]

    @property
    def reports(self) -> int:
        return sum(len(n.reports) for n in self.nodes)


@dataclass
class LinkReport:
    """One ``torchelastic.link`` record: node 0's finding, or a node's own evidence."""

    node: str  # the node that reported it (its label)
    time_ns: int
    scope: str  # link, node, fabric, nic, edge, local
    transport: str = ""  # tcp, rdma, p2p
    hosts: tuple[str, ...] = ()  # the host names named
    node_ranks: tuple[int, ...] = ()
    addresses: tuple[str, ...] = ()
    peer: str = ""  # a node's own evidence: its worst connection's peer
    rtt_s: float | None = None
    rtt_others_s: float | None = None
    rate: float | None = None  # delivery rate, bytes a second
    rate_others: float | None = None
    retransmits: float | None = None  # a second
    retransmits_others: float | None = None
    device: str = ""  # an RDMA port: mlx5_0/1
    rdma_rate: str = ""
    rdma_state: str = ""
    counters: tuple[str, ...] = ()  # the port's error counters that moved, name=delta
    evidence: tuple[str, ...] = ()  # each path or port behind it, a line each
    run_id: str = ""
    trace_id: str = ""

    @property
    def key(self) -> tuple[object, ...]:
        """What a finding names: its repeats over the windows are one finding."""
        if self.scope == LOCAL:
            return (self.scope, self.node)
        return (self.scope, self.transport, self.hosts, self.device)


@dataclass
class LinkFinding:
    """One link, node, fabric, NIC or edge named in a round (or one node's own evidence, scope
    ``local``), with every report of it in order of time."""

    run_id: str
    trace_id: str
    reports: list[LinkReport]
    round: int | None = None

    @property
    def latest(self) -> LinkReport:
        return self.reports[-1]

    @property
    def scope(self) -> str:
        return self.latest.scope

    @property
    def local(self) -> bool:
        return self.scope == LOCAL

    @property
    def start_ns(self) -> int:
        return self.reports[0].time_ns

    @property
    def end_ns(self) -> int:
        return self.latest.time_ns


def slowdowns(
    logs: Iterable[Item],
    node_of: Callable[[Item], str],
    rounds: dict[str, int] | None = None,
    round_nodes: dict[str, list[str]] | None = None,
) -> list[Slowdown]:
    """The slowdowns the ``torchelastic.slowdown`` records report, per round (trace) and process
    group, joined across the nodes that saw them, in order of start. A node's reports are one
    slowdown while their count grows and it has not ended; nodes' slowdowns of a group that
    overlap in time are one. ``round_nodes`` names each round's nodes (to say which saw none)."""
    rounds, round_nodes = rounds or {}, round_nodes or {}
    by_node: dict[tuple[str, str, str, str], list[SlowdownReport]] = {}
    for record in logs:
        if _event_name(record) != A.SLOWDOWN_EVENT_NAME:
            continue
        report = _slowdown_report(record, node_of)
        if report is not None:
            key = (report.run_id, report.trace_id, report.group, report.node)
            by_node.setdefault(key, []).append(report)
    spells: dict[tuple[str, str, str], list[NodeSlowdown]] = {}
    for (run_id, trace_id, group, node), reports in by_node.items():
        for spell in _node_spells(sorted(reports, key=lambda r: r.time_ns)):
            spells.setdefault((run_id, trace_id, group), []).append(NodeSlowdown(node, spell))
    found = []
    for (run_id, trace_id, group), nodes in spells.items():
        for joined in _overlapping(nodes):
            seen = {n.node for n in joined}
            quiet = [n for n in round_nodes.get(trace_id, []) if n not in seen]
            found.append(Slowdown(group, run_id, trace_id, joined, rounds.get(trace_id), quiet))
    found.sort(key=lambda s: (s.start_ns, s.group))
    return found


def links(
    logs: Iterable[Item], node_of: Callable[[Item], str], rounds: dict[str, int] | None = None
) -> list[LinkFinding]:
    """The ``torchelastic.link`` records per round (trace): each finding with its repeats, each
    node's own evidence (its own records, or beside its slowdown reports) as one finding of
    scope ``local`` per node; in order of first report, node 0's findings before the evidence."""
    rounds = rounds or {}
    by_key: dict[tuple[object, ...], list[LinkReport]] = {}
    for record in logs:
        name = _event_name(record)
        # A node's slowdown report carries its own evidence beside it.
        beside = name == A.SLOWDOWN_EVENT_NAME and A.LINK_SCOPE in record.get("attributes", {})
        if name != A.LINK_EVENT_NAME and not beside:
            continue
        report = _link_report(record, node_of)
        by_key.setdefault((report.run_id, report.trace_id, *report.key), []).append(report)
    found = [
        LinkFinding(
            r[0].run_id,
            r[0].trace_id,
            sorted(r, key=lambda x: x.time_ns),
            rounds.get(r[0].trace_id),
        )
        for r in by_key.values()
    ]
    found.sort(key=lambda f: (f.local, f.start_ns, f.latest.node))
    return found


def _event_name(record: Item) -> object:
    return record.get("event_name") or record.get("attributes", {}).get(A.EVENT_NAME)


def _slowdown_report(record: Item, node_of: Callable[[Item], str]) -> SlowdownReport | None:
    attrs = record.get("attributes", {})
    seconds = as_number(attrs.get(A.SLOWDOWN_SECONDS))
    group = attrs.get(A.SLOWDOWN_PROCESS_GROUP)
    if seconds is None or group is None:
        return None
    alike = attrs.get(A.SLOWDOWN_ALIKE)
    return SlowdownReport(
        node=node_of(record),
        time_ns=int(record.get("time_ns", 0)),
        group=str(group),
        ended=attrs.get(A.STATE) == A.SLOWDOWN_ENDED_STATE,
        began_ns=_iso_ns(attrs.get(A.SLOWDOWN_BEGAN)),
        seconds=seconds,
        interval_before_s=as_number(attrs.get(A.SLOWDOWN_INTERVAL_BEFORE)),
        interval_now_s=as_number(attrs.get(A.SLOWDOWN_INTERVAL_NOW)),
        ratio=as_number(attrs.get(A.SLOWDOWN_RATIO)),
        inside_before_s=as_number(attrs.get(A.SLOWDOWN_INSIDE_BEFORE)),
        inside_now_s=as_number(attrs.get(A.SLOWDOWN_INSIDE_NOW)),
        inside_ratio=as_number(attrs.get(A.SLOWDOWN_INSIDE_RATIO)),
        part=str(attrs.get(A.SLOWDOWN_PART, "") or ""),
        alike=alike if isinstance(alike, bool) else None,
        basis=str(attrs.get(A.SLOWDOWN_BASIS, "") or ""),
        lost_s=as_number(attrs.get(A.SLOWDOWN_LOST)),
        collectives=as_int(attrs.get(A.SLOWDOWN_COLLECTIVES)),
        reports=as_int(attrs.get(A.SLOWDOWN_REPORTS)),
        run_id=str(attrs.get(A.RUN_ID, "") or ""),
        trace_id=str(record.get("trace_id", "") or ""),
    )


def _link_report(record: Item, node_of: Callable[[Item], str]) -> LinkReport:
    attrs = record.get("attributes", {})

    def text(key: str) -> str:
        return str(attrs.get(key, "") or "")

    return LinkReport(
        node=node_of(record),
        time_ns=int(record.get("time_ns", 0)),
        scope=text(A.LINK_SCOPE) or "?",
        transport=text(A.LINK_TRANSPORT),
        hosts=_strings(attrs.get(A.LINK_NODES)),
        node_ranks=tuple(
            r for r in map(as_int, _list(attrs.get(A.LINK_NODE_RANK))) if r is not None
        ),
        addresses=_strings(attrs.get(A.LINK_ADDRESS)),
        peer=text(A.LINK_PEER),
        rtt_s=as_number(attrs.get(A.LINK_RTT)),
        rtt_others_s=as_number(attrs.get(A.LINK_RTT_OTHERS)),
        rate=as_number(attrs.get(A.LINK_RATE)),
        rate_others=as_number(attrs.get(A.LINK_RATE_OTHERS)),
        retransmits=as_number(attrs.get(A.LINK_RETRANSMITS)),
        retransmits_others=as_number(attrs.get(A.LINK_RETRANSMITS_OTHERS)),
        device=text(A.LINK_DEVICE),
        rdma_rate=text(A.LINK_RDMA_RATE),
        rdma_state=text(A.LINK_RDMA_STATE),
        counters=_strings(attrs.get(A.LINK_RDMA_COUNTERS)),
        evidence=_strings(attrs.get(A.LINK_EVIDENCE)),
        run_id=text(A.RUN_ID),
        trace_id=str(record.get("trace_id", "") or ""),
    )


def _list(value: object) -> list[object]:
    if isinstance(value, list | tuple):
        return list(value)
    return [] if value is None or value == "" else [value]


def _strings(value: object) -> tuple[str, ...]:
    """A string array (or one string) as a tuple of its non-empty strings."""
    return tuple(str(v) for v in _list(value) if v is not None and str(v))


def _iso_ns(value: object) -> int | None:
    """``2026-12-05T12:01:14.250Z`` → ns since the epoch (``None``: not ISO 8601)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    delta = moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _node_spells(reports: list[SlowdownReport]) -> list[list[SlowdownReport]]:
    """One node's reports of a group, in order of time → its slowdowns: a report after an end
    record, or whose count does not exceed the one before, begins a new one."""
    spells: list[list[SlowdownReport]] = []
    for report in reports:
        before = spells[-1][-1] if spells else None
        if before is None or before.ended or _restarted(before, report):
            spells.append([report])
        else:
            spells[-1].append(report)
    return spells


def _restarted(before: SlowdownReport, report: SlowdownReport) -> bool:
    if report.ended:  # the end record closes the slowdown under way
        return before.began_ns is not None and report.began_ns not in (None, before.began_ns)
    if before.reports is not None and report.reports is not None:
        return report.reports <= before.reports
    return before.began_ns is not None and report.began_ns not in (None, before.began_ns)


def _overlapping(nodes: list[NodeSlowdown]) -> list[list[NodeSlowdown]]:
    """Nodes' slowdowns of one group that overlap in time are one (each node once), by node."""
    groups: list[list[NodeSlowdown]] = []
    end = 0
    for spell in sorted(nodes, key=lambda n: (n.start_ns, n.node)):
        group = groups[-1] if groups else None
        if (
            group is not None
            and spell.start_ns <= end
            and spell.node not in {n.node for n in group}
        ):
            group.append(spell)
            end = max(end, spell.end_ns)
        else:
            groups.append([spell])
            end = spell.end_ns
    return [sorted(group, key=lambda n: n.node) for group in groups]
