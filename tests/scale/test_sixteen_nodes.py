"""Sixteen nodes of one rank each, every node a host of its own (a network namespace with its own
address, a UTS namespace with its own host name: ``tests/support/netns.py``): a torchrun agent
and its DDP worker (gloo, ``tests/scripts/ddp_train.py``) on each, the rendezvous store (c10d) on
the first, the OTLP receiver on the bridge. Every node must name the rank (or node) the job waits
for, the waiting ones through the round's store with the late node's own host name, within a
bounded time of their ranks beginning to wait, measured from the receiver's record times.

Two jobs, two cases each (a case follows the other once the first has ended: the late rank's
checkpoint load finishes, so the job goes on, as a slow mount's would):

- a rank stuck before ``init_process_group`` (15 nodes wait inside it), then, once it got past,
  another rank stuck in training (15 nodes wait in DDP's all-reduce);
- a rank stuck after ``init_process_group``, before the job's first collective (15 nodes wait in
  collective #1, DDP's first broadcast: with one rank per node the late rank is its whole node),
  then, in training, a whole node frozen (its agent and worker SIGSTOPped, as a host hung in the
  kernel): the 15 others name it by its silent rendezvous keep-alives (the frozen node itself
  says nothing: it is stopped).

The bounds, after the last waiting node began to wait (its report's time less its stalled
seconds), with ``ELASTIC_OTEL_STALL_AFTER`` = 4 s and a poll every second: a late rank is named
by every node within ``STALL_AFTER`` and two polls (the late node finds it at its first poll past
``STALL_AFTER``, each waiting node reads its entry at its next poll, and each does so within a
poll of when it could: :func:`_assert_within_a_poll_of_knowing`); a frozen node, whose silence
needs no other node, within ``STALL_AFTER`` and one poll, by every node's first report (torch's
dead-node bound is set to ``STALL_AFTER``). Each with 0.5 s for a loaded machine. The measured
times are printed at the end of the run (``tests/scale/conftest.py``).

One job costs the two cores a minute and a half (32 processes that import torch), so four jobs
would add three minutes to the suite for no case more.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import read_collectives
from tests.scale.conftest import (
    HOSTS,
    POLL_S,
    STALL_AFTER_S,
    Figure,
    HostJob,
    record_figure,
)
from tests.support.jobs import SCRIPTS, job_env
from tests.support.netns import HostNetwork
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "ddp_train.py"


def _line(marker: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if marker in line)


STARTUP_FRAME = f"stuck_loading_checkpoint at ddp_train.py:{_line('# STARTUP HANG LINE')}"
TRAINING_FRAME = f"stuck_data_loader at ddp_train.py:{_line('# HANG LINE')}"
INIT_LATE, TRAINING_LATE, FIRST_LATE = 6, 11, 3  # global ranks (one per node)
KEEP_ALIVE = "--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=4"
KEEP_ALIVE_S = 4.0  # torch's dead-node bound at that (interval x attempts): STALL_AFTER_S
TOLERANCE_S = 0.5
"""Beyond a poll, for a loaded machine: a report is made, its stacks taken and exported."""
START_TIMEOUT_S = 300  # sixteen agents and workers import torch on two cores, then the stall


def _host(record: dict) -> str:
    return str(record["resource"].get("host.name"))


@dataclass
class Case:
    """One stall of a job and what the receiver got while it lasted."""

    name: str
    late_host: str = ""
    late_rank: int | None = None
    late_pid: int = 0
    reports: list[dict] = field(default_factory=list)
    """Every ``torchelastic.stalled`` record of the case, in time order."""
    naming: dict[str, dict] = field(default_factory=dict)
    """Each node's first report naming the late rank (node)."""
    ranks: dict[str, int] = field(default_factory=dict)
    """Each host's global rank (from the workers' environments)."""
    timed_out: str = ""
    live_before: dict[str, float] = field(default_factory=dict)
    """For a freeze: the hosts torch's rendezvous held keep-alives of just before, with each
    one's age (s)."""

    def said(self) -> str:
        """What each node said, for a failure's message."""
        by_host: dict[str, list[str]] = {host: [] for host in HOSTS}
        for r in self.reports:
            seconds = r["attributes"].get(A.STALLED_SECONDS)
            by_host.setdefault(_host(r), []).append(f"[{seconds} s] {r['body']}")
        lines = [f"{self.name}: late {self.late_rank} on {self.late_host}; {self.timed_out}"]
        for host, bodies in by_host.items():
            lines.append(f"  {host} (rank {self.ranks.get(host)}): " + (" | ".join(bodies[-3:])))
        return "\n".join(lines)


