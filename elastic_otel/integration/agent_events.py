"""The records the instrumented agent reports: worker outcomes, agent steps, stacks and stalls,
stragglers, goodput summaries.

Each is the agent's own event, built by its ``_construct_event`` (the shape of torch's final
events: run id, ranks, host, restarts), named and dated here, with the facts the
instrumentation adds beside it, typed (:class:`~elastic_otel.parsing.records.AgentRecord`). The
records go to the bridge handler only, never through torch's ``events.record``: torch's other
destinations see what they always saw (docs/architecture.md, "The agent instrumentation's
records"). What to say is decided in :mod:`elastic_otel.model.worker_outcomes`; when to say it
in :mod:`elastic_otel.integration.agent_instrumentation`. A failure here is one debug line,
never the agent's.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
import time
from typing import Any, cast

from elastic_otel.bridge.handler import OtelHandler
from elastic_otel.integration.training_watch import FlightRecorderDumps, WatchedWorker
from elastic_otel.integration.worker_output import WorkerOutput, last_output
from elastic_otel.model.failures import classify
from elastic_otel.model.goodput import Summary
from elastic_otel.model.slow_nodes import SlowNode, slow_node_attributes
from elastic_otel.model.slowdowns import Slowdown, slowdown_attributes
from elastic_otel.model.stalls import (
    STALL_EVENT_NAME,
    STALL_STATE,
    SilentNode,
    TrainingStall,
    silence_attributes,
    silent_nodes,
    stall_attributes,
    timing_attributes,
)
from elastic_otel.model.stragglers import (
    STRAGGLER_EVENT_NAME,
    STRAGGLER_STATE,
    Straggler,
    straggler_attributes,
)
from elastic_otel.model.worker_outcomes import (
    KIND_STATES,
    OBSERVED_BY_MONITOR,
    Ended,
    outcome_attributes,
    worker_error,
)
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import (
    AGENT_STEP_PREFIX,
    NCCL_TIMING_EVENT,
    NCCL_TIMING_STATE,
    NVRX_EVENT_HANDLERS,
    STACKS_STATE,
    WORKER_STACKS_EVENT,
    WorkerState,
)
from elastic_otel.parsing.collectives import NcclTiming
from elastic_otel.parsing.records import AgentRecord, AttrValue, ErrorInfo, error_from_message
from elastic_otel.parsing.worker_reports import main_thread_frame

_logger = logging.getLogger("elastic_otel")

RecordAttributes = dict[str, AttrValue | None]


def reports_to_handler(agent: Any, handler: OtelHandler) -> bool:
    """Whether this agent records its events to ``handler`` (``--event-log-handler otel``):
    what it observes goes where its own events go, or nowhere. ``ft_launcher``'s agent has no
    such setting: its events go to its own copy's ``null`` destination."""
    destination = getattr(agent._worker_group.spec, "event_log_handler", None)
    if destination is None:
        copy = sys.modules.get(NVRX_EVENT_HANDLERS)
        registry = getattr(copy, "_log_handlers", None)
        return isinstance(registry, dict) and registry.get("null") is handler
    from torch.distributed.elastic.events import handlers

    return handlers._log_handlers.get(destination) is handler


NESTED_FIELDS = ("exit_code", "worker_pid")
"""What torch 2.4 on keeps in an event's nested metadata, one-element lists, per worker."""


def construct(agent: Any, state: str, source: Any, worker: Any, **fields: Any) -> Any:
    """The agent's own ``_construct_event``; what an older one takes no argument for
    (``ft_launcher``'s copy of torch 2.3: ``duration_ms``, ``exit_code``, ``worker_pid``) is
    added to the event as torch 2.4 on lays it out."""
    accepted = inspect.signature(agent._construct_event).parameters
    kwargs = {k: v for k, v in fields.items() if k in accepted}
    event = agent._construct_event(state=state, source=source, worker=worker, **kwargs)
    missing = {k: v for k, v in fields.items() if k not in accepted and v is not None}
    if "duration_ms" in missing:
        event.metadata["duration_ms"] = missing["duration_ms"]
    nested = {k: (missing[k],) for k in NESTED_FIELDS if k in missing and worker is not None}
    if nested:
        md = json.loads(event.metadata.get("metadata") or "{}")
        event.metadata["metadata"] = json.dumps({**md, **nested})
    return event


def send(
    handler: OtelHandler,
    event: Any,
    timestamp_ms: int,
    attributes: RecordAttributes,
    error: ErrorInfo | None = None,
) -> None:
    event.timestamp = timestamp_ms
    handler.info(AgentRecord(event, attributes, error))


