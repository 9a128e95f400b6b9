"""Slow point-to-point edges (elastic_otel.model.p2p_edges): a pipeline's sends and receives, as
NCCL's Flight Recorder times them, read by the worker's own reader from the H100's record with
send and receive entries added as torch's ProcessGroupNCCL names them, then merged per edge
and compared on node 0: a slow link, node or fabric named, a late peer or noise never."""

from __future__ import annotations

import copy
import json
import os
import random
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from elastic_otel.integration.link_stats import LinkStats
from elastic_otel.integration.straggler_exchange import StragglerExchange
from elastic_otel.model.link_records import describe_link, link_attributes, local_evidence
from elastic_otel.model.links import LinkWatch, NodeLinks, decode, encode
from elastic_otel.model.p2p_edges import Edge, EdgeNode, EdgeWatch, node_edges
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import (
    RECV,
    SEND,
    PeerTransfers,
    entry_bytes,
    p2p_peer,
    parse_collectives,
    read_collectives,
)
from tests.support.recorded_nccl import recorded, watch_of

GB = 1e9
MB = 1e6


# --- the worker's side ----------------------------------------------------------------------


def test_torch_s_send_and_receive_names_give_the_peer() -> None:
    # ProcessGroupNCCL::send / ::recv: c10::str("nccl:send ", rank_, "->", dstRank) and
    # c10::str("nccl:recv ", rank_, "<-", srcRank): the peer is the group rank after the arrow.
    assert p2p_peer("nccl:send 0->1") == (SEND, 1)
    assert p2p_peer("nccl:recv 3<-12") == (RECV, 12)
    for other in ("nccl:all_reduce", "nccl:coalesced", "nccl:send", "nccl:send 0->x", ""):
        assert p2p_peer(other) is None


def test_entry_bytes_from_sizes_and_dtypes() -> None:
    assert entry_bytes({"input_sizes": [[1024, 1024]], "input_dtypes": ["Float"]}) == 4 << 20
    assert entry_bytes({"input_sizes": [[8, 4], [2]], "input_dtypes": ["BFloat16", "Long"]}) == 80
    assert entry_bytes({"input_sizes": [[]], "input_dtypes": ["Double"]}) == 8  # a scalar
    assert entry_bytes({"input_sizes": [[4]], "input_dtypes": ["Quantum"]}) is None
    assert entry_bytes({"input_sizes": [[4]], "input_dtypes": []}) is None
    assert entry_bytes({}) is None


def p2p_entry(
    base: dict[str, Any], name: str, seq: int, ms: float | None, numel: int = 1 << 20
) -> dict[str, Any]:
    """An entry shaped as NCCL's for a send or receive: the H100's first entry, renamed, its
    p2p sequence number counted, its collective number left as the group's last."""
    entry = copy.deepcopy(base)
    entry.update(
        profiling_name=name,
        is_p2p=True,
        p2p_seq_id=seq,
        input_sizes=[[numel]],
        input_dtypes=["BFloat16"],
        output_sizes=[[numel]],
        output_dtypes=["BFloat16"],
        duration_ms=ms,
        state="completed" if ms is not None else "scheduled",
    )
    return entry


def test_the_worker_leaves_each_peer_s_timed_transfers(tmp_path: Path) -> None:
    """Sends to rank 1 and receives from rank 1 in the default group, through the worker's
    reader: per op and peer, their count, bytes, device time and the fastest one's speed; a
    transfer not yet completed (no duration) is left for a later window; none is an arrival."""
    record = recorded("nccl_completed.json")
    plain = watch_of(copy.deepcopy(record), tmp_path / "plain")
    (tmp_path / "plain").mkdir()
    plain.window_ns = 1
    plain.poll(time.time_ns())
    base = next(e for e in record["entries"] if e["process_group"][0] == "0")
    last = max(e["collective_seq_id"] for e in record["entries"] if e["process_group"][0] == "0")
    base = {**base, "collective_seq_id": last}
    record["entries"] += [
        p2p_entry(base, "nccl:send 0->1", 1, 0.5),  # 2 MiB in 0.5 ms: 4.19 GB/s
        p2p_entry(base, "nccl:recv 0<-1", 2, 2.0),  # waited for its peer
        p2p_entry(base, "nccl:send 0->1", 3, 0.25),  # the fastest: 8.39 GB/s
        p2p_entry(base, "nccl:recv 0<-1", 4, None),  # enqueued, not completed
    ]
    watch = watch_of(record, tmp_path)
    watch.window_ns = 1
    watch.poll(time.time_ns())
    read = read_collectives(str(tmp_path))
    assert read is not None
    size = 2 << 20
    assert set(read.transfers) == {
        PeerTransfers("nccl:0", RECV, 1, 1, size, 2_000_000, round(size / 2e-3)),
        PeerTransfers("nccl:0", SEND, 1, 2, 2 * size, 750_000, round(size / 0.25e-3)),
    }
    unread = read_collectives(str(tmp_path / "plain"))
    assert unread is not None and read.arrivals == unread.arrivals  # sends are no collectives
    record["entries"][-1].update(state="completed", duration_ms=1.0)
    time.sleep(0.001)
    watch.poll(time.time_ns())
    read = read_collectives(str(tmp_path))
    assert read is not None  # the next window: only what completed since
    assert read.transfers == (PeerTransfers("nccl:0", RECV, 1, 1, size, 1_000_000, size * 1e3),)


