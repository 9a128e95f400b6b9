"""Slow links (elastic_otel.model.links): the node-by-peer matrix names the slow node, link or
fabric and nothing in a healthy job, however noisy; RDMA ports laid out in sysfs as the kernel
does name a flapping cable; the published value survives the store and rejects what is
malformed; and the kernel's TCP statistics are read from real sockets (sock_diag), over
loopback and, as root, over a veth pair between two network namespaces."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from elastic_otel.integration.tcp_sockets import read_connections, socket_inodes
from elastic_otel.model.link_records import describe_link, link_attributes, local_evidence
from elastic_otel.model.links import (
    MAX_PEERS,
    MAX_VALUE_BYTES,
    LinkReport,
    LinkWatch,
    NicPort,
    NodeLinks,
    PeerPath,
    TcpConnection,
    decode,
    encode,
    nic_ports,
    node_links,
    summarize,
)
from elastic_otel.names import attributes as A
from elastic_otel.parsing.rdma_counters import deltas, read_ports

MS = 1e-3
MB = 1e6
COLLECTOR = "10.9.0.5"
ADDRESSES = ("10.1.0.11", "10.1.0.12", "10.1.0.13", "10.1.0.14")


def path(
    peer: str,
    rtt_ms: float = 0.1,
    rate: float = 110 * MB,
    retransmits: float = 0.0,
    share: float = 0.0,
    busy: bool = True,
) -> PeerPath:
    return PeerPath(peer, 2, 2, rtt_ms * MS, 0.05 * MS, retransmits, share, 0, rate, busy, 50 * MB)


def node(rank: int, paths: list[PeerPath], nics: tuple[NicPort, ...] = (), w: int = 1) -> NodeLinks:
    return NodeLinks(rank, f"host-{'abcd'[rank]}", (ADDRESSES[rank],), w, tuple(paths), nics)


def slow_path(peer: str) -> PeerPath:
    return path(peer, rtt_ms=420, rate=0.06 * MB, retransmits=31, share=0.04)


def job(nodes: int, slow: set[frozenset[int]], collector: Collection[int] = ()) -> list[NodeLinks]:
    """``nodes`` nodes, each with a path to every other and to the collector; the paths between
    the pairs in ``slow`` are slow, and the collector paths of the nodes in ``collector``."""
    return [
        node(
            i,
            [
                slow_path(ADDRESSES[j]) if frozenset((i, j)) in slow else path(ADDRESSES[j])
                for j in range(nodes)
                if j != i
            ]
            + [slow_path(COLLECTOR) if i in collector else path(COLLECTOR)],
        )
        for i in range(nodes)
    ]


def twice(watch: LinkWatch, nodes: list[NodeLinks]) -> LinkReport | None:
    """The second of two windows alike (a finding is reported once it held two)."""
    assert watch.close_window(nodes) is None
    return watch.close_window(nodes)


# --- the matrix -----------------------------------------------------------------------------


def test_two_nodes_node_1_slow_its_collector_path_tells() -> None:
    """Node 1's link slow: its paths to node 0 and to the collector are slow, node 0's to node 1
    too, node 0's to the collector not: node 1 is named, with its address as node 0 sees it."""
    report = twice(LinkWatch(), job(2, {frozenset((0, 1))}, collector={1}))
    assert report is not None and report.scope == "node" and report.transport == "tcp"
    assert [(n.host, n.node_rank, n.addresses) for n in report.nodes] == [
        ("host-b", 1, ("10.1.0.12",))
    ]
    assert report.windows == 2
    assert report.rtt_s == pytest.approx(0.42) and report.rtt_others_s == pytest.approx(0.0001)
    attrs = link_attributes(report)
    assert attrs[A.LINK_NODES] == ("host-b",) and attrs[A.LINK_NODE_RANK] == (1,)
    assert attrs[A.LINK_RATE] == pytest.approx(60_000) and attrs[A.LINK_RATE_OTHERS] == 110e6
    evidence = attrs[A.LINK_EVIDENCE]
    assert isinstance(evidence, tuple) and len(evidence) == 3
    assert (
        "host-b → 10.9.0.5 (outside the job): RTT 420 ms (min 0.05 ms), delivers 0.06 MB/s,"
        " 31 retransmits/s (4.0 % of bytes), 2 connections"
    ) in evidence
    assert describe_link(attrs) == (
        "host-b (node rank 1, 10.1.0.12) has the slow link: its connections to every peer"
        " deliver 0.06 MB/s (the others 110 MB/s), RTT 420 ms (0.1 ms), 31 retransmits a"
        " second (0)"
    )


