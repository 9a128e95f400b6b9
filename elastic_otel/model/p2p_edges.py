"""Slow point-to-point edges: which pair of nodes a pipeline's sends and receives slowed on.

Pipeline parallelism moves activations and gradients between stages with sends and receives;
NCCL's Flight Recorder times each one on the device (with timing events). A transfer's time
includes its wait for the peer, so an edge's speed is its *fastest* transfer of the window (the
one that waited least): bytes over device time. Each node publishes its ranks' edges
(:func:`node_edges`); node 0 merges every node's and compares each edge between two nodes
with its own usual speed (:class:`EdgeWatch`): the edges that fell far under it name a link
(one pair of nodes), a node (every edge to and from it) or the fabric (every edge between
nodes). Edges within a node (NVLink, shared memory) are another medium and are not compared.
Pure. Design: ``docs/hangs.md`` (Slow links and slowdowns).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from elastic_otel.parsing.collectives import SEND, PeerTransfers

MAX_EDGES = 128
"""Edges a node publishes (the slowest first)."""
RATE_DROP = 4.0
"""An edge is slow at a quarter of its usual speed (its fastest transfer's): a degraded link
slows every transfer over it, a late peer only the waits, which the fastest transfer leaves
out."""
BASELINE_WINDOWS = 8
MIN_BASELINE = 3
"""An edge's usual speed is the median of its last ``BASELINE_WINDOWS`` windows that were not
slow, once it has ``MIN_BASELINE`` (its first windows are taken as they come: a slowdown is a
change from the job's own start); before that, the median of the other edges between nodes (at
least two of them)."""
MAX_BASELINES = 4096


@dataclass(frozen=True, slots=True)
class Edge:
    """Transfers from global rank ``src`` to ``dst`` over one window (both sides' view)."""

    src: int
    dst: int
    count: int
    bytes: int
    best_rate: float  # bytes a second: the fastest transfer's


@dataclass(frozen=True, slots=True)
class EdgeNode:
    """What node 0 knows of a node for this: its host, its ranks, its edges."""

    host: str
    ranks: tuple[int, ...]
    edges: tuple[Edge, ...]


@dataclass(frozen=True, slots=True)
class EdgeFinding:
    """The edges node 0 names, and what they show."""

    scope: str  # link, node or fabric
    node_ranks: tuple[int, ...]
    rate: float  # bytes a second: the named edges' fastest transfers, their mean
    rate_others: float | None  # the same over the other edges between nodes
    evidence: tuple[str, ...]


def node_edges(transfers: Iterable[tuple[int, Iterable[PeerTransfers]]]) -> tuple[Edge, ...]:
    """Each (global rank, its transfers) as edges, both sides of an edge seen on one node
    merged (the faster side's speed: the side that waited less), the slowest first."""
    edges = (
        Edge(*((rank, t.peer) if t.op == SEND else (t.peer, rank)), t.count, t.bytes, t.best_rate)
        for rank, rows in transfers
        for t in rows
    )
    return tuple(sorted(_merged(edges), key=lambda e: e.best_rate)[:MAX_EDGES])


def _merged(edges: Iterable[Edge]) -> list[Edge]:
    """One edge per (src, dst): the two sides' view of it, the faster side's speed."""
    merged: dict[tuple[int, int], Edge] = {}
    for b in edges:
        a = merged.get((b.src, b.dst))
        if a is not None:
            b = Edge(
                b.src,
                b.dst,
                max(a.count, b.count),
                max(a.bytes, b.bytes),
                max(a.best_rate, b.best_rate),
            )
        merged[(b.src, b.dst)] = b
    return list(merged.values())


class EdgeWatch:
    """Every node's edges, compared window by window with each edge's usual speed (node 0)."""

    def __init__(self) -> None:
        self._baselines: dict[tuple[int, int], deque[float]] = {}

    def close_window(self, nodes: Mapping[int, EdgeNode]) -> EdgeFinding | None:
        """The window's finding from the nodes' fresh values, if any."""
        node_of = {rank: n for n, node in nodes.items() for rank in node.ranks}
        merged = _merged(e for node in nodes.values() for e in node.edges)
        crossing = [e for e in merged if e.best_rate > 0 and _crosses(e, node_of)]
        if not crossing:
            return None
        judged = []
        for e in crossing:
            usual, own = self._usual(e, crossing)
            slow = usual is not None and e.best_rate * RATE_DROP <= usual
            judged.append((e, slow, usual))
            if not slow or not own:  # its first windows are taken as they come
                self._learn(e)
        return _finding(judged, node_of, nodes)

    def _usual(self, edge: Edge, crossing: list[Edge]) -> tuple[float | None, bool]:
        """The edge's usual speed, and whether it is its own (else the other edges')."""
        held = self._baselines.get((edge.src, edge.dst))
        if held is not None and len(held) >= MIN_BASELINE:
            return statistics.median(held), True
        others = [e.best_rate for e in crossing if e is not edge]
        return (statistics.median(others) if len(others) >= 2 else None), False

    def _learn(self, edge: Edge) -> None:
        held = self._baselines.get((edge.src, edge.dst))
        if held is None:
            if len(self._baselines) >= MAX_BASELINES:
                return
            held = self._baselines[(edge.src, edge.dst)] = deque(maxlen=BASELINE_WINDOWS)
        held.append(edge.best_rate)


def _crosses(edge: Edge, node_of: Mapping[int, int]) -> bool:
    """Both ends known, on two nodes."""
    a, b = node_of.get(edge.src), node_of.get(edge.dst)
    return a is not None and b is not None and a != b


def _finding(
    judged: list[tuple[Edge, bool, float | None]],
    node_of: Mapping[int, int],
    nodes: Mapping[int, EdgeNode],
) -> EdgeFinding | None:
    """One pair of nodes whose edges alone are slow (a link); one node in every slow pair,
    every edge of it slow (the node); every edge slow over two pairs or more (the fabric)."""
    slow = [(e, usual) for e, bad, usual in judged if bad]
    good = [e for e, bad, _ in judged if not bad]
    if not slow:
        return None
    pairs = {tuple(sorted((node_of[e.src], node_of[e.dst]))) for e, _ in slow}
    if len(pairs) == 1:
        scope, named = "link", tuple(next(iter(pairs)))
    elif common := set.intersection(*(set(p) for p in pairs)):
        node = min(common)
        if any(node in (node_of[e.src], node_of[e.dst]) for e in good):
            return None  # some of its edges are fine: not its NIC
        scope, named = "node", (node,)
    elif not good:
        scope, named = "fabric", ()
    else:
        return None
    slow.sort(key=lambda s: s[0].best_rate)
    return EdgeFinding(
        scope=scope,
        node_ranks=named,
        rate=statistics.fmean(e.best_rate for e, _ in slow),
        rate_others=statistics.fmean(e.best_rate for e in good) if good else None,
        evidence=tuple(_line(e, usual, node_of, nodes) for e, usual in slow[:8]),
    )


def _line(
    edge: Edge, usual: float | None, node_of: Mapping[int, int], nodes: Mapping[int, EdgeNode]
) -> str:
    """ "host-a → host-b rank 3 → rank 4: 0.21 GB/s at best over 12 transfers of 8.4 MB
    (usually 11.8 GB/s)"."""
    a, b = nodes[node_of[edge.src]].host, nodes[node_of[edge.dst]].host
    text = f"{a} → {b} {describe_edge(edge)}"
    return text + (f" (usually {gigabytes(usual)})" if usual is not None else "")


def describe_edge(edge: Edge) -> str:
    """ "rank 3 → rank 4: 0.21 GB/s at best over 12 transfers of 8.4 MB"."""
    size = edge.bytes / edge.count if edge.count else 0
    text = f"rank {edge.src} → rank {edge.dst}: {gigabytes(edge.best_rate)} at best"
    return text + f" over {edge.count} transfers of {size / 1e6:.3g} MB"


def gigabytes(bytes_s: float) -> str:
    return f"{bytes_s / 1e9:.3g} GB/s"
