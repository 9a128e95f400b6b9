"""torch's elastic agent, instrumented: what it learns about its workers, when it learns it.

torch records worker outcomes only in its final events, after the exit barrier, and records
nothing for a worker that fails before a restart: the agent learns each outcome from
``_monitor_workers`` (a ``RunResult`` with a ``ProcessFailure`` per failed rank: pid, exit
code, error file data, time) and acts on it without an event. So, as OpenTelemetry's
instrumentation packages do for libraries, :class:`AgentInstrumentation` wraps methods of torch's
agent classes on activation and puts them back when asked (seven methods; :func:`instrument` /
:func:`uninstrument` on the process's :data:`AGENT`):

* ``LocalElasticAgent._monitor_workers``: when it reports the group FAILED or SUCCEEDED, one
  ``torchelastic.worker.status.<STATE>`` event per failed or finished worker, built by the
  agent's own ``_construct_event`` (the shape of torch's final events), dated by the failure
  time of its error file, and marked ``observed_by`` = ``monitor_workers``. torch stops the
  group's other workers (SIGTERM) as soon as one fails, and reports those as failures too
  ("for bookkeeping"): a failure by SIGTERM or SIGKILL beside a failure of another kind is
  reported as ``STOPPED`` (with ``stopped_after`` naming the failed rank), not as a failure;
* ``LocalElasticAgent._stop_workers`` / ``_start_workers``, ``SimpleElasticAgent.
  _exit_barrier`` / ``_restart_workers``: an ``elastic_otel.agent.<step>`` event when the step
  starts and one (with ``duration_ms``) when it ends, so that a step still running (the exit
  barrier waiting for a lost node) is an open span that stall reports and exit handling can
  see. A restart is a recovery: its start carries ``recovery.cause`` (``worker_failure`` when
  the monitor saw the group FAILED or UNHEALTHY, ``membership_change`` when it was HEALTHY and
  nodes wait to join) and ``recovery.detection_ms`` (failure time to now);
* ``LocalElasticAgent._setup_local_watchdog(envs)``, which torch calls with every worker's
  environment just before it starts them: adds ``TRACEPARENT`` (the worker's own ``worker``
  span, reserved in the trace model) and the ``ELASTIC_OTEL_WORKER_START_UNIX_NANO`` /
  ``ELASTIC_OTEL_RECOVERY_*`` variables :mod:`elastic_otel.worker.training` reads. The reservation
  waits for the bridge's worker thread, at most 0.5 s; without an answer the workers start
  without them. It also arranges the worker start-up (:mod:`elastic_otel.worker.startup`, on
  ``PYTHONPATH``; ``ELASTIC_OTEL_WORKER_STARTUP=false`` turns it off), which leaves a crashed
  worker's Python stack and an uncaught exception's type beside its error file;
* ``PContext.close``: torch calls it when the first worker of the group fails, to stop the
  others (SIGTERM, then SIGKILL). Which workers had ended before that call is the fact that
  separates a worker that died on its own from one its agent stopped. After a failure or a
  signal, the workers' stacks are taken first (:mod:`elastic_otel.integration.training_watch`).

Once ``_start_workers`` returns, its workers are handed to the training watch
(:mod:`elastic_otel.integration.training_watch`), which reports training stalls and the
workers' stacks through :func:`_report_stacks_and_stall`.

**Root cause or victim.** Each worker end the monitor reports is classified
(:mod:`elastic_otel.model.failures`) from what the agent knows: whether it ended before the
agent began to stop the group, its exception (the worker start-up's report, else torch's error
file) and, for a SIGKILL, whether the cgroup's OOM-kill count rose
(:mod:`elastic_otel.integration.oom_kills`). A root cause is reported ``FAILED`` with
``failure.kind`` = ``root_cause``; a worker whose collective failed because a peer died is
``PEER_FAILED`` (``peer_failure``); a worker the agent stopped is ``STOPPED`` (``stopped``,
with ``stopped_after`` naming the root cause when this node has one).

The events go to the bridge handler only, and only from an agent whose own events go there
(``--event-log-handler otel``): torch's other destinations see what they always saw. Every
wrapper calls torch's method first and reports after, inside ``try``: a failure here is one
debug line, never the agent's. Where torch's internals differ (a method or
``_construct_event`` missing or shaped differently), nothing is wrapped, with one debug line,
and the bridge falls back to torch's own events.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import logging
import os
import signal
import stat
import sys
import threading
import time
import weakref
from collections.abc import Callable, MutableMapping
from typing import Any, NamedTuple

from elastic_otel.bridge.handler import OtelHandler, get_handler
from elastic_otel.integration.goodput import GOODPUT
from elastic_otel.integration.oom_kills import oom_kill_count
from elastic_otel.integration.training_watch import WATCH, FlightRecorderDumps, WatchedWorker
from elastic_otel.integration.worker_output import capture_logs_specs, last_output
from elastic_otel.integration.worker_output import finish as finish_output
from elastic_otel.model.failures import WorkerEnd, classify, root_cause
from elastic_otel.model.goodput import Summary
from elastic_otel.model.stalls import (
    STALL_EVENT_NAME,
    STALL_STATE,
    TRAINING,
    SilentNode,
    TrainingStall,
    silence_attributes,
    silent_nodes,
)
from elastic_otel.model.stragglers import (
    STRAGGLER_EVENT_NAME,
    STRAGGLER_STATE,
    Straggler,
    straggler_attributes,
)
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from elastic_otel.names.torch_names import (
    AGENT_STEP_PREFIX,
    STACKS_STATE,
    WORKER_STACKS_EVENT,
    WorkerState,
)
from elastic_otel.parsing.worker_progress import WorkerProgress
from elastic_otel.parsing.worker_reports import (
    MAX_REPORT_BYTES,
    WorkerReport,
    main_thread_frame,
    read_worker_report,
    with_source_lines,
)

_logger = logging.getLogger("elastic_otel")

OBSERVED_BY_MONITOR = "monitor_workers"
"""The value of ``torchelastic.observed_by`` on the outcomes this module reports."""
_WORKER_SITE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "worker", "site")
"""The worker start-up's ``sitecustomize`` directory, inside the installed package (a path,
not an import: ``worker`` is this layer's sibling)."""
_WRAPPED_FLAG = "__elastic_otel_wrapped__"
Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]
_Target = tuple[type, str, Wrapper, int]  # class, method, wrapper, number of parameters
_RESTART_CAUSES: dict[str, str] = {
    WorkerState.FAILED: A.CAUSE_WORKER_FAILURE,
    WorkerState.UNHEALTHY: A.CAUSE_WORKER_FAILURE,
    WorkerState.HEALTHY: A.CAUSE_MEMBERSHIP_CHANGE,
}
# The time of each agent's latest root failure (seconds), for the detection delay.
_failed_at: MutableMapping[Any, float] = weakref.WeakKeyDictionary()


