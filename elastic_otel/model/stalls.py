"""Stall reports: a node that waits too long says so while it waits, not when it gives up.

torch says nothing while a join waits for missing nodes (until it times out, 600 s by
default), while the exit barrier waits for a lost node (300 s), or while the agent waits for
its workers to stop. Every open wait the trace model knows of is a :class:`Wait`;
:class:`StallWatch` reports one when it has lasted ``ELASTIC_OTEL_STALL_AFTER`` seconds and
again at that interval while it lasts, as a WARN log record on the waiting span
(``torchelastic.stalled.in``, ``torchelastic.stalled.seconds`` and what the node knows), and
keeps the longest current wait per kind for the ``torchelastic.stalled.seconds`` gauge.

The seam: the rendezvous and agent models only list what waits now (their ``waits()``, each
with the context only it knows); when a wait is due, and what its report says, is decided
here, once for every kind. Pure: no SDK, no torch, no clock of its own (the event thread
passes the time in).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TypeGuard

from elastic_otel.model.spans import LogOut, SpanAttributes, SpanRecord
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import (
    SCHEDULED,
    TIMING_FORCED,
    TIMING_MEASURING,
    TIMING_NOT_AT_RUN_TIME,
    TIMING_OVER_BUDGET,
    TIMING_SET_BY_JOB,
    TIMING_WITHIN_BUDGET,
    CollectiveProgress,
    NcclTiming,
    group_name,
)
from elastic_otel.parsing.torch_events import ElasticEvent, EventKind
from elastic_otel.parsing.worker_progress import WorkerProgress

STALL_EVENT_NAME = "torchelastic.stalled"
STALL_STATE = "STALLED"
WAIT_KINDS = ("rendezvous.join", "exit_barrier", "stop_workers")
"""Values of ``torchelastic.stalled.in`` for the waits the trace model knows of: the join of a
round, torch's exit barrier, the agent waiting for its workers to stop."""
TRAINING = "training"
"""``torchelastic.stalled.in`` of a training stall: no local rank made progress (see
:func:`training_stall`), or, in start-up, ranks wait for others to reach the job's first
rendezvous (:func:`startup_stall`); reported by the agent instrumentation, which reads the
workers' progress records."""
STARTUP = "startup"
"""``torchelastic.stalled.phase`` of a stall before training began: from the workers' start to
their first collective (imports, the model, ``init_process_group``, the first collective)."""
INIT = "init_process_group"
INIT_GROUP = "init"
"""The exchange's name for what ranks inside ``init_process_group`` wait in (no process group
exists yet): every rank of the job must reach it."""


@dataclass(slots=True)
class Wait:
    """Something a node is waiting for, open since its span started."""

    kind: str
    span: SpanRecord
    context: SpanAttributes  # what the node knows: run id, host, rank, round, last message


class StallWatch:
    """Decides which waits to report now; remembers when each was last reported."""

    def __init__(self, after_s: float) -> None:
        self.after_ns = int(after_s * 1e9) if after_s > 0 else 0
        self._reported: dict[int, int] = {}  # span id → when last reported
        self.current: dict[str, float] = dict.fromkeys(WAIT_KINDS, 0.0)
        """Longest wait per kind right now, in seconds (0: none); read by the gauge."""

    @property
    def enabled(self) -> bool:
        return self.after_ns > 0

    def reports(self, waits: list[Wait], now_ns: int) -> list[LogOut]:
        """WARN log records for the waits that are due, each on its waiting span."""
        out: list[LogOut] = []
        current = dict.fromkeys(WAIT_KINDS, 0.0)
        reported: dict[int, int] = {}
        for wait in waits:
            waited_ns = now_ns - wait.span.start_ns
            if waited_ns < self.after_ns:
                continue
            seconds = waited_ns / 1e9
            current[wait.kind] = max(current.get(wait.kind, 0.0), seconds)
            last = self._reported.get(wait.span.span_id)
            if last is not None and now_ns - last < self.after_ns:
                reported[wait.span.span_id] = last
                continue
            reported[wait.span.span_id] = now_ns
            report = stall_event(wait, seconds, now_ns)
            out.append(LogOut(report, wait.span.trace_id, wait.span.span_id))
        self._reported = reported  # waits that ended are forgotten
        self.current = current
        return out