def test_two_nodes_node_0_slow() -> None:
    report = twice(LinkWatch(), job(2, {frozenset((0, 1))}, collector={0}))
    assert report is not None and report.scope == "node"
    assert [n.node_rank for n in report.nodes] == [0]


def test_two_nodes_without_an_outside_peer_every_link_is_slow() -> None:
    """Two nodes and no third path to compare with: the one link there is, is every link."""
    nodes = [node(0, [slow_path(ADDRESSES[1])]), node(1, [slow_path(ADDRESSES[0])])]
    report = twice(LinkWatch(), nodes)
    assert report is not None and report.scope == "fabric" and report.nodes == ()


def test_one_link_slow_among_three_nodes() -> None:
    report = twice(LinkWatch(), job(3, {frozenset((0, 2))}))
    assert report is not None and report.scope == "link"
    assert [n.host for n in report.nodes] == ["host-a", "host-c"]
    text = describe_link(link_attributes(report))
    assert text.startswith(
        "the link between host-a (node rank 0, 10.1.0.11) and host-c (node rank 2, 10.1.0.13)"
        " is slow: its connections deliver 0.06 MB/s (the others 110 MB/s), RTT 420 ms"
    )


def test_every_link_slow_is_the_fabric() -> None:
    every = {frozenset((i, j)) for i in range(3) for j in range(3) if i != j}
    report = twice(LinkWatch(), job(3, every, collector={0, 1, 2}))
    assert report is not None and report.scope == "fabric"
    assert describe_link(link_attributes(report)) == (
        "every link of the job is slow: its connections deliver 0.06 MB/s, RTT 420 ms,"
        " 31 retransmits a second"
    )


def test_every_link_between_the_nodes_slow_is_the_fabric() -> None:
    """A switch between the job's nodes: their paths to the collector (another network) stay
    good, and no node has all its paths bad."""
    every = {frozenset((i, j)) for i in range(3) for j in range(3) if i != j}
    report = twice(LinkWatch(), job(3, every))
    assert report is not None and report.scope == "fabric"
    assert report.rtt_others_s == pytest.approx(0.0001)


def test_a_node_slow_among_four() -> None:
    slow = {frozenset((2, j)) for j in range(4) if j != 2}
    report = twice(LinkWatch(), job(4, slow, collector={2}))
    assert report is not None and report.scope == "node"
    assert [n.node_rank for n in report.nodes] == [2]


def test_a_finding_is_reported_from_its_second_window_in_a_row() -> None:
    watch = LinkWatch()
    slow = job(3, {frozenset((0, 1))})
    assert watch.close_window(slow) is None
    assert watch.close_window(job(3, set())) is None  # healthy again: the streak ends
    assert watch.close_window(slow) is None
    report = watch.close_window(slow)
    assert report is not None and report.scope == "link" and report.windows == 2
    again = watch.close_window(slow)  # every window while it holds
    assert again is not None and again.windows == 3


def test_no_fault_names_nothing() -> None:
    watch = LinkWatch()
    for _ in range(12):
        assert watch.close_window(job(3, set())) is None


def test_noisy_but_healthy_numbers_name_nothing() -> None:
    """What a busy healthy job's paths show (measured on veth links between namespaces under a
    gloo all-reduce): RTT from 0.1 to 2 ms, a collector path's 5 to 17 ms of delayed ACKs,
    delivery rates swinging 8-fold, a few dozen spurious retransmits a second."""
    rng = random.Random(46)
    watch = LinkWatch()

    def noisy(peer: str) -> PeerPath:
        if peer == COLLECTOR:
            return path(peer, rng.uniform(5, 17), rng.uniform(0.1, 1) * MB, busy=False)
        retransmits = rng.choice([0, 0, 1, 3, 24, 44])
        return path(peer, rng.uniform(0.1, 2.0), rng.uniform(750, 7000) * MB, retransmits, 0.0005)

    for w in range(40):
        nodes = [
            node(i, [noisy(ADDRESSES[j]) for j in range(3) if j != i] + [noisy(COLLECTOR)], w=w)
            for i in range(3)
        ]
        assert watch.close_window(nodes) is None, w


