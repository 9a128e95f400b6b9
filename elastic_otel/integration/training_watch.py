"""Hangs named while they hang: training stalls and the workers' Python stacks, seen by the agent.

:class:`TrainingWatch`, held by the agent instrumentation, reads the workers' progress records
as a task of the bridge's event thread (never on torch's monitor loop) and reports training
stalls, the workers' stacks (with a stall report, and before the agent stops its workers) and
stragglers: no ptrace, no code in the training script. Design: ``docs/hangs.md`` (The agent's
training watch) and ``docs/trace-model.md`` (Recoveries and the training code).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import socket
import threading
import time
import weakref
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from elastic_otel.bridge.event_thread import Task
from elastic_otel.integration.stall_exchange import StallExchange
from elastic_otel.model.p2p_edges import node_edges
from elastic_otel.model.slow_nodes import node_inside
from elastic_otel.model.slowdowns import COMMUNICATION, GroupWindow, Slowdown, SlowdownWatch
from elastic_otel.model.stalls import (
    STARTUP,
    RankProgress,
    TrainingStall,
    rank_progress,
    startup_stall,
    training_stall,
)
from elastic_otel.model.stragglers import RankScore, Straggler, StragglerWatch
from elastic_otel.names.environment_variables import (
    WORKER_FLIGHT_RECORDER_FILE,
    WORKER_REQUESTS_FIFO,
    WORKER_STACKS_FILE,
)
from elastic_otel.parsing.collectives import (
    TIMING_MEASURING,
    NcclTiming,
    PeerTransfers,
    dump_path,
    poll_period,
    read_collectives,
)
from elastic_otel.parsing.nccl_errors import find_timeout, read_tail
from elastic_otel.parsing.worker_progress import (
    MAX_STACK_BYTES,
    WorkerProgress,
    read_new_stacks,
    read_progress,
)
from elastic_otel.parsing.worker_reports import main_thread_frame, with_source_lines

if TYPE_CHECKING:
    from elastic_otel.integration.straggler_exchange import StragglerExchange

_logger = logging.getLogger("elastic_otel")

STACK_WAIT_S = 0.5
"""Longest wait for the workers' stack and Flight Recorder dumps before a stop (it delays the
restart)."""
STALL_WAIT_S = 2.0
"""Longest wait for them on a stall (a poll at a time on the event thread: it delays nothing)."""
_POLL_S = 0.02
DUMPS_KEPT = 8
"""Flight Recorder dump directories kept per attempt directory (the oldest are removed)."""
DUMPS_DIRECTORY = "flight_recorder"

REASON_TRAINING = "training"
REASON_STALL = "stall"
REASON_BEFORE_STOP = "before_stop"


@dataclass(slots=True)
class WatchedWorker:
    """A worker process of a watched group."""

    global_rank: int
    local_rank: int
    pid: int
    directory: str  # its private directory (torch's error file's)
    worker: Any  # torch's Worker, for the events the instrumentation builds
    stacks_offset: int = 0
    stderr: str | None = None  # the file its stderr goes to (torch's), where there is one


@dataclass(frozen=True, slots=True)
class FlightRecorderDumps:
    """The workers' Flight Recorder dumps taken together: a directory ``torchfrtrace`` reads."""

    directory: str
    ranks: tuple[int, ...]  # global ranks whose dump is there
    unanswered: tuple[int, ...]  # global ranks asked that wrote none in time


Schedule = Callable[[Task, float], bool]
"""``schedule(task, delay_s)``: run ``task.run()`` on the bridge's event thread
(:meth:`~elastic_otel.bridge.handler.OtelHandler.schedule`)."""

Report = Callable[
    [str, list[tuple["WatchedWorker", str]], "TrainingStall | None", "FlightRecorderDumps | None"],
    None,
]
"""``report(reason, [(worker, stacks)], stall, dumps)``: hand what was found to the bridge."""