def stall_event(wait: Wait, seconds: float, now_ns: int) -> ElasticEvent:
    """The log record of one stall report."""
    attrs: SpanAttributes = dict(wait.context)
    attrs[A.STALLED_IN] = wait.kind
    attrs[A.STALLED_SECONDS] = round(seconds, 3)
    attrs[A.EVENT_NAME] = STALL_EVENT_NAME
    attrs[A.EVENT_SOURCE] = A.SOURCE_AGENT
    where = f"round {attrs[A.ROUND]}" if A.ROUND in attrs else ""
    body = f"stalled in {wait.kind} for {seconds:.0f} s" + (f" ({where})" if where else "")
    last = attrs.get(A.MESSAGE)
    if isinstance(last, str) and last:
        body += f"; last rendezvous message: {last}"
    run_id = attrs.get(A.RUN_ID)
    return ElasticEvent(
        kind=EventKind.GENERIC,
        name=STALL_EVENT_NAME,
        body=body,
        time_ns=now_ns,
        attributes=attrs,
        run_id=run_id if isinstance(run_id, str) else "",
        state=STALL_STATE,
    )


# --- training ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankProgress:
    """Where a local rank is: from its progress record (:mod:`elastic_otel.worker.progress`:
    the Python collectives, the marked step) and, where torch keeps one, its process groups'
    Flight Recorder (:mod:`elastic_otel.parsing.collectives`), which sees every collective."""

    global_rank: int
    collective: str | None  # the collective it is in now (None: in none)
    entered: int  # which collective that is, or how many it entered (in ``group``, if known)
    step: int | None  # the last step the script marked (None: it marks none)
    progress_ns: int  # when it last entered or left a collective or marked a step
    group: str | None = None  # the key of ``collective``'s process group (None: unknown)
    issued: tuple[tuple[str, int], ...] = ()  # (group key, last collective issued) per group
    state: str | None = None  # ``collective``'s state on the device, where the record says
    members: tuple[int, ...] = ()  # the global ranks of ``group`` (empty: unknown)
    left: bool = False  # it left training: destroyed its default process group, or exiting
    timing: NcclTiming | None = None  # its NCCL timing events, where it has a NCCL group
    init: int = 0  # init_process_group: 0 not reached (or unknown), 1 inside (since
    # ``progress_ns``), 2 past it
    timed_from: int = 0  # ``group``'s first collective with NCCL timing events (0: none known)


@dataclass(frozen=True, slots=True)
class TrainingStall:
    """No local rank made progress for a while; who waits, and for whom."""

    seconds: float
    waiting: tuple[int, ...]  # global ranks inside the collective the node waits in
    waited_for: tuple[int, ...]  # local global ranks the waiting ones wait for (may be none)
    collective: str | None  # the collective they wait in
    number: int  # which collective that is (1: the first; of ``group`` when there is one)
    group: str | None = None  # its process group, where the Flight Recorder says
    backend: str = ""  # the record that says so ("gloo", "nccl")
    not_reached: tuple[int, ...] = ()  # of the ranks waited for: issued it, device not started
    left: tuple[int, ...] = ()  # of the ranks waited for: left training (uneven inputs)
    state_known: bool = False  # the record tracks the device's start (NCCL with timing)
    local_group: bool = False  # every member of the group is a local rank
    timed_out: tuple[int, ...] = ()  # local ranks whose NCCL watchdog timed the collective out
    timeout_s: float | None = None  # after how long
    phase: str = TRAINING  # STARTUP before training began
    timing: NcclTiming | None = None  # the waiting ranks' NCCL timing, where they have one
    timed_from: int = 0  # the group's first collective with NCCL timing events (0: none known)
    # Named by other nodes through the round's store (model/stall_exchange.py): the ranks
    # waited for there, their nodes (host, agent pid) and the first one's innermost frame.
    remote: tuple[int, ...] = ()
    remote_hosts: tuple[str, ...] = ()
    remote_pids: tuple[int, ...] = ()
    remote_frame: str = ""


