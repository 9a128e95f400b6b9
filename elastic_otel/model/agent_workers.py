"""An agent's ``worker`` spans: one per global rank, START → SUCCEEDED / FAILED / STOPPED ...

:class:`WorkerSpans` opens a worker's span (with the ids reserved for its ``TRACEPARENT``),
ends it, marks it failed, peer-failed or stopped, links it to the root cause, and ends a group
still running when it is replaced. Outcomes come from the instrumented agent as it sees them,
else from torch's own events alone (``REPLACED``, ``RESTARTED``). Design:
``docs/trace-model.md`` (Worker outcomes when the agent sees them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from elastic_otel.model import collective_timeouts
from elastic_otel.model.failures import describe, error_type
from elastic_otel.model.spans import (
    STATUS_ERROR,
    STATUS_OK,
    STATUS_UNSET,
    LogOut,
    Output,
    SpanAttributes,
    SpanLink,
    SpanRecord,
    SpanRef,
)
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import WorkerState
from elastic_otel.parsing.torch_events import ElasticEvent

_FAILURE_FACTS = frozenset(
    {
        A.RUN_ID,
        A.HOST_NAME,
        A.GLOBAL_RANK,
        A.LOCAL_RANK,
        A.STATE,
        A.FAILURE_KIND,
        A.ERROR_TYPE,
        A.PROCESS_EXIT_CODE,
        A.OOM_KILL,
        A.LEFT_TRAINING,
        A.AGENT_RESTARTS,
    }
)
"""What a ``worker.failure`` span repeats of the worker span it stands for."""
_COLLECTIVE_KEYS = frozenset(
    {
        A.STALLED_COLLECTIVE,
        A.STALLED_COLLECTIVE_NUMBER,
        A.STALLED_PROCESS_GROUP,
        A.STALLED_RANKS,
        A.STALLED_WAITING,
        A.NCCL_TIMEOUT_S,
        A.NCCL_ERROR,
        A.FLIGHT_RECORDER_DUMP,
    }
)
"""What a failed worker's record says of its collective (a watchdog timeout), for its span."""
_SPAN_KEYS = (
    A.RUN_ID,
    A.RANK,
    A.GLOBAL_RANK,
    A.GROUP_RANK,
    A.LOCAL_RANK,
    A.ROLE,
    A.ROLE_RANK,
    A.ROLE_WORLD_SIZE,
    A.GROUP_WORLD_SIZE,
    A.WORKER_ID,
    A.WORKER_PID,
    A.EXIT_CODE,
    A.STATE,
    A.AGENT_RESTARTS,
    A.DURATION_MS,
    A.RDZV_BACKEND,
    A.HOST_NAME,
    A.ENTRY_POINT,
    A.ERROR_CATEGORY,
    A.OBSERVED_BY,
    A.FAILURE_KIND,
    A.OOM_KILL,
    A.LEFT_TRAINING,
)


FAILED_ENDS = frozenset(
    {WorkerState.FAILED, WorkerState.PEER_FAILED, WorkerState.TERMINATED, WorkerState.UNHEALTHY}
)
"""A worker's end that fails its group's attempt: the instrumented agent's ``FAILED`` and
``PEER_FAILED``; torch's final ``FAILED`` (a failure) and ``TERMINATED`` / ``UNHEALTHY`` (the
others of a failed group), which it records only for a run whose result failed."""


@dataclass(frozen=True, slots=True)
class ReservedSpan:
    """A ``worker`` span whose ids were chosen before its START (the worker's ``TRACEPARENT``)."""

    trace_id: int
    span_id: int
    parent_span_id: int


class WorkerGroup(Protocol):
    """What :class:`WorkerSpans` reads and writes of one agent: its workers' spans and what
    it knows of their attempt. :class:`~elastic_otel.model.agent.Agent` satisfies it."""

    run_id: str
    workers: dict[int, SpanRecord]  # running, by global rank
    ended: dict[int, SpanRecord]  # this attempt's workers the agent saw end
    failed: SpanRecord | None  # this attempt's first failed worker
    failed_end: SpanRecord | None  # this attempt's first worker that ended failed, any kind
    restarts: int
    stop_ns: int  # when the workers were stopped for a new rendezvous
    reserved: dict[int, ReservedSpan]  # by local rank

    def new_attempt(self) -> None:
        """Forget the ended and failed workers of the attempt before."""


class RoundContext(Protocol):
    """What the worker spans ask the rendezvous side (a part of
    :class:`~elastic_otel.model.agent.RoundView`)."""

    def round_context(self, run_id: str) -> SpanRef | None:
        """The round's trace and the node's join span in it, when the node's spans are in a
        trace of their own (a large round); ``None`` otherwise."""


