"""What the agent instrumentation's wrappers do with what torch's agent tells them.

:class:`AgentObserver` keeps what it learns of each agent between calls on one
:class:`AgentState` per agent (forgotten with the agent), decides with
:mod:`elastic_otel.model.worker_outcomes`, reports through
:mod:`elastic_otel.integration.agent_events`, and feeds the training watch and the goodput
accounting it holds. The wrappers themselves, and when each is called:
:mod:`elastic_otel.integration.agent_instrumentation`. Design: docs/trace-model.md.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from elastic_otel.bridge.handler import OtelHandler
from elastic_otel.integration import straggler_exchange
from elastic_otel.integration.agent_events import (
    RecordAttributes,
    RendezvousLiveness,
    report_goodput,
    report_link,
    report_nccl_timing,
    report_outcomes,
    report_slow_node,
    report_slowdown,
    report_stacks_and_stall,
    report_straggler,
    reports_to_handler,
)
from elastic_otel.integration.goodput import AgentGoodput, GoodputWatch
from elastic_otel.integration.nccl_watchdog import nccl_story
from elastic_otel.integration.oom_kills import oom_kill_count
from elastic_otel.integration.training_watch import (
    FlightRecorderDumps,
    TrainingWatch,
    WatchedWorker,
)
from elastic_otel.integration.worker_output import WorkerOutput
from elastic_otel.model.agent_outcome import SIGNAL_EXCEPTION
from elastic_otel.model.failures import WorkerEnd, root_cause
from elastic_otel.model.goodput import Summary
from elastic_otel.model.slow_nodes import SlowNode
from elastic_otel.model.slowdowns import Slowdown
from elastic_otel.model.stalls import TrainingStall
from elastic_otel.model.stragglers import Straggler
from elastic_otel.model.worker_outcomes import (
    RESTART_CAUSES,
    Closing,
    Ended,
    ExitedWorker,
    FailedWorker,
    early_exits,
    failure_time_ns,
    oom_kills_rose,
    recovery_attributes,
    unexplained_sigkill,
    worker_ends,
)
from elastic_otel.names.torch_names import WorkerState
from elastic_otel.parsing.collectives import NcclTiming
from elastic_otel.parsing.worker_progress import WorkerProgress, read_progress
from elastic_otel.parsing.worker_reports import read_worker_report

_logger = logging.getLogger("elastic_otel")


@dataclass(eq=False)
class AgentState:
    """What the instrumentation knows of one agent between its wrapped calls."""

    failed_at: float | None = None
    """When its latest failure began (seconds): the restart's detection delay, the attempt's
    lost progress."""
    oom_kills: int | None = None
    """The cgroup's OOM-kill count when it last started workers or saw a SIGKILL."""
    closing: Closing | None = None
    """When torch began to close :attr:`closing_of`, and which workers had ended by then."""
    closing_of: weakref.ref[Any] | None = None
    goodput: AgentGoodput | None = None
    """Its goodput ledger (:mod:`elastic_otel.integration.goodput`)."""
    left_early: set[int] = field(default_factory=set)
    """The global ranks of its current workers reported as having left the job first."""
    reported: set[int] = field(default_factory=set)
    """The global ranks of its current workers whose end was reported (an agent that monitors
    again after it stopped the rest, as ``ft_launcher``'s does, reports each once)."""

    def unreported(self, ended: Ended) -> tuple[Ended, bool]:
        """The ends in ``ended`` not reported yet (now counted as reported), and whether they
        are the attempt's first."""
        first = not self.reported
        new = {rank: end for rank, end in ended.items() if rank not in self.reported}
        self.reported.update(new)
        return new, first

    def closing_of_context(self, pcontext: Any) -> Closing | None:
        """:attr:`closing`, if it is ``pcontext``'s."""
        owner = self.closing_of() if self.closing_of is not None else None
        return self.closing if owner is not None and owner is pcontext else None


def monitored_state(result: Any) -> str:
    """The state of a monitor's ``RunResult`` whose workers' ends are reported:
    ``ft_launcher``'s agent says ``UNHEALTHY`` while some workers failed and the others run
    until it stops them; that is a failure too."""
    state: str = getattr(getattr(result, "state", None), "name", "")
    if state == WorkerState.UNHEALTHY and getattr(result, "failures", None):
        return WorkerState.FAILED.value
    return state