@dataclass(slots=True)
class _Group:
    workers: list[WatchedWorker]
    report: Report
    after_ns: int
    current_stalls: Callable[[], dict[str, float]]
    last_training_ns: int = 0  # when a training stall was last reported (0: none under way)
    named: bool = False  # that report named the ranks waited for (here or on another node)
    stall_exchange: StallExchange | None = None  # the stall told to other nodes, and theirs
    last_stacks_ns: int = 0  # when stacks were last taken for another stall
    stalled_s: float = 0.0  # how long its training stall has lasted (0: none)
    done: bool = False
    seen: dict[int, WorkerProgress] = field(default_factory=dict)
    observe: Callable[[int, list[WorkerProgress]], None] | None = None
    stragglers: StragglerWatch | None = None
    report_straggler: Callable[[Straggler], None] | None = None
    window_ns: int = 0  # straggler window (0: no scores)
    window_start_ns: int = 0
    windows_read: dict[int, int] = field(default_factory=dict)  # rank → its arrivals' window
    exchange: StragglerExchange | None = None  # the slow-node exchange (two nodes or more)
    windows_closed: int = 0
    report_timing: Callable[[WatchedWorker, NcclTiming], None] | None = None
    started_ns: int = 0  # when its workers started (the start-up watch's clock)
    timings: dict[int, NcclTiming] = field(default_factory=dict)  # rank → its decision said
    slowdowns: SlowdownWatch | None = None
    report_slowdown: Callable[[Slowdown], None] | None = None
    shares: dict[int, dict[str, float]] = field(default_factory=dict)
    """Rank → group key → its share of time with a collective open, over its last window read
    (the workers' windows and the agent's are not in step: the latest stands until replaced)."""
    communication: bool = False  # a slowdown of the time inside is under way (names the link)
    slowing: bool = False  # a slowdown of any part is under way (names a slow edge)
    transfers: dict[int, tuple[PeerTransfers, ...]] = field(default_factory=dict)
    """Rank → its sends and receives over its last window read."""