def test_a_path_s_own_history_is_its_reference() -> None:
    """A slowdown that does not reach the others' paths' RTT four-fold (a rate-limited veth:
    0.3 → 6 ms) is still one against the path's usual RTT; a collector path that is always
    slower (delayed ACKs) is its usual self."""
    watch = LinkWatch()

    def window(slow: bool) -> list[NodeLinks]:
        rtt = {frozenset((0, 1)): 6.0 if slow else 0.3}
        return [
            node(
                i,
                [path(ADDRESSES[j], rtt.get(frozenset((i, j)), 0.3)) for j in range(3) if j != i]
                + [path(COLLECTOR, 10.0, 0.2 * MB, busy=False)],
            )
            for i in range(3)
        ]

    for _ in range(4):
        assert watch.close_window(window(False)) is None
    assert watch.close_window(window(True)) is None
    report = watch.close_window(window(True))
    assert report is not None and report.scope == "link"
    assert [n.node_rank for n in report.nodes] == [0, 1]
    assert "RTT 6.0 ms (usually 0.3 ms)" in link_attributes(report)[A.LINK_EVIDENCE][0]


def test_a_lossy_path_is_slow() -> None:
    def window(lossy: bool) -> list[NodeLinks]:
        bad = path(ADDRESSES[1], retransmits=400, share=0.03)
        return [
            node(0, [bad if lossy else path(ADDRESSES[1], retransmits=3), path(ADDRESSES[2])]),
            node(1, [path(ADDRESSES[0], retransmits=2), path(ADDRESSES[2])]),
            node(2, [path(ADDRESSES[0]), path(ADDRESSES[1])]),
        ]

    assert twice(LinkWatch(), window(False)) is None
    report = twice(LinkWatch(), window(True))
    assert report is not None and report.scope == "link"
    assert report.retransmits_s == 400


def test_too_little_evidence_names_nothing() -> None:
    """One node with data, or paths that sent nothing in the window (their RTT is not of it)."""
    watch = LinkWatch()
    alone = job(2, {frozenset((0, 1))}, collector={0, 1})[:1]
    assert watch.close_window(alone) is None and watch.close_window(alone) is None
    idle = [
        NodeLinks(n.node_rank, n.host, n.addresses, 1, tuple(_idle(p) for p in n.peers), ())
        for n in job(2, {frozenset((0, 1))}, collector={1})
    ]
    assert watch.close_window(idle) is None and watch.close_window(idle) is None


def _idle(p: PeerPath) -> PeerPath:
    return replace(p, sending=0, retransmits_s=0.0, retransmit_share=0.0, bytes_s=0.0)


def test_an_address_two_nodes_claim_is_no_column_and_a_node_s_own_is_none() -> None:
    """Containers behind one NAT address, a connection to the node's own address: neither
    says which node a path goes to."""
    nodes = job(2, {frozenset((0, 1))}, collector={1})
    shared = [
        replace(
            n,
            addresses=(*n.addresses, "172.17.0.2"),
            peers=(*n.peers, slow_path("172.17.0.2"), slow_path(n.addresses[0])),
        )
        for n in nodes
    ]
    report = twice(LinkWatch(), shared)
    assert report is not None and report.scope == "node"
    assert [n.node_rank for n in report.nodes] == [1]


# --- a node's own evidence ---------------------------------------------------------------------