def _follow(
    case: Case,
    job: HostJob,
    receiver: OtlpReceiver,
    belongs: Callable[[dict], bool],
    names: Callable[[dict], bool],
    nodes: int,
    timeout: float,
) -> None:
    """Wait (bounded) until ``nodes`` nodes made a report that ``names`` the late rank; keep the
    stall reports that ``belong`` to the case. A timeout is kept, not raised: the tests say
    what each node said."""

    def named() -> bool:
        found = [
            r for r in receiver.logs() if r["event_name"] == "torchelastic.stalled" and belongs(r)
        ]
        case.reports = sorted(found, key=lambda r: r["time_ns"])
        case.naming = {}
        for r in case.reports:
            if names(r):
                case.naming.setdefault(_host(r), r)
        ended = [h for h, a in job.agents.items() if a.poll() is not None]
        if ended:
            case.timed_out = f"agents ended: {ended}\n{job.outputs()}"
        return len(case.naming) >= nodes or bool(ended)

    try:
        receiver.wait_until(named, timeout)
    except TimeoutError:
        case.timed_out = f"{len(case.naming)} of {nodes} nodes named it within {timeout} s"


def _wait_start_ns(report: dict) -> int:
    """When the report's ranks began to wait, by its own clock: its time less its seconds."""
    return report["time_ns"] - int(report["attributes"][A.STALLED_SECONDS] * 1e9)


def _measure(case: Case, waiting_hosts: list[str]) -> Figure:
    """From the receiver's record times: the first report of the case, and the last node's
    first naming, after the last waiting node began to wait (its first report's time less its
    stalled seconds)."""
    first_reports = {}
    for r in case.reports:
        first_reports.setdefault(_host(r), r)
    began = max(_wait_start_ns(first_reports[h]) for h in waiting_hosts if h in first_reports)
    first = min(r["time_ns"] for r in case.reports)
    last = max(r["time_ns"] for r in case.naming.values())
    return Figure(
        case.name, (first - began) / 1e9, (last - began) / 1e9, len(case.naming), len(HOSTS)
    )


def _assert_within_a_poll_of_knowing(case: Case, waiting_hosts: list[str]) -> None:
    """Each waiting node names the late rank within a poll of when it could: its own first
    report of the stall, or the late node's first report naming it (what it publishes),
    whichever is later (docs/hangs.md, "Every node names the rank")."""
    first_reports: dict[str, dict] = {}
    for r in case.reports:
        first_reports.setdefault(_host(r), r)
    published = case.naming[case.late_host]["time_ns"]
    late = {
        host: (case.naming[host]["time_ns"] - max(first_reports[host]["time_ns"], published)) / 1e9
        for host in waiting_hosts
    }
    slow = {h: round(s, 3) for h, s in late.items() if s > POLL_S + TOLERANCE_S}
    assert not slow, f"named more than a poll after it could: {slow}\n{case.said()}"


def _assert_bounded(case: Case, figure: Figure, bound_s: float) -> None:
    assert figure.last_named_s <= bound_s + TOLERANCE_S, (
        f"the last node named it {figure.last_named_s:.2f} s after the last waiting node began"
        f" to wait (bound {bound_s} s)\n{case.said()}"
    )


# --- job 1: a rank stuck before init_process_group, then another in training -----------------


@dataclass
class Job:
    cases: dict[str, Case]


def _job(
    network: HostNetwork,
    receiver: OtlpReceiver,
    tmp_path: Path,
    name: str,
    extra_args: tuple[str, ...] = (),
    **env: str,
) -> HostJob:
    receiver.clear()
    environ = job_env(receiver, tmp_path, ELASTIC_OTEL_STALL_AFTER=str(STALL_AFTER_S), **env)
    job = HostJob(network, environ, tmp_path, SCRIPT, extra_args)
    return job.start(f"{name}-{uuid.uuid4().hex[:6]}")


