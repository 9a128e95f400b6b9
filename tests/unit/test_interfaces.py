"""The slow end of a link from the nodes' own interfaces (issue 46): two nodes have one pair of
paths, alike slow whichever end is slow; the end whose transmit queue holds traffic back (or
whose errors move, or whose rate is lower) is the one named. Also the worker's sampling of
open collectives, on status values as torch's ``_dump_fr_trace_json`` writes them."""

from __future__ import annotations

from elastic_otel.model.interfaces import (
    InterfaceSample,
    describe_interface,
    slow_ends,
    windows,
)
from elastic_otel.model.link_records import describe_link, link_attributes
from elastic_otel.model.links import LinkWatch, NodeLinks, PeerPath, decode, encode
from elastic_otel.names import attributes as A
from elastic_otel.worker.collectives import OpenSamples

MS = 1e-3
MB = 1e6
A0, A1 = "10.1.0.11", "10.1.0.12"


def sample(name: str, address: str, **counters: int) -> InterfaceSample:
    backlog = counters.pop("backlog", 0)
    base = {"tx_bytes": 0, "rx_bytes": 0, "qdisc_overlimits": 0, "rx_crc_errors": 0}
    return InterfaceSample(name, (address,), None, {**base, **counters}, backlog)


def shaped(address: str, held: int) -> tuple[InterfaceSample, InterfaceSample]:
    """An interface over a 2 s window that sent 24 MB and held back ``held`` packets."""
    before = sample("eth0", address)
    after = sample("eth0", address, tx_bytes=24_000_000, rx_bytes=1_000_000,
                   qdisc_overlimits=held, backlog=65_536)  # fmt: skip
    return before, after


def test_an_interface_over_a_window() -> None:
    before, after = shaped(A1, 620)
    (window,) = windows([before], [after], 2.0)
    assert window.tx_rate == 12e6 and window.rx_rate == 0.5e6
    assert window.trouble == {"qdisc_overlimits": 620} and window.trouble_per_s == 310
    assert window.slow_end
    assert describe_interface(window) == (
        "eth0 (10.1.0.12): sends 12.00 MB/s, receives 0.50 MB/s; 310 a second held back or lost"
        " (qdisc_overlimits +620), 66 kB waiting in its queue"
    )
    quiet = windows([sample("eth0", A0)], [sample("eth0", A0, tx_bytes=1000)], 2.0)
    assert not quiet[0].slow_end and quiet[0].trouble == {}
    # A counter that went back (a reset, a driver reloaded) counts as its new value.
    reset = windows(
        [sample("eth0", A0, rx_crc_errors=90)], [sample("eth0", A0, rx_crc_errors=4)], 1
    )
    assert reset[0].trouble == {"rx_crc_errors": 4}
    assert windows([before], [after], 0.0) == ()


def test_the_end_whose_interface_says_so_is_named_while_the_other_stays_quiet() -> None:
    (slow,) = windows(*map(lambda s: [s], shaped(A1, 620)), 2.0)
    (calm,) = windows([sample("eth0", A0)], [sample("eth0", A0, tx_bytes=24_000_000)], 2.0)
    assert slow_ends({0: [calm], 1: [slow]}) == [1]
    assert slow_ends({0: [slow], 1: [calm]}) == [0]
    assert slow_ends({0: [slow], 1: [slow]}) == []  # every end alike: they cannot tell
    assert slow_ends({0: [calm], 1: [calm]}) == []
    assert slow_ends({0: [], 1: []}) == []


def test_a_nic_fallen_to_a_lower_rate_is_the_slow_end() -> None:
    def at(speed: int, address: str) -> InterfaceSample:
        return InterfaceSample("eth0", (address,), speed, {"tx_bytes": 0})

    fast, slow = (windows([at(s, a)], [at(s, a)], 1.0)[0] for s, a in ((100_000, A0), (25_000, A1)))
    assert slow_ends({0: [fast], 1: [slow]}) == [1]


def path(peer: str, rtt_ms: float, rate: float) -> PeerPath:
    return PeerPath(peer, 2, 2, rtt_ms * MS, 0.05 * MS, 0.0, 0.0, 0, rate, True, 50 * MB)


def test_two_nodes_alike_slow_name_the_end_whose_queue_backs_up() -> None:
    """Both nodes' one path slow alike (what a tbf on node 1's link gives, measured: srtt 3.4
    to 7.7 ms on both, the delivery rate down to 300-400 Mbit/s): by the paths alone every link
    of the job; node 1's interface held traffic back, node 0's did not: node 1's link."""
    (slow,) = windows(*map(lambda s: [s], shaped(A1, 620)), 2.0)
    (calm,) = windows([sample("eth0", A0)], [sample("eth0", A0, tx_bytes=24_000_000)], 2.0)
    nodes = [
        NodeLinks(0, "host-a", (A0,), 1, (path(A1, 6.3, 43 * MB),), (), (calm,)),
        NodeLinks(1, "host-b", (A1,), 1, (path(A0, 3.6, 38 * MB),), (), (slow,)),
    ]
    watch = LinkWatch()
    assert watch.close_window(nodes) is None  # a finding holds two windows before it is said
    report = watch.close_window(nodes)
    assert report is not None and report.scope == "node" and report.transport == "netdev"
    assert [(n.host, n.node_rank) for n in report.nodes] == [("host-b", 1)]
    attributes = link_attributes(report)
    evidence = attributes[A.LINK_EVIDENCE]
    assert isinstance(evidence, tuple)
    assert evidence[0].startswith("host-b eth0 (10.1.0.12): sends 12.00 MB/s")
    text = describe_link(attributes)
    assert text.startswith("host-b (node rank 1, 10.1.0.12) has the slow link: ")
    assert "its own interface held traffic back: eth0 (10.1.0.12)" in text
    # Without the interfaces' word, the same paths are every link of the job.
    bare = [NodeLinks(n.node_rank, n.host, n.addresses, 1, n.peers, ()) for n in nodes]
    watch = LinkWatch()
    watch.close_window(bare)
    fabric = watch.close_window(bare)
    assert fabric is not None and fabric.scope == "fabric"


def test_interfaces_travel_in_the_stored_value() -> None:
    (slow,) = windows(*map(lambda s: [s], shaped(A1, 620)), 2.0)
    node = NodeLinks(1, "host-b", (A1,), 3, (), (), (slow,))
    assert decode(encode(node)) == node
    older = encode(NodeLinks(1, "host-b", (A1,), 3, (), ())).replace(b',"f":[]', b"")
    assert b'"f"' not in older and decode(older) == NodeLinks(1, "host-b", (A1,), 3, (), ())
    bad = encode(node).replace(b'"qdisc_overlimits",620', b'"qdisc_overlimits",-620')
    assert decode(bad) is None


def test_open_samples_count_the_groups_with_a_collective_open() -> None:
    """What a worker's collectives thread samples every 0.1 s between its polls: per group (of
    each backend's record), how many status reads found a collective issued and not completed."""
    samples = OpenSamples()
    status = {"last_enqueued_collective": 7, "last_started_collective": -1}
    samples.count("gloo", {"0": {**status, "last_completed_collective": 6}, "1": {}})
    samples.count("gloo", {"0": {**status, "last_completed_collective": 7}})
    samples.count("nccl", {"0": {**status, "last_completed_collective": 6}})
    assert samples.take() == {"gloo:0": (1, 2), "gloo:1": (0, 1), "nccl:0": (1, 1)}
    assert samples.take() == {}