def test_local_evidence_is_the_node_s_worst_path() -> None:
    mine = job(2, {frozenset((0, 1))}, collector={1})[1]
    attrs = local_evidence(mine)
    assert attrs[A.LINK_SCOPE] == "local" and attrs[A.LINK_TRANSPORT] == "tcp"
    assert attrs[A.LINK_PEER] in (ADDRESSES[0], COLLECTOR)
    assert attrs[A.LINK_RTT] == pytest.approx(0.42) and attrs[A.LINK_RTT_OTHERS] == 0.42
    assert attrs[A.LINK_NODES] == ("host-b",) and attrs[A.LINK_NODE_RANK] == (1,)
    assert describe_link(attrs).startswith(
        f"this node's slowest path goes to {attrs[A.LINK_PEER]}: it delivers 0.06 MB/s (its"
        " other paths 0.06 MB/s), RTT 420 ms (420 ms), 31 retransmits a second (31)"
    )
    assert local_evidence(NodeLinks(0, "h", (), 1, (), ())) == {}


# --- summaries of the kernel's connections ----------------------------------------------------


def conn(inode: int, peer: str = "10.1.0.12", **kw: int) -> TcpConnection:
    values = dict(
        srtt_us=400,
        min_rtt_us=50,
        rttvar_us=100,
        total_retrans=0,
        lost=0,
        delivery_rate=int(100 * MB),
        bytes_acked=0,
        bytes_received=0,
        bytes_sent=0,
        bytes_retrans=0,
        busy_time_us=0,
    )
    values.update(kw)
    app_limited = bool(values.pop("app_limited", 0))
    return TcpConnection("10.1.0.11", peer, 29500, inode, app_limited=app_limited, **values)


def test_summarize_takes_each_connection_s_deltas() -> None:
    before = {1: conn(1, bytes_acked=1000, bytes_sent=1000, total_retrans=5)}
    now = [
        conn(1, bytes_acked=3000, bytes_sent=3200, bytes_retrans=200, total_retrans=9),
        conn(2, srtt_us=800, bytes_received=4000, delivery_rate=1000, app_limited=1),
        conn(3, peer="10.1.0.13", srtt_us=9000, bytes_acked=500, bytes_sent=500),
    ]
    a, b = summarize(before, now, 2.0)
    assert (a.peer, b.peer) == ("10.1.0.13", "10.1.0.12")  # the worst RTT first
    assert a.bytes_s == 250 and a.sending == 1  # new in the window: counted from zero
    assert b.connections == 2 and b.sending == 1
    assert b.srtt_s == 400e-6  # the connection that sent (the other's RTT is of another time)
    assert b.retransmits_s == 2 and b.retransmit_share == pytest.approx(200 / 2200)
    assert b.bytes_s == (2000 + 4000) / 2
    assert b.delivery_rate == 100 * MB and b.busy  # the app-limited connection left out
    assert b.min_rtt_s == 50e-6


def test_summarize_without_a_previous_reading_has_no_rates() -> None:
    (p,) = summarize(None, [conn(1, bytes_acked=10**9, total_retrans=50)], 2.0)
    assert p.bytes_s == 0 and p.retransmits_s == 0 and p.sending == 0 and p.srtt_s == 400e-6


def test_a_reused_inode_or_a_counter_gone_back_is_a_new_connection() -> None:
    before = {1: conn(1, peer="10.1.0.13", bytes_acked=10**6), 2: conn(2, bytes_acked=10**6)}
    now = [conn(1, bytes_acked=100), conn(2, bytes_acked=50)]
    (p,) = summarize(before, now, 1.0)
    assert p.bytes_s == 150


def test_summarize_keeps_the_worst_peers() -> None:
    now = [conn(i, peer=f"10.2.{i // 250}.{i % 250}", srtt_us=i + 1) for i in range(100)]
    paths = summarize(None, now, 1.0)
    assert len(paths) == MAX_PEERS and paths[0].srtt_s == 100e-6 and paths[-1].srtt_s == 37e-6
    value = node_links(0, "h", 1, now, paths, ())
    assert value.addresses == ("10.1.0.11",) and len(value.peers) == MAX_PEERS


# --- the value in the store -------------------------------------------------------------------