def rank_progress(
    global_rank: int, progress: WorkerProgress, collectives: CollectiveProgress | None
) -> RankProgress:
    """Where a rank is, from its progress record and its Flight Recorder reading (which wins
    on the collective: it sees all of them; the record adds the marked step and whether it
    left training)."""
    found = _rank_progress(global_rank, progress, collectives)
    if collectives is not None and collectives.groups:
        found = replace(found, init=2)  # it made its groups: past init_process_group
    if collectives is not None and collectives.nccl_timing is not None:
        found = replace(found, timing=collectives.nccl_timing)
    return replace(found, left=True) if progress.left else found


def _rank_progress(
    global_rank: int, progress: WorkerProgress, collectives: CollectiveProgress | None
) -> RankProgress:
    groups = collectives.groups if collectives is not None else ()
    if collectives is None or not groups:
        if progress.init == 1:  # inside init_process_group since it entered it
            return RankProgress(global_rank, INIT, 0, progress.step, progress.since_ns, init=1)
        # Before init_process_group, or past it: only the Python record says which (the
        # rank's groups are in the Flight Recorder once it made them).
        init_state = progress.init or (2 if progress.entered else 0)
        return RankProgress(
            global_rank,
            progress.collective,
            progress.entered,
            progress.step,
            progress.progress_ns,
            issued=((INIT_GROUP, 1 if init_state else 0),),
            init=init_state,
        )
    issued = tuple((g.key, g.issued) for g in groups)
    progress_ns = max(progress.progress_ns, collectives.progress_ns)
    inside = collectives.open_group()
    if inside is not None:
        number = inside.first_open
        return RankProgress(
            global_rank,
            inside.op or progress.collective or "collective",
            number,
            progress.step,
            progress_ns,
            inside.key,
            issued,
            inside.state_of(number),
            inside.members,
            timed_from=inside.timed_from,
        )
    if progress.collective is not None:  # one the Flight Recorder does not count (send, recv)
        return RankProgress(
            global_rank,
            progress.collective,
            progress.entered,
            progress.step,
            progress_ns,
            None,
            issued,
        )
    # The default group in the record that counts its collectives (each record lists it once
    # the worker made it, the other record's never issues one).
    default = max((g for g in groups if g.name == "0"), key=lambda g: g.issued, default=groups[0])
    entered = max(default.issued, progress.entered)
    return RankProgress(global_rank, None, entered, progress.step, progress_ns, None, issued)


def training_stall(
    ranks: list[RankProgress], now_ns: int, after_ns: int, local_ranks: Iterable[int] = ()
) -> TrainingStall | None:
    """A training stall when no rank of ``ranks`` made progress for ``after_ns``.

    The ranks inside the oldest open collective of the group most of them wait in wait there.
    Where the Flight Recorder names the process group, the ranks waited for are its local
    members that never issued that collective (no collective of the group yet counts as an
    earlier one) and, where the record tracks the device's start, those whose device has not
    started it; otherwise every other local rank is. With no rank in a collective, ranks behind
    the others' last marked step are waited for. When every local rank waits in the same
    collective, the ranks they wait for are on other nodes: that node's report names them.
    Training begins with the first collective a local rank enters (or the first step it marks)
    and ends for a rank when it leaves (destroys its default process group, or exits): neither
    a slow start (imports, ``init_process_group`` of thousands of ranks) nor a slow exit is a
    training stall; a rank that left and never issued the collective the others wait in is
    named as one that left. ``local_ranks``: every global rank of this node (those without a
    record yet too), to tell a group whose members are all here.
    """
    if not ranks or after_ns <= 0 or all(r.left for r in ranks):
        return None
    if not any(r.entered > 0 or r.step is not None for r in ranks):
        return None  # still starting: training has not begun
    last = max(r.progress_ns for r in ranks)
    if now_ns - last < after_ns:
        return None
    seconds = (now_ns - last) / 1e9
    inside = [r for r in ranks if r.collective is not None]
    group = _waited_group(inside)
    if group is not None:
        local = {*local_ranks, *(r.global_rank for r in ranks)}
        return _group_stall([r for r in inside if r.group == group], ranks, group, seconds, local)
    not_reached: list[RankProgress] = []
    if inside:
        number = max(r.entered for r in inside)
        waiting = [r for r in inside if r.entered == number]
        collective = waiting[0].collective
        waited_for = [r for r in ranks if r not in waiting]
    else:  # behind in marked steps; a rank that left is behind nobody and waits for nobody
        training = [r for r in ranks if not r.left]
        steps = [r.step for r in training if r.step is not None]
        top = max(steps) if steps else None
        waiting = [r for r in training if top is not None and r.step == top] if steps else []
        number, collective = 0, None
        if len(waiting) == len(training):
            waiting = []  # all at the same step, none in a collective: nobody waits on a rank
        waited_for = [r for r in training if r not in waiting] if waiting else []
    return TrainingStall(
        seconds=seconds,
        waiting=_ranks(waiting),
        waited_for=_ranks(waited_for + not_reached),
        collective=collective,
        number=number,
        left=_ranks([r for r in waited_for if r.left]),
    )


