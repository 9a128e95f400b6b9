"""A job slowed by a link, or by its own compute, explained from the exported records alone
(issue 46): two hosts of their own, one torchrun agent of two DDP ranks each (gloo,
``tests/scripts/link_train.py``, no ``elastic_otel`` call), a real OTLP receiver on the bridge
(``tests/links/conftest.py``). Five jobs, one after the other, each read by several tests:

- node 1's link rate-limited (``tc tbf`` at :data:`~tests.links.conftest.RATE` on both ends of
  its veth pair) for eight straggler windows in the middle of training: every node reports a
  slowdown dated inside the fault's first windows and read as communication, which ends (INFO,
  with the training time it cost) after the fault did, and node 0 names node 1 as the slow one;
- the same on node 0's link: node 0 names itself;
- every rank's compute slower for as long (``SLOW_ALL_WHEN``: a sleep on every rank): a
  slowdown read as compute, and no link named;
- twice, the same job with no fault: nothing reported.

Each job, from rank 0's first progress line: the slowdown watch's warm-up (2 straggler
windows) and baseline (5), and a spare window; the fault for 8 windows (16 s); 4 windows after
it (an end takes 3), and up to 4 more while a node that reported a slowdown has not said it
ended; then SIGTERM. The straggler window is 2 s.

Calibrated on the 2-core machine (2026-12-05, load average under 2), rank 0's median step time
(every rank sleeps ``STEP_SECONDS`` = 0.1 s a step; two ``Linear(1024, 1024)`` layers, batch 8:
8.4 MB of gradients in two DDP buckets): 132 to 150 ms with no fault; 382 to 397 ms with either
node's link at 400 Mbit/s (2.7x to 3.0x: the ring all-reduce sends 12.6 MB across the link each
way every step, 0.25 s at 50 MB/s); 348 to 357 ms with 0.2 s more a step on every rank (2.4x to
2.7x); 200 Mbit/s gave 670 ms (4.5x), 100 Mbit/s over a second (8x). A job takes 8 to 11 s from
its agents' start to training and about 50 s in all; the five, 4 min 10 s.

What the kernel's statistics of the job's connections show (``ss -tin`` in each namespace, a
sample a second, medians over a phase). The connections that carry gloo's all-reduce between
the hosts, one each way (each node's sending end): with no fault srtt 0.13 to 0.23 ms and a
delivery rate of 11 to 39 Gbit/s on both nodes; with either node's link at 400 Mbit/s, srtt 3.4
to 7.7 ms and 310 to 380 Mbit/s on both nodes alike, whichever link is slow: two nodes have one
pair, so these cannot tell node 0's link from node 1's (with a third host, the pair of the two
others stays fast: 0.4 ms, 12 Gbit/s). Retransmits are no sign here: BBR keeps tbf's queue short,
and the veth pairs' reordering gives a few hundred spurious ones (DSACKed) in any phase. Each
agent's connection to the receiver on the bridge crosses its own link only, but is app-limited,
its srtt 5 to 17 ms (delayed ACKs) in every phase.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import pytest

from elastic_otel.names import attributes as A
from tests.links.conftest import (
    FAULT_S,
    HOSTS,
    RATE,
    SLOW_ALL_S,
    WINDOW_S,
    LinkRun,
    run_link_job,
)
from tests.support.netns import HostNetwork
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.e2e

EARLY_S = 1.0
"""A slowdown may be dated this much before the fault began (the clocks of one machine; a
collective the fault's first packets slowed may have been issued just before)."""
LATE_S = 3 * WINDOW_S
"""...and at most this much after it."""

Fault = Callable[[LinkRun], None]


def _shaped(network: HostNetwork, node_rank: int) -> tuple[Fault, Fault]:
    """``begin`` and ``end`` of a job whose node ``node_rank``'s link is slow."""

    def begin(run: LinkRun) -> None:
        network.shape(run.host(node_rank), RATE)

    def end(run: LinkRun) -> None:
        network.unshape(run.host(node_rank))

    return begin, end


@pytest.fixture(scope="module")
def node1_link(
    host_network: HostNetwork,
    link_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> LinkRun:
    begin, end = _shaped(host_network, 1)
    tmp_path = tmp_path_factory.mktemp("node1_link")
    return run_link_job(host_network, link_receiver, tmp_path, "node1-link", begin, end)


@pytest.fixture(scope="module")
def node0_link(
    host_network: HostNetwork,
    link_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> LinkRun:
    begin, end = _shaped(host_network, 0)
    tmp_path = tmp_path_factory.mktemp("node0_link")
    return run_link_job(host_network, link_receiver, tmp_path, "node0-link", begin, end)


@pytest.fixture(scope="module")
def slow_compute(
    host_network: HostNetwork,
    link_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> LinkRun:
    tmp_path = tmp_path_factory.mktemp("slow_compute")
    slow = tmp_path / "slower-compute"
    return run_link_job(
        host_network,
        link_receiver,
        tmp_path,
        "slow-compute",
        lambda run: slow.touch(),
        lambda run: slow.unlink(missing_ok=True),
        SLOW_ALL_WHEN=str(slow),
        SLOW_ALL_SECONDS=str(SLOW_ALL_S),
    )


@pytest.fixture(scope="module", params=[1, 2], ids=["first", "second"])
def no_fault(
    request: pytest.FixtureRequest,
    host_network: HostNetwork,
    link_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> LinkRun:
    tmp_path = tmp_path_factory.mktemp(f"no_fault_{request.param}")
    slow = tmp_path / "never-created"  # the compute job's environment, its file never made
    return run_link_job(
        host_network,
        link_receiver,
        tmp_path,
        f"no-fault-{request.param}",
        SLOW_ALL_WHEN=str(slow),
        SLOW_ALL_SECONDS=str(SLOW_ALL_S),
    )


# --- reading the records ----------------------------------------------------------------------


def _host(record: dict) -> str:
    return str(record["resource"].get("host.name"))


def _reports(run: LinkRun) -> list[dict]:
    """The job's slowdown reports (WARN, while it lasts), in time order."""
    return [
        r
        for r in run.events(A.SLOWDOWN_EVENT_NAME)
        if r["attributes"].get(A.STATE) != A.SLOWDOWN_ENDED_STATE
    ]


def _ends(run: LinkRun) -> list[dict]:
    """The job's records of a slowdown's end (INFO), in time order."""
    return [
        r
        for r in run.events(A.SLOWDOWN_EVENT_NAME)
        if r["attributes"].get(A.STATE) == A.SLOWDOWN_ENDED_STATE
    ]


def _began_ns(record: dict) -> int:
    """The record's ``torchelastic.slowdown.began`` (ISO 8601), in ns since the epoch."""
    began = datetime.datetime.fromisoformat(str(record["attributes"][A.SLOWDOWN_BEGAN]))
    if began.tzinfo is None:
        began = began.replace(tzinfo=datetime.timezone.utc)
    return int(began.timestamp() * 1e9)


def _check_dated(run: LinkRun, part: str) -> list[dict]:
    """Every node reported the slowdown, each report dated within the fault's first windows,
    read as ``part``, WARN; the reports."""
    reports = _reports(run)
    assert reports, f"no slowdown reported\n{run.said()}"
    earliest = run.fault_began_ns - EARLY_S * 1e9
    latest = run.fault_began_ns + LATE_S * 1e9
    for r in reports:
        assert r["severity_text"] == "WARN", (r, run.said())
        assert earliest <= _began_ns(r) <= latest, (
            f"a slowdown dated {r['attributes'][A.SLOWDOWN_BEGAN]}, not within"
            f" {EARLY_S:g} s before to {LATE_S:g} s after the fault began\n{run.said()}"
        )
        assert r["attributes"][A.SLOWDOWN_PART] == part, (r["attributes"], run.said())
    assert {_host(r) for r in reports} == set(HOSTS), f"not every node saw it\n{run.said()}"
    return reports


def _check_ended(run: LinkRun) -> None:
    """Each node that reported it said, after the fault ended, that it ended, and what it
    cost."""
    ends = _ends(run)
    assert ends, f"no end of the slowdown reported\n{run.said()}"
    for r in ends:
        assert r["severity_text"] == "INFO", (r, run.said())
        assert r["time_ns"] >= run.fault_ended_ns, f"ended before the fault did\n{run.said()}"
        assert r["attributes"][A.SLOWDOWN_LOST] > 0, (r["attributes"], run.said())
        lasted = r["attributes"][A.SLOWDOWN_SECONDS]
        assert FAULT_S - LATE_S <= lasted <= FAULT_S + LATE_S + 2 * WINDOW_S, (
            r["attributes"],
            run.said(),
        )
    assert {_host(r) for r in ends} == {_host(r) for r in _reports(run)}, run.said()


def _named(run: LinkRun) -> list[dict]:
    """Node 0's link records naming something (not a node's own evidence, scope ``local``)."""
    return [
        r
        for r in run.events(A.LINK_EVENT_NAME)
        if _host(r) == run.host(0) and r["attributes"].get(A.LINK_SCOPE) != "local"
    ]


def _check_node_named(run: LinkRun, node_rank: int) -> None:
    """Node 0 named node ``node_rank`` (its host name) as the node whose link is slow, while
    the fault lasted, and never the other node alone."""
    slow_host = run.host(node_rank)
    named = _named(run)
    assert named, f"node 0 named no link\n{run.said()}"
    right = [
        r
        for r in named
        if r["attributes"].get(A.LINK_SCOPE) == "node"
        and r["attributes"].get(A.LINK_NODES) == [slow_host]
    ]
    assert right, f"node 0 did not name {slow_host}'s link\n{run.said()}"
    for r in right:
        attrs = r["attributes"]
        assert r["severity_text"] == "WARN", (r, run.said())
        assert attrs[A.LINK_NODE_RANK] == [node_rank], (attrs, run.said())
        # Two nodes have one pair of paths, alike slow whichever end is slow: the slow end's
        # own interface (its transmit queue held traffic back) is what tells it.
        assert attrs[A.LINK_TRANSPORT] == "netdev", (attrs, run.said())
        evidence = attrs[A.LINK_EVIDENCE]
        assert any(
            line.startswith(f"{slow_host} {slow_host}-c ") and "qdisc_overlimits +" in line
            for line in evidence
        ), (evidence, run.said())
        assert run.fault_began_ns <= r["time_ns"], f"named before the fault\n{run.said()}"
    # A record of scope "link" names the path between two nodes: in a two-node job the one
    # path, slowed at whichever end; it may follow the node's naming once that end's queue
    # drained (seen once in CI, after the fault, while the slowdown was still reported).
    wrong = [
        r
        for r in named
        if slow_host not in r["attributes"].get(A.LINK_NODES, [])
        or (
            r["attributes"].get(A.LINK_SCOPE) != "link"
            and r["attributes"][A.LINK_NODES] != [slow_host]
        )
    ]
    assert wrong == [], f"node 0 named a node whose link was not slowed\n{run.said()}"


# --- the faults are what the tests say they are -----------------------------------------------


@pytest.mark.parametrize("job", ["node1_link", "node0_link", "slow_compute"])
def test_each_fault_slows_training(job: str, request: pytest.FixtureRequest) -> None:
    """The harness's own check, from rank 0's step times: the fault slows the steps as
    calibrated (2.5x to 3x; at least the issue's 1.5x on a loaded machine, whose CPU time adds
    to every step), and they are as fast as before once it ended."""
    run: LinkRun = request.getfixturevalue(job)
    before, during, after = run.step_phases()
    assert 1.5 <= during / before <= 5, run.said()
    assert after / before < 1.4, run.said()


def test_with_no_fault_training_keeps_its_pace(no_fault: LinkRun) -> None:
    before, during, after = no_fault.step_phases()
    assert 0.7 < during / before < 1.4, no_fault.said()
    assert 0.7 < after / before < 1.4, no_fault.said()


# --- a slow link ---------------------------------------------------------------------------


@pytest.mark.parametrize("job", ["node1_link", "node0_link"])
def test_a_slow_link_is_a_slowdown_dated_and_read_as_communication(
    job: str, request: pytest.FixtureRequest
) -> None:
    """Every node reports the slowdown, dated within three windows of the link's slowing, its
    time inside the collectives grown for every rank alike: communication; at the straggler
    window's cadence while it lasts."""
    run: LinkRun = request.getfixturevalue(job)
    reports = _check_dated(run, "communication")
    for r in reports:
        attrs = r["attributes"]
        assert attrs[A.SLOWDOWN_RATIO] > 1.5, (attrs, run.said())
        assert attrs[A.SLOWDOWN_INSIDE_NOW] > attrs[A.SLOWDOWN_INSIDE_BEFORE], attrs
        assert attrs[A.SLOWDOWN_INTERVAL_NOW] > attrs[A.SLOWDOWN_INTERVAL_BEFORE], attrs
    for host in HOSTS:  # reported again while it lasts
        mine = [r for r in reports if _host(r) == host]
        assert len(mine) >= 2, f"{host} reported it {len(mine)} times\n{run.said()}"
        # Each node's own evidence rides on its reports: its paths, slow like the others'.
        own = [
            r["attributes"]
            for r in mine
            if r["attributes"].get(A.LINK_SCOPE) == "local" and r["time_ns"] < run.fault_ended_ns
        ]
        assert own, f"{host}'s reports carry no evidence of its own\n{run.said()}"
        assert all(a[A.LINK_NODES] == [host] and a[A.LINK_RTT] > 0.002 for a in own), own


@pytest.mark.parametrize("job", ["node1_link", "node0_link"])
def test_a_slow_link_s_slowdown_ends_after_it_with_what_it_cost(
    job: str, request: pytest.FixtureRequest
) -> None:
    _check_ended(request.getfixturevalue(job))


def test_node_0_names_node_1_s_link(node1_link: LinkRun) -> None:
    """From every node's connection statistics and interfaces, node 0 names node 1 (its host
    name) as the node whose link is slow."""
    _check_node_named(node1_link, 1)


def test_node_0_names_its_own_link(node0_link: LinkRun) -> None:
    _check_node_named(node0_link, 0)


# --- slower compute, no fault ----------------------------------------------------------------


def test_slower_compute_is_a_slowdown_read_as_compute(slow_compute: LinkRun) -> None:
    """Every rank's step slower, the links untouched: a slowdown of the time between the
    collectives (compute), and no link, node or fabric named."""
    _check_dated(slow_compute, "compute")
    assert _named(slow_compute) == [], slow_compute.said()
    named = [
        r
        for r in slow_compute.events(A.LINK_EVENT_NAME)
        if r["attributes"].get(A.LINK_SCOPE) != "local"
    ]
    assert named == [], slow_compute.said()


def test_slower_compute_s_slowdown_ends_after_it(slow_compute: LinkRun) -> None:
    _check_ended(slow_compute)


def test_with_no_fault_nothing_is_reported(no_fault: LinkRun) -> None:
    assert no_fault.events(A.SLOWDOWN_EVENT_NAME) == [], no_fault.said()
    assert no_fault.events(A.LINK_EVENT_NAME) == [], no_fault.said()
