"""torch's elastic agent, instrumented: what it learns about its workers, when it learns it.

torch records worker outcomes only in its final events, after the exit barrier, and nothing for
a worker that fails before a restart. :class:`AgentInstrumentation` wraps the methods of torch's
agent classes in :data:`WRAPPED` (each entry says why), calling torch first and reporting after;
where torch is shaped otherwise nothing is wrapped. Design: ``docs/trace-model.md`` (Worker
outcomes when the agent sees them); torch releases: ``docs/torch-versions.md``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastic_otel.bridge.handler import OtelHandler, get_handler
from elastic_otel.integration.agent_events import (
    report_duration,
    report_step,
    report_worker_starts,
    reports_to_handler,
)
from elastic_otel.integration.agent_observer import AgentObserver
from elastic_otel.integration.goodput import GoodputWatch
from elastic_otel.integration.training_watch import TrainingWatch
from elastic_otel.integration.worker_output import capture_logs_specs
from elastic_otel.integration.worker_output import finish as finish_output
from elastic_otel.names import environment_variables as env

_logger = logging.getLogger("elastic_otel")

_WORKER_SITE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "worker", "site")
"""The worker start-up's ``sitecustomize`` directory, inside the installed package (a path,
not an import: ``worker`` is this layer's sibling)."""
_WRAPPED_FLAG = "__elastic_otel_wrapped__"  # on a wrapper: the instrumentation that made it
Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]
_Target = tuple[type, str, Wrapper, int]  # class, method, wrapper, number of parameters

TESTED_TORCH = ((2, 13), (2, 15))
"""The oldest and newest torch (major, minor) the agent instrumentation is on by default with:
the releases CI runs it on (the full suite on 2.13, the instrumentation and end-to-end subset
on 2.14.1 and 2.15.0; every release from 2.4 in docs/torch-versions.md)."""