def report_outcomes(
    agent: Any,
    handler: OtelHandler,
    worker_group: Any,
    state: str,
    failures: dict[int, Any],
    returned: dict[int, Any],
    ended: Ended,
    root_rank: int | None,
    oom: bool,
    now_ms: float,
    output: WorkerOutput,
    collective: dict[int, RecordAttributes] | None = None,
) -> None:
    """One record per worker that failed (its kind's state) or, when the group succeeded,
    returned; the root cause first: the workers that died of it link to its span. A failed
    worker's record adds what ``collective`` says of it (its NCCL watchdog's collective)."""
    from torch.distributed.elastic.events import EventSource

    workers = sorted(worker_group.workers, key=lambda w: w.global_rank != root_rank)
    for worker in workers:
        attributes: RecordAttributes = {}
        error: ErrorInfo | None = None
        if worker.global_rank in ended:
            end, report = ended[worker.global_rank]
            kind = classify(end)
            # None: a worker torch counted as a success that the bridge found to have left the
            # job first (model/worker_outcomes.early_exits)
            failure = failures.get(worker.global_rank)
            exit_code = failure.exitcode if failure is not None else end.exit_code
            pcontext = getattr(agent, "_pcontext", None)
            words, fault = last_output(pcontext, worker.local_rank, output)
            raw_error = None
            if kind != A.KIND_STOPPED:
                error = worker_error(report, exit_code, fault)
                data = getattr(failure, "error_file_data", None)
                # torch's own error file, as torch's final events carry it
                raw_error = json.dumps(data) if error is None and data else None
            pid = failure.pid if failure is not None else _pid(pcontext, worker.local_rank)
            event = construct(
                agent,
                KIND_STATES[kind].value,
                EventSource.WORKER,
                worker,
                raw_error=raw_error,
                exit_code=exit_code,
                worker_pid=pid,
            )
            attributes = outcome_attributes(end, kind, root_rank, words, oom)
            attributes.update((collective or {}).get(worker.global_rank, {}))
            timestamp_ms = end.time_ns // 1_000_000 or int(now_ms)
        elif state == WorkerState.SUCCEEDED and worker.global_rank in returned:
            event = construct(agent, WorkerState.SUCCEEDED.value, EventSource.WORKER, worker)
            timestamp_ms = int(now_ms)
        else:
            continue  # still running: it ends when the agent stops it (stop_workers)
        attributes[A.OBSERVED_BY] = OBSERVED_BY_MONITOR
        send(handler, event, timestamp_ms, attributes, error)


def _pid(pcontext: Any, local_rank: int) -> int | None:
    try:
        pid = pcontext.pids().get(local_rank)
    except Exception:
        return None
    return pid if isinstance(pid, int) else None


def report_step(
    agent: Any,
    handler: OtelHandler,
    step: str,
    phase: str,
    duration_ms: float | None = None,
    error: BaseException | None = None,
    extra: RecordAttributes | None = None,
) -> None:
    """An ``elastic_otel.agent.<step>`` record: the step's start or end (with its duration and
    the exception it raised, if any)."""
    try:
        if not reports_to_handler(agent, handler):
            return
        from torch.distributed.elastic.events import EventSource

        event = construct(agent, step.upper(), EventSource.AGENT, None, duration_ms=duration_ms)
        event.name = AGENT_STEP_PREFIX + step
        attributes: RecordAttributes = {A.PHASE: phase, **(extra or {})}
        failure = step_error(error) if error is not None else None
        send(handler, event, int(time.time() * 1000), attributes, failure)
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: agent step %s not reported", step, exc_info=True)


def report_duration(agent: Any, handler: OtelHandler, state: str, duration_ms: float) -> None:
    """An agent event with its duration, as torch 2.4 on records one (``record_duration``)."""
    try:
        if not reports_to_handler(agent, handler):
            return
        from torch.distributed.elastic.events import EventSource

        event = construct(agent, state, EventSource.AGENT, None, duration_ms=duration_ms)
        send(handler, event, int(time.time() * 1000), {})
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: agent %s not reported", state, exc_info=True)


def report_worker_starts(agent: Any, handler: OtelHandler, worker_group: Any) -> None:
    """Each worker's ``START``, as torch 2.4 on records it once its workers started, for an
    agent that records none itself (``ft_launcher``'s copy of torch 2.3)."""
    try:
        if not reports_to_handler(agent, handler):
            return
        from torch.distributed.elastic.events import EventSource

        now_ms = int(time.time() * 1000)
        for worker in worker_group.workers:
            event = construct(agent, WorkerState.START.value, EventSource.WORKER, worker)
            send(handler, event, now_ms, {})
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: worker starts not reported", exc_info=True)


def step_error(error: BaseException) -> ErrorInfo:
    """A step's exception as a traceback's last line names it: ``module.Qualname: message``."""
    text = f"{type(error).__module__}.{type(error).__qualname__}: {error}"
    return error_from_message(text.strip().rsplit("\n", 1)[-1].strip(), text)