class _Closing(NamedTuple):
    """When torch first began to close a process context, and the local ranks that had
    failed by then (``None``: this context does not say)."""

    time_ns: int
    ended: frozenset[int] | None


_closing: MutableMapping[Any, _Closing] = weakref.WeakKeyDictionary()
# Per agent: the cgroup's OOM-kill count when it last started workers or saw a SIGKILL.
_oom_kills: MutableMapping[Any, int | None] = weakref.WeakKeyDictionary()


TESTED_TORCH = ((2, 13), (2, 15))
"""The oldest and newest torch (major, minor) the agent instrumentation is on by default with:
the releases CI runs it on (the full suite on 2.13, the instrumentation and end-to-end subset
on 2.14.1 and 2.15.0; the shapes of every release from 2.4 are in
:mod:`elastic_otel.integration.torch_shapes` and docs/torch-versions.md)."""


class AgentInstrumentation:
    """The wrapping of torch's agent methods, and the originals to put back: state on the
    instance, in the shape of OpenTelemetry's ``BaseInstrumentor._instrument`` /
    ``_uninstrument``. torch's classes are process-wide, so the process has one,
    :data:`AGENT`, which the :class:`~elastic_otel.integration.registration.Bridge` holds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._originals: list[tuple[type, str, Any]] = []
        self.handler: OtelHandler | None = None

    def instrument(self, force: bool = False, handler: OtelHandler | None = None) -> bool:
        """Wrap torch's agent methods (idempotent); ``False`` when not done.

        Only on the torch versions in :data:`TESTED_TORCH`, unless ``force``
        (``ELASTIC_OTEL_AGENT_INSTRUMENTATION=true``); even then, never when torch's internals
        differ from what the wrappers expect. What the agent observes goes to ``handler``
        (default: the process-wide bridge handler).
        """
        with self._lock:
            if self._originals:
                return True
            version = _torch_version()
            if not force and not TESTED_TORCH[0] <= version <= TESTED_TORCH[1]:
                _logger.debug(
                    "elastic-otel: agent not instrumented: torch %s.%s is not a version it was "
                    "tested with (%s.%s to %s.%s); ELASTIC_OTEL_AGENT_INSTRUMENTATION=true uses "
                    "it",
                    *version,
                    *TESTED_TORCH[0],
                    *TESTED_TORCH[1],
                )
                return False
            try:
                from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
                from torch.distributed.elastic.agent.server.local_elastic_agent import (
                    LocalElasticAgent,
                )
                from torch.distributed.elastic.multiprocessing.api import PContext
            except ImportError as e:
                _logger.debug("elastic-otel: agent not instrumented (%s)", e)
                return False
            bridge = handler if handler is not None else get_handler()
            targets: list[_Target] = [
                (LocalElasticAgent, "_monitor_workers", _monitor_wrapper(bridge), 2),
                (LocalElasticAgent, "_stop_workers", _step_wrapper("stop_workers", bridge), 2),
                (LocalElasticAgent, "_start_workers", _step_wrapper("start_workers", bridge), 2),
                (LocalElasticAgent, "_setup_local_watchdog", _watchdog_wrapper(bridge), 2),
                (SimpleElasticAgent, "_exit_barrier", _step_wrapper("exit_barrier", bridge), 1),
                (
                    SimpleElasticAgent,
                    "_restart_workers",
                    _step_wrapper("restart_workers", bridge),
                    2,
                ),
                (PContext, "close", _close_wrapper, 3),
            ]
            problem = _shape_problem(SimpleElasticAgent, targets)
            if problem:
                _logger.debug("elastic-otel: agent not instrumented: %s", problem)
                return False
            for cls, name, wrap, _ in targets:
                original = cls.__dict__[name]
                wrapped = functools.wraps(original)(wrap(original))
                setattr(wrapped, _WRAPPED_FLAG, True)
                setattr(cls, name, wrapped)
                self._originals.append((cls, name, original))
            self.handler = bridge
            return True

    def uninstrument(self) -> None:
        """Put torch's methods back."""
        with self._lock:
            while self._originals:
                cls, name, original = self._originals.pop()
                setattr(cls, name, original)
            self.handler = None

    @property
    def instrumented(self) -> bool:
        return bool(self._originals)


