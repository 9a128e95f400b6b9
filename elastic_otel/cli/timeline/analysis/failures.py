"""The failure analysis: per attempt (the ``worker`` spans of one trace: one round, across
nodes), the root cause and what followed it.

The root cause is the earliest worker that failed on its own (``torchelastic.failure.kind`` =
``root_cause``; in exports from before that attribute, an ERROR ``FAILED`` worker) by span end;
the other root causes are independent failures, and the workers that died of it
(``peer_failure``, ``stopped``) its consequences, each with its delay after the root cause.
An attempt in which no worker failed on its own but a training stall named the rank every other
rank waited for, and that ended without a restart (a scheduler's signal), has that stalled rank
as its root cause (:class:`StalledRank`, from :func:`~.stalls.stalled_root`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from elastic_otel.cli.timeline.analysis.items import (
    Item,
    as_int,
    error_message,
    exception_type,
    host_of,
    instance_id,
    rank_key,
)
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import WorkerState

_KINDS = frozenset({A.KIND_ROOT_CAUSE, A.KIND_PEER_FAILURE, A.KIND_STOPPED})

ROOT = "root"
INDEPENDENT = "independent"
CONSEQUENCE = "consequence"
"""A worker's role in its attempt's failure (:meth:`Failure.roles`)."""


@dataclass
class FailedAttemptWorker:
    """A worker of a failed attempt that did not succeed, read from its ``worker`` span: a root
    cause, or a consequence of one (``torchelastic.failure.kind``)."""

    global_rank: int | None
    host: str  # where it ran: host.name, or the node label when agents share the host
    state: str
    kind: str  # a torchelastic.failure.kind value
    end_ns: int
    span_id: str = ""
    error_type: str = ""
    exit_code: int | None = None
    oom: bool = False
    message: str = ""
    node: str = ""  # its agent's node label, where rendezvous spans name it
    last_words: str = ""  # a root cause's last lines of stderr (torchelastic.last_words)

    @property
    def rank(self) -> str:
        return "?" if self.global_rank is None else str(self.global_rank)


@dataclass
class StalledRank:
    """A root cause no worker's end shows: the rank a training stall's other ranks waited for
    (``torchelastic.stalled.ranks``), from when it stopped making progress, at its line."""

    global_rank: int
    node: str  # the node that has it (another node's report names it: remote host, pids)
    frame: str  # its innermost frame (torchelastic.stack.frame)
    seconds: float  # how long it was stalled, as last reported
    start_ns: int  # when it stopped making progress
    collective: str = ""  # what the others wait in: ``all_reduce #4``
    waiting: list[tuple[int, str]] = field(default_factory=list)  # (rank, node) waiting for it

    @property
    def rank(self) -> str:
        return str(self.global_rank)


@dataclass
class Failure:
    """What failed in one attempt (the worker spans of one trace), across nodes."""

    trace_id: str
    round: int | None
    roots: list[
        FailedAttemptWorker
    ]  # failed on their own, earliest first: the first is the root cause
    consequences: list[FailedAttemptWorker]  # died of it (peer failures, stopped), by end time
    stalled: StalledRank | None = None  # no root cause among the workers: the rank it hung on

    @property
    def root(self) -> FailedAttemptWorker | None:
        return self.roots[0] if self.roots else None

    @property
    def cause_rank(self) -> str | None:
        """The global rank of the root cause (a failed worker's, else the stalled rank's)."""
        if self.root is not None:
            return self.root.rank
        return None if self.stalled is None else self.stalled.rank

    @property
    def time_ns(self) -> int:
        """When the attempt broke: the root cause's end, else the stall's start (else the first
        consequence's end)."""
        if self.root is not None:
            return self.root.end_ns
        if self.stalled is not None:
            return self.stalled.start_ns
        return min(w.end_ns for w in self.consequences)

    def delay_ns(self, worker: FailedAttemptWorker) -> int:
        return worker.end_ns - self.time_ns

    def after_root(self) -> list[FailedAttemptWorker]:
        """Everything but the root cause, in order of end: the other roots, the consequences."""
        rest = self.roots[1:] + self.consequences
        return sorted(rest, key=lambda w: (w.end_ns, rank_key(w.global_rank)))

    def span_ids(self) -> set[str]:
        return {w.span_id for w in self.roots + self.consequences if w.span_id}

    def roles(self) -> dict[str, tuple[str, FailedAttemptWorker]]:
        """Worker span id → its role (:data:`ROOT`, :data:`INDEPENDENT`: another that failed
        on its own, :data:`CONSEQUENCE`) and the worker."""
        roles = {}
        if self.root is not None:
            roles[self.root.span_id] = (ROOT, self.root)
        for w in self.roots[1:] + self.consequences:
            roles[w.span_id] = (INDEPENDENT if w.kind == A.KIND_ROOT_CAUSE else CONSEQUENCE, w)
        return roles


def failures(
    workers: Iterable[Item],
    labels: dict[str, str] | None = None,
    rounds: dict[str, int] | None = None,
) -> list[Failure]:
    """Per attempt (trace) with a worker that failed, its root cause and consequences, in
    order of time. An attempt whose workers were only stopped (a membership change) is none.
    ``labels`` names the node of a process (``service.instance.id``), ``rounds`` the round of
    a trace."""
    labels = labels or {}
    by_trace: dict[str, list[FailedAttemptWorker]] = {}
    nodes_on: dict[str, set[str]] = {}  # host → the nodes (agent processes) seen on it
    for span in workers:
        end = failed_worker(span, labels)
        node = labels.get(instance_id(span))
        if node:
            nodes_on.setdefault(host_of(span) or node, set()).add(node)
        if end is not None:
            by_trace.setdefault(span["trace_id"], []).append(end)
    for end in (end for ends in by_trace.values() for end in ends):
        if end.node and len(nodes_on.get(end.host, ())) > 1:
            end.host = end.node  # agents sharing a host (the demo): name the process too
    found = []
    for trace_id, ends in by_trace.items():
        roots = [w for w in ends if w.kind == A.KIND_ROOT_CAUSE]
        consequences = [w for w in ends if w.kind != A.KIND_ROOT_CAUSE]
        if not roots and all(w.kind == A.KIND_STOPPED for w in consequences):
            continue
        roots.sort(key=lambda w: (w.end_ns, rank_key(w.global_rank)))
        consequences.sort(key=lambda w: (w.end_ns, rank_key(w.global_rank)))
        found.append(Failure(trace_id, (rounds or {}).get(trace_id), roots, consequences))
    found.sort(key=lambda f: f.time_ns)
    return found


def failed_worker(span: Item, labels: dict[str, str]) -> FailedAttemptWorker | None:
    """``span`` (a ``worker`` span) as a failure or a consequence of one; ``None`` when it is
    neither (it succeeded, still runs, or was restarted for a membership change)."""
    attrs = span["attributes"]
    state = str(attrs.get(A.STATE, ""))
    kind = attrs.get(A.FAILURE_KIND)
    if kind is None:  # an export from before failure kinds: what the state and status say
        if state == WorkerState.FAILED.value and span["status_code"] == "ERROR":
            kind = A.KIND_ROOT_CAUSE
        elif state == WorkerState.PEER_FAILED.value:
            kind = A.KIND_PEER_FAILURE
        elif state == WorkerState.STOPPED.value:
            kind = A.KIND_STOPPED
    if kind not in _KINDS:
        return None
    error_type = str(attrs.get(A.ERROR_TYPE, "") or exception_type(span))
    message = error_message(span) or str(attrs.get(A.END_REASON, "") or span["status_message"])
    if error_type and message.startswith(f"{error_type}: "):
        message = message[len(error_type) + 2 :]
    elif message == error_type:
        message = ""
    exit_code = attrs.get(A.PROCESS_EXIT_CODE, attrs.get(A.EXIT_CODE))
    node = labels.get(instance_id(span), "")
    return FailedAttemptWorker(
        global_rank=as_int(attrs.get(A.GLOBAL_RANK)),
        host=host_of(span) or node or "?",
        state=state or "?",
        kind=str(kind),
        end_ns=span["end_ns"],
        span_id=span["span_id"],
        error_type=error_type,
        exit_code=as_int(exit_code),
        oom=attrs.get(A.OOM_KILL) is True,
        message=message,
        node=node,
        last_words=str(attrs.get(A.LAST_WORDS, "") or ""),
    )