class TrainingWatch:
    """The agent process's watch over its workers' progress (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: MutableMapping[Any, _Group] = weakref.WeakKeyDictionary()
        self._schedule: Schedule | None = None  # set while a task on the event thread
        self._period = 0.0
        self._next_check = 0.0  # monotonic
        self._requests: list[_StackRequest] = []  # the event thread's: stacks awaited
        self.current = 0.0
        """Seconds of the longest training stall under way (0: none), for the gauge."""
        if hasattr(os, "register_at_fork"):
            after_fork = weakref.WeakMethod(self._after_fork)  # not kept alive by the hook
            os.register_at_fork(after_in_child=lambda: _call(after_fork))

    def watch(
        self,
        pcontext: Any,
        workers: list[WatchedWorker],
        report: Report,
        after_s: float,
        current_stalls: Callable[[], dict[str, float]],
        observe: Callable[[int, list[WorkerProgress]], None] | None = None,
        straggler_window_s: float = 0.0,
        straggler_score: float = 0.0,
        report_straggler: Callable[[Straggler], None] | None = None,
        exchange: StragglerExchange | None = None,
        store: Any = None,
        report_timing: Callable[[WatchedWorker, NcclTiming], None] | None = None,
        slowdown_ratio: float = 0.0,
        report_slowdown: Callable[[Slowdown], None] | None = None,
        schedule: Schedule | None = None,
    ) -> None:
        """Watch the workers torch just started in ``pcontext`` (until it is closed), as a
        task ``schedule`` runs on the bridge's event thread (none: not watched);
        ``observe(now_ns, records)`` is given each reading (the goodput accounting's stalls);
        with a ``straggler_window_s``, the ranks are scored per window and a straggler handed
        to ``report_straggler``, and each window's device times to the slow-node ``exchange``;
        with the round's ``store``, a training stall is shared with the other nodes
        (:mod:`elastic_otel.integration.stall_exchange`); each worker's NCCL timing decision,
        once made, goes to ``report_timing``; with a ``slowdown_ratio``, each window's pace
        goes to the slowdown watch too, and a slowdown (or its end) to ``report_slowdown``."""
        if after_s <= 0 or not workers or schedule is None:
            return
        for worker in workers:
            worker.stacks_offset = _size(os.path.join(worker.directory, WORKER_STACKS_FILE))
        with self._lock:
            group = self._groups[pcontext] = _Group(
                workers, report, int(after_s * 1e9), current_stalls, observe=observe
            )
            group.report_timing = report_timing
            group.started_ns = time.time_ns()
            if store is not None:
                group.stall_exchange = StallExchange(store, self._check_now)
            if straggler_window_s > 0:
                group.stragglers = StragglerWatch(straggler_score)
                group.report_straggler = report_straggler
                group.window_ns = int(straggler_window_s * 1e9)
                group.window_start_ns = time.time_ns()
                group.exchange = exchange
                if slowdown_ratio > 0:
                    group.slowdowns = SlowdownWatch(slowdown_ratio)
                    group.report_slowdown = report_slowdown
            if self._schedule is None:
                # The workers leave their arrivals once per window: look at least twice as
                # often, so that none is replaced unread.
                period = poll_period(after_s)
                if straggler_window_s > 0:
                    period = min(period, straggler_window_s / 2)
                self._period = period
                self._next_check = time.monotonic() + period
                if schedule(self, period):
                    self._schedule = schedule

    def before_stop(self, pcontext: Any, reason_is_failure: bool) -> None:
        """torch is about to stop ``pcontext``'s workers: after a failure or a signal, take
        their stacks first; in any case stop watching them."""
        with self._lock:
            group = self._groups.pop(pcontext, None)
        if group is None:
            return
        group.done = True
        if group.exchange is not None:
            group.exchange.close()
        if group.stall_exchange is not None:
            group.stall_exchange.close()
        if reason_is_failure:
            request = self._take_stacks(group, REASON_BEFORE_STOP, None)
            while not request.poll():
                time.sleep(_POLL_S)
            request.finish()
        self._recompute_current()

    # --- the event thread's task -------------------------------------------------------------

    def straggler_scores(self) -> list[RankScore]:
        """Every watched rank's straggler score over its node's last window (the gauges)."""
        with self._lock:
            groups = list(self._groups.values())
        return [s for g in groups if g.stragglers for s in g.stragglers.scores.values()]

    def slowdown_ratios(self) -> list[tuple[str, float]]:
        """Each watched process group's last interval against its baseline (the gauge)."""
        with self._lock:
            groups = list(self._groups.values())
        return [r for g in groups if g.slowdowns for r in g.slowdowns.ratios.items()]

    def run(self) -> float | None:
        """Check every group when due, and follow the stacks asked for (a task of the event
        thread, which must not wait: a stall's stacks are awaited a poll at a time); ``None``
        once nothing is watched (:meth:`watch` schedules it again)."""
        for request in list(self._requests):
            if request.poll():
                self._requests.remove(request)
                request.finish()
        with self._lock:
            groups = list(self._groups.values())
            if not groups and not self._requests:
                self._schedule = None
                return None
        if time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + self._period
            awaited = [r.group for r in self._requests]
            for group in groups:
                if any(group is g for g in awaited):
                    continue  # checked again once its stacks came
                try:
                    self._check(group, time.time_ns())
                except Exception:  # never the agent's problem
                    _logger.debug("elastic-otel: training watch failed", exc_info=True)
            self._recompute_current()
        wait = self._next_check - time.monotonic()
        return min(wait, _POLL_S) if self._requests else wait

    def _check_now(self) -> None:
        """Check at once (another node named this node's stall: said now, not a period on)."""
        self._next_check = 0.0
        schedule = self._schedule
        if schedule is not None:
            schedule(self, 0.0)

    def _check(self, group: _Group, now_ns: int) -> None:
        ranks: list[RankProgress] = []
        for worker in group.workers:
            progress = read_progress(worker.directory)
            if progress is None or progress.pid != worker.pid:
                continue
            group.seen[worker.global_rank] = progress
            collectives = read_collectives(worker.directory)
            if collectives is not None and collectives.pid != worker.pid:
                collectives = None
            ranks.append(rank_progress(worker.global_rank, progress, collectives))
            if collectives is not None and collectives.nccl_timing is not None:
                self._timing(group, worker, collectives.nccl_timing)
            if (
                group.stragglers is not None
                and collectives is not None
                and collectives.window_ns != group.windows_read.get(worker.global_rank)
            ):
                group.windows_read[worker.global_rank] = collectives.window_ns
                members = {g.key: g.members for g in collectives.groups}
                group.stragglers.observe(
                    worker.global_rank, collectives.arrivals, members, collectives.durations
                )
                group.shares[worker.global_rank] = {
                    key: opened / samples for key, opened, samples in collectives.open_share
                }
                group.transfers[worker.global_rank] = collectives.transfers
        if group.stragglers is not None and now_ns - group.window_start_ns >= group.window_ns:
            group.window_start_ns = now_ns
            straggler = group.stragglers.close_window(w.global_rank for w in group.workers)
            if straggler is not None and group.report_straggler is not None and not group.done:
                group.report_straggler(straggler)
            self._close_slowdowns(group)
            self._publish_inside(group)
        if group.observe is not None:
            group.observe(now_ns, [group.seen[r.global_rank] for r in ranks])
        local = [w.global_rank for w in group.workers]
        stall = training_stall(ranks, now_ns, group.after_ns, local)
        if stall is None:
            stall = startup_stall(ranks, now_ns, group.after_ns, group.started_ns)
        if stall is not None and group.stall_exchange is not None:
            stall = group.stall_exchange.exchanged(stall, ranks)
        if stall is not None and stall.phase == STARTUP and not (stall.waiting or stall.waited_for):
            stall = None  # in start-up, nobody waits for this node's ranks: a slow start
        group.stalled_s = stall.seconds if stall is not None else 0.0
        named = stall is not None and bool(stall.waited_for or stall.remote)
        if stall is None:
            group.last_training_ns = 0
        elif not group.done and (
            (due := now_ns - group.last_training_ns >= group.after_ns)
            or (named and not group.named)
        ):
            # Named by another node after this node's report (or, in no collective, told the
            # collective its ranks never issued): said now, once, not an interval later.
            group.last_training_ns, group.named = now_ns, named
            stall = _with_watchdog(stall, group.workers)
            if due or stall.waited_for:
                self._requests.append(self._take_stacks(group, REASON_TRAINING, stall))
            else:
                group.report(REASON_TRAINING, [], stall, None)  # its stacks were just taken
            return
        other = any(seconds > 0 for seconds in group.current_stalls().values())
        if other and now_ns - group.last_stacks_ns >= group.after_ns and not group.done:
            group.last_stacks_ns = now_ns
            self._requests.append(self._take_stacks(group, REASON_STALL, None))

    @staticmethod
    def _timing(group: _Group, worker: WatchedWorker, timing: NcclTiming) -> None:
        """Say a worker's NCCL timing decision once it is made (and again if it changes)."""
        if timing.reason == TIMING_MEASURING or group.timings.get(worker.global_rank) == timing:
            return
        group.timings[worker.global_rank] = timing
        if group.report_timing is not None and not group.done:
            group.report_timing(worker, timing)

    @staticmethod
    def _close_slowdowns(group: _Group) -> None:
        """Hand each process group's window to the slowdown watch; report what is due."""
        watch, stragglers = group.slowdowns, group.stragglers
        if watch is None or stragglers is None:
            return
        keys = set(stragglers.earliest) | set(watch.ratios) | set(watch.under_way)
        for key in sorted(keys):
            timed = stragglers.inside.get(key)
            window = GroupWindow(
                key,
                stragglers.earliest.get(key, ()),
                {r: ns / 1e9 for r, ns in timed.mean_ns.items()} if timed else {},
                {r: shares[key] for r, shares in group.shares.items() if key in shares},
            )
            slowdown = watch.close(window)
            if slowdown is not None and group.report_slowdown is not None and not group.done:
                group.report_slowdown(slowdown)
                group.communication = slowdown.part == COMMUNICATION and not slowdown.ended
        group.slowing = bool(watch.under_way)

    @staticmethod
    def _publish_inside(group: _Group) -> None:
        """Hand the window's device times (and the pids whose connections tell the node's
        links, its ranks' point-to-point edges) to the slow-node exchange (it never blocks)."""
        if group.exchange is None or group.stragglers is None or group.done:
            return
        group.windows_closed += 1
        closed, inside = group.windows_closed, group.stragglers.inside
        ranks = [w.global_rank for w in group.workers]
        value = node_inside(group.exchange.node_rank, socket.gethostname(), ranks, closed, inside)
        pids = [os.getpid(), *(w.pid for w in group.workers)]
        edges = (tuple(ranks), node_edges(group.transfers.items()))
        group.exchange.publish(value, pids, closed, group.communication, group.slowing, edges)

    @staticmethod
    def _take_stacks(group: _Group, reason: str, stall: TrainingStall | None) -> _StackRequest:
        """Signal every worker that armed the stack signal and ask every one that reads its
        Flight Recorder for a dump: the request that awaits both, and then reports."""
        asked: list[WatchedWorker] = []
        for worker in group.workers:
            progress = read_progress(worker.directory) or group.seen.get(worker.global_rank)
            if progress is None or progress.pid != worker.pid or progress.stack_signal <= 0:
                continue
            try:
                signal_main_thread(worker.pid, progress.stack_signal)
            except OSError:  # gone already
                continue
            asked.append(worker)
        dumps_asked = {w.global_rank: n for w in group.workers if (n := _ask_dump(w)) is not None}
        wait_s = STACK_WAIT_S if reason == REASON_BEFORE_STOP else STALL_WAIT_S
        return _StackRequest(group, reason, stall, asked, dumps_asked, time.monotonic() + wait_s)

    def _recompute_current(self) -> None:
        with self._lock:
            groups = list(self._groups.values())
        self.current = max((g.stalled_s for g in groups), default=0.0)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._groups = weakref.WeakKeyDictionary()
        self._schedule = None
        self._requests = []
        self.current = 0.0  # straggler scores live on the groups, forgotten with them


class _StackRequest:
    """Stacks and Flight Recorder dumps asked of a group's workers, awaited a poll at a time
    until all came or the deadline passed, then reported. A dump is whole once its file
    stopped growing for one poll; all workers are awaited together, so that the wait does not
    grow with their number (it delays the restart when taken before a stop)."""

    def __init__(
        self,
        group: _Group,
        reason: str,
        stall: TrainingStall | None,
        asked: list[WatchedWorker],
        dumps_asked: dict[int, int],
        deadline: float,
    ) -> None:
        self.group, self.reason, self.stall = group, reason, stall
        self.asked, self.dumps_asked, self.deadline = asked, dumps_asked, deadline
        self.found: dict[int, str] = {}
        self.sizes: dict[int, int] = {}
        self.dumped: set[int] = set()
        self.published = False

    def poll(self) -> bool:
        """Look once; whether the wait is over (all came, or the deadline passed)."""
        if not (self.asked or self.dumps_asked) or time.monotonic() >= self.deadline:
            return True
        found, sizes = self.found, self.sizes
        for worker in self.asked:
            rank = worker.global_rank
            if rank in found:
                continue
            path = os.path.join(worker.directory, WORKER_STACKS_FILE)
            size = _size(path)
            if size > worker.stacks_offset and size == sizes.get(rank):
                text, worker.stacks_offset = read_new_stacks(path, worker.stacks_offset)
                if text:
                    found[rank] = text
            sizes[rank] = size
        self._publish(final=False)
        for worker in self.group.workers:
            rank = worker.global_rank
            if rank in self.dumps_asked and rank not in self.dumped:
                collectives = read_collectives(worker.directory)
                if collectives is not None and collectives.dumps > self.dumps_asked[rank]:
                    self.dumped.add(rank)
        return len(found) == len(self.asked) and len(self.dumped) == len(self.dumps_asked)

    def finish(self) -> None:
        """Report what came."""
        # Each frame's source line, in the room the record has: what was read, and what the
        # emitter keeps of a record's body (it clips the end, where the main thread is). The
        # emitter is loaded here, not with this module: the SDK only once the bridge reports.
        from elastic_otel.emit.emitter import value_limit

        group, found, stall = self.group, self.found, self.stall
        limit = min(MAX_STACK_BYTES, value_limit())
        stacks = [
            (w, with_source_lines(found[w.global_rank], limit))
            for w in self.asked
            if w.global_rank in found
        ]
        unanswered = set(self.dumps_asked) - self.dumped
        dumps = _gather_dumps(group.workers, self.dumped, unanswered, self.reason)
        self._publish(final=True)
        group.report(self.reason, stacks, stall, dumps)

    def _publish(self, final: bool) -> None:
        """Tell the other nodes the rank this node's stall waits for, with its innermost frame,
        as soon as its stack came (the other nodes name it from this), not after the Flight
        Recorder dumps, which may take the whole wait; at the end without it if it never came."""
        stall, exchange = self.stall, self.group.stall_exchange
        if self.published or stall is None or not stall.waited_for or exchange is None:
            return
        text = self.found.get(stall.waited_for[0])
        if text is None and not final:
            return
        self.published = True
        exchange.publish(stall, main_thread_frame(text or "") or "")


def _with_watchdog(stall: TrainingStall, workers: list[WatchedWorker]) -> TrainingStall:
    """``stall`` with the local ranks whose NCCL watchdog timed out its collective, as their
    stderr says (torch then dumps its Flight Recorder and aborts them: a minute on an H200)."""
    if stall.backend != "nccl":
        return stall
    timed_out: list[int] = []
    timeout_s = None
    for worker in workers:
        found = find_timeout(read_tail(worker.stderr)) if worker.stderr else None
        if found is not None and (stall.number in (0, found.number)):
            timed_out.append(worker.global_rank)
            timeout_s = found.timeout_ms / 1000.0
    if not timed_out:
        return stall
    return replace(stall, timed_out=tuple(sorted(timed_out)), timeout_s=timeout_s)


def signal_main_thread(pid: int, number: int) -> None:
    """Send signal ``number`` to the main thread of process ``pid`` (``tgkill``), where the
    C library has it, else to the process; ``OSError`` when the process is gone.

    The stack signal's handler dumps the thread it interrupts: the main thread is the training
    thread, and a process-directed signal may land on any other."""
    tgkill = getattr(_libc(), "tgkill", None)
    if tgkill is None:
        os.kill(pid, number)
        return
    if tgkill(pid, pid, number) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {number})")


