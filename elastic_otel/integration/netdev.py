"""A node's network interfaces as the kernel counts them: bytes, errors, drops, and what its
transmit queue (the qdisc) held back, read through rtnetlink (``pyroute2``) once per window.

A link slowed at one end (a NIC fallen back to a lower rate, a cable throwing errors, a port
shaped) shows on that end's own interface: its transmit queue backs up (the qdisc's backlog,
requeues, overlimits and drops rise) or its error counters move, while the far end's stay
quiet. A two-node job's TCP connections cannot tell which end it is (both see the same slow
path); the interfaces can. Never raises: a read that fails is no evidence. Design:
``docs/hangs.md`` (Slow links and slowdowns).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from elastic_otel.model.interfaces import COUNTERS, QDISC_COUNTERS, InterfaceSample

_logger = logging.getLogger("elastic_otel")

SYSFS_NET = "/sys/class/net"


def read_interfaces(addresses: Iterable[str]) -> tuple[InterfaceSample, ...]:
    """The interfaces that hold any of ``addresses`` (the local addresses of the job's
    connections), each with its counters and its root qdisc's; ``()`` where none can be read."""
    wanted = set(addresses)
    if not wanted:
        return ()
    try:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            by_index: dict[int, list[str]] = {}
            for msg in ipr.get_addr():
                address = msg.get_attr("IFA_ADDRESS")
                if address in wanted:
                    by_index.setdefault(int(msg["index"]), []).append(str(address))
            if not by_index:
                return ()
            qdiscs: dict[int, dict[str, int]] = {}
            for msg in ipr.get_qdiscs():
                if int(msg["index"]) in by_index and msg["parent"] == 0xFFFFFFFF:  # the root
                    qdiscs[int(msg["index"])] = _qdisc_counters(msg)
            samples = []
            for msg in ipr.get_links(*by_index):
                index = int(msg["index"])
                name = str(msg.get_attr("IFLA_IFNAME"))
                stats = msg.get_attr("IFLA_STATS64") or {}
                counters = {k: int(stats[k]) for k in COUNTERS if k in stats}
                queue = qdiscs.get(index, {})
                counters.update({k: v for k, v in queue.items() if k in QDISC_COUNTERS})
                samples.append(
                    InterfaceSample(
                        name=name,
                        addresses=tuple(sorted(by_index[index])),
                        speed_mbps=_speed(name),
                        counters=counters,
                        backlog=queue.get("backlog", 0),
                    )
                )
            return tuple(samples)
    except Exception:  # no rtnetlink here, no pyroute2: no interface evidence
        _logger.debug("elastic-otel: network interfaces not read", exc_info=True)
        return ()


def _qdisc_counters(msg: Any) -> dict[str, int]:
    stats = msg.get_attr("TCA_STATS") or {}
    return {
        "qdisc_drops": int(stats.get("drop", 0)),
        "qdisc_overlimits": int(stats.get("overlimits", 0)),
        "backlog": int(stats.get("backlog", 0)),
    }


def _speed(name: str) -> int | None:
    """The link's rate in Mb/s as sysfs says it (``None``: not said, or down)."""
    try:
        with open(os.path.join(SYSFS_NET, os.path.basename(name), "speed")) as f:
            speed = int(f.read(32).strip())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None