def startup_stall(
    ranks: list[RankProgress], now_ns: int, after_ns: int, started_ns: int
) -> TrainingStall | None:
    """A stall before training began (no local rank issued a collective or marked a step).

    Ranks inside ``init_process_group`` for ``after_ns`` wait there for every rank of the job:
    for the local ranks that have not reached it (named here) or, with none, for ranks on other
    nodes. With no local rank waiting, once the workers started ``after_ns`` ago, a stall that
    names nobody: not a report by itself (a slow start is no stall), but what the stall
    exchange needs to learn that other nodes wait for this one's ranks (``started_ns``: when
    the workers started)."""
    if not ranks or after_ns <= 0 or started_ns <= 0:
        return None
    if any(r.entered > 0 or r.step is not None or r.left for r in ranks):
        return None  # training began (or ended): training_stall's
    inside = [r for r in ranks if r.init == 1]
    waiting = [r for r in inside if now_ns - r.progress_ns >= after_ns]
    if waiting:
        return TrainingStall(
            seconds=(now_ns - min(r.progress_ns for r in waiting)) / 1e9,
            waiting=_ranks(inside),
            waited_for=_ranks([r for r in ranks if r.init == 0]),
            collective=INIT,
            number=1,
            group=INIT_GROUP,
            phase=STARTUP,
        )
    if now_ns - started_ns < after_ns or inside:
        return None
    return TrainingStall((now_ns - started_ns) / 1e9, (), (), None, 0, phase=STARTUP)


def _group_stall(
    inside: list[RankProgress],
    ranks: list[RankProgress],
    group: str,
    seconds: float,
    local: set[int],
) -> TrainingStall:
    """Who waits for whom in one process group's collective (the Flight Recorder's view)."""
    number = min(r.entered for r in inside)  # with NCCL a rank may have enqueued more behind it
    members = {m for r in inside for m in r.members}

    def member(r: RankProgress) -> bool:  # unknown members: the default group has every rank
        return r.global_rank in members if members else group_name(group) == "0"

    def state(r: RankProgress) -> str | None:
        return r.state if r.group == group and r.entered == number else None

    issued = {r.global_rank: dict(r.issued).get(group, 0) for r in ranks}
    never = [r for r in ranks if member(r) and issued[r.global_rank] < number]
    not_reached = [r for r in inside if state(r) == SCHEDULED]
    waiting = [r for r in inside if r not in not_reached]
    return TrainingStall(
        seconds=seconds,
        waiting=_ranks(waiting),
        waited_for=_ranks(never + not_reached),
        collective=next((r.collective for r in inside if r.entered == number), None),
        number=number,
        group=group_name(group),
        backend=group.rpartition(":")[0],
        not_reached=_ranks(not_reached),
        left=_ranks([r for r in never if r.left]),
        state_known=any(state(r) is not None for r in inside),
        local_group=bool(members) and members <= local,
        timing=next((r.timing for r in inside if r.timing is not None), None),
        timed_from=max((r.timed_from for r in inside if r.entered == number), default=0),
    )


