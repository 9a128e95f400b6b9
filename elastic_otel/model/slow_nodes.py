"""Slow nodes: a node whose every rank keeps the other nodes waiting, named from device time.

A node whose ranks are all late (a throttled GPU, a slow host) is no local straggler: its ranks
are equal among themselves. Time inside a collective needs no shared clock, so each node
publishes once per window its ranks' mean time inside per process group (:class:`NodeInside`)
and one node compares them (:class:`SlowNodeWatch`), with the local ranks' score and rules
(:mod:`.stragglers`). Pure: the store is the agent's (``integration/straggler_exchange.py``).
Design: ``docs/hangs.md`` (Stragglers).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from elastic_otel.model.spans import SpanAttributes
from elastic_otel.model.stragglers import (
    DOMINANCE,
    INSIDE,
    MIN_COLLECTIVES,
    WINDOWS,
    GroupInside,
    Streak,
)
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import group_name

MAX_VALUE_BYTES = 64 * 1024
"""Largest published value read (a node's few groups and its global ranks)."""
MAX_GROUPS = 32
"""Process groups a node publishes (those with the most collectives)."""


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """One node's ranks' time inside one group's collectives over its last window."""

    group: str  # the group key (backend:name)
    collectives: int
    mean_ns: float  # the mean of its ranks' mean ns inside per collective
    low_ns: float  # the least of its ranks' means
    high_ns: float  # the most
    interval_ns: float  # mean ns between the group's collectives, by the node's own clock


@dataclass(frozen=True, slots=True)
class NodeInside:
    """What a node publishes once per window."""

    node_rank: int  # torchrun's group rank in the round
    host: str
    ranks: tuple[int, ...]  # its global ranks
    window: int  # its window count: a value read twice is not fresh
    groups: tuple[NodeGroup, ...]


@dataclass(frozen=True, slots=True)
class NodeScore:
    """A node's score in the group where it was worst: the rank score's, between nodes."""

    node_rank: int
    host: str
    ranks: tuple[int, ...]
    score: float  # 1 - lateness / interval, clamped to [0, 1]
    lateness_s: float  # how much less time inside than the node that spends the most
    interval_s: float
    waited_share: float  # share of the interval the other nodes' ranks wait for it
    group: str
    collectives: int


@dataclass(frozen=True, slots=True)
class SlowNode:
    """A node reported as slow."""

    node: NodeScore
    waiting: tuple[int, ...]  # the node ranks compared with it
    windows: int  # consecutive windows it has been the slow node


def node_inside(
    node_rank: int, host: str, ranks: Iterable[int], window: int, inside: Mapping[str, GroupInside]
) -> NodeInside | None:
    """A node's value for its last window (``None``: nothing timed to publish)."""
    groups = [
        NodeGroup(
            group=group,
            collectives=g.collectives,
            mean_ns=sum(g.mean_ns.values()) / len(g.mean_ns),
            low_ns=min(g.mean_ns.values()),
            high_ns=max(g.mean_ns.values()),
            interval_ns=g.interval_ns,
        )
        for group, g in inside.items()
        if g.mean_ns and g.interval_ns > 0
    ]
    if not groups:
        return None
    groups = sorted(groups, key=lambda g: -g.collectives)[:MAX_GROUPS]
    return NodeInside(node_rank, host, tuple(sorted(ranks)), window, tuple(groups))


def encode(node: NodeInside) -> bytes:
    """The value stored for ``node`` (compact JSON)."""
    body = {
        "n": node.node_rank,
        "h": node.host,
        "r": list(node.ranks),
        "w": node.window,
        "g": [
            [g.group, g.collectives, g.mean_ns, g.low_ns, g.high_ns, g.interval_ns]
            for g in node.groups
        ],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode(data: object) -> NodeInside | None:
    """A stored value as a :class:`NodeInside`; ``None`` if malformed (never raises)."""
    try:
        if not isinstance(data, bytes | bytearray) or len(data) > MAX_VALUE_BYTES:
            return None
        body = json.loads(data)
        groups = tuple(
            NodeGroup(str(g), int(n), float(m), float(lo), float(hi), float(iv))
            for g, n, m, lo, hi, iv in body["g"][:MAX_GROUPS]
        )
        if not all(
            math.isfinite(v) and v >= 0
            for g in groups
            for v in (g.mean_ns, g.low_ns, g.high_ns, g.interval_ns)
        ):
            return None
        return NodeInside(
            int(body["n"]), str(body["h"]), tuple(int(r) for r in body["r"]), int(body["w"]), groups
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


class SlowNodeWatch:
    """The nodes' published times inside, compared window by window (on one node)."""

    def __init__(self, threshold: float, windows: int = WINDOWS) -> None:
        self.threshold = threshold
        self.windows = windows
        self.scores: dict[int, NodeScore] = {}  # node rank → its score over the last window
        self._streak = Streak(windows)

    def close_window(self, nodes: Iterable[NodeInside]) -> SlowNode | None:
        """Compare the nodes' fresh values; the slow node to report now, if any."""
        by_group: dict[str, list[tuple[NodeInside, NodeGroup]]] = {}
        for node in {n.node_rank: n for n in nodes}.values():
            for g in node.groups:
                if g.collectives >= MIN_COLLECTIVES and g.interval_ns > 0:
                    by_group.setdefault(g.group, []).append((node, g))
        scores: dict[int, NodeScore] = {}
        candidates: list[tuple[NodeScore, tuple[int, ...]]] = []
        for _, entries in sorted(by_group.items()):
            if len(entries) < 2:
                continue
            most = max(g.mean_ns for _, g in entries)
            group_scores = [_node_score(node, g, most, entries) for node, g in entries]
            for score in group_scores:
                held = scores.get(score.node_rank)
                if held is None or score.score < held.score:
                    scores[score.node_rank] = score
            i = min(range(len(entries)), key=lambda k: group_scores[k].score)
            worst, slow = group_scores[i], entries[i][1]
            peers = [(group_scores[k], entries[k][1]) for k in range(len(entries)) if k != i]
            if (
                worst.score < self.threshold
                and all(worst.lateness_s >= DOMINANCE * s.lateness_s for s, _ in peers)
                and all(slow.high_ns < g.low_ns for _, g in peers)  # every rank of it
            ):
                candidates.append((worst, tuple(s.node_rank for s, _ in peers)))
        if not scores:  # fewer than two nodes with timed collectives: no evidence
            return None
        self.scores = scores
        if not candidates:
            self._streak.update(None)
            return None
        worst, waiting = min(candidates, key=lambda c: c[0].score)
        windows = self._streak.update(worst.node_rank)
        return SlowNode(worst, waiting, windows) if windows else None


def _node_score(
    node: NodeInside, g: NodeGroup, most: float, entries: list[tuple[NodeInside, NodeGroup]]
) -> NodeScore:
    lateness = most - g.mean_ns
    others = [o.mean_ns - g.mean_ns for n, o in entries if n is not node]
    waited = sum(max(0.0, w) for w in others) / len(others)
    return NodeScore(
        node_rank=node.node_rank,
        host=node.host,
        ranks=node.ranks,
        score=min(max(1.0 - lateness / g.interval_ns, 0.0), 1.0),
        lateness_s=lateness / 1e9,
        interval_s=g.interval_ns / 1e9,
        waited_share=min(waited / g.interval_ns, 1.0),
        group=g.group,
        collectives=g.collectives,
    )


def slow_node_attributes(slow: SlowNode) -> SpanAttributes:
    """The report's facts, as the ``torchelastic.straggler`` record's attributes."""
    node = slow.node
    return {
        A.STRAGGLER_NODE: node.host,
        A.STRAGGLER_NODE_RANK: node.node_rank,
        A.STRAGGLER_NODE_RANKS: node.ranks,
        A.STRAGGLER_SCORE: round(node.score, 3),
        A.STRAGGLER_LATENESS: round(node.lateness_s, 4),
        A.STRAGGLER_INTERVAL: round(node.interval_s, 4),
        A.STRAGGLER_WAITED_SHARE: round(node.waited_share, 3),
        A.STRAGGLER_WAITING_NODES: slow.waiting,
        A.STRAGGLER_WINDOWS: slow.windows,
        A.STRAGGLER_PROCESS_GROUP: group_name(node.group),
        A.STRAGGLER_BASIS: INSIDE,
    }


def describe_slow_node(attributes: SpanAttributes) -> str:
    """The body of a slow-node report: "node host-b (node rank 1, global ranks 2,3) is a slow
    node: score 0.10 over 3 windows; its ranks spend 0.270 s less inside each collective of
    process group 0 than the other nodes' (one every 0.300 s); nodes 0 spend 90 % of that time
    waiting for it"."""
    ranks = attributes.get(A.STRAGGLER_NODE_RANKS)
    ranks_text = ",".join(map(str, ranks)) if isinstance(ranks, tuple | list) else "?"
    text = (
        f"node {attributes.get(A.STRAGGLER_NODE)} (node rank "
        f"{attributes.get(A.STRAGGLER_NODE_RANK)}, global ranks {ranks_text}) is a slow node"
    )
    score, windows = attributes.get(A.STRAGGLER_SCORE), attributes.get(A.STRAGGLER_WINDOWS)
    if isinstance(score, int | float):
        text += f": score {score:.2f}"
        text += f" over {windows} windows" if isinstance(windows, int) else ""
    lateness, interval = attributes.get(A.STRAGGLER_LATENESS), attributes.get(A.STRAGGLER_INTERVAL)
    if isinstance(lateness, int | float) and isinstance(interval, int | float):
        group = attributes.get(A.STRAGGLER_PROCESS_GROUP)
        of = f" of process group {group}" if group is not None else ""
        text += (
            f"; its ranks spend {lateness:.3f} s less inside each collective{of} than the"
            f" other nodes' (one every {interval:.3f} s)"
        )
    waiting = attributes.get(A.STRAGGLER_WAITING_NODES)
    share = attributes.get(A.STRAGGLER_WAITED_SHARE)
    if isinstance(waiting, tuple | list) and waiting and isinstance(share, int | float):
        nodes = ",".join(map(str, waiting))
        text += f"; nodes {nodes} spend {share * 100:.0f} % of that time waiting for it"
    return text
