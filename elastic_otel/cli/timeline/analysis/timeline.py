"""The timeline of a job as plain data: rounds, each with its nodes in join order and below each
node its workers and recoveries into the round, how the round began and ended, and what the
analyses found in it (its failure, stalls, stragglers, slowdowns and slow links, lost progress);
above them, per run, its
summary and goodput. :func:`~elastic_otel.cli.timeline.analysis.build.build_timeline` fills it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from elastic_otel.cli.timeline.analysis.failures import Failure
from elastic_otel.cli.timeline.analysis.goodput import AttemptGoodput
from elastic_otel.cli.timeline.analysis.runs import NodeRecovery, RunSummary
from elastic_otel.cli.timeline.analysis.slowdowns import LinkFinding, Slowdown
from elastic_otel.cli.timeline.analysis.stalls import Stall
from elastic_otel.cli.timeline.analysis.stragglers import StragglerSpell
from elastic_otel.model.goodput import Breakdown
from elastic_otel.names.torch_names import WorkerState

FAILURE_STATES = frozenset(
    {WorkerState.FAILED.value, WorkerState.UNHEALTHY.value, WorkerState.PEER_FAILED.value}
)
LOST = "LOST"
"""Worker states drawn as failures (``REPLACED`` counts too when its span has ERROR status)."""

AFTER_FAILURE = "failure"
AFTER_MEMBERSHIP_CHANGE = "membership change"
"""Why a round that is not its run's first began (:attr:`Round.began_after`)."""


@dataclass
class Bar:
    """One span on the time axis."""

    name: str
    start_ns: int
    end_ns: int
    status: str = "UNSET"
    detail: str = ""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class WorkerRow:
    global_rank: int | None
    local_rank: int | None
    state: str
    start_ns: int
    end_ns: int
    exit_code: int | None = None
    message: str = ""
    error: bool = False
    restarts: int | None = None
    pid: int | None = None
    span_id: str = ""
    trace_id: str = ""

    @property
    def failed(self) -> bool:
        return self.error or self.state in FAILURE_STATES or self.state == LOST


@dataclass
class NodeRow:
    key: tuple
    label: str
    host: str = ""
    pid: int | None = None
    rank: int | None = None
    world_size: int | None = None
    join: Bar | None = None
    member: Bar | None = None
    steps: list[Bar] = field(default_factory=list)
    workers: list[WorkerRow] = field(default_factory=list)
    agent_state: str = ""
    agent_end_ns: int | None = None
    agent_message: str = ""
    lost_ns: int | None = None  # its process was lost; last heard at this time
    recoveries: list[NodeRecovery] = field(default_factory=list)  # its agent's, into this round

    @property
    def first_ns(self) -> int:
        starts = [b.start_ns for b in (self.join, self.member) if b is not None]
        starts += [w.start_ns for w in self.workers] + [s.start_ns for s in self.steps]
        return min(starts) if starts else 0

    @property
    def join_failed(self) -> bool:
        return self.join is not None and self.join.status == "ERROR"

    @property
    def left_ns(self) -> int | None:
        """When it left the round: its member span's end, else its join's."""
        if self.member is not None:
            return self.member.end_ns
        return self.join.end_ns if self.join is not None else None


@dataclass
class LostProgress:
    """The progress a failure of the round lost (a restart redoes it), on the node that
    reported it: the attempt's goodput breakdown says which steps."""

    node: str
    start_ns: int
    end_ns: int
    attempt: int
    breakdown: Breakdown


@dataclass
class RoundOutcome:
    """How a round ended. Of ``job_failed``, ``job_succeeded`` and ``workers_succeeded`` at
    most one holds; ``workers_succeeded`` only when nothing else is to be said of the round."""

    lost_nodes: int = 0
    rendezvous_failed: bool = False
    worker_failure: bool = False  # a worker failed (not just lost)
    group_restarted: bool = False  # after that failure, its group was replaced
    membership_restart: bool = False  # no failure, but workers restarted for new members
    job_failed: bool = False  # an agent's run ended FAILED
    job_succeeded: bool = False  # every agent's run ended SUCCEEDED
    workers_succeeded: bool = False  # every worker SUCCEEDED, no agent said the job ended


@dataclass
class Round:
    run_id: str
    number: int | None
    label: str
    nodes: list[NodeRow] = field(default_factory=list)
    world_size: int | None = None
    began_after: str = ""  # AFTER_FAILURE, AFTER_MEMBERSHIP_CHANGE; "": its run's first
    agent_restarts: int = 0  # the agents' restart count in it, when it began after another
    outcome: RoundOutcome = field(default_factory=RoundOutcome)
    failure: Failure | None = None  # its root cause and the failures that followed it
    stalls: list[Stall] = field(default_factory=list)  # training stalls, agents' waits
    stragglers: list[StragglerSpell] = field(default_factory=list)
    slowdowns: list[Slowdown] = field(default_factory=list)
    links: list[LinkFinding] = field(default_factory=list)  # node 0's findings, then evidence
    lost: list[LostProgress] = field(default_factory=list)  # progress its failure lost

    @property
    def start_ns(self) -> int:
        return min((n.first_ns for n in self.nodes), default=0)

    @property
    def failed(self) -> bool:
        return any(
            n.join_failed or n.lost_ns is not None or any(w.failed for w in n.workers)
            for n in self.nodes
        )


@dataclass
class ErrorNote:
    """A log record of severity ERROR or above."""

    time_ns: int
    node: str  # its node's label, else the host that logged it
    message: str  # its text (a traceback's last line), with its exception's type and message
    source: str = ""  # torchelastic.event.source
    global_rank: str | None = None  # a worker's, as it logged it


@dataclass
class Timeline:
    rounds: list[Round]
    t0_ns: int
    t1_ns: int
    errors: list[ErrorNote] = field(default_factory=list)
    runs: list[RunSummary] = field(default_factory=list)
    goodput: list[AttemptGoodput] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        """Every node label, in order of first appearance."""
        return list(dict.fromkeys(n.label for r in self.rounds for n in r.nodes))

    @property
    def run_ids(self) -> list[str]:
        return list(dict.fromkeys(r.run_id for r in self.rounds))

    @property
    def worker_runs(self) -> int:
        """Worker spans across rounds and nodes."""
        return sum(len(n.workers) for r in self.rounds for n in r.nodes)