def test_transfers_in_the_file_are_checked() -> None:
    data = {"pid": 1, "progress_ns": 0, "groups": [], "dumps": 0}
    row = ["nccl:0", "send", 1, 2, 4096, 1000, 4.1e9]
    parsed = parse_collectives({**data, "transfers": [row]})
    assert parsed is not None
    assert parsed.transfers == (PeerTransfers("nccl:0", SEND, 1, 2, 4096, 1000, 4.1e9),)
    assert parse_collectives(data) is not None  # an older file
    for bad in (["nccl:0", "put", 1, 2, 4096, 1000, 1.0], [*row[:3], -2, *row[4:]], row[:6]):
        assert parse_collectives({**data, "transfers": [bad]}) is None
    assert parse_collectives({**data, "transfers": [[*row[:6], float("nan")]]}) is None
    assert parse_collectives({**data, "transfers": {"x": 1}}) is None


def test_a_node_s_edges_merge_both_sides_and_keep_the_faster() -> None:
    """Rank 1 sends to rank 2 on the same node: its send and rank 2's receive are one edge,
    as fast as the side that waited less; rank 2's send to rank 5 is another edge."""
    edges = node_edges(
        [
            (1, [PeerTransfers("nccl:3", SEND, 2, 4, 4 * MB, 9_000, 2 * GB)]),
            (2, [PeerTransfers("nccl:3", RECV, 1, 4, 4 * MB, 5_000, 3 * GB)]),
            (2, [PeerTransfers("nccl:4", SEND, 5, 4, 4 * MB, 8_000, 1 * GB)]),
        ]
    )
    assert edges == (Edge(2, 5, 4, 4 * MB, 1 * GB), Edge(1, 2, 4, 4 * MB, 3 * GB))


# --- node 0: the comparison -----------------------------------------------------------------

PIPE = [(0, 1), (1, 2), (2, 3), (1, 0), (2, 1), (3, 2)]
"""A pipeline of four stages, one rank a node: activations forward, gradients back."""


def window(rates: dict[tuple[int, int], float], noise: random.Random | None = None) -> dict:
    """Four nodes, each with the edges it sends or receives on, at ``rates`` (10 GB/s by
    default, within 2x noise)."""
    nodes = {}
    for n in range(4):
        edges = []
        for src, dst in PIPE:
            if n in (src, dst):
                rate = rates.get((src, dst), 10 * GB)
                rate *= noise.uniform(0.5, 1.0) if noise else 1.0
                edges.append(Edge(src, dst, 8, 8 * 64 * MB, rate))
        nodes[n] = EdgeNode(f"host-{'abcd'[n]}", (n,), tuple(edges))
    return nodes


def settled(noise: random.Random | None = None) -> EdgeWatch:
    watch = EdgeWatch()
    for _ in range(4):
        assert watch.close_window(window({}, noise)) is None
    return watch


def test_one_link_s_edges_slow_name_the_link() -> None:
    watch = settled()
    found = watch.close_window(window({(1, 2): 0.4 * GB, (2, 1): 0.5 * GB}))
    assert found is not None and found.scope == "link" and found.node_ranks == (1, 2)
    assert found.rate == pytest.approx(0.45 * GB) and found.rate_others == pytest.approx(10 * GB)
    assert found.evidence[0] == (
        "host-b → host-c rank 1 → rank 2: 0.4 GB/s at best over 8 transfers of 64 MB"
        " (usually 10 GB/s)"
    )


def test_every_edge_of_a_node_slow_names_the_node() -> None:
    slow = {e: 0.3 * GB for e in PIPE if 2 in e}
    found = settled().close_window(window(slow))
    assert found is not None and found.scope == "node" and found.node_ranks == (2,)


def test_every_edge_slow_is_the_fabric() -> None:
    found = settled().close_window(window({e: 0.3 * GB for e in PIPE}))
    assert found is not None and found.scope == "fabric" and found.node_ranks == ()


def test_without_history_an_edge_far_under_the_others_is_slow() -> None:
    found = EdgeWatch().close_window(window({(2, 3): 0.2 * GB, (3, 2): 0.2 * GB}))
    assert found is not None and found.scope == "link" and found.node_ranks == (2, 3)


def test_noise_late_peers_and_edges_within_a_node_name_nothing() -> None:
    """Healthy edges swing 2x from window to window; a late stage makes its peers' transfers
    wait (their total device time grows) but not their fastest; an edge within a node (rank 0
    to rank 4 over NVLink) is a medium of its own, however it compares."""
    noise = random.Random(7)
    watch = settled(noise)
    for _ in range(50):
        nodes = window({}, noise)
        inside = Edge(0, 4, 8, 8 * 64 * MB, 200 * GB)
        nodes[0] = EdgeNode("host-a", (0, 4), (*nodes[0].edges, inside))
        assert watch.close_window(nodes) is None


