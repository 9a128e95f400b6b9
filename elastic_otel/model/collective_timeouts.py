"""Collective timeouts and NCCL errors in a failure's story: who waited, who never came.

A rank whose NCCL watchdog timed out in collective #n waited for a rank that never entered it:
from the agent's last collectives readings, the node's ranks whose last issued collective in that
process group is below n are the root cause (even stopped by their agent), the ranks that timed
out their victims; with no rank to blame, the timeout is a root cause of its own. An NCCL error
that means a peer died makes a victim. Pure: no torch, no OpenTelemetry. Design:
``docs/trace-model.md`` (Root cause or victim) and ``docs/hangs.md`` (torch's NCCL watchdog).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from elastic_otel.model.failures import is_peer_failure
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import SCHEDULED, CollectiveProgress
from elastic_otel.parsing.nccl_errors import COMMUNICATOR_ABORTED, NcclFailure, WatchdogTimeout
from elastic_otel.parsing.records import AttrValue

PEER_ERRORS = frozenset({"ncclRemoteError", COMMUNICATOR_ABORTED})
"""NCCL errors that mean a peer died (or the network between them failed)."""
ERROR_TYPE_TIMEOUT = "collective_timeout"
"""``error.type`` of a root cause in a collective timeout: the rank that timed out with nobody
else to blame, or the rank that never entered the collective."""
WATCHDOG = "NCCL watchdog"


@dataclass(frozen=True, slots=True)
class CollectiveFacts:
    """What the NCCL watchdog and the collectives readings say of one failed worker."""

    kind: str | None  # root_cause / peer_failure, decided here; None: its own end decides
    op: str | None = None  # the collective timed out in (or never entered)
    number: int | None = None
    group: str | None = None  # torch's group name; None: not known
    timeout_s: float | None = None  # its own watchdog's timeout (None: it never entered)
    waited_for: tuple[int, ...] = ()  # a rank that timed out: the node's ranks never entered
    waiting: tuple[int, ...] = ()  # a rank that never entered: the node's ranks timed out
    elsewhere: bool = False  # the group has members on other nodes
    error: str | None = None  # the NCCL error named (NCCL_RESULTS, communicator_aborted)
    not_reached: tuple[int, ...] = ()  # ranks that timed out with the GPU never in it (timing)


def collective_facts(
    found: Mapping[int, NcclFailure],
    readings: Mapping[int, CollectiveProgress],
    local_ranks: Iterable[int],
) -> dict[int, CollectiveFacts]:
    """Per global rank, the facts ``found`` in the failed workers' texts (their watchdog's
    timeout, their NCCL error) give, with the node's last collectives ``readings``: the ranks
    that timed out, the ranks that never entered that collective, and how each ended."""
    local = set(local_ranks) | set(readings)
    facts: dict[int, CollectiveFacts] = {}
    waits: dict[tuple[str | None, int, str], list[tuple[int, WatchdogTimeout]]] = {}
    for rank, failure in found.items():
        timeout = failure.timeout
        if timeout is None:
            peer = failure.error in PEER_ERRORS and _aborted_by_peer(failure)
            kind = A.KIND_PEER_FAILURE if peer else None
            facts[rank] = CollectiveFacts(kind, error=failure.error)
            continue
        group = timeout.group or _open_group(readings.get(rank), timeout.number)
        waits.setdefault((group, timeout.number, timeout.op), []).append((rank, timeout))
    blamed: dict[int, CollectiveFacts] = {}
    for (group, number, op), waiters in sorted(waits.items(), key=lambda kv: kv[0][1]):
        ranks = {r for r, _ in waiters}
        members = _members(group, ranks, readings)
        late = _never_entered(group, number, ranks, members, readings)
        unstarted = _not_started(group, number, ranks, readings)
        elsewhere = bool(members) and not members <= local
        for rank, timeout in waiters:
            if rank in unstarted:  # its own GPU never reached it: what the others waited for
                kind = A.KIND_ROOT_CAUSE
            elif late or unstarted or elsewhere:
                kind = A.KIND_PEER_FAILURE
            else:
                kind = A.KIND_ROOT_CAUSE
            facts[rank] = CollectiveFacts(
                kind,
                op,
                number,
                group,
                timeout.timeout_ms / 1000.0,
                waited_for=tuple(sorted(late | (unstarted - {rank}))),
                elsewhere=elsewhere,
                not_reached=tuple(sorted(unstarted)),
                error=found[rank].error,
            )
        waiting = tuple(sorted(ranks))
        for rank in late:
            blamed.setdefault(
                rank, CollectiveFacts(A.KIND_ROOT_CAUSE, op, number, group, waiting=waiting)
            )
    facts.update(blamed)  # never entered: the root cause, whatever else it said
    return facts


def collective_attributes(facts: CollectiveFacts) -> dict[str, AttrValue]:
    """What a failed worker's record says of its collective and NCCL error."""
    attrs: dict[str, AttrValue] = {}
    if facts.op is not None and facts.number is not None:
        attrs[A.STALLED_COLLECTIVE] = facts.op
        attrs[A.STALLED_COLLECTIVE_NUMBER] = facts.number
        if facts.group is not None:
            attrs[A.STALLED_PROCESS_GROUP] = facts.group
    if facts.timeout_s is not None:
        attrs[A.NCCL_TIMEOUT_S] = facts.timeout_s
    if facts.waited_for:
        attrs[A.STALLED_RANKS] = facts.waited_for
    if facts.waiting:
        attrs[A.STALLED_WAITING] = facts.waiting
    if facts.error is not None:
        attrs[A.NCCL_ERROR] = facts.error
    if facts.not_reached:
        attrs[A.STALLED_NOT_REACHED] = facts.not_reached
    return attrs