class AgentObserver:
    """The wrappers' side of the agent: each agent's state, the training watch and the goodput
    accounting. Every method is called from a wrapper, after torch's own method (``closing``:
    before it) and inside the wrapper's ``try``."""

    def __init__(self, watch: TrainingWatch, goodput: GoodputWatch) -> None:
        self.watch = watch
        self.goodput = goodput
        self.output = WorkerOutput()  # the workers' captured output, read for every agent
        self._agents: MutableMapping[Any, AgentState] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def state(self, agent: Any) -> AgentState:
        """``agent``'s state (made on first use; forgotten with the agent)."""
        with self._lock:
            found = self._agents.get(agent)
            if found is None:
                found = self._agents[agent] = AgentState()
            return found

    def state_of_context(self, pcontext: Any) -> AgentState | None:
        """The state of the agent whose current process context is ``pcontext``."""
        agent = self._agent_of_context(pcontext)
        return self.state(agent) if agent is not None else None

    def _agent_of_context(self, pcontext: Any) -> Any:
        with self._lock:
            agents = list(self._agents)
        return next((a for a in agents if getattr(a, "_pcontext", None) is pcontext), None)

    # --- torch's agent, step by step ---------------------------------------------------------

    def workers_starting(self, agent: Any) -> None:
        """torch is about to start ``agent``'s workers: the OOM-kill count before them."""
        state = self.state(agent)
        state.oom_kills = oom_kill_count()
        state.left_early.clear()
        state.reported.clear()

    def outcomes(self, handler: OtelHandler, agent: Any, worker_group: Any, result: Any) -> None:
        """The monitor saw the group FAILED or SUCCEEDED: date the failures, end the attempt
        when no restart is left, report every worker that ended."""
        state_name = monitored_state(result)
        if state_name not in (WorkerState.FAILED, WorkerState.SUCCEEDED):
            return  # HEALTHY, UNHEALTHY, UNKNOWN: nothing ended that the agent knows of
        failures = getattr(result, "failures", {}) or {}
        returned = getattr(result, "return_values", {}) or {}
        now_ms = time.time() * 1000.0
        state = self.state(agent)
        ended = self._worker_ends(state, agent, failures)
        collective: dict[int, RecordAttributes] = {}
        if state_name == WorkerState.FAILED:
            # who timed out in a collective, who never entered it: torch's NCCL watchdog
            workers = {w.global_rank: w.local_rank for w in worker_group.workers}
            pids = {r: f.pid for r, f in failures.items() if isinstance(f.pid, int)}
            pcontext = getattr(agent, "_pcontext", None)
            ended, collective = nccl_story(pcontext, workers, ended, pids)
            if root_cause([e for e, _ in ended.values()]) is None:
                early = _left_early(pcontext, worker_group, ended, state.left_early)
                state.left_early.update(early)
                ended.update(early)
        ended, first = state.unreported(ended)
        if not ended and state_name == WorkerState.FAILED:
            return  # each end was reported when the agent first saw it
        ends = [e for e, _ in ended.values()]
        failed_ns = failure_time_ns(ends)
        if state_name == WorkerState.FAILED and first:  # the attempt's failure, first seen
            if failed_ns is not None:
                state.failed_at = failed_ns / 1e9
            if getattr(agent, "_remaining_restarts", 1) <= 0:
                self.attempt_ended(handler, agent, lost=True, final=True)  # no restart left
        root = root_cause(ends)
        root_rank = root.global_rank if root is not None else None
        oom = self._oom_killed(state, ends)
        report_outcomes(
            agent, handler, worker_group, state_name, failures, returned, ended, root_rank, oom,
            now_ms, self.output, collective,
        )  # fmt: skip

    def restart_facts(self, agent: Any, worker_group: Any) -> RecordAttributes:
        """What the start of a restart says about the recovery: its cause, the detection delay
        (the failure's time is used up)."""
        try:
            cause = RESTART_CAUSES.get(getattr(getattr(worker_group, "state", None), "name", ""))
            if cause is None:
                return {}
            state = self.state(agent)
            failed_at, state.failed_at = state.failed_at, None
            return {**recovery_attributes(cause, failed_at, time.time())}
        except Exception:
            return {}

    def attempt_ended(self, handler: OtelHandler, agent: Any, lost: bool, final: bool) -> None:
        """The worker group's attempt ended now: account for it (see
        :mod:`elastic_otel.integration.goodput`)."""
        try:
            if not handler.settings.goodput or not reports_to_handler(agent, handler):
                return
            state = self.state(agent)
            failed_at = state.failed_at if lost else None
            failure_ns = int(failed_at * 1e9) if failed_at else None
            if state.goodput is not None:
                self.goodput.ended(state.goodput, time.time_ns(), lost, final, failure_ns)
        except Exception:  # never the agent's problem
            _logger.debug("elastic-otel: goodput not accounted", exc_info=True)

    def workers_started(self, handler: OtelHandler, agent: Any, worker_group: Any) -> None:
        """Hand the workers torch just started to the training watch (hangs, stacks,
        stragglers) and to the goodput accounting."""
        try:
            if reports_to_handler(agent, handler):
                self._watch(handler, agent, worker_group)
        except Exception:  # never the agent's problem
            _logger.debug("elastic-otel: workers not watched", exc_info=True)

    def closing(self, pcontext: Any, handler: OtelHandler) -> None:
        """torch begins to close ``pcontext``: which workers had ended on their own by now
        (the first close only); after a failure or a signal, the workers' stacks first; a
        worker that left the job first, as the root cause."""
        failures = getattr(pcontext, "_failures", None)  # SubprocessContext's
        state = self.state_of_context(pcontext)
        if state is not None and state.closing_of_context(pcontext) is None:
            ended = frozenset(failures) if isinstance(failures, dict) else None
            state.closing = Closing(time.time_ns(), ended)
            state.closing_of = weakref.ref(pcontext)
        # After a failure (torch's _poll, MultiprocessContext's inside its except) or a
        # signal (torch's SignalException being handled): the victims' last stacks first
        raised = sys.exc_info()[1]
        failed = bool(failures) or raised is not None
        if not failures:  # with a failure of its own, the monitor's outcomes said it
            self._left_early_at_close(handler, pcontext)
        self.watch.before_stop(pcontext, failed)
        if state is not None and type(raised).__name__ == SIGNAL_EXCEPTION:
            self._signalled(state)

    def _signalled(self, state: AgentState) -> None:
        """A signal ends the agent's run (a scheduler's time limit, ``scancel``, a requeue, a
        person's Ctrl-C): its attempt ends now, the job's last on this node, what came after
        its last checkpoint lost; the summary is reported before torch stops the workers."""
        if state.goodput is not None:
            now = time.time_ns()
            self.goodput.ended(state.goodput, now, lost=True, final=True, failure_ns=now)

    # --- helpers ------------------------------------------------------------------------------

    def _worker_ends(self, state: AgentState, agent: Any, failures: dict[int, Any]) -> Ended:
        """What the agent knows of each failed worker (by global rank), and its report."""
        pcontext = getattr(agent, "_pcontext", None)
        # torch's ProcessFailure forgets the path of an error file the worker did not write
        error_files = getattr(pcontext, "error_files", None) or {}
        now_ns = time.time_ns()
        failed = [
            FailedWorker(
                global_rank=rank,
                local_rank=failure.local_rank,
                exit_code=failure.exitcode,
                report=read_worker_report(
                    error_files.get(failure.local_rank) or failure.error_file
                ),
            )
            for rank, failure in failures.items()
        ]
        return worker_ends(failed, state.closing_of_context(pcontext), now_ns)

    def _left_early_at_close(self, handler: OtelHandler, pcontext: Any) -> None:
        """torch closes the group for no failure it saw (another node's failure or arrival,
        a signal) while a worker that left the job first is gone and another still trains:
        that worker is reported as the root cause before the others are stopped."""
        agent = self._agent_of_context(pcontext)
        if agent is None or not reports_to_handler(agent, handler):
            return
        state, worker_group = self.state(agent), agent._worker_group
        early = _left_early(pcontext, worker_group, {}, state.left_early, time.time_ns())
        if not early:
            return
        state.left_early.update(early)
        root = root_cause([e for e, _ in early.values()])
        root_rank = root.global_rank if root is not None else None
        report_outcomes(
            agent,
            handler,
            worker_group,
            WorkerState.FAILED,
            {},
            {},
            early,
            root_rank,
            False,
            time.time() * 1000.0,
            self.output,
        )

    def _oom_killed(self, state: AgentState, ends: list[WorkerEnd]) -> bool:
        """Whether the cgroup's OOM-kill count rose since the workers started (or since the
        last SIGKILL this agent saw), when a worker died of a SIGKILL its agent did not send."""
        if not unexplained_sigkill(ends):
            return False
        before = state.oom_kills
        now = state.oom_kills = oom_kill_count()
        return oom_kills_rose(before, now)

    def _watch(self, handler: OtelHandler, agent: Any, worker_group: Any) -> None:
        pcontext = agent._pcontext
        pids = pcontext.pids()
        error_files = getattr(pcontext, "error_files", None) or {}
        stderrs = getattr(pcontext, "stderrs", None) or {}
        workers = [
            WatchedWorker(
                global_rank=w.global_rank,
                local_rank=w.local_rank,
                pid=pids[w.local_rank],
                directory=os.path.dirname(error_files[w.local_rank]),
                worker=w,
                stderr=stderrs.get(w.local_rank) or None,
            )
            for w in worker_group.workers
            if w.local_rank in pids and error_files.get(w.local_rank)
        ]
        liveness = RendezvousLiveness.of(agent._worker_group.spec.rdzv_handler)

        def report(
            reason: str,
            stacks: list[tuple[WatchedWorker, str]],
            stall: TrainingStall | None,
            dumps: FlightRecorderDumps | None,
        ) -> None:
            report_stacks_and_stall(agent, handler, reason, stacks, stall, dumps, liveness)

        def timing_decided(watched: WatchedWorker, timing: NcclTiming) -> None:
            report_nccl_timing(agent, handler, watched, timing)

        observe: Callable[[int, list[WorkerProgress]], None] | None = None
        settings = handler.settings
        if settings.goodput:
            run_id = agent._worker_group.spec.rdzv_handler.get_run_id()

            def report_summary(summary: Summary) -> None:
                report_goodput(agent, handler, summary)

            state = self.state(agent)
            ledger = self.goodput.started(
                state.goodput, run_id, workers, settings.stall_after_s, report_summary
            )
            state.goodput = ledger

            def observe_progress(now_ns: int, readings: list[WorkerProgress]) -> None:
                self.goodput.observe(ledger, now_ns, readings)

            observe = observe_progress

        def straggler_found(straggler: Straggler) -> None:
            report_straggler(agent, handler, straggler)

        def slow_node_found(slow: SlowNode) -> None:
            report_slow_node(agent, handler, slow)

        def link_found(attributes: dict[str, Any]) -> None:
            report_link(agent, handler, attributes)

        links_on = settings.link_stats and settings.slowdown > 0
        exchange = None
        if settings.straggler_window_s > 0:
            exchange = straggler_exchange.for_workers(
                agent,
                worker_group,
                settings.straggler_score,
                slow_node_found,
                link_settings=settings if links_on else None,
                report_link=link_found,
            )

        def slowdown_found(slowdown: Slowdown) -> None:
            evidence = exchange.local_evidence() if exchange is not None else {}
            report_slowdown(agent, handler, slowdown, evidence)

        self.watch.watch(
            pcontext,
            workers,
            report,
            settings.stall_after_s,
            handler.current_stalls,
            observe,
            settings.straggler_window_s,
            settings.straggler_score,
            straggler_found,
            exchange,
            store=getattr(worker_group, "store", None) if settings.stall_exchange else None,
            report_timing=timing_decided,
            slowdown_ratio=settings.slowdown,
            report_slowdown=slowdown_found,
            schedule=handler.schedule,
        )