def report_goodput(agent: Any, handler: OtelHandler, summary: Summary) -> None:
    """The attempt's goodput summary as a ``torchelastic.goodput`` record on the node's round."""
    try:
        from torch.distributed.elastic.events import EventSource

        event = construct(agent, A.GOODPUT_STATE, EventSource.AGENT, None)
        event.name = A.GOODPUT_EVENT_NAME
        attributes = cast(RecordAttributes, summary.attributes())  # numbers and flags
        send(handler, event, int(time.time() * 1000), attributes)
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: goodput summary not reported", exc_info=True)


def report_straggler(agent: Any, handler: OtelHandler, straggler: Straggler) -> None:
    """A straggler as a WARN ``torchelastic.straggler`` record on the node's round."""
    try:
        from torch.distributed.elastic.events import EventSource

        event = construct(agent, STRAGGLER_STATE, EventSource.AGENT, None)
        event.name = STRAGGLER_EVENT_NAME
        attributes: RecordAttributes = {**straggler_attributes(straggler)}
        send(handler, event, int(time.time() * 1000), attributes)
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: straggler not reported", exc_info=True)


def report_slow_node(agent: Any, handler: OtelHandler, slow: SlowNode) -> None:
    """A slow node as a WARN ``torchelastic.straggler`` record on the node's round (node 0's,
    which compares the nodes)."""
    try:
        from torch.distributed.elastic.events import EventSource

        event = construct(agent, STRAGGLER_STATE, EventSource.AGENT, None)
        event.name = STRAGGLER_EVENT_NAME
        attributes: RecordAttributes = {**slow_node_attributes(slow)}
        send(handler, event, int(time.time() * 1000), attributes)
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: slow node not reported", exc_info=True)


def report_slowdown(
    agent: Any, handler: OtelHandler, slowdown: Slowdown, evidence: RecordAttributes
) -> None:
    """A slowdown as a WARN ``torchelastic.slowdown`` record on the node's round (INFO once it
    ended), with the node's own link ``evidence`` beside it."""
    try:
        from torch.distributed.elastic.events import EventSource

        state = A.SLOWDOWN_ENDED_STATE if slowdown.ended else A.SLOWDOWN_STATE
        event = construct(agent, state, EventSource.AGENT, None)
        event.name = A.SLOWDOWN_EVENT_NAME
        attributes: RecordAttributes = {**slowdown_attributes(slowdown), **evidence}
        send(handler, event, int(time.time() * 1000), attributes)
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: slowdown not reported", exc_info=True)


def report_link(agent: Any, handler: OtelHandler, attributes: RecordAttributes) -> None:
    """A slow link, node or NIC as a WARN ``torchelastic.link`` record on the node's round
    (node 0's, which compares the nodes)."""
    try:
        from torch.distributed.elastic.events import EventSource

        event = construct(agent, A.LINK_STATE, EventSource.AGENT, None)
        event.name = A.LINK_EVENT_NAME
        send(handler, event, int(time.time() * 1000), dict(attributes))
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: slow link not reported", exc_info=True)


def report_nccl_timing(
    agent: Any, handler: OtelHandler, watched: WatchedWorker, timing: NcclTiming
) -> None:
    """A worker's NCCL timing decision as an INFO record on its ``worker`` span."""
    try:
        from torch.distributed.elastic.events import EventSource

        event = construct(agent, NCCL_TIMING_STATE, EventSource.AGENT, watched.worker)
        event.name = NCCL_TIMING_EVENT
        send(handler, event, int(time.time() * 1000), {**timing_attributes(timing)})
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: NCCL timing decision not reported", exc_info=True)


def report_stacks_and_stall(
    agent: Any,
    handler: OtelHandler,
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
    dump_facts: RecordAttributes = {}
    if dumps is not None:
        dump_facts[A.FLIGHT_RECORDER_DUMP] = dumps.directory
        if dumps.unanswered:
            dump_facts[A.FLIGHT_RECORDER_UNANSWERED] = dumps.unanswered
    for watched, text in stacks:
        frame = main_thread_frame(text) or ""
        frames[watched.global_rank] = frame
        event = construct(agent, STACKS_STATE, EventSource.AGENT, watched.worker)
        event.name = WORKER_STACKS_EVENT
        attributes = {A.STACKS: text, A.STACKS_REASON: reason, A.STACK_FRAME: frame}
        send(handler, event, now_ms, {**attributes, **dump_facts})
    if stall is None:
        return
    event = construct(agent, STALL_STATE, EventSource.AGENT, None)
    event.name = STALL_EVENT_NAME
    facts: RecordAttributes = {**stall_attributes(stall)}
    facts.update(dump_facts)
    if liveness is not None:
        facts.update(silence_attributes(liveness.silent_nodes()))
    first = frames.get(stall.waited_for[0]) if stall.waited_for else stall.remote_frame
    if first:
        facts[A.STACK_FRAME] = first
    send(handler, event, now_ms, facts)


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