AGENT = AgentInstrumentation()
"""The process's agent instrumentation (torch's agent classes are process-wide)."""


def instrument(force: bool = False) -> bool:
    """:meth:`AgentInstrumentation.instrument` on :data:`AGENT`."""
    return AGENT.instrument(force)


def uninstrument() -> None:
    """:meth:`AgentInstrumentation.uninstrument` on :data:`AGENT`."""
    AGENT.uninstrument()


def instrumented() -> bool:
    return AGENT.instrumented


def _torch_version() -> tuple[int, int]:
    try:
        import torch

        major, minor = str(torch.__version__).split(".")[:2]
        return int(major), int(minor)
    except (ImportError, ValueError):
        return (0, 0)


def _shape_problem(agent_cls: type, targets: list[_Target]) -> str:
    """Why torch's agent does not look like the one this was written against (``""``: it does)."""
    for cls, name, _, arity in targets:
        method = cls.__dict__.get(name)
        if method is None or not callable(method):
            return f"{cls.__name__}.{name} not found"
        if getattr(method, _WRAPPED_FLAG, False):
            return f"{cls.__name__}.{name} is already wrapped"
        try:
            params = list(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            return f"{cls.__name__}.{name} has no signature"
        if len(params) != arity:
            return f"{cls.__name__}.{name}{tuple(params)} takes other arguments"
    construct = getattr(agent_cls, "_construct_event", None)
    if construct is None:
        return "SimpleElasticAgent._construct_event not found"
    accepted = set(inspect.signature(construct).parameters)
    if not {"state", "source", "worker", "raw_error"} <= accepted:
        return "SimpleElasticAgent._construct_event takes other arguments"
    return ""


# --- the wrappers -------------------------------------------------------------------------------


def _reports_to_bridge(agent: Any, bridge: OtelHandler) -> bool:
    """Whether this agent records its events to the bridge (``--event-log-handler otel``):
    what it observes goes where its own events go, or nowhere."""
    from torch.distributed.elastic.events import handlers

    destination = agent._worker_group.spec.event_log_handler
    return handlers._log_handlers.get(destination) is bridge


def _monitor_wrapper(bridge: OtelHandler) -> Wrapper:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def _monitor_workers(self: Any, worker_group: Any) -> Any:
            result = original(self, worker_group)
            try:
                if _reports_to_bridge(self, bridge):
                    _report_outcomes(self, worker_group, result, bridge)
            except Exception:  # never the agent's problem
                _logger.debug("elastic-otel: worker outcomes not reported", exc_info=True)
            return result

        return _monitor_workers

    return wrap


def _step_wrapper(step: str, bridge: OtelHandler) -> Wrapper:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def step_method(self: Any, *args: Any) -> Any:
            if step == "restart_workers":
                _end_attempt(self, bridge, lost=True, final=False)
            _report_step(self, step, "start", bridge, extra=_recovery_facts(self, step, args))
            start = time.monotonic()
            error: BaseException | None = None
            try:
                result = original(self, *args)
            except BaseException as e:
                error = e
                raise
            finally:
                duration_ms = (time.monotonic() - start) * 1000.0
                _report_step(self, step, "end", bridge, duration_ms, error)
                if step == "exit_barrier":
                    _end_attempt(self, bridge, lost=False, final=True)
            if step == "start_workers":
                _watch_workers(self, args[0], bridge)
            return result

        return step_method

    return wrap


def _watchdog_wrapper(bridge: OtelHandler) -> Wrapper:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def _setup_local_watchdog(self: Any, envs: dict[int, dict[str, str]]) -> Any:
            try:
                if _reports_to_bridge(self, bridge):
                    _oom_kills[self] = oom_kill_count()
                    if bridge.settings.worker_startup:
                        _add_worker_startup(envs)
                    _add_trace_context(self, envs, bridge)
                    if bridge.settings.worker_output_streams:
                        capture_logs_specs(self, bridge)
            except Exception:  # never the agent's problem
                _logger.debug("elastic-otel: workers started without trace context", exc_info=True)
            return original(self, envs)

        return _setup_local_watchdog

    return wrap


def _close_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def close(self: Any, death_sig: Any = None, timeout: int = 30) -> Any:
        try:
            failures = getattr(self, "_failures", None)  # SubprocessContext's
            if self not in _closing:
                ended = frozenset(failures) if isinstance(failures, dict) else None
                _closing[self] = _Closing(time.time_ns(), ended)
            # After a failure (torch's _poll, MultiprocessContext's inside its except) or a
            # signal (torch's SignalException being handled): the victims' last stacks first
            failed = bool(failures) or sys.exc_info()[1] is not None
            WATCH.before_stop(self, failed)
        except Exception:  # never the agent's problem
            _logger.debug("elastic-otel: close not observed", exc_info=True)
        result = original(self, death_sig, timeout)
        try:
            finish_output(self)  # the ended workers' output, to its last line
        except Exception:  # never the agent's problem
            _logger.debug("elastic-otel: worker output not read to its end", exc_info=True)
        return result

    return close


# --- events -------------------------------------------------------------------------------------


def _recovery_facts(agent: Any, step: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """What the start of a restart says about the recovery: its cause, the detection delay."""
    if step != "restart_workers" or not args:
        return {}
    try:
        state = getattr(getattr(args[0], "state", None), "name", "")
        cause = _RESTART_CAUSES.get(state)
        if cause is None:
            return {}
        facts: dict[str, Any] = {"recovery.cause": cause}
        failed_at = _failed_at.pop(agent, None)
        if cause == A.CAUSE_WORKER_FAILURE and failed_at:
            facts["recovery.detection_ms"] = max(0.0, time.time() - failed_at) * 1000.0
        return facts
    except Exception:
        return {}


def _add_trace_context(agent: Any, envs: dict[int, dict[str, str]], bridge: OtelHandler) -> None:
    """Give each worker its ``TRACEPARENT`` and start times (see the module docstring)."""
    run_id = agent._worker_group.spec.rdzv_handler.get_run_id()
    launch = bridge.worker_launch(run_id, sorted(envs))
    if launch is None:
        return
    started = str(time.time_ns())
    for local_rank, worker_env in envs.items():
        span_id = launch.span_ids.get(local_rank)
        if span_id is None:
            continue
        worker_env[env.TRACEPARENT] = traceparent(launch.trace_id, span_id)
        worker_env[env.TRACESTATE] = ""  # not the agent's own, if it has one
        worker_env[env.ELASTIC_OTEL_WORKER_START_UNIX_NANO] = started
        if launch.recovery_cause:
            worker_env[env.ELASTIC_OTEL_RECOVERY_CAUSE] = launch.recovery_cause
            worker_env[env.ELASTIC_OTEL_RECOVERY_START_UNIX_NANO] = str(launch.recovery_start_ns)


def _watch_workers(agent: Any, worker_group: Any, bridge: OtelHandler) -> None:
    """Hand the workers torch just started to the training watch (hangs, stacks)."""
    try:
        if not _reports_to_bridge(agent, bridge):
            return
        pcontext = agent._pcontext
        pids = pcontext.pids()
        error_files = getattr(pcontext, "error_files", None) or {}
        workers = [
            WatchedWorker(
                global_rank=w.global_rank,
                local_rank=w.local_rank,
                pid=pids[w.local_rank],
                directory=os.path.dirname(error_files[w.local_rank]),
                worker=w,
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
            _report_stacks_and_stall(agent, bridge, reason, stacks, stall, dumps, liveness)

        observe: Callable[[int, list[WorkerProgress]], None] | None = None
        if bridge.settings.goodput:
            run_id = agent._worker_group.spec.rdzv_handler.get_run_id()

            def report_goodput(summary: Summary) -> None:
                _report_goodput(agent, bridge, summary)

            GOODPUT.started(agent, run_id, workers, bridge.settings.stall_after_s, report_goodput)
            agent_ref = weakref.ref(agent)

            def observe_progress(now_ns: int, readings: list[WorkerProgress]) -> None:
                watched = agent_ref()
                if watched is not None:
                    GOODPUT.observe(watched, now_ns, readings)

            observe = observe_progress

        def report_straggler(straggler: Straggler) -> None:
            _report_straggler(agent, bridge, straggler)

        WATCH.watch(
            pcontext,
            workers,
            report,
            bridge.settings.stall_after_s,
            bridge.current_stalls,
            observe,
            bridge.settings.straggler_window_s,
            bridge.settings.straggler_score,
            report_straggler,
        )
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: workers not watched", exc_info=True)


def _end_attempt(agent: Any, bridge: OtelHandler, lost: bool, final: bool) -> None:
    """The worker group's attempt ended now: account for it (see
    :mod:`elastic_otel.integration.goodput`)."""
    try:
        if not bridge.settings.goodput or not _reports_to_bridge(agent, bridge):
            return
        failed_at = _failed_at.get(agent) if lost else None
        failure_ns = int(failed_at * 1e9) if failed_at else None
        GOODPUT.ended(agent, time.time_ns(), lost, final, failure_ns)
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: goodput not accounted", exc_info=True)


def _report_goodput(agent: Any, bridge: OtelHandler, summary: Summary) -> None:
    """The attempt's goodput summary as a ``torchelastic.goodput`` event on the node's round."""
    try:
        from torch.distributed.elastic.events import EventSource

        event = _construct(agent, A.GOODPUT_STATE, EventSource.AGENT, None)
        event.name = A.GOODPUT_EVENT_NAME
        event.metadata.update(
            {key.removeprefix(A.NS): value for key, value in summary.attributes().items()}
        )
        event.timestamp = int(time.time() * 1000)
        bridge.info(event)
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: goodput summary not reported", exc_info=True)


def _report_straggler(agent: Any, bridge: OtelHandler, straggler: Straggler) -> None:
    """A straggler as a WARN ``torchelastic.straggler`` event on the node's round."""
    try:
        from torch.distributed.elastic.events import EventSource

        event = _construct(agent, STRAGGLER_STATE, EventSource.AGENT, None)
        event.name = STRAGGLER_EVENT_NAME
        facts = {k.removeprefix(A.NS): v for k, v in straggler_attributes(straggler).items()}
        # torch's metadata holds scalars: "0,2" here, an int array once parsed and exported
        facts["straggler.waiting"] = ",".join(map(str, straggler.waiting))
        event.metadata.update(facts)
        event.timestamp = int(time.time() * 1000)
        bridge.info(event)
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: straggler not reported", exc_info=True)


def _report_stacks_and_stall(
    agent: Any,
    bridge: OtelHandler,
    reason: str,
    stacks: list[tuple[WatchedWorker, str]],
    stall: TrainingStall | None,
    dumps: FlightRecorderDumps | None = None,
    liveness: RendezvousLiveness | None = None,
) -> None:
    """One record per worker's stacks (on its span), then the training stall's report; each
    names the directory of the workers' Flight Recorder dumps taken with them. The stall's
    report names the round's nodes whose rendezvous keep-alives stopped (``liveness``)."""
    from torch.distributed.elastic.events import EventSource

    frames: dict[int, str] = {}
    now_ms = int(time.time() * 1000)
    dump_facts: dict[str, Any] = {}
    if dumps is not None:
        dump_facts["flight_recorder.dump"] = dumps.directory
        if dumps.unanswered:
            dump_facts["flight_recorder.unanswered"] = ",".join(map(str, dumps.unanswered))
    for watched, text in stacks:
        frame = main_thread_frame(text) or ""
        frames[watched.global_rank] = frame
        event = _construct(agent, STACKS_STATE, EventSource.AGENT, watched.worker)
        event.name = WORKER_STACKS_EVENT
        event.metadata.update({"stacks": text, "stacks.reason": reason, "stack.frame": frame})
        event.metadata.update(dump_facts)
        event.timestamp = now_ms
        bridge.info(event)
    if stall is None:
        return
    event = _construct(agent, STALL_STATE, EventSource.AGENT, None)
    event.name = STALL_EVENT_NAME
    facts: dict[str, Any] = {
        "stalled.in": TRAINING,
        "stalled.seconds": round(stall.seconds, 3),
        # torch's metadata holds scalars: "1,2" here, an int array once parsed and exported
        "stalled.ranks": ",".join(map(str, stall.waited_for)),
        "stalled.waiting": ",".join(map(str, stall.waiting)),
    }
    if stall.collective:
        facts["stalled.collective"] = stall.collective
        facts["stalled.collective_number"] = stall.number
    if stall.group is not None:
        facts["stalled.process_group"] = stall.group
    facts.update(dump_facts)
    if liveness is not None:
        for key, value in silence_attributes(liveness.silent_nodes()).items():
            # torch's metadata holds scalars: group ranks as "1,2", an int array once parsed
            facts[key.removeprefix(A.NS)] = (
                ",".join(map(str, value)) if isinstance(value, tuple) else value
            )
    first = frames.get(stall.waited_for[0]) if stall.waited_for else None
    if first:
        facts["stack.frame"] = first
    event.metadata.update(facts)
    event.timestamp = now_ms
    bridge.info(event)


class RendezvousLiveness:
    """The keep-alives of a round's nodes, as this node's dynamic rendezvous (c10d, etcd-v2)
    keeps them: who stopped sending them. The round's members are taken when its workers
    start; torch drops a node it declares dead from its state, so a member missing later has
    been silent at least as long as torch's own bound."""

    def __init__(self, handler: Any, members: dict[str, int], this_node: str) -> None:
        self._handler = handler
        self._members = members
        self._this_node = this_node

    @classmethod
    def of(cls, handler: Any) -> RendezvousLiveness | None:
        """For ``handler`` (traced or not); ``None`` for a backend without keep-alives."""
        inner = getattr(handler, "_inner", handler)
        try:
            state = inner._state_holder.state
            members = {repr(node): rank for node, rank in list(state.participants.items())}
            return cls(inner, members, repr(inner._this_node))
        except Exception:  # static, etcd (v1), or another torch
            return None

    def silent_nodes(self) -> list[SilentNode]:
        try:
            holder = self._handler._state_holder
            settings = self._handler._settings
            after_s = (
                settings.keep_alive_interval * settings.keep_alive_max_attempt
            ).total_seconds()
            beats = {
                repr(node): when.timestamp()
                for node, when in list(holder.state.last_heartbeats.items())
            }
            synced = getattr(holder, "_last_sync_time", None)
            own_age = time.monotonic() - synced if isinstance(synced, float) else None
        except Exception:  # torch's private state changed shape: say nothing
            return []
        return silent_nodes(self._members, beats, self._this_node, own_age, time.time(), after_s)


def _add_worker_startup(envs: dict[int, dict[str, str]]) -> None:
    """Put the worker start-up on each worker's ``PYTHONPATH`` (see the module docstring);
    only from the installed package, never from a directory anyone may write to."""
    shim = os.path.join(_WORKER_SITE, "sitecustomize.py")
    if not os.path.isfile(shim) or os.stat(_WORKER_SITE).st_mode & stat.S_IWOTH:
        return
    for worker_env in envs.values():
        base = worker_env.get(env.PYTHONPATH, os.environ.get(env.PYTHONPATH, ""))
        worker_env[env.PYTHONPATH] = _WORKER_SITE + (os.pathsep + base if base else "")
        worker_env[env.ELASTIC_OTEL_WORKER_PYTHONPATH] = base
        worker_env[env.ELASTIC_OTEL_WORKER_REPORTS] = "1"


def traceparent(trace_id: int, span_id: int) -> str:
    """A W3C ``traceparent`` value for a sampled span."""
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def _report_outcomes(agent: Any, worker_group: Any, result: Any, handler: OtelHandler) -> None:
    state = getattr(getattr(result, "state", None), "name", "")
    if state not in (WorkerState.FAILED, WorkerState.SUCCEEDED):
        return  # HEALTHY, UNHEALTHY, UNKNOWN: nothing ended that the agent knows of
    from torch.distributed.elastic.events import EventSource

    failures = getattr(result, "failures", {}) or {}
    returned = getattr(result, "return_values", {}) or {}
    now_ms = time.time() * 1000.0
    ended = _worker_ends(agent, failures)
    ends = [e for e, _ in ended.values()]
    root = root_cause(ends)
    if state == WorkerState.FAILED and ends:
        first = root or min(ends, key=lambda e: e.time_ns)
        _failed_at[agent] = first.time_ns / 1e9
    if state == WorkerState.FAILED and getattr(agent, "_remaining_restarts", 1) <= 0:
        _end_attempt(agent, handler, lost=True, final=True)  # no restart left: the job failed
    oom = _oom_killed(agent, ends)
    # The root cause first: the workers that died of it link to its span.
    root_rank = root.global_rank if root is not None else None
    workers = sorted(worker_group.workers, key=lambda w: w.global_rank != root_rank)
    for worker in workers:
        if worker.global_rank in ended:
            end, report = ended[worker.global_rank]
            kind = classify(end)
            failure = failures[worker.global_rank]
            words, fault = last_output(getattr(agent, "_pcontext", None), worker.local_rank)
            event = _construct(
                agent,
                _KIND_STATES[kind].value,
                EventSource.WORKER,
                worker,
                raw_error=None if kind == A.KIND_STOPPED else _raw_error(failure, report, fault),
                exit_code=failure.exitcode,
                worker_pid=failure.pid,
            )
            event.metadata["failure.kind"] = kind
            if kind == A.KIND_ROOT_CAUSE and words:
                event.metadata["last_words"] = words
            if kind == A.KIND_STOPPED and root_rank is not None:
                event.metadata["stopped_after"] = root_rank
            if oom and kind == A.KIND_ROOT_CAUSE and end.exit_code == -signal.SIGKILL:
                event.metadata["oom_kill"] = True
            event.timestamp = end.time_ns // 1_000_000 or int(now_ms)
        elif state == WorkerState.SUCCEEDED and worker.global_rank in returned:
            event = _construct(agent, WorkerState.SUCCEEDED.value, EventSource.WORKER, worker)
            event.timestamp = int(now_ms)
        else:
            continue  # still running: it ends when the agent stops it (stop_workers)
        event.metadata["observed_by"] = OBSERVED_BY_MONITOR
        handler.info(event)


_KIND_STATES = {
    A.KIND_ROOT_CAUSE: WorkerState.FAILED,
    A.KIND_PEER_FAILURE: WorkerState.PEER_FAILED,
    A.KIND_STOPPED: WorkerState.STOPPED,
}


def _worker_ends(
    agent: Any, failures: dict[int, Any]
) -> dict[int, tuple[WorkerEnd, WorkerReport | None]]:
    """What the agent knows of each failed worker (by global rank), and its report."""
    pcontext = getattr(agent, "_pcontext", None)
    closing = _closing.get(pcontext) if pcontext is not None else None
    # torch's ProcessFailure forgets the path of an error file the worker did not write
    error_files = getattr(pcontext, "error_files", None) or {}
    now_ns = time.time_ns()
    ended: dict[int, tuple[WorkerEnd, WorkerReport | None]] = {}
    for rank, failure in failures.items():
        report = read_worker_report(error_files.get(failure.local_rank) or failure.error_file)
        ended_before = closing.ended if closing is not None else None
        stopped = ended_before is not None and failure.local_rank not in ended_before
        # The moment of death: the worker's own report (an exception, a fault stack), else
        # when the agent saw it (torch's failure time has whole seconds, rounded down)
        seen_ns = closing.time_ns if closing is not None and not stopped else now_ns
        end = WorkerEnd(
            global_rank=rank,
            exit_code=failure.exitcode,
            stopped_by_agent=stopped,
            exception_type=report.exception_type if report is not None else None,
            message=report.message if report is not None else None,
            time_ns=(report.time_ns if report is not None else None) or seen_ns,
        )
        ended[rank] = (end, report)
    return _dated_by_victims(ended)


def _dated_by_victims(
    ended: dict[int, tuple[WorkerEnd, WorkerReport | None]],
) -> dict[int, tuple[WorkerEnd, WorkerReport | None]]:
    """A death no report dates (a SIGKILL) is dated when its agent saw it, up to a monitor
    interval late; when every dated death of the node is a victim's, it died no later than
    the first of them, which it caused."""
    dated = {r: e for r, (e, report) in ended.items() if report is not None and report.time_ns}
    if not dated or any(classify(e) == A.KIND_ROOT_CAUSE for e in dated.values()):
        return ended
    first = min(e.time_ns for e in dated.values())
    for rank, (end, report) in ended.items():
        if rank not in dated and not end.stopped_by_agent and end.time_ns > first:
            ended[rank] = (dataclasses.replace(end, time_ns=first), report)
    return ended


def _oom_killed(agent: Any, ends: list[WorkerEnd]) -> bool:
    """Whether the cgroup's OOM-kill count rose since the workers started (or since the last
    SIGKILL this agent saw), when a worker died of a SIGKILL its agent did not send."""
    if not any(e.exit_code == -signal.SIGKILL and not e.stopped_by_agent for e in ends):
        return False
    before = _oom_kills.get(agent)
    now = _oom_kills[agent] = oom_kill_count()
    return before is not None and now is not None and now > before


def _fatal_error(fault_stack: str) -> str:
    """ "Fatal Python error: Segmentation fault, in fail (train.py:27)": faulthandler's first
    line and the crashing thread's innermost frame (it lists the current thread first)."""
    lines = fault_stack.strip().splitlines()
    frame = next((line.strip() for line in lines if line.startswith('  File "')), "")
    path, _, rest = frame[len('File "') :].partition('", line ')
    line, _, function = rest.partition(" in ")
    where = f", in {function} ({os.path.basename(path)}:{line})" if function else ""
    return lines[0] + where


def _raw_error(
    failure: Any, report: WorkerReport | None, stderr_fault: str | None = None
) -> str | None:
    """The worker's error in the shape of torch's error file (what the parser reads): the
    worker start-up's report (an exception, or a fatal signal's Python stack), else the fatal
    signal's stack ``faulthandler`` wrote on the worker's stderr (torch's ``@record`` points it
    there), else torch's."""
    if report is not None and report.exception_type:
        message = f"{report.exception_type}: {report.message or ''}"
        stack = report.traceback or ""
    elif report is not None and report.fault_stack:
        message = _fatal_error(report.fault_stack)
        stack = report.fault_stack
    elif stderr_fault and (getattr(failure, "exitcode", 0) or 0) < 0:
        stack = with_source_lines(stderr_fault, MAX_REPORT_BYTES)
        message = _fatal_error(stack)
    else:
        data = getattr(failure, "error_file_data", None)
        return json.dumps(data) if data else None
    return json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": stack}}})


def _report_step(
    agent: Any,
    step: str,
    phase: str,
    bridge: OtelHandler,
    duration_ms: float | None = None,
    error: BaseException | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    try:
        if not _reports_to_bridge(agent, bridge):
            return
        from torch.distributed.elastic.events import EventSource

        event = _construct(
            agent,
            step.upper(),
            EventSource.AGENT,
            None,
            raw_error=_describe(error) if error is not None else None,
            duration_ms=duration_ms,
        )
        event.name = AGENT_STEP_PREFIX + step
        event.metadata["phase"] = phase
        event.metadata.update(extra or {})
        event.timestamp = int(time.time() * 1000)
        bridge.info(event)
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: agent step %s not reported", step, exc_info=True)


def _construct(agent: Any, state: str, source: Any, worker: Any, **fields: Any) -> Any:
    """The agent's own ``_construct_event``, without the arguments this torch lacks."""
    accepted = inspect.signature(agent._construct_event).parameters
    kwargs = {k: v for k, v in fields.items() if k in accepted}
    return agent._construct_event(state=state, source=source, worker=worker, **kwargs)


def _describe(error: BaseException) -> str:
    return f"{type(error).__module__}.{type(error).__qualname__}: {error}"