def test_a_slow_edge_is_compared_with_its_own_usual_speed() -> None:
    """The edges of one link usually at 1 GB/s (another NIC, or small messages), the others at
    10: once that is their own history, 1 GB/s is not slow, 0.2 GB/s is."""
    watch = EdgeWatch()
    usual = {(1, 2): 1 * GB, (2, 1): 1 * GB}
    for _ in range(4):
        watch.close_window(window(usual))
    assert watch.close_window(window(usual)) is None
    found = watch.close_window(window({(1, 2): 0.2 * GB, (2, 1): 1 * GB}))
    assert found is not None and found.scope == "link" and found.node_ranks == (1, 2)


# --- through the published value and the record ---------------------------------------------


def published(nodes: dict, window_: int) -> list[NodeLinks]:
    """Each node's edges as it publishes them: through the store's encoding."""
    out = []
    for n, node in nodes.items():
        address = (f"10.1.0.{11 + n}",)
        value = NodeLinks(n, node.host, address, window_, (), (), (), node.ranks, node.edges)
        back = decode(encode(value))
        assert back is not None and back.edges == tuple(
            Edge(e.src, e.dst, e.count, e.bytes, round(e.best_rate)) for e in node.edges
        )
        out.append(back)
    return out


def test_the_slow_link_is_reported_from_its_second_window_with_its_record() -> None:
    watch = LinkWatch()
    for w in range(4):
        assert watch.close_window(published(window({}), w)) is None
    slow = window({(1, 2): 0.4 * GB, (2, 1): 0.5 * GB})
    assert watch.close_window(published(slow, 5)) is None
    report = watch.close_window(published(slow, 6))
    assert report is not None and report.transport == "p2p" and report.windows == 2
    attributes = link_attributes(report)
    assert attributes[A.LINK_SCOPE] == "link" and attributes[A.LINK_NODES] == ("host-b", "host-c")
    assert attributes[A.LINK_RATE] == pytest.approx(0.45 * GB)
    assert describe_link(attributes) == (
        "the link between host-b (node rank 1, 10.1.0.12) and host-c (node rank 2, 10.1.0.13)"
        " is slow: its sends and receives move at best 450 MB/s (the others 10,000 MB/s)"
    )
    assert len(json.dumps(list(attributes.values()))) < 2048


def test_a_node_s_own_evidence_names_its_slowest_edges_leaving_it() -> None:
    node = published(window({(1, 2): 0.4 * GB}), 1)[1]
    evidence = local_evidence(node)
    assert evidence[A.LINK_TRANSPORT] == "p2p" and evidence[A.LINK_SCOPE] == "local"
    assert evidence[A.LINK_EVIDENCE][0].startswith("host-b rank 1 → rank 2: 0.4 GB/s at best")


def test_the_exchange_names_a_slow_edge_during_a_slowdown_of_either_part(tmp_path: Path) -> None:
    """Two agents' exchanges on a real TCPStore, each reading its own links (this process's
    sockets, an RDMA tree with no port) with a two-stage pipeline's edges: node 0 names the
    slow edge once it held two windows and a slowdown is under way, even one read as compute
    (the transfers are between the collectives), and not before."""
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    reported: list[dict[str, Any]] = []
    stats = [LinkStats(n, f"host-{'ab'[n]}", str(tmp_path)) for n in range(2)]
    nodes = [
        StragglerExchange(store, 0, n, 2, 0.75, lambda slow: None, stats[n], reported.append)
        for n in range(2)
    ]

    def exchange(w: int, rate: float, slowing: bool) -> None:
        edges = (Edge(0, 1, 8, 64 * MB, rate), Edge(1, 0, 8, 64 * MB, 10 * GB))
        for n in (1, 0):  # node 0 last: it reads both
            mine = tuple(e for e in edges if n in (e.src, e.dst))
            nodes[n]._links(store, [os.getpid()], w, False, slowing, ((n,), mine))

    for w in range(6):  # the first read only starts the window; then their usual speed
        exchange(w, 10 * GB, False)
    exchange(6, 0.5 * GB, False)
    exchange(7, 0.5 * GB, False)  # held two windows, but no slowdown under way
    assert reported == []
    exchange(8, 0.5 * GB, True)
    (report,) = reported
    assert report[A.LINK_TRANSPORT] == "p2p" and report[A.LINK_SCOPE] == "link"
    assert report[A.LINK_NODES] == ("host-a", "host-b")
    assert report[A.LINK_EVIDENCE] == (
        "host-a → host-b rank 0 → rank 1: 0.5 GB/s at best over 8 transfers of 8 MB"
        " (usually 10 GB/s)",
    )
    own = nodes[1].local_evidence()[A.LINK_EVIDENCE]
    assert "host-b rank 0 → rank 1: 0.5 GB/s at best over 8 transfers of 8 MB" in own