def test_encode_decode_round_trip_and_size() -> None:
    nic = NicPort(
        "mlx5_0",
        1,
        "100 Gb/sec (4X EDR)",
        "4: ACTIVE",
        "5: LinkUp",
        (("symbol_error", 3),),
        1.5e9,
        False,
        False,
    )
    peers = tuple(path(f"10.2.0.{i}", rtt_ms=1 + i / 7, rate=3.25e8) for i in range(MAX_PEERS))
    value = NodeLinks(3, "host-d", ("10.1.0.14", "fd00::4"), 17, peers, (nic,) * 8)
    data = encode(value)
    assert len(data) < 16 * 1024  # 64 peers, 8 ports
    back = decode(data)
    assert back is not None and back.window == 17 and back.nics == value.nics
    assert back.addresses == value.addresses and len(back.peers) == MAX_PEERS
    for got, sent in zip(back.peers, value.peers, strict=True):
        assert got.peer == sent.peer and got.busy == sent.busy
        assert got.srtt_s == pytest.approx(sent.srtt_s, abs=1e-6)


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.update(w="x"),
        lambda b: b.pop("p"),
        lambda b: b["p"][0].__setitem__(3, -1.0),
        lambda b: b["p"][0].__setitem__(8, float("nan")),
        lambda b: b["p"][0].__setitem__(8, float("inf")),
        lambda b: b["p"][0].pop(),
        lambda b: b["i"][0].__setitem__(5, [["symbol_error", -3]]),
        lambda b: b["i"][0].__setitem__(6, "fast"),
        lambda b: b.update(p=[b["p"][0]] * (MAX_PEERS + 1)),
        lambda b: b.update(h=None, n=[1]),
    ],
)
def test_decode_rejects_malformed_values(change: Callable[[dict], object]) -> None:
    nic = NicPort("mlx5_0", 1, "", "", "", (("symbol_error", 3),), 0.0, False, False)
    body = json.loads(encode(NodeLinks(0, "h", ("10.0.0.1",), 1, (path("10.0.0.2"),), (nic,))))
    change(body)
    assert decode(json.dumps(body).encode()) is None


def test_decode_rejects_what_is_not_a_value() -> None:
    assert decode(None) is None and decode("{}") is None and decode(b"\xff") is None
    assert decode(b"[]") is None and decode(b" " * (MAX_VALUE_BYTES + 1)) is None


# --- RDMA ports in sysfs ----------------------------------------------------------------------


def lay_port(
    root: Path,
    device: str,
    port: int,
    counters: dict[str, int],
    state: str = "4: ACTIVE",
    phys: str = "5: LinkUp",
    rate: str = "200 Gb/sec (4X HDR)",
    hw: dict[str, int] | None = None,
) -> None:
    """A port as the kernel lays it out under /sys/class/infiniband (files end in a newline)."""
    base = root / device / "ports" / str(port)
    for sub, values in (("counters", counters), ("hw_counters", hw or {})):
        (base / sub).mkdir(parents=True, exist_ok=True)
        for name, value in values.items():
            (base / sub / name).write_text(f"{value}\n")
    for name, text in (("rate", rate), ("state", state), ("phys_state", phys)):
        (base / name).write_text(text + "\n")
    (base / "link_layer").write_text("InfiniBand\n")


HEALTHY = {
    "symbol_error": 0,
    "link_error_recovery": 0,
    "link_downed": 0,
    "port_rcv_errors": 0,
    "port_xmit_discards": 0,
    "local_link_integrity_errors": 0,
    "port_xmit_wait": 0,
    "port_xmit_data": 0,
    "port_rcv_data": 0,
}


def tree(root: Path, moved: int, errors: dict[str, int] | None = None, **port0: str) -> Path:
    """Two devices of one port each; ``moved`` 4-octet units sent and received so far; mlx5_0's
    own error counters so far and its state, physical state or rate (``port0``)."""
    data = {"port_xmit_data": moved, "port_rcv_data": moved}
    lay_port(root, "mlx5_0", 1, {**HEALTHY, **data, **(errors or {})}, **port0)
    lay_port(root, "mlx5_1", 1, {**HEALTHY, **data}, hw={"out_of_sequence": 0, "lifespan": 10})
    return root


