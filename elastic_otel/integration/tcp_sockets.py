"""The kernel's statistics of this node's TCP connections: netlink sock_diag, per socket.

Which connections are the job's: the socket inodes its processes hold (``/proc/<pid>/fd``).
Their statistics: one ``inet_diag`` dump of the established IPv4 and IPv6 sockets with
``tcp_info`` (``pyroute2``'s ``DiagSocket``: binary and complete, where ``ss``'s text would
have to be parsed), kept for those inodes. Loopback peers are left out: they never cross a
link. ``pyroute2`` is imported on the first read, so a process that never reads pays nothing
for it. Never raises: a read that fails is no connections. Design: ``docs/hangs.md`` (Slow
links and slowdowns).
"""

from __future__ import annotations

import importlib
import ipaddress
import logging
import os
import socket
from collections.abc import Collection, Iterable
from typing import Any

from elastic_otel.model.links import TcpConnection

_logger = logging.getLogger("elastic_otel")

ESTABLISHED = 1 << 1  # 1 << TCP_ESTABLISHED: the states asked for
INET_DIAG_INFO = 1 << (2 - 1)  # the extension bit of INET_DIAG_INFO (2): tcp_info


def socket_inodes(pids: Iterable[int]) -> set[int]:
    """The inodes of the sockets the processes ``pids`` hold (a process gone, or not ours to
    read, holds none)."""
    inodes = set()
    for pid in pids:
        directory = f"/proc/{pid}/fd"
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(f"{directory}/{name}")
            except OSError:
                continue
            if target.startswith("socket:[") and target.endswith("]"):
                inodes.add(int(target[8:-1]))
    return inodes


def read_connections(inodes: Collection[int], keep_loopback: bool = False) -> list[TcpConnection]:
    """The established TCP connections of the sockets ``inodes``, their peer not on loopback
    (``keep_loopback``: those too, for tests on one machine); ``[]`` if the kernel could not be
    read."""
    if not inodes:
        return []
    try:
        pyroute2 = importlib.import_module("pyroute2")  # untyped: its names are Any here
        with pyroute2.DiagSocket() as diag:
            diag.bind()
            messages = [
                m
                for family in (socket.AF_INET, socket.AF_INET6)
                for m in diag.get_sock_stats(
                    family=family, states=ESTABLISHED, extensions=INET_DIAG_INFO
                )
            ]
    except Exception:  # no netlink, no sock_diag module, a seccomp filter: no statistics
        _logger.debug("elastic-otel: sock_diag read failed", exc_info=True)
        return []
    found = []
    for message in messages:
        try:
            connection = _connection(message, inodes, keep_loopback)
        except Exception:  # one odd message is one connection less
            _logger.debug("elastic-otel: sock_diag message not read", exc_info=True)
            continue
        if connection is not None:
            found.append(connection)
    return found


def _connection(message: Any, inodes: Collection[int], keep_loopback: bool) -> TcpConnection | None:
    inode = int(message["idiag_inode"])
    if inode not in inodes:
        return None
    info = message.get_attr("INET_DIAG_INFO")
    if info is None:
        return None
    peer, local = _address(message["idiag_dst"]), _address(message["idiag_src"])
    if not keep_loopback and peer.is_loopback:
        return None

    values = dict(info)  # plain lookups: the message's own get() also searches its attributes

    def field(name: str) -> int:
        return int(values.get(name) or 0)  # an older kernel's shorter tcp_info lacks the newest

    return TcpConnection(
        local=str(local),
        peer=str(peer),
        peer_port=int(message["idiag_dport"]),
        inode=inode,
        srtt_us=field("tcpi_rtt"),
        min_rtt_us=field("tcpi_min_rtt"),
        rttvar_us=field("tcpi_rttvar"),
        total_retrans=field("tcpi_total_retrans"),
        lost=field("tcpi_lost"),
        delivery_rate=field("tcpi_delivery_rate"),
        # pyroute2 decodes the bit field as its lowest bit: where little-endian C puts it
        app_limited=bool(field("tcpi_delivery_rate_app_limited")),
        bytes_acked=field("tcpi_bytes_acked"),
        bytes_received=field("tcpi_bytes_received"),
        bytes_sent=field("tcpi_bytes_sent"),
        bytes_retrans=field("tcpi_bytes_retrans"),
        busy_time_us=field("tcpi_busy_time"),
    )


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address, an IPv4 one mapped into IPv6 (a dual-stack socket's) as IPv4."""
    address = ipaddress.ip_address(text)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
