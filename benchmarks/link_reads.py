"""What one window's link reads cost the agent (issue 46): ``python -m benchmarks.link_reads``.

The reads the agent's exchange thread makes once per window, timed READS times each on this
machine: the socket inodes of PROCESSES processes (this one and children holding 100 open
files each, as an agent and its workers), the kernel's statistics of CONNECTIONS established
TCP connections (loopback pairs this process opens and moves data on, read with
``keep_loopback``: the agent leaves loopback out), the same when none of them is the job's (the
machine's other connections cost their share of the dump), the interfaces those connections go
out through (rtnetlink: their counters and their qdisc's), one node's RDMA ports (a sysfs tree
laid out in a temporary directory: 4 devices of 2 ports, with an mlx5 port's counters), and the
model's share: a node's summary and its encoded value, and node 0's comparison of 16 nodes of
64 peers. Prints a markdown table (ms) and the size of a published value of 64 peers. Not part
of ``benchmarks.run``.

Renders its recorded table into section 9 of BENCHMARKS.md (:func:`render`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.format import RECORDED

COUNTERS = [
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_xmit_wait",
]
HW_COUNTERS = [
    "duplicate_request",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "rx_atomic_requests",
    "rx_read_requests",
    "rx_write_requests",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "roce_adp_retrans",
    "roce_slow_restart",
    "lifespan",
]
CHILD = "import os, time\nfiles = [os.open('/dev/null', os.O_RDONLY) for _ in range(100)]\n"
CHILD += "time.sleep(600)"


def loopback_connections(count: int) -> list[socket.socket]:
    """``count`` established sockets (``count // 2`` pairs), each pair having moved 64 KiB."""
    server = socket.create_server(("127.0.0.1", 0), backlog=count)
    sockets = [server]
    for _ in range(count // 2):
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        sender = threading.Thread(target=client.sendall, args=(b"x" * 65536,))
        sender.start()
        got = 0
        while got < 65536:
            got += len(accepted.recv(65536))
        sender.join()
        sockets += [client, accepted]
    return sockets


def lay_tree(root: Path, devices: int = 4, ports: int = 2) -> None:
    for d in range(devices):
        for p in range(1, ports + 1):
            base = root / f"mlx5_{d}" / "ports" / str(p)
            for sub, names in (("counters", COUNTERS), ("hw_counters", HW_COUNTERS)):
                (base / sub).mkdir(parents=True)
                for i, name in enumerate(names):
                    (base / sub / name).write_text(f"{i * 1_000_003}\n")
            for name, text in (("rate", "400 Gb/sec (4X NDR)"), ("state", "4: ACTIVE")):
                (base / name).write_text(text + "\n")
            (base / "phys_state").write_text("5: LinkUp\n")


def timed(fn: Callable[[], Any], reads: int) -> dict[str, float]:
    times = []
    for _ in range(reads):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return common.summarize(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--processes", type=int, default=8)
    args = parser.parse_args()

    from elastic_otel.integration.netdev import read_interfaces
    from elastic_otel.integration.tcp_sockets import read_connections, socket_inodes
    from elastic_otel.model.links import (
        MAX_PEERS,
        LinkWatch,
        NodeLinks,
        encode,
        nic_ports,
        node_links,
        summarize,
    )
    from elastic_otel.parsing.rdma_counters import read_ports

    sockets = loopback_connections(args.connections)
    root = Path(tempfile.mkdtemp(prefix="link_reads_"))
    children = [subprocess.Popen([sys.executable, "-c", CHILD]) for _ in range(args.processes - 1)]
    try:
        time.sleep(0.5)  # the children have opened their files
        pids = [os.getpid(), *(c.pid for c in children)]
        inodes = socket_inodes(pids)
        t0 = time.perf_counter()
        first = read_connections(inodes, keep_loopback=True)
        first_ms = (time.perf_counter() - t0) * 1e3
        assert len(first) == args.connections, len(first)
        lay_tree(root)
        ports = read_ports(str(root))

        addresses = {c.local for c in first}

        def whole_window() -> None:
            read_connections(socket_inodes(pids), keep_loopback=True)
            read_interfaces(addresses)
            read_ports(str(root))

        previous = {c.inode: c for c in first}
        nics = nic_ports(ports, ports, 2.0)
        wide = [replace(c, peer=f"10.2.0.{i}") for i, c in enumerate(first)]  # 64 kept
        value = node_links(0, "host-a", 1, wide, summarize(None, wide, 2.0), nics)
        assert len(value.peers) == MAX_PEERS
        nodes = [
            NodeLinks(r, f"host-{r}", (f"10.2.0.{r}",), 1, value.peers, value.nics)
            for r in range(16)
        ]
        rows = {
            f"socket_inodes, {args.processes} processes": timed(
                lambda: socket_inodes(pids), args.reads
            ),
            f"read_connections, {args.connections} connections": timed(
                lambda: read_connections(inodes, keep_loopback=True), args.reads
            ),
            f"read_connections, none of {args.connections} the job's": timed(
                lambda: read_connections({0}), args.reads
            ),
            "read_interfaces, the connections' interface": timed(
                lambda: read_interfaces(addresses), args.reads
            ),
            "read_ports, 4 devices x 2 ports": timed(lambda: read_ports(str(root)), args.reads),
            "the node's whole read (inodes, connections, interfaces, ports)": timed(
                whole_window, args.reads
            ),
            "summarize + node_links + encode": timed(
                lambda: encode(node_links(0, "h", 1, first, summarize(previous, first, 2.0), nics)),
                args.reads,
            ),
            "node 0: LinkWatch.close_window, 16 nodes x 64 peers": timed(
                lambda: LinkWatch().close_window(nodes), args.reads
            ),
        }
    finally:
        for child in children:
            child.kill()
            child.wait()
        for s in sockets:
            s.close()
        shutil.rmtree(root, ignore_errors=True)
    facts = common.machine()
    print(f"link_reads: {args.reads} reads each; {facts['cpu']}, {facts['cores']}, {facts['os']}")
    print()
    print("| read | median ms | p90 ms | max ms |")
    print("| --- | ---: | ---: | ---: |")
    for name, s in rows.items():
        print(f"| {name} | {s['median']:.3f} | {s['p90']:.3f} | {s['max']:.3f} |")
    print(f"| first read_connections (imports pyroute2) | {first_ms:.1f} | | |")
    print()
    print(
        f"encoded NodeLinks: {len(encode(value))} bytes for {len(value.peers)} peers and"
        f" {len(value.nics)} RDMA ports"
    )


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


def render() -> list[str]:
    """``python -m benchmarks.link_reads``'s table, from the newest
    ``benchmarks/recorded/link-reads-*.txt`` (it prints markdown: kept as printed)."""
    files = sorted(RECORDED.glob("link-reads-*.txt"))
    if not files:
        return []
    rel = files[-1].relative_to(RECORDED.parents[1])
    return [
        "",
        "### Slow links: the per-window reads",
        "",
        "What one node reads once per straggler window for the slow-link exchange "
        "(docs/hangs.md, Slow links and slowdowns), on the exchange's thread, never the "
        "training watch's or a worker's: the socket inodes of the agent and its workers, the "
        "kernel's statistics of their TCP connections (sock_diag through `pyroute2`; the dump "
        "holds every socket of the host, so the machine's other connections cost their share), "
        "the interfaces they go out through (rtnetlink), the RDMA ports (sysfs, a laid-out tree: "
        "this machine has no NIC), and the model's share; the store traffic is one value a "
        "window per node (the size below at its bound of 64 peers, a few hundred bytes for a "
        f"ring's few peers) and, on node 0, one `multi_get` of every node's (`{rel}`, as "
        "printed by `python -m benchmarks.link_reads`):",
        "",
        *(line for line in files[-1].read_text().splitlines()),
        "",
    ]


if __name__ == "__main__":
    main()