def test_read_ports_reads_every_counter(tmp_path: Path) -> None:
    root = tree(tmp_path / "a", 5, {"VL15_dropped": 2})
    (root / "mlx5_0" / "ports" / "1" / "counters" / "unicast_rcv_packets").write_text(
        "N/A (no PMA)\n"
    )
    (root / "mlx5_0" / "ports" / "1" / "hw_counters" / "symbol_error").write_text("8\n")
    a, b = read_ports(str(root))
    assert (a.device, a.port, a.rate, a.state, a.phys_state) == (
        "mlx5_0",
        1,
        "200 Gb/sec (4X HDR)",
        "4: ACTIVE",
        "5: LinkUp",
    )
    assert a.counters["VL15_dropped"] == 2 and a.counters["port_xmit_data"] == 5
    assert a.counters["hw_counters/symbol_error"] == 8 and "unicast_rcv_packets" not in a.counters
    assert b.counters["out_of_sequence"] == 0 and "lifespan" not in b.counters
    assert read_ports(str(tmp_path / "none")) == ()


def test_deltas_of_a_counter_reset_count_its_new_value(tmp_path: Path) -> None:
    before = read_ports(str(tree(tmp_path / "a", 1000, {"symbol_error": 50})))
    after = read_ports(str(tree(tmp_path / "b", 1500, {"symbol_error": 7})))
    d = deltas(before, after)[0]
    assert d.counters["symbol_error"] == 7 and d.reset == ("symbol_error",)
    assert d.data_bytes == 2 * 500 * 4 and d.errors == {"symbol_error": 7}


def nodes_with_ports(ports: dict[int, tuple[NicPort, ...]]) -> list[NodeLinks]:
    """Two healthy nodes over TCP, with these RDMA ports."""
    return [replace(n, nics=ports[n.node_rank]) for n in job(2, set())]


def test_a_healthy_fabric_names_no_port(tmp_path: Path) -> None:
    watch = LinkWatch()
    for w in range(3):
        ports = {
            r: nic_ports(
                read_ports(str(tree(tmp_path / f"{r}-{w}", w * 10**9))),
                read_ports(str(tree(tmp_path / f"{r}-{w}b", (w + 1) * 10**9))),
                2.0,
            )
            for r in (0, 1)
        }
        assert ports[0][0].bytes_s == 4e9 and ports[0][0].errors == ()
        assert watch.close_window(nodes_with_ports(ports)) is None


def test_a_flapping_cable_is_named(tmp_path: Path) -> None:
    """Node 1's mlx5_0 port 1: symbol errors and link recoveries rise, the link goes down once
    (``1: DOWN``, ``2: Polling``) and comes back; node 0's same port is healthy."""
    down = {"state": "1: DOWN", "phys": "2: Polling"}
    readings = {0: [], 1: []}
    for i, (errors, state) in enumerate(
        [
            ({}, {}),
            ({"symbol_error": 1204, "link_error_recovery": 17, "link_downed": 1}, down),
            ({"symbol_error": 1380, "link_error_recovery": 19, "link_downed": 3}, {}),
        ]
    ):
        readings[0].append(read_ports(str(tree(tmp_path / f"0-{i}", i * 10**8))))
        readings[1].append(read_ports(str(tree(tmp_path / f"1-{i}", i * 10**8, errors, **state))))
    watch = LinkWatch()
    reports = []
    for w in (1, 2):
        ports = {r: nic_ports(readings[r][w - 1], readings[r][w], 2.0) for r in (0, 1)}
        reports.append(watch.close_window(nodes_with_ports(ports)))
    assert reports[0] is None
    report = reports[1]
    assert report is not None and report.scope == "nic" and report.transport == "rdma"
    attrs = link_attributes(report)
    assert attrs[A.LINK_DEVICE] == "mlx5_0/1" and attrs[A.LINK_NODES] == ("host-b",)
    assert attrs[A.LINK_RDMA_STATE] == "4: ACTIVE / 5: LinkUp"
    assert attrs[A.LINK_RDMA_COUNTERS] == (
        "link_downed=2",
        "link_error_recovery=2",
        "symbol_error=176",
    )
    assert describe_link(attrs).startswith(
        "mlx5_0 port 1 of host-b (node rank 1, 10.1.0.12): link_downed +2,"
        " link_error_recovery +2, symbol_error +176 over the window; state 4: ACTIVE /"
        " 5: LinkUp, rate 200 Gb/sec (4X HDR)"
    )
    went_down = nic_ports(readings[1][0], readings[1][1], 2.0)[0]
    assert went_down.changed and went_down.state == "1: DOWN"
    assert dict(went_down.errors) == {
        "link_downed": 1,
        "link_error_recovery": 17,
        "symbol_error": 1204,
    }
    own = local_evidence(nodes_with_ports({0: (), 1: (went_down,)})[1])
    assert "1: DOWN / 2: Polling" in own[A.LINK_EVIDENCE][-1]
    rdma_only = local_evidence(NodeLinks(1, "host-b", (), 1, (), (went_down,)))
    assert rdma_only[A.LINK_TRANSPORT] == "rdma"
    assert describe_link(rdma_only) == (
        "mlx5_0 port 1 of this node: link_downed +1, link_error_recovery +17, symbol_error"
        " +1,204 over the window; state 1: DOWN / 2: Polling, rate 200 Gb/sec (4X HDR)"
    )