def _left_early(
    pcontext: Any, worker_group: Any, ended: Ended, reported: set[int], now_ns: int = 0
) -> Ended:
    """The workers that left the job first (:func:`~elastic_otel.model.worker_outcomes.
    early_exits`): before the first failure of ``ended``, else (``now_ns``: torch closes
    the group without a failure it knows of) before now, while another worker still
    trains. ``reported``: ranks said already."""
    handlers = getattr(pcontext, "subprocess_handlers", None) or {}
    error_files = getattr(pcontext, "error_files", None) or {}
    exited, training = [], False
    for worker in worker_group.workers:
        process = getattr(handlers.get(worker.local_rank), "proc", None)
        path = error_files.get(worker.local_rank)
        if worker.global_rank in ended or process is None or not path:
            continue
        progress = read_progress(os.path.dirname(path))
        left = progress is not None and progress.pid == process.pid and progress.left
        report = read_worker_report(path) if left else None
        if report is not None and (report.exception_type or report.fault_stack):
            continue  # it raised or crashed, and is still exiting: torch will say it failed
        since = progress.since_ns if left and progress is not None else None
        code = process.poll()
        training = training or (since is None and code is None)
        if worker.global_rank not in reported:
            exited.append(ExitedWorker(worker.global_rank, code, since))
    failed_ns = failure_time_ns([e for e, _ in ended.values()])
    if failed_ns is None and now_ns and training:
        failed_ns = now_ns
    return {e.global_rank: (e, None) for e in early_exits(exited, failed_ns)}