def _ranks(ranks: list[RankProgress]) -> tuple[int, ...]:
    return tuple(sorted({r.global_rank for r in ranks}))


def _waited_group(inside: list[RankProgress]) -> str | None:
    """The process group most ranks inside a collective wait in (the default group, ``0``,
    on a tie); ``None`` where none is known."""
    counts: dict[str, int] = {}
    for r in inside:
        if r.group is not None:
            counts[r.group] = counts.get(r.group, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda g: (counts[g], group_name(g) == "0"))


@dataclass(frozen=True, slots=True)
class SilentNode:
    """A node of the round whose rendezvous keep-alives stopped, as this node sees them."""

    node: str  # the node's rendezvous name (``host_pid_id``)
    group_rank: int | None  # its rank in the round
    seconds: float  # since its last keep-alive (dropped as dead: at least torch's bound)
    this_node: bool  # this node itself: it reached no rendezvous store
    dropped: bool = False  # torch dropped it from its state as dead


def silent_nodes(
    members: dict[str, int],
    heartbeats: dict[str, float],
    this_node: str,
    own_sync_age_s: float | None,
    now_s: float,
    after_s: float,
) -> list[SilentNode]:
    """The round's nodes (``members``: name → group rank) whose keep-alives stopped: this
    node when it has not reached the rendezvous store for ``after_s`` (its view of the others
    is then stale, so it names no other); else every other member whose last keep-alive
    (``heartbeats``: name → epoch seconds) is older than ``after_s`` or that the rendezvous
    dropped as dead. torch itself declares a node dead after ``keep_alive_interval *
    keep_alive_max_attempt``: the ``after_s`` to pass."""
    if own_sync_age_s is not None and own_sync_age_s >= after_s:
        return [SilentNode(this_node, members.get(this_node), own_sync_age_s, True)]
    # A dropped member has been silent at least torch's bound: ``after_s`` is its age.
    out = []
    for node, rank in sorted(members.items(), key=lambda item: item[1]):
        if node == this_node:
            continue
        beat = heartbeats.get(node)
        if beat is None:
            out.append(SilentNode(node, rank, after_s, False, dropped=True))
        elif now_s - beat >= after_s:
            out.append(SilentNode(node, rank, now_s - beat, False))
    return out


def silence_attributes(nodes: list[SilentNode]) -> SpanAttributes:
    """The attributes a stall report carries about silent nodes (none for none)."""
    if not nodes:
        return {}
    attrs: SpanAttributes = {
        A.STALLED_SILENT_NODES: ", ".join(n.node for n in nodes),
        A.STALLED_SILENT_GROUP_RANKS: tuple(
            n.group_rank for n in nodes if n.group_rank is not None
        ),
        A.STALLED_SILENT_SELF: any(n.this_node for n in nodes),
        A.STALLED_SILENT_SECONDS: round(min(n.seconds for n in nodes), 3),
    }
    return attrs


def _describe_silence(attributes: SpanAttributes) -> str:
    nodes = attributes.get(A.STALLED_SILENT_NODES)
    if not isinstance(nodes, str) or not nodes:
        return ""
    seconds = attributes.get(A.STALLED_SILENT_SECONDS)
    since = f" for {float(seconds):.0f} s or more" if _is_number(seconds) else ""
    if attributes.get(A.STALLED_SILENT_SELF):
        return f"this node reached no rendezvous store{since}: its link may be cut"
    ranks = _rank_text(attributes.get(A.STALLED_SILENT_GROUP_RANKS))
    which = f"node {nodes}" + (f" (group rank {ranks})" if ranks else "")
    return f"{which} sent no rendezvous keep-alive{since}: its host or link may be down"