class WorkerSpans:
    """The steps of the worker spans, each applied to the :class:`WorkerGroup` it is given."""

    def __init__(self, rounds: RoundContext, event_limit: int) -> None:
        self._rounds = rounds
        self.event_limit = event_limit

    def start(self, group: WorkerGroup, ev: ElasticEvent, parent: SpanRef, out: Output) -> None:
        """A worker's START: ends the group it replaces, if any, then opens its span."""
        t = ev.time_ns
        restarts = ev.agent_restarts or 0
        if restarts > group.restarts:
            self.end_all(
                group,
                group.stop_ns or t,
                out,
                WorkerState.REPLACED,
                f"worker group restarted after a failure (restart {restarts})",
                error=True,
            )
            group.new_attempt()
        elif ev.global_rank is not None and ev.global_rank in group.workers:
            self.end_all(
                group,
                group.stop_ns or t,
                out,
                WorkerState.RESTARTED,
                "worker group restarted for a membership change",
            )
            group.new_attempt()
        elif ev.global_rank is not None and ev.global_rank in group.ended:
            group.new_attempt()  # the agent stopped them itself, then started them again
        group.restarts = max(group.restarts, restarts)
        group.stop_ns = 0
        local_rank = ev.attributes.get(A.LOCAL_RANK)
        reserved = group.reserved.pop(local_rank, None) if isinstance(local_rank, int) else None
        if reserved is not None:  # the worker was told these ids (TRACEPARENT)
            parent = SpanRef(reserved.trace_id, reserved.parent_span_id)
        span = agent_span(A.SPAN_WORKER, t, ev, parent, self.event_limit)
        if reserved is not None:
            span.span_id = reserved.span_id
        key = ev.global_rank if ev.global_rank is not None else -1 - len(group.workers)
        group.workers[key] = span
        out.log(ev, span)

    def about_worker(
        self, group: WorkerGroup, ev: ElasticEvent, parent: SpanRef, out: Output
    ) -> None:
        """A record about one worker (its stacks, its NCCL timing decision): a log record on its
        span (open, or just ended by the stop the stacks were taken before); stacks' frames as
        its body."""
        rank = ev.global_rank
        span = group.workers.get(rank) if rank is not None else None
        if span is None and rank is not None:
            span = group.ended.get(rank)
        attributes = dict(ev.attributes)
        stacks = attributes.pop(A.STACKS, None)
        body = stacks if isinstance(stacks, str) and stacks else ev.body
        record = replace(ev, body=body, attributes=attributes)
        if span is not None:
            out.log(record, span)
        else:
            out.logs.append(LogOut(record, parent.trace_id, parent.span_id))

    def end(self, group: WorkerGroup, ev: ElasticEvent, parent: SpanRef, out: Output) -> None:
        """A worker's outcome: ends its span (or, already ended, adds a log record to it)."""
        t = ev.time_ns
        rank = ev.global_rank
        span = group.workers.pop(rank, None) if rank is not None else None
        if span is None and rank is not None and rank in group.ended:
            ended = group.ended[rank]
            out.log(ev, ended)  # torch's late word on an outcome already exported
            if ev.state in FAILED_ENDS and group.failed_end is None:
                group.failed_end = ended
            return
        if span is None:  # its START was never seen (out of order, or state evicted)
            span = agent_span(A.SPAN_WORKER, t, ev, parent, self.event_limit)
            span.attributes = {A.START_UNKNOWN: True}
        span.attributes.update(agent_attributes(ev))
        code = ev.attributes.get(A.EXIT_CODE)
        if code is not None and ev.state != WorkerState.SUCCEEDED:
            span.attributes[A.PROCESS_EXIT_CODE] = code
        if ev.state == WorkerState.FAILED:
            _failed(span, ev, code)
            status = STATUS_ERROR
            if group.failed is None:
                group.failed = span
            self._failure_in_round(group, span, t, out)
        elif ev.state == WorkerState.PEER_FAILED:
            _peer_failed(span, ev, group.failed)
            status = STATUS_UNSET
        elif ev.state == WorkerState.STOPPED:
            _stopped_by_agent(span, group.failed)
            status = STATUS_UNSET
        else:
            status = STATUS_OK if ev.state == WorkerState.SUCCEEDED else STATUS_UNSET
        out.spans.append(span.end(t, status))
        out.log(ev, span)
        if rank is not None:
            group.ended[rank] = span
        if ev.state in FAILED_ENDS and group.failed_end is None:
            group.failed_end = span

    def end_all(
        self,
        group: WorkerGroup,
        t: int,
        out: Output,
        state: WorkerState,
        reason: str,
        error: bool = False,
        link_to: SpanRecord | None = None,
    ) -> None:
        """End the workers still running as ``state`` (``STOPPED``: linked to ``link_to``)."""
        for rank, span in group.workers.items():
            span.attributes[A.STATE] = state.value  # exported: the plain text
            if error:
                span.set_error(reason)
            if state is WorkerState.STOPPED:
                _stopped_by_agent(span, link_to)
            out.spans.append(span.end(t, STATUS_UNSET, reason))
            if rank >= 0:
                group.ended[rank] = span
        group.workers.clear()

    def _failure_in_round(
        self, group: WorkerGroup, worker: SpanRecord, t: int, out: Output
    ) -> None:
        """In a round with a trace per node, a root cause also shows in the round's trace: a
        ``worker.failure`` span under the node's join span, linked to the ``worker`` span."""
        round_ref = self._rounds.round_context(group.run_id)
        if round_ref is None or round_ref.trace_id == worker.trace_id:
            return
        attributes = {k: v for k, v in worker.attributes.items() if k in _FAILURE_FACTS}
        span = SpanRecord(
            A.SPAN_WORKER_FAILURE,
            worker.start_ns,
            attributes,
            trace_id=round_ref.trace_id,
            parent_span_id=round_ref.span_id,
            event_limit=self.event_limit,
        )
        span.links.append(failure_link(worker))
        span.status_message = worker.status_message
        out.spans.append(span.end(t, STATUS_ERROR))


