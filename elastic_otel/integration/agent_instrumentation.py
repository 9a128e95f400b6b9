"""torch's elastic agent, instrumented: what it learns about its workers, when it learns it.

torch records worker outcomes only in its final events, after the exit barrier, and records
nothing for a worker that fails before a restart: the agent learns each outcome from
``_monitor_workers`` (a ``RunResult`` with a ``ProcessFailure`` per failed rank: pid, exit
code, error file data, time) and acts on it without an event. So, as OpenTelemetry's
instrumentation packages do for libraries, :class:`AgentInstrumentation` wraps methods of torch's
agent classes on activation and puts them back when asked (six methods; :func:`instrument` /
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
  without them.

The events go to the bridge handler only, and only from an agent whose own events go there
(``--event-log-handler otel``): torch's other destinations see what they always saw. Every
wrapper calls torch's method first and reports after, inside ``try``: a failure here is one
debug line, never the agent's. Where torch's internals differ (a method or
``_construct_event`` missing or shaped differently), nothing is wrapped, with one debug line,
and the bridge falls back to torch's own events.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import signal
import threading
import time
import weakref
from collections.abc import Callable, MutableMapping
from typing import Any

from elastic_otel.bridge.handler import OtelHandler, get_handler
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from elastic_otel.names.torch_names import AGENT_STEP_PREFIX, WorkerState

_logger = logging.getLogger("elastic_otel")

OBSERVED_BY_MONITOR = "monitor_workers"
"""The value of ``torchelastic.observed_by`` on the outcomes this module reports."""
_STOP_EXIT_CODES = frozenset({-signal.SIGTERM, -signal.SIGKILL})
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


TESTED_TORCH = ((2, 13), (2, 13))
"""The oldest and newest torch (major, minor) the agent instrumentation is tested with (CI)."""


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
            _report_step(self, step, "start", bridge, extra=_recovery_facts(self, step, args))
            start = time.monotonic()
            error: BaseException | None = None
            try:
                return original(self, *args)
            except BaseException as e:
                error = e
                raise
            finally:
                duration_ms = (time.monotonic() - start) * 1000.0
                _report_step(self, step, "end", bridge, duration_ms, error)

        return step_method

    return wrap


def _watchdog_wrapper(bridge: OtelHandler) -> Wrapper:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def _setup_local_watchdog(self: Any, envs: dict[int, dict[str, str]]) -> Any:
            try:
                if _reports_to_bridge(self, bridge):
                    _add_trace_context(self, envs, bridge)
            except Exception:  # never the agent's problem
                _logger.debug("elastic-otel: workers started without trace context", exc_info=True)
            return original(self, envs)

        return _setup_local_watchdog

    return wrap


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
    root = root_failure({rank: (f.exitcode, f.timestamp) for rank, f in failures.items()})
    if root is not None and state == WorkerState.FAILED:
        _failed_at[agent] = float(failures[root].timestamp or 0)
    # The root cause first: the workers stopped because of it link to its span.
    workers = sorted(worker_group.workers, key=lambda w: w.global_rank != root)
    for worker in workers:
        failure = failures.get(worker.global_rank)
        if failure is not None:
            stopped = worker.global_rank != root and failure.exitcode in _STOP_EXIT_CODES
            event = _construct(
                agent,
                (WorkerState.STOPPED if stopped else WorkerState.FAILED).value,
                EventSource.WORKER,
                worker,
                raw_error=None if stopped else json.dumps(failure.error_file_data),
                exit_code=failure.exitcode,
                worker_pid=failure.pid,
            )
            if stopped:
                event.metadata["stopped_after"] = root
            failed_at = getattr(failure, "timestamp", 0)
            event.timestamp = int(failed_at * 1000) if failed_at else int(now_ms)
        elif state == WorkerState.SUCCEEDED and worker.global_rank in returned:
            event = _construct(agent, WorkerState.SUCCEEDED.value, EventSource.WORKER, worker)
            event.timestamp = int(now_ms)
        else:
            continue  # still running: it ends when the agent stops it (stop_workers)
        event.metadata["observed_by"] = OBSERVED_BY_MONITOR
        handler.info(event)


def root_failure(failures: dict[int, tuple[int, float]]) -> int | None:
    """The global rank that failed first, from ``{rank: (exit code, failure time)}``.

    Workers torch stopped itself (killed by SIGTERM or SIGKILL) are not candidates while
    another failure is there; ties go to the earliest time, then the lowest rank.
    """
    if not failures:
        return None
    own = {r: v for r, v in failures.items() if v[0] not in _STOP_EXIT_CODES} or failures
    return min(own, key=lambda r: (own[r][1], r))


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
