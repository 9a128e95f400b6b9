"""What the nodes of a stalled job tell each other through the round's store, so that every
node's training stall report names the rank the job waits for, not only the node that has it.

Pure decisions: which keys, what a node publishes for its stall, what a value read back means
(garbage or an oversized value reads as nothing) and how it changes the node's report. The
store and its thread are :mod:`elastic_otel.integration.stall_exchange`; the protocol and why
it is bounded: docs/hangs.md ("Every node names the rank").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TypeGuard

from elastic_otel.model.stalls import RankProgress, TrainingStall
from elastic_otel.parsing.collectives import group_key

PREFIX = "elastic_otel/stall/"
"""Every key of the exchange starts so, in the round's store (torch's key prefix names the run
and the round already)."""
MAX_ENTRIES = 16
"""Culprit entries kept per collective: nodes past this many append nothing."""
MAX_ENTRY_BYTES = 512
"""Longest culprit entry (a stack frame that would not fit is cut)."""
MAX_VALUE_BYTES = MAX_ENTRIES * (MAX_ENTRY_BYTES + 1)
"""Longest culprits value read; a longer one is not the exchange's and reads as nothing."""
MAX_GROUPS = 8
"""Process groups whose waiting key a node in no collective reads, at most (its own)."""
MAX_RANKS = 64
"""Global ranks one entry names, at most (a node has a few)."""
_MAX_KEY_PART = 128


@dataclass(frozen=True, slots=True)
class Culprit:
    """One node's entry: its ranks that never issued the collective others wait in (or whose
    GPU has it scheduled), as that node named them."""

    host: str
    pid: int  # the node's agent process id (with the host, how ``elastic-otel timeline`` names it)
    ranks: tuple[int, ...]  # global ranks
    frame: str = ""  # the first rank's innermost frame, "f at file.py:LINE"
    not_reached: tuple[int, ...] = ()  # of ``ranks``: issued it, their GPU has not started it
    left: tuple[int, ...] = ()  # of ``ranks``: left training


@dataclass(frozen=True, slots=True)
class Waiting:
    """What nodes whose ranks wait say: the collective of the group they wait in."""

    number: int
    collective: str


def waiting_key(group: str) -> str:
    """The key of the collective group ``group`` (``backend:name``) waits in."""
    return f"{PREFIX}waiting/{group[:_MAX_KEY_PART]}"


def culprits_key(group: str, number: int) -> str:
    """The key the culprit entries of collective ``number`` of ``group`` are appended to."""
    return f"{PREFIX}culprits/{group[:_MAX_KEY_PART]}/{number}"


def count_key(culprits: str) -> str:
    """The counter that caps the entries of a :func:`culprits_key` at :data:`MAX_ENTRIES`."""
    return culprits + "/count"


def stall_group(stall: TrainingStall) -> str | None:
    """The key of the process group ``stall`` waits in, where the Flight Recorder names it."""
    if stall.group is None or stall.number <= 0:
        return None
    return group_key(stall.group, stall.backend)


def names_local_culprits(stall: TrainingStall) -> bool:
    """Whether this node names the ranks the collective waits for: it publishes them."""
    return stall_group(stall) is not None and bool(stall.waited_for)


def waits_on_other_nodes(stall: TrainingStall) -> bool:
    """Whether every local rank waits inside the collective: the ranks waited for are
    elsewhere; this node publishes what it waits in and reads who is waited for."""
    return stall_group(stall) is not None and bool(stall.waiting) and not stall.waited_for


def in_no_collective(stall: TrainingStall) -> bool:
    """Whether no local rank is in a collective: the job may wait for this node's ranks."""
    return stall.collective is None and not stall.waited_for


def encode_waiting(stall: TrainingStall) -> bytes:
    return json.dumps({"n": stall.number, "c": stall.collective or ""}).encode()


def decode_waiting(value: object) -> Waiting | None:
    """A waiting value read back; ``None`` for anything else."""
    data = _json(value, 256)
    if not isinstance(data, dict):
        return None
    number, collective = data.get("n"), data.get("c")
    if not _int(number) or number <= 0 or not isinstance(collective, str):
        return None
    return Waiting(number, collective[:_MAX_KEY_PART])