def _late(case: Case, job: HostJob, rank: int) -> None:
    hosts = job.worker_hosts()
    case.ranks = {host: r for r, host in hosts.items()}
    case.late_rank = rank
    case.late_host = hosts.get(rank, "")
    case.late_pid = job.agents[case.late_host].pid if case.late_host else 0


@pytest.fixture(scope="module")
def init_then_training(
    host_network: HostNetwork,
    network_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Job:
    tmp_path = tmp_path_factory.mktemp("init_then_training")
    release = tmp_path / "checkpoint-loaded"
    job = _job(
        host_network,
        network_receiver,
        tmp_path,
        "init",
        STARTUP_HANG_RANKS=str(INIT_LATE),
        STARTUP_HANG_AT="init",
        STARTUP_HANG_UNTIL=str(release),
        HANG_RANK=str(TRAINING_LATE),
        HANG_STEP="5",
    )
    init, training = (
        Case("a rank stuck before init_process_group"),
        Case("a rank stuck in training"),
    )
    try:
        _follow(
            init,
            job,
            network_receiver,
            lambda r: r["attributes"].get(A.STALLED_PHASE) == "startup",
            lambda r: r["attributes"].get(A.STALLED_RANKS) == [INIT_LATE],
            16,
            START_TIMEOUT_S,
        )
        _late(init, job, INIT_LATE)
        released_ns = time.time_ns()
        release.touch()  # the checkpoint is loaded: the rank goes on, the job trains
        _follow(
            training,
            job,
            network_receiver,
            lambda r: (
                r["time_ns"] >= released_ns
                and r["attributes"].get(A.STALLED_IN) == "training"
                and A.STALLED_PHASE not in r["attributes"]
            ),
            lambda r: r["attributes"].get(A.STALLED_RANKS) == [TRAINING_LATE],
            16,
            120,
        )
        _late(training, job, TRAINING_LATE)
    finally:
        job.stop()  # before the next job: the two cores run one at a time
    return Job({"init": init, "training": training})


def _check_named_by_every_node(case: Case, frame: str) -> list[str]:
    """Every node named the late rank, each waiting one with the late node's host name and
    agent pid, learnt through the round's store; the waiting hosts."""
    assert case.late_host, case.said()
    assert sorted(case.naming) == sorted(HOSTS), case.said()
    waiting_hosts = [h for h in HOSTS if h != case.late_host]
    for host in waiting_hosts:
        attrs = case.naming[host]["attributes"]
        assert attrs[A.STALLED_REMOTE_HOST] == case.late_host, (host, attrs, case.said())
        assert attrs[A.STALLED_REMOTE_PIDS] == [case.late_pid], (host, attrs)
        assert attrs[A.STALLED_WAITING] == [case.ranks[host]], (host, attrs)
        assert attrs[A.STACK_FRAME] == frame, (host, attrs)
        assert (
            f"waiting for global rank {case.late_rank} on {case.late_host} pid"
            in (case.naming[host]["body"])
        ), case.naming[host]["body"]
    own = case.naming[case.late_host]["attributes"]
    assert A.STALLED_REMOTE_HOST not in own, own
    assert own[A.STACK_FRAME] == frame, own
    return waiting_hosts


def test_a_rank_stuck_before_init_process_group_is_named_by_all_16_nodes(
    init_then_training: Job,
) -> None:
    """Global rank 6 never reaches ``init_process_group`` (its checkpoint load hangs); the
    15 other ranks wait inside it. Its node names it once its worker started
    ``ELASTIC_OTEL_STALL_AFTER`` ago and another node waits (``waiting/init`` in the store);
    every other node names it with that node's host name."""
    case = init_then_training.cases["init"]
    waiting_hosts = _check_named_by_every_node(case, STARTUP_FRAME)
    for host in waiting_hosts:
        report = case.naming[host]
        assert report["attributes"][A.STALLED_COLLECTIVE] == "init_process_group", report
        assert (
            f" s in start-up: global ranks {case.ranks[host]} wait in init_process_group;"
            f" waiting for global rank {INIT_LATE} on {case.late_host} pid {case.late_pid}"
            f" (in {STARTUP_FRAME}), which has not reached it" in report["body"]
        ), report["body"]
    own = case.naming[case.late_host]
    assert (
        " s in start-up: ranks on other nodes wait in init_process_group; waiting for global"
        f" rank {INIT_LATE} (in {STARTUP_FRAME}), which has not reached it" in own["body"]
    ), own["body"]
    figure = _measure(case, waiting_hosts)
    record_figure(figure)
    _assert_within_a_poll_of_knowing(case, waiting_hosts)
    # the late node learns what the others wait in at its first poll past STALL_AFTER, then
    # each waiting node at its next poll
    _assert_bounded(case, figure, STALL_AFTER_S + 2 * POLL_S)


def test_then_a_rank_stuck_in_training_is_named_by_all_16_nodes(
    init_then_training: Job,
) -> None:
    """The same job, past its start-up: global rank 11 stops before its ``backward()`` at
    step 5, the 15 others wait in DDP's all-reduce. Its node (no rank in a collective) reads
    what the others wait in from the store and names it; the others name it through it."""
    case = init_then_training.cases["training"]
    waiting_hosts = _check_named_by_every_node(case, TRAINING_FRAME)
    numbers = {r["attributes"][A.STALLED_COLLECTIVE_NUMBER] for r in case.naming.values()}
    assert len(numbers) == 1 and numbers.pop() > 1, case.said()
    for host in waiting_hosts:
        report = case.naming[host]
        assert report["attributes"][A.STALLED_PROCESS_GROUP] == "0", report
        assert f"global ranks {case.ranks[host]} wait in all_reduce #" in report["body"], report
        assert (
            f"; waiting for global rank {TRAINING_LATE} on {case.late_host} pid {case.late_pid}"
            f" (in {TRAINING_FRAME}), which never entered it" in report["body"]
        ), report["body"]
    own = case.naming[case.late_host]
    assert "ranks on other nodes wait in all_reduce #" in own["body"], own["body"]
    figure = _measure(case, waiting_hosts)
    record_figure(figure)
    _assert_within_a_poll_of_knowing(case, waiting_hosts)
    _assert_bounded(case, figure, STALL_AFTER_S + 2 * POLL_S)


# --- job 2: a rank stuck before the first collective, then a node frozen in training ----------


def _host_of(case: Case, rank: int) -> str:
    return next((host for host, r in case.ranks.items() if r == rank), "")


def _training(job: HostJob) -> bool:
    """Whether every worker issued 10 collectives or more (its Flight Recorder's reading)."""
    readings = [
        read_collectives(str(f.parent)) for f in job.logs.rglob("elastic_otel_collectives.json")
    ]
    issued = [r.groups[0].issued for r in readings if r is not None and r.groups]
    return len(issued) == len(HOSTS) and min(issued) > 10


@pytest.fixture(scope="module")
def first_then_frozen(
    host_network: HostNetwork,
    network_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Job:
    tmp_path = tmp_path_factory.mktemp("first_then_frozen")
    release = tmp_path / "checkpoint-loaded"
    job = _job(
        host_network,
        network_receiver,
        tmp_path,
        "first",
        (KEEP_ALIVE,),
        STARTUP_HANG_RANKS=str(FIRST_LATE),
        STARTUP_HANG_AT="first",
        STARTUP_HANG_UNTIL=str(release),
        STEP_SECONDS="0.1",
    )
    first, frozen = (
        Case("a rank stuck before the first collective"),
        Case("a node frozen in training"),
    )
    stopped: list[str] = []
    try:
        _follow(
            first,
            job,
            network_receiver,
            lambda r: True,
            lambda r: r["attributes"].get(A.STALLED_RANKS) == [FIRST_LATE],
            16,
            START_TIMEOUT_S,
        )
        _late(first, job, FIRST_LATE)
        release.touch()
        network_receiver.wait_until(lambda: _training(job), 120)
        # A node whose keep-alives torch's rendezvous still holds (one it dropped at a loaded
        # start-up sends none since, and is named silent too: rightly, but not for the
        # freeze), that neither hosts the store nor has rank 0 (whose agent hosts the workers').
        frozen.live_before = job.heartbeats()
        rank = next(
            (
                r
                for r in (9, 10, 12, 13, 14, 15, 4, 5, 6, 7, 8, 1, 2, 3, 11)
                if first.ranks.get(HOSTS[0]) != r
                and frozen.live_before.get(_host_of(first, r), KEEP_ALIVE_S) < KEEP_ALIVE_S / 2
            ),
            None,
        )
        assert rank is not None, f"torch's rendezvous dropped every node: {frozen.live_before}"
        _late(frozen, job, rank)
        frozen_ns = time.time_ns()
        stopped.append(frozen.late_host)
        host_network.signal(frozen.late_host, signal.SIGSTOP)
        silent = f"{frozen.late_host}_{frozen.late_pid}_"
        _follow(
            frozen,
            job,
            network_receiver,
            lambda r: r["time_ns"] >= frozen_ns and r["attributes"].get(A.STALLED_IN) == "training",
            lambda r: silent in str(r["attributes"].get(A.STALLED_SILENT_NODES)),
            15,
            120,
        )
    finally:
        for host in stopped:
            host_network.signal(host, signal.SIGCONT)
        job.stop()
    return Job({"first": first, "frozen": frozen})


def test_a_rank_stuck_before_the_first_collective_is_named_by_all_16_nodes(
    first_then_frozen: Job,
) -> None:
    """Global rank 3 stops after ``init_process_group``, before DDP's first broadcast: the 15
    others wait in collective #1 of the default group. Its node, none of whose ranks began
    training, reads that from the store and names it; the others name it through it."""
    case = first_then_frozen.cases["first"]
    waiting_hosts = _check_named_by_every_node(case, STARTUP_FRAME)
    for report in case.naming.values():
        attrs = report["attributes"]
        assert attrs[A.STALLED_COLLECTIVE_NUMBER] == 1 and attrs[A.STALLED_PROCESS_GROUP] == "0"
        assert f"(in {STARTUP_FRAME}), which never entered it" in report["body"], report["body"]
    own = case.naming[case.late_host]
    assert own["attributes"][A.STALLED_PHASE] == "startup", own
    assert " s in start-up: ranks on other nodes wait in " in own["body"], own["body"]
    figure = _measure(case, waiting_hosts)
    record_figure(figure)
    _assert_within_a_poll_of_knowing(case, waiting_hosts)
    _assert_bounded(case, figure, STALL_AFTER_S + 2 * POLL_S)


def test_then_a_node_frozen_in_training_is_named_by_the_15_others(first_then_frozen: Job) -> None:
    """The same job, training: a whole node freezes (everything in its namespace stopped).
    Every rank of every other node waits in the same all-reduce; each of the 15 says it waits
    for ranks on other nodes and names the frozen node, by its host name, agent pid and group
    rank, as the one whose rendezvous keep-alives stopped. The frozen node says nothing."""
    case = first_then_frozen.cases["frozen"]
    assert case.late_host, case.said()
    others = [h for h in HOSTS if h != case.late_host]
    assert sorted(case.naming) == sorted(others), case.said()
    assert case.late_host not in {_host(r) for r in case.reports}, case.said()
    assert case.live_before[case.late_host] < KEEP_ALIVE_S, case.live_before  # not dropped
    for host in others:
        attrs = case.naming[host]["attributes"]
        assert attrs[A.STALLED_WAITING] == [case.ranks[host]], (host, attrs)
        assert A.STALLED_RANKS not in attrs, (host, attrs)
        assert attrs[A.STALLED_SILENT_SELF] is False, (host, attrs)
        assert f"{case.late_host}_{case.late_pid}_0" in attrs[A.STALLED_SILENT_NODES].split(", ")
        assert case.ranks[case.late_host] in attrs[A.STALLED_SILENT_GROUP_RANKS], attrs
        assert "waiting for ranks on other nodes" in case.naming[host]["body"]
        assert "sent no rendezvous keep-alive for" in case.naming[host]["body"]
    figure = _measure(case, others)
    record_figure(figure)
    # every node's first report names it: keep-alives silent for KEEP_ALIVE_S by then
    late = {h: r["time_ns"] for h, r in case.naming.items() if r is not _first(case, h)}
    assert not late, f"not named in a node's first report: {sorted(late)}\n{case.said()}"
    _assert_bounded(case, figure, max(STALL_AFTER_S, KEEP_ALIVE_S) + POLL_S)


def _first(case: Case, host: str) -> dict:
    return next(r for r in case.reports if _host(r) == host)
