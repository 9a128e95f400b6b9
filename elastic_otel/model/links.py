"""Slow links: which link, node, RDMA port or fabric a communication slowdown comes from.

Each node sums up, once per window, its TCP connections per peer address (:func:`summarize`,
from the kernel's statistics) and its RDMA ports' counters (:func:`nic_ports`), and publishes
one small value (:class:`NodeLinks`). Node 0 puts every node's values in a node-by-peer matrix
(:class:`LinkWatch`): a path is bad when its RTT grew well over its usual one, its delivery
rate fell far under it, or it retransmits a clear share of what it sends; the pattern of bad
cells names a link (one pair of nodes), a node (its row and its column), the fabric (every
cell), or an RDMA port whose counters say so. Peers outside the job (the store's host, a
collector) are columns of their own: in a two-node job they tell whose link it is. Pure: the
reads are ``integration/tcp_sockets.py`` and ``parsing/rdma_counters.py``.
Design: ``docs/hangs.md`` (Slow links and slowdowns).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from elastic_otel.model.interfaces import InterfaceWindow, describe_interface, slow_ends
from elastic_otel.model.p2p_edges import MAX_EDGES, Edge, EdgeNode, EdgeWatch
from elastic_otel.parsing.rdma_counters import PortReading, deltas

LinkAttributes = dict[str, str | int | float | tuple[str, ...] | tuple[int, ...]]

MAX_VALUE_BYTES = 64 * 1024
"""Largest published value read (64 peers and 32 ports take about 10 KiB)."""
MAX_PEERS = 64
"""Peer addresses a node publishes: those with the highest RTT."""
MAX_ADDRESSES = 16
MAX_NICS = 32
MAX_INTERFACES = 8
MAX_RANKS = 1024
"""Global ranks a node publishes (its workers')."""
MAX_EVIDENCE = 8
"""Lines of evidence on a report (the worst paths or ports first)."""
WINDOWS = 2
"""Consecutive windows with the same finding before it is reported; then it is reported every
window it holds (the caller reports only while a communication slowdown is under way, whose
first windows the finding may precede)."""

RTT_INFLATION = 4.0
RTT_FLOOR_S = 0.002
"""A path's RTT is inflated at ``RTT_INFLATION`` times its reference and ``RTT_FLOOR_S`` over
it: the queue of a slowed link, not a healthy path's noise. Measured between two network
namespaces under a gloo all-reduce (``tests/links/``): healthy paths 0.1 to 1.9 ms (a mean over
a path's connections), the same paths 3.9 to 12 ms with one end's link at 400 Mbit/s."""
RTT_DOMINANCE = 4.0
"""Without a path's own history, its RTT must also be this many times the median of the paths
whose RTT is not inflated (delayed ACKs inflate a quiet request-response connection's RTT over
its minimum alike on every node)."""
RATE_DROP = 8.0
"""A busy path (not app-limited) delivering this many times less than its reference is slow.
The delivery rate is the kernel's last sample: the same healthy paths swung between 2.5 and
87 Gbit/s from window to window, and fell to 0.22 to 0.39 Gbit/s at 400 Mbit/s (30 to 50x)."""
RETRANSMIT_SHARE = 0.01
RETRANSMITS_MIN_S = 5.0
RETRANSMIT_DOMINANCE = 4.0
"""A path is lossy when it retransmits at least 1 % of the bytes it sends, at least 5 segments
a second, and 4 times the median rate of the paths that are not lossy: reordering makes
healthy paths retransmit spurious segments (up to 150 a second, 0.23 % of the bytes, measured
as above)."""
BASELINE_WINDOWS = 8
MIN_BASELINE = 3
"""A path's reference is the median of its last ``BASELINE_WINDOWS`` windows in which it was
not bad; its first ``MIN_BASELINE`` windows are taken as they come (a slowdown is a change
from the job's own start, and a path's usual RTT may be well over its minimum: delayed ACKs).
Before that, its minimum RTT and the other paths' are the reference."""
MAX_BASELINES = 4096

NIC_DATA_LAG = 0.25
NIC_MIN_BYTES_S = 1e6
"""An RDMA port moving under a quarter of what the same port of the other nodes moves (their
median, at least 1 MB/s) lags them."""
ACTIVE_STATES = ("ACTIVE", "ACTIVE_DEFER")


@dataclass(frozen=True, slots=True)
class TcpConnection:
    """One established TCP connection as the kernel's ``tcp_info`` shows it."""

    local: str  # the local address
    peer: str
    peer_port: int
    inode: int
    srtt_us: int  # tcpi_rtt: the smoothed RTT
    min_rtt_us: int
    rttvar_us: int
    total_retrans: int  # segments retransmitted over the connection's life
    lost: int  # segments now thought lost
    delivery_rate: int  # bytes a second, the last sample
    app_limited: bool  # that sample was limited by the application, not the path
    bytes_acked: int
    bytes_received: int
    bytes_sent: int  # retransmissions included
    bytes_retrans: int
    busy_time_us: int


@dataclass(frozen=True, slots=True)
class PeerPath:
    """A node's connections to one peer address over one window."""

    peer: str
    connections: int
    sending: int  # connections whose sent bytes were acknowledged in the window
    srtt_s: float  # mean over the sending connections (all, if none sent)
    min_rtt_s: float  # the least of the connections'
    retransmits_s: float  # segments retransmitted a second over the window
    retransmit_share: float  # bytes retransmitted / bytes sent over the window
    lost: int
    delivery_rate: float  # bytes a second: mean over the sending connections not app-limited
    busy: bool  # there were some (else the mean is over the sending ones, or all)
    bytes_s: float  # bytes acknowledged and received a second over the window


@dataclass(frozen=True, slots=True)
class NicPort:
    """An RDMA port over one window."""

    device: str
    port: int
    rate: str  # as sysfs says it: "100 Gb/sec (4X EDR)"
    state: str  # "4: ACTIVE"
    phys_state: str  # "5: LinkUp"
    errors: tuple[tuple[str, int], ...]  # error counters that moved: (name, increase)
    bytes_s: float  # data sent and received a second
    changed: bool  # its state or physical state changed over the window
    reset: bool  # a data counter went backwards (reset or wrapped): bytes_s understates


@dataclass(frozen=True, slots=True)
class NodeLinks:
    """What a node publishes once per window."""

    node_rank: int
    host: str
    addresses: tuple[str, ...]  # its own addresses, as its connections' local ends show them
    window: int  # its window count: a value read twice is not fresh
    peers: tuple[PeerPath, ...]
    nics: tuple[NicPort, ...]
    interfaces: tuple[InterfaceWindow, ...] = ()  # those its connections go out through
    ranks: tuple[int, ...] = ()  # its workers' global ranks
    edges: tuple[Edge, ...] = ()  # its ranks' point-to-point edges the device timed


@dataclass(frozen=True, slots=True)
class LinkNode:
    """A node named in a report."""

    host: str
    node_rank: int
    addresses: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LinkReport:
    """What node 0 names; the values are means per path over the named paths and over the
    others (``None``: no such path)."""

    scope: str  # link, node, fabric or nic
    transport: str  # tcp, netdev, rdma or p2p
    nodes: tuple[LinkNode, ...]
    rtt_s: float | None = None
    rtt_others_s: float | None = None
    rate: float | None = None  # bytes a second (a NIC: its data moved)
    rate_others: float | None = None
    retransmits_s: float | None = None
    retransmits_others_s: float | None = None
    device: str | None = None  # "mlx5_0/1"
    rdma_rate: str | None = None
    rdma_state: str | None = None  # "4: ACTIVE / 5: LinkUp"
    counters: tuple[str, ...] = ()  # "symbol_error=1204"
    evidence: tuple[str, ...] = ()
    windows: int = 0  # consecutive windows with this finding


def summarize(
    previous: Mapping[int, TcpConnection] | None, current: Iterable[TcpConnection], elapsed_s: float
) -> tuple[PeerPath, ...]:
    """The window's paths per peer address, the worst RTT first (at most :data:`MAX_PEERS`).
    The counters' deltas are per connection (by inode); a connection new in the window counts
    from zero; without a previous reading (``None``) there are no deltas, only the gauges."""
    rate = 1.0 / elapsed_s if math.isfinite(elapsed_s) and elapsed_s > 0 else 0.0
    by_peer: dict[str, list[tuple[TcpConnection, tuple[int, ...]]]] = {}
    for c in current:
        by_peer.setdefault(c.peer, []).append((c, _moved(previous, c)))
    paths = []
    for peer, entries in by_peer.items():
        sending = [c for c, moved in entries if moved[0] > 0]
        timed = sending or [c for c, _ in entries]
        busy = [c for c in timed if not c.app_limited]
        sent, retransmitted = (sum(m[i] for _, m in entries) for i in (3, 4))
        paths.append(
            PeerPath(
                peer=peer,
                connections=len(entries),
                sending=len(sending) if rate else 0,
                srtt_s=statistics.fmean(c.srtt_us for c in timed) / 1e6,
                min_rtt_s=min(c.min_rtt_us for c, _ in entries) / 1e6,
                retransmits_s=sum(m[2] for _, m in entries) * rate,
                retransmit_share=retransmitted / sent if sent else 0.0,
                lost=sum(c.lost for c, _ in entries),
                delivery_rate=float(statistics.fmean(c.delivery_rate for c in busy or timed)),
                busy=bool(busy),
                bytes_s=sum(m[0] + m[1] for _, m in entries) * rate,
            )
        )
    return tuple(sorted(paths, key=lambda p: -p.srtt_s)[:MAX_PEERS])


def _moved(previous: Mapping[int, TcpConnection] | None, c: TcpConnection) -> tuple[int, ...]:
    """(acked, received, retransmitted segments, sent, retransmitted bytes) since ``previous``."""
    now = (c.bytes_acked, c.bytes_received, c.total_retrans, c.bytes_sent, c.bytes_retrans)
    if previous is None:
        return (0, 0, 0, 0, 0)
    before = previous.get(c.inode)
    if before is None or (before.peer, before.peer_port) != (c.peer, c.peer_port):
        return now  # new in the window (an inode reused by another connection is new too)
    then = (
        before.bytes_acked,
        before.bytes_received,
        before.total_retrans,
        before.bytes_sent,
        before.bytes_retrans,
    )
    moved = tuple(n - t for n, t in zip(now, then, strict=True))
    return now if min(moved) < 0 else moved


def nic_ports(
    before: Sequence[PortReading], after: Sequence[PortReading], elapsed_s: float
) -> tuple[NicPort, ...]:
    """The window's RDMA ports from two readings (:func:`~elastic_otel.parsing.rdma_counters.
    read_ports`); a port in one reading only is left out."""
    rate = 1.0 / elapsed_s if math.isfinite(elapsed_s) and elapsed_s > 0 else 0.0
    ports = []
    for d in deltas(tuple(before), tuple(after))[:MAX_NICS]:
        was, now = d.before, d.after
        ports.append(
            NicPort(
                device=now.device,
                port=now.port,
                rate=now.rate,
                state=now.state,
                phys_state=now.phys_state,
                errors=tuple(sorted(d.errors.items())),
                bytes_s=d.data_bytes * rate,
                changed=(was.state, was.phys_state) != (now.state, now.phys_state),
                reset=any(name in d.reset for name in ("port_xmit_data", "port_rcv_data")),
            )
        )
    return tuple(ports)


def node_links(
    node_rank: int,
    host: str,
    window: int,
    connections: Iterable[TcpConnection],
    peers: Iterable[PeerPath],
    nics: Iterable[NicPort],
    interfaces: Iterable[InterfaceWindow] = (),
) -> NodeLinks:
    """A node's value for its last window; its addresses are its connections' local ends."""
    addresses = sorted({c.local for c in connections})[:MAX_ADDRESSES]
    return NodeLinks(
        node_rank,
        host,
        tuple(addresses),
        window,
        tuple(peers)[:MAX_PEERS],
        tuple(nics)[:MAX_NICS],
        tuple(interfaces)[:MAX_INTERFACES],
    )


# --- the value in the store ------------------------------------------------------------------


def encode(node: NodeLinks) -> bytes:
    """The value stored for ``node`` (compact JSON)."""
    body = {
        "n": node.node_rank,
        "h": node.host,
        "a": list(node.addresses[:MAX_ADDRESSES]),
        "w": node.window,
        "p": [
            [
                p.peer,
                p.connections,
                p.sending,
                round(p.srtt_s, 6),
                round(p.min_rtt_s, 6),
                round(p.retransmits_s, 3),
                round(p.retransmit_share, 5),
                p.lost,
                round(p.delivery_rate),
                int(p.busy),
                round(p.bytes_s),
            ]
            for p in node.peers[:MAX_PEERS]
        ],
        "i": [
            [
                n.device,
                n.port,
                n.rate,
                n.state,
                n.phys_state,
                [list(e) for e in n.errors],
                round(n.bytes_s),
                int(n.changed),
                int(n.reset),
            ]
            for n in node.nics[:MAX_NICS]
        ],
        "f": [
            [
                f.name,
                list(f.addresses[:MAX_ADDRESSES]),
                f.speed_mbps or 0,
                round(f.tx_rate),
                round(f.rx_rate),
                sorted(f.trouble.items()),
                round(f.trouble_per_s, 3),
                f.backlog,
            ]
            for f in node.interfaces[:MAX_INTERFACES]
        ],
        "r": list(node.ranks[:MAX_RANKS]),
        "e": [[e.src, e.dst, e.count, e.bytes, round(e.best_rate)] for e in node.edges[:MAX_EDGES]],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode(data: object) -> NodeLinks | None:
    """A stored value as a :class:`NodeLinks`; ``None`` if malformed (never raises)."""
    try:
        if not isinstance(data, bytes | bytearray) or len(data) > MAX_VALUE_BYTES:
            return None
        body = json.loads(data)
        peers = tuple(
            PeerPath(
                str(peer),
                int(n),
                int(sending),
                float(srtt),
                float(low),
                float(retr),
                float(share),
                int(lost),
                float(rate),
                bool(busy),
                float(moved),
            )
            for peer, n, sending, srtt, low, retr, share, lost, rate, busy, moved in body["p"]
        )
        nics = tuple(
            NicPort(
                str(dev),
                int(port),
                str(rate),
                str(state),
                str(phys),
                tuple((str(name), int(v)) for name, v in errors),
                float(moved),
                bool(changed),
                bool(reset),
            )
            for dev, port, rate, state, phys, errors, moved, changed, reset in body["i"]
        )
        interfaces = tuple(
            InterfaceWindow(
                str(name),
                tuple(str(a) for a in addresses[:MAX_ADDRESSES]),
                int(speed) or None,
                float(tx),
                float(rx),
                {str(k): int(v) for k, v in trouble},
                float(per_s),
                int(backlog),
            )
            for name, addresses, speed, tx, rx, trouble, per_s, backlog in body.get("f", [])
        )
        edges = tuple(
            Edge(int(src), int(dst), int(count), int(size), float(rate))
            for src, dst, count, size, rate in body.get("e", [])
        )
        ranks = tuple(int(r) for r in body.get("r", [])[:MAX_RANKS])
        numbers = [n.bytes_s for n in nics] + [v for n in nics for _, v in n.errors]
        numbers += [v for e in edges for v in (e.src, e.dst, e.count, e.bytes, e.best_rate)]
        for f in interfaces:
            numbers += (f.tx_rate, f.rx_rate, f.trouble_per_s, f.backlog, *f.trouble.values())
        for p in peers:
            numbers += (p.srtt_s, p.min_rtt_s, p.retransmits_s, p.retransmit_share, p.lost)
            numbers += (p.delivery_rate, p.bytes_s, p.connections, p.sending)
        if (
            len(peers) > MAX_PEERS
            or len(nics) > MAX_NICS
            or len(interfaces) > MAX_INTERFACES
            or len(edges) > MAX_EDGES
            or not all(math.isfinite(v) and v >= 0 for v in numbers)
        ):
            return None
        addresses = tuple(str(a) for a in body["a"][:MAX_ADDRESSES])
        node_rank, host, window = int(body["n"]), str(body["h"]), int(body["w"])
        return NodeLinks(node_rank, host, addresses, window, peers, nics, interfaces, ranks, edges)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


# --- node 0: the matrix ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Cell:
    """One node's path to one peer: a row of the matrix, and the peer's node (its column;
    ``None``: a peer outside the job)."""

    row: NodeLinks
    column: int | None
    path: PeerPath


@dataclass(frozen=True, slots=True)
class _Judged:
    cell: _Cell
    bad: bool
    rtt_ref: float | None  # its usual RTT (None: not known yet)
    rate_ref: float | None  # its usual busy delivery rate


class LinkWatch:
    """The nodes' published paths and ports, compared window by window (on node 0). It keeps
    each path's recent values as its reference (:data:`MIN_BASELINE`): a path's usual RTT, not
    the best it ever had, is what a slow link inflates."""

    def __init__(self, windows: int = WINDOWS) -> None:
        self.windows = windows
        self._finding: tuple[object, ...] | None = None
        self._held = 0  # consecutive windows of that finding
        self._baselines: dict[tuple[int, str], tuple[deque[float], deque[float]]] = {}
        self._edges = EdgeWatch()

    def close_window(self, nodes: Iterable[NodeLinks]) -> LinkReport | None:
        """Compare the nodes' fresh values; what to report now, if anything (a finding that held
        :attr:`windows` windows in a row, or more)."""
        latest = {n.node_rank: n for n in nodes}
        cells = _cells(latest)
        timed = [c for c in cells if c.path.sending]
        judged = self._judge(timed)
        found = _nic_finding(latest)
        edges = self._edge_finding(latest)  # every window: the edges learn their usual speed
        found = found or edges
        if found is None:
            if len({c.row.node_rank for c in timed}) < 2:
                return None  # too thin to compare: the streak goes on
            found = _by_interfaces(_tcp_finding(latest, judged), latest, judged)
        if found is None:
            self._finding, self._held = None, 0
            return None
        key = (found.scope, tuple(n.node_rank for n in found.nodes), found.device)
        self._held = self._held + 1 if key == self._finding else 1
        self._finding = key
        return replace(found, windows=self._held) if self._held >= self.windows else None

    def _edge_finding(self, nodes: Mapping[int, NodeLinks]) -> LinkReport | None:
        """The point-to-point edges' finding, as a report."""
        found = self._edges.close_window(
            {r: EdgeNode(n.host, n.ranks, n.edges) for r, n in nodes.items() if n.ranks}
        )
        if found is None:
            return None
        return LinkReport(
            scope=found.scope,
            transport="p2p",
            nodes=tuple(LinkNode(nodes[r].host, r, nodes[r].addresses) for r in found.node_ranks),
            rate=found.rate,
            rate_others=found.rate_others,
            evidence=found.evidence,
        )

    def _judge(self, timed: list[_Cell]) -> list[_Judged]:
        """Each path that sent in the window, bad or not; the good ones join their reference."""
        refs = [self._reference(c) for c in timed]
        inflated = [
            c.path.srtt_s >= max(RTT_INFLATION * b, b + RTT_FLOOR_S)
            for c, (rtt, _) in zip(timed, refs, strict=True)
            for b in [rtt if rtt is not None else c.path.min_rtt_s]
        ]
        calm = [c.path.srtt_s for c, hot in zip(timed, inflated, strict=True) if not hot]
        typical = statistics.median(calm) if calm else 0.0
        busy = [c.path.delivery_rate for c in timed if c.path.busy]
        lossy = [
            c.path.retransmits_s >= RETRANSMITS_MIN_S
            and c.path.retransmit_share >= RETRANSMIT_SHARE
            for c in timed
        ]
        calm_losses = [c.path.retransmits_s for c, hot in zip(timed, lossy, strict=True) if not hot]
        typical_loss = statistics.median(calm_losses) if calm_losses else 0.0
        judged = []
        for c, (rtt, rate), hot, lost in zip(timed, refs, inflated, lossy, strict=True):
            slow_rtt = hot and (rtt is not None or c.path.srtt_s >= RTT_DOMINANCE * typical)
            usual = rate
            if usual is None and c.path.busy and len(busy) > 1:
                others = list(busy)
                others.remove(c.path.delivery_rate)
                usual = statistics.median(others)
            slow_rate = (
                c.path.busy and usual is not None and c.path.delivery_rate * RATE_DROP <= usual
            )
            lost = lost and c.path.retransmits_s >= RETRANSMIT_DOMINANCE * typical_loss
            judged.append(_Judged(c, slow_rtt or slow_rate or lost, rtt, rate))
        for j in judged:
            if not j.bad or j.rtt_ref is None:
                self._learn(j.cell)
        return judged

    def _reference(self, cell: _Cell) -> tuple[float | None, float | None]:
        """The path's usual RTT and busy delivery rate (``None``: too few good windows yet)."""
        held = self._baselines.get((cell.row.node_rank, cell.path.peer))
        if held is None:
            return None, None
        rtts, rates = held
        return (
            statistics.median(rtts) if len(rtts) >= MIN_BASELINE else None,
            statistics.median(rates) if len(rates) >= MIN_BASELINE else None,
        )

    def _learn(self, cell: _Cell) -> None:
        key = (cell.row.node_rank, cell.path.peer)
        held = self._baselines.get(key)
        if held is None:
            if len(self._baselines) >= MAX_BASELINES:
                return
            held = self._baselines[key] = (
                deque(maxlen=BASELINE_WINDOWS),
                deque(maxlen=BASELINE_WINDOWS),
            )
        held[0].append(cell.path.srtt_s)
        if cell.path.busy:
            held[1].append(cell.path.delivery_rate)


def _cells(nodes: Mapping[int, NodeLinks]) -> list[_Cell]:
    """Every node's paths, each with the node its peer address belongs to (an address two
    nodes claim is left out, and so is a node's path to itself)."""
    owners: dict[str, int | None] = {}
    for node in nodes.values():
        for address in node.addresses:
            owners[address] = node.node_rank if address not in owners else None
    cells = []
    for node in nodes.values():
        for path in node.peers:
            column = owners.get(path.peer)
            if (path.peer in owners and column is None) or column == node.node_rank:
                continue
            cells.append(_Cell(node, column, path))
    return cells


def _tcp_finding(nodes: Mapping[int, NodeLinks], judged: list[_Judged]) -> LinkReport | None:
    """The node(s), link or fabric the bad paths point to: every path bad (the fabric); every
    path of a node, to and from it, bad while others are good (the node); the paths between
    two nodes alone (the link); every path between the job's nodes, over three nodes or more,
    while some to peers outside the job are good (the job's fabric). ``None``: no bad path, or
    a pattern none of these explains (bad paths to peers outside the job only, a few links)."""
    bad = [j for j in judged if j.bad]
    good = [j for j in judged if not j.bad]
    if not bad:
        return None
    if not good:
        return _tcp_report("fabric", (), bad, good, nodes)
    slow_nodes = []
    for rank in sorted(nodes):
        involving = [j for j in judged if rank in (j.cell.row.node_rank, j.cell.column)]
        if len(involving) >= 2 and all(j.bad for j in involving):  # and some other path good
            slow_nodes.append(rank)
    if slow_nodes:
        named = [j for j in bad if {j.cell.row.node_rank, j.cell.column} & set(slow_nodes)]
        return _tcp_report("node", slow_nodes, named, good, nodes)
    ends = set()
    for j in bad:
        row, column = j.cell.row.node_rank, j.cell.column
        if column is None:
            return None
        ends.add((min(row, column), max(row, column)))
    if len(ends) == 1:
        return _tcp_report("link", next(iter(ends)), bad, good, nodes)
    inside = [j for j in judged if j.cell.column is not None]
    if len({j.cell.row.node_rank for j in inside}) >= 3 and all(j.bad for j in inside):
        return _tcp_report("fabric", (), bad, good, nodes)
    return None


def _by_interfaces(
    found: LinkReport | None, nodes: Mapping[int, NodeLinks], judged: list[_Judged]
) -> LinkReport | None:
    """The TCP finding, or the node(s) whose own interface is the slow end where the paths
    cannot tell (a link between two nodes, every path of a two-node job, or no bad path): its
    transmit queue held traffic back or its errors moved while the others' stayed quiet."""
    ends = slow_ends({rank: node.interfaces for rank, node in nodes.items()})
    if not ends or (found is not None and found.scope not in ("link", "fabric")):
        return found
    linked = {n.node_rank for n in found.nodes} if found is not None else set()
    if found is not None and found.scope == "link" and not set(ends) <= linked:
        return found
    named = [j for j in judged if {j.cell.row.node_rank, j.cell.column} & set(ends)]
    others = [j for j in judged if j not in named]
    report = _tcp_report("node", ends, [j for j in named if j.bad] or named, others, nodes)
    lines = [
        f"{nodes[rank].host} {describe_interface(f)}"
        for rank in ends
        for f in nodes[rank].interfaces
        if f.slow_end
    ]
    return replace(report, transport="netdev", evidence=(*lines, *report.evidence)[:MAX_EVIDENCE])


def _tcp_report(
    scope: str,
    ranks: Sequence[int],
    named: list[_Judged],
    others: list[_Judged],
    nodes: Mapping[int, NodeLinks],
) -> LinkReport:
    named = sorted(named, key=lambda j: -j.cell.path.srtt_s)
    return LinkReport(
        scope=scope,
        transport="tcp",
        nodes=tuple(_link_node(nodes[r], [j.cell for j in named]) for r in ranks),
        rtt_s=mean(j.cell.path.srtt_s for j in named),
        rtt_others_s=mean(j.cell.path.srtt_s for j in others),
        rate=path_rate([j.cell.path for j in named]),
        rate_others=path_rate([j.cell.path for j in others]),
        retransmits_s=mean(j.cell.path.retransmits_s for j in named),
        retransmits_others_s=mean(j.cell.path.retransmits_s for j in others),
        evidence=tuple(_cell_line(j, nodes) for j in named[:MAX_EVIDENCE]),
    )


def _link_node(node: NodeLinks, cells: list[_Cell]) -> LinkNode:
    """A named node, with its addresses as the other nodes' paths to it show them."""
    seen = {c.path.peer for c in cells if c.column == node.node_rank}
    addresses = tuple(a for a in node.addresses if a in seen) or node.addresses
    return LinkNode(node.host, node.node_rank, addresses)


def path_rate(paths: list[PeerPath]) -> float | None:
    busy = [p for p in paths if p.busy]
    return mean(p.delivery_rate for p in busy or paths)


def mean(values: Iterable[float]) -> float | None:
    found = list(values)
    return statistics.fmean(found) if found else None


def _cell_line(j: _Judged, nodes: Mapping[int, NodeLinks]) -> str:
    c = j.cell
    if c.column is None:
        to = f"{c.path.peer} (outside the job)"
    else:
        to = f"{nodes[c.column].host} ({c.path.peer})"
    return f"{c.row.host} → {to}: {path_facts(c.path, j.rtt_ref, j.rate_ref)}"


def path_facts(p: PeerPath, rtt_ref: float | None = None, rate_ref: float | None = None) -> str:
    rtt = f"RTT {milliseconds(p.srtt_s)} " + (
        f"(usually {milliseconds(rtt_ref)})"
        if rtt_ref is not None
        else f"(min {milliseconds(p.min_rtt_s)})"
    )
    rate = f"delivers {megabytes(p.delivery_rate)}" + ("" if p.busy else " (app-limited)")
    if rate_ref is not None and p.busy:
        rate += f" (usually {megabytes(rate_ref)})"
    retransmits = f"{number(p.retransmits_s)} retransmits/s"
    if p.retransmit_share:
        retransmits += f" ({p.retransmit_share * 100:.1f} % of bytes)"
    return f"{rtt}, {rate}, {retransmits}, {p.connections} connections"


# --- node 0: RDMA ports ----------------------------------------------------------------------


def _nic_finding(nodes: Mapping[int, NodeLinks]) -> LinkReport | None:
    """The RDMA port to name: error counters that moved, a state that left ACTIVE (where it
    changed, or where the same port of another node is ACTIVE), a rate lower than the same
    port's on the other nodes, or data moving at a fraction of theirs."""
    same: dict[tuple[str, int], list[tuple[int, NicPort]]] = {}
    for node in nodes.values():
        for nic in node.nics:
            same.setdefault((nic.device, nic.port), []).append((node.node_rank, nic))
    flagged = []
    for node in nodes.values():
        for nic in node.nics:
            others = [o for r, o in same[(nic.device, nic.port)] if r != node.node_rank]
            reasons = _nic_reasons(nic, others)
            if reasons:
                flagged.append((node, nic, reasons, others))
    if not flagged:
        return None
    flagged.sort(key=lambda f: (-sum(v for _, v in f[1].errors), -len(f[2])))
    node, nic, _, others = flagged[0]
    return LinkReport(
        scope="nic",
        transport="rdma",
        nodes=(LinkNode(node.host, node.node_rank, node.addresses),),
        rate=nic.bytes_s,
        rate_others=statistics.median(o.bytes_s for o in others) if others else None,
        device=f"{nic.device}/{nic.port}",
        rdma_rate=nic.rate,
        rdma_state=f"{nic.state} / {nic.phys_state}",
        counters=tuple(f"{name}={delta}" for name, delta in nic.errors),
        evidence=tuple(
            f"{n.host} {p.device}/{p.port}: {'; '.join(why)}" for n, p, why, _ in flagged
        )[:MAX_EVIDENCE],
    )


def _nic_reasons(nic: NicPort, others: list[NicPort]) -> list[str]:
    reasons = []
    if nic.errors:
        reasons.append(", ".join(f"{name} +{delta:,}" for name, delta in nic.errors))
    if (
        nic.state
        and not is_active(nic.state)
        and (nic.changed or any(is_active(o.state) for o in others))
    ):
        reasons.append(f"state {nic.state} / {nic.phys_state}")
    rate = _gbps(nic.rate)
    best = max((g for o in others if is_active(o.state) for g in [_gbps(o.rate)] if g), default=0.0)
    if rate and rate < best:
        reasons.append(f"rate {nic.rate} (the others {best:g} Gb/sec)")
    moving = [o.bytes_s for o in others if not o.reset]
    usual = statistics.median(moving) if moving else 0.0
    if not nic.reset and usual >= NIC_MIN_BYTES_S and nic.bytes_s < NIC_DATA_LAG * usual:
        reasons.append(f"moves {megabytes(nic.bytes_s)} (the others {megabytes(usual)})")
    return reasons


def is_active(state: str) -> bool:
    """``4: ACTIVE`` (sysfs's ``<number>: <name>``)."""
    return state.partition(":")[2].strip() in ACTIVE_STATES


def _gbps(rate: str) -> float | None:
    """``100 Gb/sec (4X EDR)`` → 100.0."""
    number, _, unit = rate.partition(" ")
    try:
        return float(number) if unit.startswith("Gb/sec") else None
    except ValueError:
        return None


# --- text ----------------------------------------------------------------------------------


def nic_state(nic: NicPort) -> str:
    moved = ", ".join(f"{name} +{delta:,}" for name, delta in nic.errors)
    return "; ".join(filter(None, [moved, f"{nic.state} / {nic.phys_state}", nic.rate]))


def rounded(value: float) -> float:
    return float(f"{value:.4g}")


def number(value: float) -> str:
    if value >= 10:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.2g}"


def milliseconds(seconds: float) -> str:
    return f"{number(seconds * 1e3)} ms"


def megabytes(bytes_s: float) -> str:
    return f"{number(bytes_s / 1e6)} MB/s"