def describe_training_stall(attributes: SpanAttributes) -> str:
    """The body of a training stall report, from its attributes: "stalled 62 s in training:
    global ranks 0 wait in all_reduce #7; waiting for global rank 1 (in sleep at train.py:42)"."""
    seconds = attributes.get(A.STALLED_SECONDS, 0)
    phase = "start-up" if attributes.get(A.STALLED_PHASE) == STARTUP else "training"
    text = f"stalled {float(seconds):.0f} s in {phase}" if _is_number(seconds) else "stalled"
    waiting = _rank_text(attributes.get(A.STALLED_WAITING))
    collective = attributes.get(A.STALLED_COLLECTIVE)
    group = attributes.get(A.STALLED_PROCESS_GROUP)
    backend = attributes.get(A.STALLED_BACKEND)
    # Without the device's start (NCCL without timing events) a rank "in" a collective has it
    # enqueued and not completed: its GPU may be inside it or still before it.
    unknown = backend == "nccl" and attributes.get(A.STALLED_STATE_KNOWN) is False
    which = ""
    if collective:
        number = attributes.get(A.STALLED_COLLECTIVE_NUMBER)
        which = f"{collective}" + (f" #{number}" if number else "")
        which += f" of process group {group}" if group is not None else ""
        which += f" ({backend})" if backend else ""
        if waiting:
            verb = "have" if unknown else "wait in"
            text += f": global ranks {waiting} {verb} {which}"
            text += " enqueued, not completed" if unknown else ""
    ranks = attributes.get(A.STALLED_RANKS)
    late = _as_ranks(attributes.get(A.STALLED_NOT_REACHED))
    left = _as_ranks(attributes.get(A.STALLED_LEFT))
    never = [r for r in _as_ranks(ranks) if r not in late and r not in left]
    frame = attributes.get(A.STACK_FRAME)
    init = collective == INIT  # no process group yet: every rank must reach it
    late_timing = _late_timing(attributes)
    if collective and not waiting and never and (group is not None or init):
        # Ranks that never issued it, none local waiting: the ones that issued it are elsewhere.
        text += f": ranks on other nodes wait in {which}"
    where = _remote_text(attributes)
    parts = []
    if left:
        part = f"global rank {_rank_text(left)}" + where + (f" (in {frame})" if frame else "")
        parts.append(part + ", which left training (destroyed its process group, or exiting)")
    if never or (ranks and not late and not left):
        named = _rank_text(tuple(never)) if never else _rank_text(ranks)
        part = f"global rank {named}" + where + (f" (in {frame})" if frame else "")
        if init:
            part += ", which has not reached it"
        elif group is not None and collective:
            part += ", which never issued it" if backend == "nccl" else ", which never entered it"
        parts.append(part)
    if late:
        part = f"global rank {_rank_text(late)}" + where
        part += f" (in {frame})" if frame and not never else ""
        # Named here when no clause before said which collective "it" is.
        named_before = bool(waiting) or (bool(never) and group is not None)
        reached = "it" if named_before or not which else which
        part += f", whose GPU has not reached {reached} (scheduled: its own compute is slow or"
        part += " stuck)"
        parts.append(part)
    if parts:
        text += "; waiting for " + " and ".join(parts)
    elif waiting and attributes.get(A.STALLED_LOCAL_GROUP) is True:
        text += "; every member of the group is on this node"
        if unknown and late_timing:
            text += f" and none of their GPUs has finished it: {late_timing}, so the record"
            text += f" cannot tell which GPU stopped ({_TIMED_FROM_START})"
        elif unknown:
            text += " and none of their GPUs has finished it: without NCCL timing the record"
            text += " cannot tell which GPU stopped"
        else:
            text += " and inside it: no rank is late, the transport between them is stuck"
    elif waiting:
        text += "; waiting for ranks on other nodes"
        if unknown and late_timing:
            text += f" (or a local GPU: {late_timing}, so the record cannot say whose GPU"
            text += f" started it; {_TIMED_FROM_START})"
        elif unknown:
            text += " (or a local GPU: without NCCL timing the record does not say whose GPU"
            text += " started it)"
    elif not collective:
        text += "; no rank is in a collective"
    timed_out = _rank_text(attributes.get(A.STALLED_TIMED_OUT))
    timeout = attributes.get(A.NCCL_TIMEOUT_S)
    if timed_out and _is_number(timeout):
        plural = "," in timed_out
        text += f"; torch's NCCL watchdog timed it out after {float(timeout):g} s on global"
        text += f" rank{'s' if plural else ''} {timed_out} and is dumping its Flight Recorder"
        text += f" before it aborts {'them' if plural else 'the rank'}"
    if backend == "nccl" and attributes.get(A.NCCL_TIMING) == "off":
        text += f" (NCCL timing {describe_nccl_timing(attributes)})"
    silence = _describe_silence(attributes)
    if silence:
        text += f"; {silence}"
    unanswered = _rank_text(attributes.get(A.FLIGHT_RECORDER_UNANSWERED))
    if unanswered:
        text += f"; no Flight Recorder dump from global rank {unanswered} (holding the GIL?)"
    return text