def test_a_port_fallen_to_a_lower_rate_or_lagging_is_named(tmp_path: Path) -> None:
    def ports(rank: int, rate: str, moved: int) -> tuple[NicPort, ...]:
        before = read_ports(str(tree(tmp_path / f"{rank}a", 0, rate=rate)))
        return nic_ports(before, read_ports(str(tree(tmp_path / f"{rank}b", moved, rate=rate))), 1)

    fast, slow = "200 Gb/sec (4X HDR)", "50 Gb/sec (1X HDR)"
    report = twice(
        LinkWatch(), nodes_with_ports({0: ports(0, fast, 10**9), 1: ports(1, slow, 10**9)})
    )
    assert report is not None and report.scope == "nic" and report.device == "mlx5_0/1"
    assert "rate 50 Gb/sec (1X HDR) (the others 200 Gb/sec)" in report.evidence[0]
    lagging = nodes_with_ports({0: ports(0, fast, 10**9), 1: ports(1, fast, 10**6)})
    report = twice(LinkWatch(), lagging)
    assert report is not None and report.nodes[0].node_rank == 1
    assert "moves 8.0 MB/s (the others 8,000 MB/s)" in report.evidence[0]


# --- the kernel's TCP statistics ---------------------------------------------------------------


@pytest.fixture
def loopback_pair() -> Iterator[tuple[socket.socket, socket.socket, int]]:
    """A connected pair over 127.0.0.1 that has moved 4 MB from the client to the server."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    sender = threading.Thread(target=client.sendall, args=(b"x" * (4 << 20),))
    sender.start()
    got = 0
    while got < 4 << 20:
        got += len(accepted.recv(1 << 20))
    sender.join()
    yield client, accepted, server.getsockname()[1]
    for s in (client, accepted, server):
        s.close()


def test_kernel_read_of_a_loopback_connection(
    loopback_pair: tuple[socket.socket, socket.socket, int],
) -> None:
    client, accepted, port = loopback_pair
    inodes = socket_inodes([os.getpid()])
    mine = {os.fstat(client.fileno()).st_ino, os.fstat(accepted.fileno()).st_ino}
    assert mine <= inodes
    assert read_connections(mine) == []  # loopback never crosses a link
    client_ino = os.fstat(client.fileno()).st_ino
    (c,) = read_connections({client_ino}, keep_loopback=True)
    assert (c.local, c.peer, c.peer_port, c.inode) == ("127.0.0.1", "127.0.0.1", port, client_ino)
    assert c.bytes_acked >= 4 << 20 and c.bytes_sent >= 4 << 20 and c.bytes_received == 0
    assert 0 < c.min_rtt_us <= 100_000 and 0 < c.srtt_us < 1_000_000 and c.delivery_rate > 0
    both = read_connections(mine, keep_loopback=True)
    server_side = next(x for x in both if x.inode != client_ino)
    assert server_side.bytes_received >= 4 << 20 and server_side.peer_port != port
    (p,) = summarize(None, both, 1.0)
    assert p.connections == 2


def test_a_dual_stack_socket_s_ipv4_peer_is_read_as_ipv4() -> None:
    """An IPv6 server socket accepting an IPv4 client sees it as ``::ffff:127.0.0.1``: read as
    ``127.0.0.1``, and so as loopback."""
    try:
        server = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    except (OSError, ValueError):
        pytest.skip("no dual-stack IPv6 here")
    with server, socket.create_connection(("127.0.0.1", server.getsockname()[1])) as client:
        accepted, _ = server.accept()
        with accepted:
            client.sendall(b"x" * 1000)
            accepted.recv(1000)
            inode = os.fstat(accepted.fileno()).st_ino
            assert read_connections({inode}) == []
            (c,) = read_connections({inode}, keep_loopback=True)
    assert (c.peer, c.local) == ("127.0.0.1", "127.0.0.1") and c.bytes_received == 1000


def test_socket_inodes_of_processes_gone_or_unknown() -> None:
    assert socket_inodes([2**22 + 12345, -1]) == set()
    assert read_connections(set()) == []


NS_SERVER = """
import socket
conn, _ = socket.create_server(("10.251.7.1", 29599)).accept()
while conn.recv(1 << 16):
    conn.sendall(b"y" * 4096)
