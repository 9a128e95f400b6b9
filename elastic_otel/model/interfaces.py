"""A node's network interfaces over a window, and the nodes whose own interface is the slow end.

Per window each node keeps, for the interfaces that carry its job's connections, what moved:
bytes sent and received a second, error and drop counters, and what its transmit queue held back
(the root qdisc's overlimits and drops, its backlog now). The end of a slow link that is
slow itself (a NIC at a lower rate, a port shaped, a cable throwing errors) is the one whose
interface says so; :func:`slow_ends` names those nodes when the others' interfaces stay quiet.
Pure: the kernel is read by ``integration/netdev.py``. Design: ``docs/hangs.md`` (Slow links
and slowdowns).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

COUNTERS = (
    "tx_bytes",
    "rx_bytes",
    "tx_dropped",
    "rx_dropped",
    "tx_errors",
    "rx_errors",
    "rx_crc_errors",
    "rx_frame_errors",
    "rx_missed_errors",
    "tx_carrier_errors",
)
"""The kernel's interface counters (``IFLA_STATS64``) kept."""
QDISC_COUNTERS = ("qdisc_drops", "qdisc_overlimits")
"""The root qdisc's counters kept: packets it dropped, times it held one back over its rate."""
TROUBLE = tuple(c for c in (*COUNTERS, *QDISC_COUNTERS) if not c.endswith("_bytes"))
"""The counters whose movement is evidence of a slow or bad end (all but the bytes)."""
MIN_TROUBLE_PER_S = 5.0
"""Trouble counted a second, over a window, before an interface is called the slow end."""


@dataclass(frozen=True, slots=True)
class InterfaceSample:
    """One interface as read at one moment."""

    name: str
    addresses: tuple[str, ...]
    speed_mbps: int | None  # as sysfs says it (None: not said)
    counters: Mapping[str, int] = field(default_factory=dict)
    backlog: int = 0  # bytes its root qdisc holds now


@dataclass(frozen=True, slots=True)
class InterfaceWindow:
    """One interface over one window."""

    name: str
    addresses: tuple[str, ...]
    speed_mbps: int | None
    tx_rate: float  # bytes a second sent
    rx_rate: float
    trouble: dict[str, int]  # the trouble counters that moved, by how much
    trouble_per_s: float
    backlog: int

    @property
    def slow_end(self) -> bool:
        """Its transmit queue holds traffic back or its errors move, lastingly over the window."""
        return self.trouble_per_s >= MIN_TROUBLE_PER_S


def windows(
    before: Sequence[InterfaceSample], after: Sequence[InterfaceSample], elapsed_s: float
) -> tuple[InterfaceWindow, ...]:
    """Each interface read both times, over the ``elapsed_s`` between (a counter that went
    back, reset or wrapped, counts as its new value)."""
    if elapsed_s <= 0:
        return ()
    previous = {s.name: s for s in before}
    out = []
    for now in after:
        then = previous.get(now.name)
        if then is None:
            continue
        moved = {k: _delta(then.counters.get(k, 0), v) for k, v in now.counters.items()}
        trouble = {k: v for k, v in moved.items() if k in TROUBLE and v > 0}
        out.append(
            InterfaceWindow(
                name=now.name,
                addresses=now.addresses,
                speed_mbps=now.speed_mbps,
                tx_rate=moved.get("tx_bytes", 0) / elapsed_s,
                rx_rate=moved.get("rx_bytes", 0) / elapsed_s,
                trouble=trouble,
                trouble_per_s=sum(trouble.values()) / elapsed_s,
                backlog=now.backlog,
            )
        )
    return tuple(out)


def _delta(before: int, after: int) -> int:
    return after - before if after >= before else after


def slow_ends(nodes: Mapping[int, Iterable[InterfaceWindow]]) -> list[int]:
    """The nodes (by node rank) whose own interface is the slow end of their links: its queue
    or errors say so while at least one other node's interfaces stay quiet; none where every
    node's do (then the interfaces cannot tell one end from another)."""
    flagged = {n for n, ifaces in nodes.items() if any(i.slow_end for i in ifaces)}
    quiet = set(nodes) - flagged
    slower = _slower_speed(nodes)
    if slower and len(slower) < len(nodes):
        flagged |= slower
        quiet -= slower
    return sorted(flagged) if flagged and quiet else []


def _slower_speed(nodes: Mapping[int, Iterable[InterfaceWindow]]) -> set[int]:
    """Nodes whose fastest job interface is slower than every other node's (a NIC fallen back
    to a lower rate)."""
    fastest = {
        n: max((i.speed_mbps for i in ifaces if i.speed_mbps), default=0)
        for n, ifaces in nodes.items()
    }
    known = {n: s for n, s in fastest.items() if s}
    if len(known) < 2:
        return set()
    top = max(known.values())
    return {n for n, s in known.items() if s < top}


def describe_interface(window: InterfaceWindow) -> str:
    """One evidence line: "eth0 (10.1.0.12, 100000 Mb/s): sends 6.2 MB/s; its queue held back
    31 packets a second (qdisc_overlimits +620), 64 kB waiting"."""
    where = ", ".join(window.addresses)
    speed = f", {window.speed_mbps} Mb/s" if window.speed_mbps else ""
    text = f"{window.name} ({where}{speed}): sends {window.tx_rate / 1e6:.2f} MB/s"
    text += f", receives {window.rx_rate / 1e6:.2f} MB/s"
    if window.trouble:
        moved = ", ".join(f"{k} +{v:,}" for k, v in sorted(window.trouble.items()))
        text += f"; {window.trouble_per_s:.0f} a second held back or lost ({moved})"
    if window.backlog:
        text += f", {window.backlog / 1000:.0f} kB waiting in its queue"
    return text