class AgentInstrumentation:
    """The wrapping of torch's agent methods, the originals to put back, and what the wrappers
    learn per agent (``observer``): state on the instance, in the shape of OpenTelemetry's
    ``BaseInstrumentor._instrument`` / ``_uninstrument``. It holds the training watch
    (``watch``) and the goodput accounting (``goodput``) its wrappers feed, which the metrics
    read. torch's classes are process-wide: the process's registration holds the one in use."""

    def __init__(
        self, watch: TrainingWatch | None = None, goodput: GoodputWatch | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._originals: list[tuple[type, str, Any]] = []
        self.handler: OtelHandler | None = None
        self.watch = watch if watch is not None else TrainingWatch()
        self.goodput = goodput if goodput is not None else GoodputWatch()
        self.observer = AgentObserver(self.watch, self.goodput)
        self.classes: Callable[[], dict[str, type]] = torch_classes
        """The classes to wrap, by torch's names (``ft_launcher``'s copy of them, say)."""

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
                classes = self.classes()
            except ImportError as e:
                _logger.debug("elastic-otel: agent not instrumented (%s)", e)
                return False
            handler = handler if handler is not None else get_handler()
            targets: list[_Target] = [
                (
                    classes[m.owner],
                    m.name,
                    m.wrapper(self.observer, handler, m.name),
                    len(m.parameters),
                )
                for m in WRAPPED
            ]
            simple = classes["SimpleElasticAgent"]
            if not hasattr(simple, "record_duration"):  # torch 2.3's copy (ft_launcher's)
                targets += [
                    (classes[m.owner], m.name, m.wrapper(self.observer, handler, m.name), 0)
                    for m in OLDER_AGENT
                ]
            problem = shape_problem(simple, targets)
            if problem:
                _logger.debug("elastic-otel: agent not instrumented: %s", problem)
                return False
            for cls, name, wrap, _ in targets:
                original = cls.__dict__[name]
                wrapped = functools.wraps(original)(wrap(original))
                setattr(wrapped, _WRAPPED_FLAG, self)
                setattr(cls, name, wrapped)
                self._originals.append((cls, name, original))
            self.handler = handler
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

    @staticmethod
    def installed() -> AgentInstrumentation | None:
        """The instrumentation whose wrappers are on torch's classes now (``None``: none)."""
        try:
            classes = torch_classes()
        except ImportError:
            return None
        first = WRAPPED[0]
        owner = getattr(classes[first.owner].__dict__.get(first.name), _WRAPPED_FLAG, None)
        return owner if isinstance(owner, AgentInstrumentation) else None


def torch_classes() -> dict[str, type]:
    """torch's classes whose methods :data:`WRAPPED` names, by the name it uses."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import PContext

    return {
        "SimpleElasticAgent": SimpleElasticAgent,
        "LocalElasticAgent": LocalElasticAgent,
        "PContext": PContext,
    }


def _torch_version() -> tuple[int, int]:
    try:
        import torch

        major, minor = str(torch.__version__).split(".")[:2]
        return int(major), int(minor)
    except (ImportError, ValueError):
        return (0, 0)


def shape_problem(agent_cls: type, targets: list[_Target]) -> str:
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
        if arity and len(params) != arity:
            return f"{cls.__name__}.{name}{tuple(params)} takes other arguments"
    construct = getattr(agent_cls, "_construct_event", None)
    if construct is None:
        return "SimpleElasticAgent._construct_event not found"
    accepted = set(inspect.signature(construct).parameters)
    if not {"state", "source", "worker", "raw_error"} <= accepted:
        return "SimpleElasticAgent._construct_event takes other arguments"
    return ""


# --- the wrappers -------------------------------------------------------------------------------

WrapperFactory = Callable[[AgentObserver, OtelHandler, str], Wrapper]
"""``factory(observer, handler, method name)``: the wrapper of one method."""


def _monitor_wrapper(observer: AgentObserver, handler: OtelHandler, _: str) -> Wrapper:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def _monitor_workers(self: Any, worker_group: Any) -> Any:
            result = original(self, worker_group)
            try:
                if reports_to_handler(self, handler):
                    observer.outcomes(handler, self, worker_group, result)
            except Exception:  # never the agent's problem
                _logger.debug("elastic-otel: worker outcomes not reported", exc_info=True)
            return result

        return _monitor_workers

    return wrap


def _step_wrapper(observer: AgentObserver, handler: OtelHandler, method: str) -> Wrapper:
    step = method.removeprefix("_")

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def step_method(self: Any, *args: Any) -> Any:
            extra = None
            if step == "restart_workers":
                observer.attempt_ended(handler, self, lost=True, final=False)
                extra = observer.restart_facts(self, args[0]) if args else None
            report_step(self, handler, step, "start", extra=extra)
            start = time.monotonic()
            error: BaseException | None = None
            try:
                result = original(self, *args)
            except BaseException as e:
                error = e
                raise
            finally:
                duration_ms = (time.monotonic() - start) * 1000.0
                report_step(self, handler, step, "end", duration_ms, error)
                if step == "exit_barrier":
                    observer.attempt_ended(handler, self, lost=False, final=True)
            if step == "start_workers":
                observer.workers_started(handler, self, args[0])
            return result

        return step_method

    return wrap


def _timed_wrapper(_: AgentObserver, handler: OtelHandler, method: str) -> Wrapper:
    """torch 2.4's ``record_duration`` events for an agent that records none: ``RENDEZVOUS``
    (the rendezvous handler's part of ``_rendezvous``, up to the ranks' assignment) and
    ``ASSIGN_WORKER_RANKS``, each with the duration measured here."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            if method == "_assign_worker_ranks":
                began = self.__dict__.pop(_RENDEZVOUS_START, None)
                if began is not None:
                    report_duration(self, handler, "RENDEZVOUS", (start - began) * 1000.0)
            else:
                self.__dict__[_RENDEZVOUS_START] = start
            try:
                return original(self, *args, **kwargs)
            finally:
                if method == "_assign_worker_ranks":
                    duration_ms = (time.monotonic() - start) * 1000.0
                    report_duration(self, handler, "ASSIGN_WORKER_RANKS", duration_ms)
                elif self.__dict__.pop(_RENDEZVOUS_START, None) is not None:  # it raised first
                    duration_ms = (time.monotonic() - start) * 1000.0
                    report_duration(self, handler, "RENDEZVOUS", duration_ms)

        return timed

    return wrap


_RENDEZVOUS_START = "_elastic_otel_rendezvous_start"


def _starts_wrapper(_: AgentObserver, handler: OtelHandler, __: str) -> Wrapper:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def _initialize_workers(self: Any, worker_group: Any) -> Any:
            result = original(self, worker_group)
            report_worker_starts(self, handler, worker_group)
            return result

        return _initialize_workers

    return wrap


def _watchdog_wrapper(observer: AgentObserver, handler: OtelHandler, _: str) -> Wrapper:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def _setup_local_watchdog(self: Any, envs: dict[int, dict[str, str]]) -> Any:
            try:
                if reports_to_handler(self, handler):
                    observer.workers_starting(self)
                    if handler.settings.worker_startup:
                        add_worker_startup(envs)
                    add_trace_context(self, envs, handler)
                    if handler.settings.worker_output_streams:
                        capture_logs_specs(self, handler, observer.output)
            except Exception:  # never the agent's problem
                _logger.debug("elastic-otel: workers started without trace context", exc_info=True)
            return original(self, envs)

        return _setup_local_watchdog

    return wrap


def _close_wrapper(observer: AgentObserver, handler: OtelHandler, _: str) -> Wrapper:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def close(self: Any, death_sig: Any = None, timeout: int = 30) -> Any:
            try:
                observer.closing(self, handler)
            except Exception:  # never the agent's problem
                _logger.debug("elastic-otel: close not observed", exc_info=True)
            result = original(self, death_sig, timeout)
            try:
                finish_output(self, observer.output)  # the ended workers' output, to the end
            except Exception:  # never the agent's problem
                _logger.debug("elastic-otel: worker output not read to its end", exc_info=True)
            return result

        return close

    return wrap


@dataclass(frozen=True)
class WrappedMethod:
    """One method of torch's the instrumentation replaces."""

    owner: str  # the class whose own body defines it (its __dict__ entry is replaced)
    name: str
    parameters: tuple[str, ...]  # what the wrapper takes (the shape check counts them)
    wrapper: WrapperFactory
    why: str


WRAPPED: tuple[WrappedMethod, ...] = (
    WrappedMethod(
        "LocalElasticAgent",
        "_monitor_workers",
        ("self", "worker_group"),
        _monitor_wrapper,
        "a FAILED or SUCCEEDED group: each failed or finished worker's outcome, at once",
    ),
    WrappedMethod(
        "LocalElasticAgent",
        "_stop_workers",
        ("self", "worker_group"),
        _step_wrapper,
        "an agent step: its start and end",
    ),
    WrappedMethod(
        "LocalElasticAgent",
        "_start_workers",
        ("self", "worker_group"),
        _step_wrapper,
        "an agent step; then its workers are handed to the training watch and the goodput",
    ),
    WrappedMethod(
        "LocalElasticAgent",
        "_setup_local_watchdog",
        ("self", "envs"),
        _watchdog_wrapper,
        "every worker's environment before it starts: TRACEPARENT, the worker start-up",
    ),
    WrappedMethod(
        "SimpleElasticAgent",
        "_exit_barrier",
        ("self",),
        _step_wrapper,
        "an agent step (a wait for lost nodes is an open span); the attempt ends",
    ),
    WrappedMethod(
        "SimpleElasticAgent",
        "_restart_workers",
        ("self", "worker_group"),
        _step_wrapper,
        "a recovery: its cause and detection delay; the attempt ends",
    ),
    WrappedMethod(
        "PContext",
        "close",
        ("self", "death_sig", "timeout"),
        _close_wrapper,
        "the agent begins to stop its workers: which had ended on their own; their stacks",
    ),
)
"""What the instrumentation wraps, and why."""

OLDER_AGENT: tuple[WrappedMethod, ...] = (
    WrappedMethod(
        "SimpleElasticAgent",
        "_rendezvous",
        (),
        _timed_wrapper,
        "torch 2.3's agent (ft_launcher's copy) records no RENDEZVOUS with its duration",
    ),
    WrappedMethod(
        "SimpleElasticAgent",
        "_assign_worker_ranks",
        (),
        _timed_wrapper,
        "nor ASSIGN_WORKER_RANKS",
    ),
    WrappedMethod(
        "SimpleElasticAgent",
        "_initialize_workers",
        (),
        _starts_wrapper,
        "nor its workers' START events (once their ids are set)",
    ),
)
"""Wrapped where the agent has no ``record_duration`` (torch before 2.4): the events torch 2.4
on records that it does not."""


def add_worker_startup(envs: dict[int, dict[str, str]]) -> None:
    """Put the worker start-up (:mod:`elastic_otel.worker.startup`: a crashed worker's Python
    stack, an uncaught exception's type, the progress records) on each worker's
    ``PYTHONPATH``; only from the installed package, never from a directory anyone may write
    to. ``ELASTIC_OTEL_WORKER_STARTUP=false`` turns it off."""
    shim = os.path.join(_WORKER_SITE, "sitecustomize.py")
    if not os.path.isfile(shim) or os.stat(_WORKER_SITE).st_mode & stat.S_IWOTH:
        return
    for worker_env in envs.values():
        base = worker_env.get(env.PYTHONPATH, os.environ.get(env.PYTHONPATH, ""))
        worker_env[env.PYTHONPATH] = _WORKER_SITE + (os.pathsep + base if base else "")
        worker_env[env.ELASTIC_OTEL_WORKER_PYTHONPATH] = base
        worker_env[env.ELASTIC_OTEL_WORKER_REPORTS] = "1"


def add_trace_context(agent: Any, envs: dict[int, dict[str, str]], handler: OtelHandler) -> None:
    """Give each worker its ``TRACEPARENT`` (its own ``worker`` span, reserved in the trace
    model) and the start times :mod:`elastic_otel.worker.training` reads. The reservation waits
    for the bridge's event thread, at most 0.5 s; without an answer the workers start without
    them."""
    run_id = agent._worker_group.spec.rdzv_handler.get_run_id()
    launch = handler.worker_launch(run_id, sorted(envs))
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
