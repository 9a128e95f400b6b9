"""One node's links over one window: its TCP connections' statistics, the interfaces they go
out through, and its RDMA ports' counters, read once per window on the exchange's thread.

The kernel keeps per-connection TCP statistics (read through sock_diag, :mod:`.tcp_sockets`),
per-interface counters and its transmit queue's (rtnetlink, :mod:`.netdev`), and RDMA NICs
their port counters in sysfs (:mod:`elastic_otel.parsing.rdma_counters`); all are cumulative,
so this keeps the previous window's readings and hands the model
(:mod:`elastic_otel.model.links`) both. Design:
``docs/hangs.md`` (Slow links and slowdowns).
"""

from __future__ import annotations

import time

from elastic_otel.integration.netdev import read_interfaces
from elastic_otel.integration.tcp_sockets import read_connections, socket_inodes
from elastic_otel.model.interfaces import InterfaceSample, windows
from elastic_otel.model.links import NodeLinks, TcpConnection, nic_ports, node_links, summarize
from elastic_otel.parsing.rdma_counters import PortReading, read_ports


class LinkStats:
    """The reader of one node's links (its previous window's readings its only state)."""

    def __init__(self, node_rank: int, host: str, rdma_root: str) -> None:
        self.node_rank = node_rank
        self.host = host
        self.rdma_root = rdma_root
        self._connections: dict[int, TcpConnection] | None = None
        self._ports: tuple[PortReading, ...] | None = None
        self._interfaces: tuple[InterfaceSample, ...] = ()
        self._read_ns = 0

    def read(self, pids: list[int], window: int) -> NodeLinks | None:
        """This window's value for the processes ``pids`` (the agent and its workers); ``None``
        on the first read, which only sets the start."""
        now_ns = time.monotonic_ns()
        connections = read_connections(socket_inodes(pids))
        ports = read_ports(self.rdma_root)
        interfaces = read_interfaces({c.local for c in connections})
        elapsed_s = (now_ns - self._read_ns) / 1e9
        previous, before, then = self._connections, self._ports, self._interfaces
        self._connections = {c.inode: c for c in connections}
        self._ports, self._interfaces, self._read_ns = ports, interfaces, now_ns
        if previous is None or before is None or elapsed_s <= 0:
            return None
        return node_links(
            self.node_rank,
            self.host,
            window,
            connections,
            summarize(previous, connections, elapsed_s),
            nic_ports(before, ports, elapsed_s),
            windows(then, interfaces, elapsed_s),
        )