_TIMED_FROM_START = "ELASTIC_OTEL_NCCL_TIMING=true times from the first"


def _late_timing(attributes: SpanAttributes) -> str:
    """``NCCL timing came on from collective #502, after this one (#501) was enqueued`` when
    ``auto`` turned timing on while the stuck collective was already enqueued (it never gets a
    start event, whatever ``torchelastic.nccl.timing`` says); ``""`` otherwise."""
    since = attributes.get(A.NCCL_TIMING_FROM)
    number = attributes.get(A.STALLED_COLLECTIVE_NUMBER)
    if attributes.get(A.NCCL_TIMING) != "on" or not _is_number(since):
        return ""
    this = f" (#{number})" if _is_number(number) and number else ""
    return f"NCCL timing came on from collective #{since}, after this one{this} was enqueued"


def stall_attributes(stall: TrainingStall) -> SpanAttributes:
    """What a training stall report says of ``stall`` (the body is
    :func:`describe_training_stall` of them; the agent adds its dumps, silent nodes and the
    first late rank's frame)."""
    attrs: SpanAttributes = {
        A.STALLED_IN: TRAINING,
        A.STALLED_SECONDS: round(stall.seconds, 3),
        A.STALLED_RANKS: stall.waited_for or stall.remote,
        A.STALLED_WAITING: stall.waiting,
    }
    if stall.remote:  # named by the nodes that have them (the stall exchange)
        attrs[A.STALLED_REMOTE_HOST] = ", ".join(stall.remote_hosts)
        attrs[A.STALLED_REMOTE_PIDS] = stall.remote_pids
    if stall.phase == STARTUP:
        attrs[A.STALLED_PHASE] = STARTUP
    if stall.collective:
        attrs[A.STALLED_COLLECTIVE] = stall.collective
    if stall.collective and stall.group != INIT_GROUP:  # no group exists inside init
        attrs[A.STALLED_COLLECTIVE_NUMBER] = stall.number
    if stall.group is not None and stall.group != INIT_GROUP:
        attrs[A.STALLED_PROCESS_GROUP] = stall.group
    if stall.backend:
        attrs[A.STALLED_BACKEND] = stall.backend
        attrs[A.STALLED_STATE_KNOWN] = stall.state_known
    if stall.not_reached:
        attrs[A.STALLED_NOT_REACHED] = stall.not_reached
    if stall.left:
        attrs[A.STALLED_LEFT] = stall.left
    if stall.local_group:
        attrs[A.STALLED_LOCAL_GROUP] = True
    if stall.timed_out and stall.timeout_s is not None:
        attrs[A.STALLED_TIMED_OUT] = stall.timed_out
        attrs[A.NCCL_TIMEOUT_S] = stall.timeout_s
    if stall.timing is not None:
        attrs.update(timing_attributes(stall.timing))
        if stall.timing.on and not stall.state_known and stall.timed_from > stall.number > 0:
            attrs[A.NCCL_TIMING_FROM] = stall.timed_from  # came on after this one was enqueued
    return attrs