"""
NS_CLIENT = """
import dataclasses, json, os, socket, threading, time
from elastic_otel.integration.tcp_sockets import read_connections, socket_inodes
for _ in range(100):  # until the server listens
    try:
        s = socket.create_connection(("10.251.7.1", 29599))
        break
    except OSError:
        time.sleep(0.05)
threading.Thread(target=s.sendall, args=(b"x" * (4 << 20),), daemon=True).start()
time.sleep(1.0)  # 4 MiB take 4 s at 8 Mbit/s: read while the link's queue is full
found = read_connections(socket_inodes([os.getpid()]))
print(json.dumps([dataclasses.asdict(c) for c in found]), flush=True)
os._exit(0)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="network namespaces need root, ip and tc",
)
def test_kernel_read_across_a_veth_pair() -> None:
    """Two network namespaces joined by a veth pair, the client's end rate-limited (tc tbf at
    8 Mbit/s): the client's connection, read while its send waits in the link's queue, has the
    server's address and the RTT of that queue. (Read after the send, the RTT is the one of the
    last acknowledgements, which may come after the queue drained: tens of microseconds.)"""
    tag = f"eotl{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"

    def run(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)

    try:
        try:
            run("ip", "netns", "add", a)
        except subprocess.CalledProcessError as e:  # root without CAP_SYS_ADMIN, say
            pytest.skip(f"no network namespaces here: {e.stderr.strip()}")
        run("ip", "netns", "add", b)
        run("ip", "link", "add", f"{tag}x", "netns", a, "type", "veth", "peer", f"{tag}y",
            "netns", b)  # fmt: skip
        for ns, dev, address in ((a, f"{tag}x", "10.251.7.1"), (b, f"{tag}y", "10.251.7.2")):
            run("ip", "-n", ns, "addr", "add", f"{address}/30", "dev", dev)
            run("ip", "-n", ns, "link", "set", dev, "up")
        tbf = ("tbf", "rate", "8mbit", "burst", "16kb", "latency", "400ms")
        run("tc", "-n", b, "qdisc", "add", "dev", f"{tag}y", "root", *tbf)
        server = subprocess.Popen(
            ["ip", "netns", "exec", a, sys.executable, "-c", NS_SERVER],
            stderr=subprocess.DEVNULL,  # the client's end resets it
        )
        try:
            done = subprocess.run(
                ["ip", "netns", "exec", b, sys.executable, "-c", NS_CLIENT],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=Path(__file__).parents[2],
            )
        finally:
            server.kill()
            server.wait()
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    (fields,) = json.loads(done.stdout)
    connection = TcpConnection(**fields)
    assert connection.peer == "10.251.7.1" and connection.local == "10.251.7.2"
    assert connection.peer_port == 29599 and 0 < connection.bytes_acked < 4 << 20
    assert connection.bytes_received > 0
    assert connection.srtt_us >= 5_000  # the link's queue: 16 KiB alone take 16 ms