def encode_culprit(culprit: Culprit) -> bytes:
    """One entry, one line, at most :data:`MAX_ENTRY_BYTES` (the frame is cut to fit)."""

    def encoded(frame: str) -> bytes:
        data = {
            "h": culprit.host[:_MAX_KEY_PART],
            "p": culprit.pid,
            "r": list(culprit.ranks[:MAX_RANKS]),
            "f": frame,
            "s": list(culprit.not_reached[:MAX_RANKS]),
            "l": list(culprit.left[:MAX_RANKS]),
        }
        return json.dumps(data, separators=(",", ":")).encode() + b"\n"

    value = encoded(culprit.frame)
    if len(value) > MAX_ENTRY_BYTES:
        over = len(value) - MAX_ENTRY_BYTES
        value = encoded(culprit.frame[: max(0, len(culprit.frame) - over)])
    return value if len(value) <= MAX_ENTRY_BYTES else encoded("")


def decode_culprits(value: object) -> list[Culprit]:
    """The entries of a culprits value, in order; lines that are not an entry are skipped."""
    if not isinstance(value, bytes) or len(value) > MAX_VALUE_BYTES:
        return []
    out = []
    for line in value.split(b"\n")[:MAX_ENTRIES]:
        data = _json(line, MAX_ENTRY_BYTES)
        if not isinstance(data, dict):
            continue
        host, pid, frame = data.get("h"), data.get("p"), data.get("f", "")
        ranks, late = _ranks(data.get("r")), _ranks(data.get("s"))
        left = _ranks(data.get("l", []))
        if not isinstance(host, str) or not _int(pid) or not ranks or not isinstance(frame, str):
            continue
        out.append(
            Culprit(
                host,
                pid,
                ranks,
                frame,
                tuple(r for r in late if r in ranks),
                tuple(r for r in left if r in ranks),
            )
        )
    return out


def with_remote_culprits(
    stall: TrainingStall, culprits: list[Culprit], local: set[int]
) -> TrainingStall:
    """``stall`` (every local rank waiting) naming the ranks other nodes said the collective
    waits for; entries naming local ranks are ignored (this node knows its own)."""
    remote = [c for c in culprits if not set(c.ranks) & local]
    if not remote or stall.waited_for:
        return stall
    ranks = tuple(sorted({r for c in remote for r in c.ranks}))
    late = tuple(sorted({r for c in remote for r in c.not_reached}))
    left = tuple(sorted({r for c in remote for r in c.left}))
    nodes = list(dict.fromkeys((c.host, c.pid) for c in remote))
    return dataclasses.replace(
        stall,
        remote=ranks,
        remote_hosts=tuple(h for h, _ in nodes),
        remote_pids=tuple(p for _, p in nodes),
        remote_frame=remote[0].frame,
        not_reached=tuple(sorted(set(stall.not_reached) | set(late))),
        left=tuple(sorted(set(stall.left) | set(left))),
    )


def with_waiting_peers(
    stall: TrainingStall, ranks: list[RankProgress], group: str, waiting: Waiting
) -> TrainingStall:
    """``stall`` (no local rank in a collective) naming the local ranks that never issued
    collective ``waiting.number`` of ``group``, which ranks on other nodes wait in; unchanged
    when every local rank issued it (or none has the group)."""
    behind = [
        r.global_rank
        for r in ranks
        if (issued := dict(r.issued).get(group)) is not None and issued < waiting.number
    ]
    if not behind or not in_no_collective(stall):
        return stall
    backend, _, name = group.rpartition(":")
    return dataclasses.replace(
        stall,
        waited_for=tuple(sorted(behind)),
        left=tuple(sorted(r.global_rank for r in ranks if r.left and r.global_rank in behind)),
        collective=waiting.collective or "collective",
        number=waiting.number,
        group=name,
        backend=backend,
    )


def own_groups(ranks: list[RankProgress]) -> list[str]:
    """The process groups the local ranks have, the default group's first: whose waiting keys a
    node in no collective reads (at most :data:`MAX_GROUPS`)."""
    keys = list(dict.fromkeys(g for r in ranks for g, _ in r.issued))
    keys.sort(key=lambda g: g.rpartition(":")[2] != "0")
    return keys[:MAX_GROUPS]


def _json(value: object, limit: int) -> object:
    if not isinstance(value, bytes) or not value or len(value) > limit:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return None


def _int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _ranks(value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_RANKS:
        return ()
    if not all(_int(r) and r >= 0 for r in value):
        return ()
    return tuple(sorted(set(value)))