def describe(attributes: Mapping[str, object]) -> str | None:
    """A failed worker's story from its record's attributes: "timed out after 600 s in
    all_reduce #11 of process group 0 (NCCL watchdog), waiting for global rank 3", "never
    entered all_reduce #11 of process group 0, in which global ranks 0, 1 timed out (NCCL
    watchdog)", "NCCL error ncclRemoteError"; ``None`` when the record says none of it."""
    op = attributes.get(A.STALLED_COLLECTIVE)
    number = attributes.get(A.STALLED_COLLECTIVE_NUMBER)
    error = attributes.get(A.NCCL_ERROR)
    timeout = attributes.get(A.NCCL_TIMEOUT_S)
    if not isinstance(op, str) or not isinstance(number, int) or isinstance(number, bool):
        return f"NCCL error {error}" if isinstance(error, str) and error else None
    group = attributes.get(A.STALLED_PROCESS_GROUP)
    where = f"{op} #{number}" + (f" of process group {group}" if group is not None else "")
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        text = f"timed out after {timeout:g} s in {where} ({WATCHDOG})"
        late = _ranks(attributes.get(A.STALLED_RANKS))
        unstarted = _ranks(attributes.get(A.STALLED_NOT_REACHED))
        if late:
            text += f", waiting for {_global_ranks(late)}"
            if set(late) <= set(unstarted):
                text += f", whose GPU{'s' if len(late) > 1 else ''} never started it"
        elif unstarted:
            text += ": its GPU never started it (scheduled: its own compute is slow or stuck)"
        return text
    waiting = _ranks(attributes.get(A.STALLED_WAITING))
    timed_out = f", in which {_global_ranks(waiting)} timed out" if waiting else ""
    return f"never entered {where}{timed_out} ({WATCHDOG})"


def error_type(attributes: Mapping[str, object]) -> str | None:
    """``error.type`` of a root cause in a collective timeout; ``None`` for any other."""
    if attributes.get(A.STALLED_COLLECTIVE) is None:
        return None
    timed_out = attributes.get(A.NCCL_TIMEOUT_S) is not None
    return ERROR_TYPE_TIMEOUT if timed_out or attributes.get(A.STALLED_WAITING) else None


def _open_group(reading: CollectiveProgress | None, number: int) -> str | None:
    """The one process group of the worker's last reading that had issued collective
    ``number`` and not completed it (the watchdog's line did not name its group)."""
    if reading is None:
        return None
    open_groups = [g.name for g in reading.groups if g.completed < number <= g.issued]
    return open_groups[0] if len(open_groups) == 1 else None


def _members(
    group: str | None, ranks: set[int], readings: Mapping[int, CollectiveProgress]
) -> set[int]:
    """The group's members (global ranks), as the readings of the ranks that timed out say."""
    if group is None:
        return set()
    for rank in sorted(ranks):
        reading = readings.get(rank)
        found = reading.group(group) if reading is not None else None
        if found is not None and found.members:
            return set(found.members)
    return set()


def _never_entered(
    group: str | None,
    number: int,
    ranks: set[int],
    members: set[int],
    readings: Mapping[int, CollectiveProgress],
) -> set[int]:
    """The node's ranks of ``group`` whose last reading had not issued collective ``number``."""
    if group is None:
        return set()
    late = set()
    for rank, reading in readings.items():
        if rank in ranks or (members and rank not in members):
            continue
        found = reading.group(group)
        if found is not None and found.issued < number:
            late.add(rank)
    return late


def _not_started(
    group: str | None, number: int, ranks: set[int], readings: Mapping[int, CollectiveProgress]
) -> set[int]:
    """Of the ranks that timed out in collective ``number``, those whose GPU never started it
    (``scheduled``, where the record tracks starts: NCCL with timing): their own compute was
    slow or stuck, and the ranks whose GPU started it waited inside it for them."""
    if group is None:
        return set()
    states = {}
    for rank in ranks:
        reading = readings.get(rank)
        found = reading.group(group) if reading is not None else None
        state = found.state_of(number) if found is not None else None
        if state is not None:
            states[rank] = state
    return {rank for rank, state in states.items() if state == SCHEDULED}


def _aborted_by_peer(failure: NcclFailure) -> bool:
    """An aborted communicator is a peer's doing unless the reason torch gives for the abort is
    an error of the worker's own (a CUDA error)."""
    if failure.error != COMMUNICATOR_ABORTED or not failure.abort_reason:
        return True
    return is_peer_failure(None, failure.abort_reason)


def _ranks(value: object) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]  # one rank, as a serialized event's one-element list is read
    if isinstance(value, (list, tuple)):
        return [r for r in value if isinstance(r, int) and not isinstance(r, bool)]
    return []


def _global_ranks(ranks: list[int]) -> str:
    return ("global rank " if len(ranks) == 1 else "global ranks ") + ", ".join(map(str, ranks))