def timing_attributes(timing: NcclTiming) -> SpanAttributes:
    """What a record says of a worker's NCCL timing decision."""
    attrs: SpanAttributes = {A.NCCL_TIMING: timing.state, A.NCCL_TIMING_REASON: timing.reason}
    if timing.rate is not None:
        attrs[A.NCCL_TIMING_RATE] = timing.rate
    if timing.share_percent is not None:
        attrs[A.NCCL_TIMING_COST] = timing.share_percent
    if timing.budget_percent is not None:
        attrs[A.NCCL_TIMING_BUDGET] = timing.budget_percent
    if timing.cost_us is not None:
        attrs[A.NCCL_TIMING_COST_US] = timing.cost_us
    return attrs


_TIMING_WHY = {
    TIMING_FORCED: "ELASTIC_OTEL_NCCL_TIMING={}",
    TIMING_SET_BY_JOB: "TORCH_NCCL_ENABLE_TIMING set by the job",
    TIMING_MEASURING: "still measuring the collective rate",
    TIMING_NOT_AT_RUN_TIME: "this torch cannot turn it on at run time",
}


def describe_nccl_timing(attributes: SpanAttributes) -> str:
    """What follows "NCCL timing" in a record, from :func:`timing_attributes`: "off: 800
    collectives/s x 9.0 µs = 0.72 % of wall time, over the 0.5 % budget"; the cost per
    collective is the configured one (``ELASTIC_OTEL_NCCL_TIMING_COST_US``), derived from the
    share and the rate only for records from before it was carried."""
    state = attributes.get(A.NCCL_TIMING)
    reason = attributes.get(A.NCCL_TIMING_REASON)
    rate = attributes.get(A.NCCL_TIMING_RATE)
    cost = attributes.get(A.NCCL_TIMING_COST)
    budget = attributes.get(A.NCCL_TIMING_BUDGET)
    each = attributes.get(A.NCCL_TIMING_COST_US)
    measured = reason in (TIMING_WITHIN_BUDGET, TIMING_OVER_BUDGET)
    if measured and _is_number(rate) and _is_number(cost) and _is_number(budget):
        if not _is_number(each) and rate:
            each = cost / rate * 1e4  # % of a second per collective → µs
        times = f" x {_short(each)} µs" if _is_number(each) else ""
        side = "within" if reason == TIMING_WITHIN_BUDGET else "over"
        return (
            f"{state}: {_rate(rate)} collectives/s{times} = {_percent(cost)} % of wall time,"
            f" {side} the {budget:g} % budget"
        )
    if reason == TIMING_MEASURING and rate == 0:
        return f"{state}: still measuring the collective rate (none completed while it measured)"
    why = _TIMING_WHY.get(str(reason), str(reason))
    return f"{state}: " + why.format("true" if state == "on" else "false")


def _rate(rate: float) -> str:
    """``800``, ``3.6``, ``0.4``: a job of a collective every few seconds is not "0"."""
    return f"{rate:.0f}" if rate >= 10 or rate == 0 else f"{rate:.2g}"


def _short(us: float) -> str:
    return f"{us:.1f}" if us >= 0.1 or us == 0 else f"{us:.2g}"


def _percent(share: float) -> str:
    return f"{share:.2f}" if share >= 0.01 or share == 0 else f"{share:.1g}"


def _remote_text(attributes: SpanAttributes) -> str:
    """`` on host-a pid 4700`` for ranks another node named (``""`` for local ones)."""
    hosts = attributes.get(A.STALLED_REMOTE_HOST)
    if not isinstance(hosts, str) or not hosts:
        return ""
    pids = _as_ranks(attributes.get(A.STALLED_REMOTE_PIDS))
    names = hosts.split(", ")
    if len(pids) == len(names):
        names = [f"{host} pid {pid}" for host, pid in zip(names, pids, strict=True)]
    return " on " + ", ".join(names)


def _as_ranks(value: object) -> tuple[int, ...]:
    if isinstance(value, tuple | list):
        return tuple(r for r in value if isinstance(r, int))
    return ()


def _rank_text(value: object) -> str:
    """Global ranks as a report says them: ``(2, 3)`` → ``"2,3"`` (absent: ``""``)."""
    if isinstance(value, tuple | list):
        return ",".join(map(str, value))
    return str(value) if value is not None else ""


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