@functools.cache
def _libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # no C library to load
        return None


def _ask_dump(worker: WatchedWorker) -> int | None:
    """Ask ``worker``'s collectives thread for a Flight Recorder dump (a byte on its FIFO):
    the number of dumps it had written, or ``None`` if it reads no Flight Recorder."""
    collectives = read_collectives(worker.directory)
    if collectives is None or collectives.pid != worker.pid:
        return None
    try:
        fd = os.open(
            os.path.join(worker.directory, WORKER_REQUESTS_FIFO), os.O_WRONLY | os.O_NONBLOCK
        )
    except OSError:  # no reader: the worker or its thread is gone
        return None
    try:
        os.write(fd, b"d")
    except OSError:
        return None
    finally:
        os.close(fd)
    return collectives.dumps


def _gather_dumps(
    workers: list[WatchedWorker], dumped: set[int], unanswered: set[int], reason: str
) -> FlightRecorderDumps | None:
    """Link the fresh dumps into one new directory, ``rank_<global rank>`` each, beside the
    attempt's worker directories; keep the newest :data:`DUMPS_KEPT` such directories."""
    if not dumped and not unanswered:
        return None
    attempt = os.path.dirname(workers[0].directory)
    root = os.path.join(attempt, DUMPS_DIRECTORY)
    directory = os.path.join(root, f"{reason}-{time.time_ns() // 1_000_000}")
    try:
        os.makedirs(directory, exist_ok=True)
        for worker in workers:
            if worker.global_rank not in dumped:
                continue
            source = os.path.join(worker.directory, WORKER_FLIGHT_RECORDER_FILE)
            _keep(source, os.path.join(directory, f"rank_{worker.global_rank}"))
            for backend in ("gloo", "nccl"):  # a job with two backends: the second record
                second = dump_path(source, backend)
                if os.path.exists(second):
                    os.makedirs(os.path.join(directory, backend), exist_ok=True)
                    _keep(second, os.path.join(directory, backend, f"rank_{worker.global_rank}"))
        for old in sorted(os.listdir(root), key=lambda n: int(n.rpartition("-")[2]))[:-DUMPS_KEPT]:
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    except (OSError, ValueError):
        _logger.debug("elastic-otel: flight recorder dumps not gathered", exc_info=True)
    return FlightRecorderDumps(directory, tuple(sorted(dumped)), tuple(sorted(unanswered)))


def _keep(source: str, target: str) -> None:
    try:
        os.link(source, target)  # the worker replaces its file: this one stays
    except OSError:
        shutil.copyfile(source, target)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _call(method: weakref.WeakMethod[Callable[[], None]]) -> None:
    bound = method()
    if bound is not None:
        bound()