def _failed(span: SpanRecord, ev: ElasticEvent, code: object) -> None:
    """A worker that failed on its own (a root cause, or one torch reported without the
    instrumentation's classification): ERROR, ``error.type``, what killed it (a collective
    timeout: which collective, :mod:`elastic_otel.model.collective_timeouts`)."""
    span.record_error(ev)
    if ev.attributes.get(A.LEFT_TRAINING) is True:  # left the job first: no exception
        span.attributes[A.ERROR_TYPE] = A.ERROR_TYPE_LEFT_TRAINING
        span.status_message = str(ev.attributes.get(A.END_REASON) or "")
        return
    err = ev.error
    span.attributes.update(_collective_facts(ev))
    collective = collective_timeouts.describe(ev.attributes)
    span.attributes[A.ERROR_TYPE] = collective_timeouts.error_type(ev.attributes) or error_type(
        code, err.type if err is not None else None
    )
    exception = f"{err.type}: {err.message}" if err and err.type else (err.message if err else "")
    oom = ev.attributes.get(A.OOM_KILL) is True
    if collective:
        span.status_message = collective
    elif code is not None or exception:
        span.status_message = describe(code, exception, oom)


def _peer_failed(span: SpanRecord, ev: ElasticEvent, failed: SpanRecord | None) -> None:
    """A victim: its collective failed because a peer died (or timed out waiting for one that
    never entered it). Not an error of its own."""
    span.attributes.update(_collective_facts(ev))
    first_line = (ev.error.message.strip().splitlines() or [""])[0] if ev.error else ""
    first_line = collective_timeouts.describe(ev.attributes) or first_line
    reason = "its collective failed after a peer died"
    if ev.attributes.get(A.NCCL_TIMEOUT_S) is not None:
        reason = "its collective timed out waiting for a peer"
    span.attributes[A.END_REASON] = f"{reason}: {first_line[:200]}" if first_line else reason
    if failed is not None:
        span.links.append(failure_link(failed))


def _collective_facts(ev: ElasticEvent) -> SpanAttributes:
    """The collective and NCCL error a failed worker's record names, for its span."""
    return {k: v for k, v in ev.attributes.items() if k in _COLLECTIVE_KEYS}


def _stopped_by_agent(span: SpanRecord, failed: SpanRecord | None) -> None:
    """Mark a worker the agent stopped; link it to the failure that made the agent stop it."""
    if failed is None:
        span.attributes[A.END_REASON] = "stopped by the agent"
        return
    rank = failed.attributes.get(A.GLOBAL_RANK)
    span.attributes[A.END_REASON] = f"stopped by the agent after global rank {rank} failed"
    span.links.append(failure_link(failed))


def failure_link(failed: SpanRecord) -> SpanLink:
    """A link to a failed worker's span, saying what it is."""
    attrs: SpanAttributes = {A.STATE: WorkerState.FAILED.value}
    rank = failed.attributes.get(A.GLOBAL_RANK)
    if rank is not None:
        attrs[A.GLOBAL_RANK] = rank
    return SpanLink(failed.trace_id, failed.span_id, attrs)


def agent_span(
    name: str, start_ns: int, ev: ElasticEvent, parent: SpanRef, event_limit: int
) -> SpanRecord:
    """A span of an agent or one of its workers, opened by ``ev`` under ``parent``."""
    return SpanRecord(
        name,
        start_ns,
        agent_attributes(ev),
        trace_id=parent.trace_id,
        parent_span_id=parent.span_id,
        event_limit=event_limit,
    )


def agent_attributes(ev: ElasticEvent) -> SpanAttributes:
    """The event attributes that belong on agent and worker spans."""
    src = ev.attributes
    return {k: src[k] for k in _SPAN_KEYS if k in src}
