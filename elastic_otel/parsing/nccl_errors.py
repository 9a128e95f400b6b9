"""torch's NCCL watchdog and NCCL's errors, read from what a worker said before it died.

A collective timeout ends a worker in C++ (``std::terminate``: SIGABRT), so its only trace is
the watchdog's text on the worker's stderr, or in an exception's message where Python saw it.
:func:`read_nccl_failure` finds the collective that timed out (its op, sequence number, sizes,
timeout, process group) and the NCCL error named, in the formats of torch's
``ProcessGroupNCCL.cpp`` and ``NCCLUtils.cpp``. Pure: a malformed text is just not matched.
Design: ``docs/hangs.md`` (torch's NCCL watchdog).
"""

from __future__ import annotations

import os
import re
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

MAX_TAIL_BYTES = 64 * 1024
"""Bytes read of the end of a worker's stderr: the watchdog's lines, torch's C++ stack after
them (about twenty frames) and a ``faulthandler`` dump fit in it."""

OP_NAMES = {
    "BROADCAST": "broadcast",
    "ALLREDUCE": "all_reduce",
    "ALLREDUCE_COALESCED": "all_reduce_coalesced",
    "REDUCE": "reduce",
    "ALLGATHER": "all_gather",
    "_ALLGATHER_BASE": "_allgather_base",
    "ALLGATHER_COALESCED": "all_gather_coalesced",
    "GATHER": "gather",
    "SCATTER": "scatter",
    "REDUCE_SCATTER": "reduce_scatter",
    "ALLTOALL_BASE": "all_to_all_base",
    "ALLTOALL": "all_to_all",
    "SEND": "send",
    "RECV": "recv",
    "RECVANYSOURCE": "recv_any_source",
    "BARRIER": "barrier",
    "_REDUCE_SCATTER_BASE": "_reduce_scatter_base",
    "COALESCED": "coalesced",
    "_ALLREDUCE_SPARSE": "_allreduce_sparse",
    "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter_tensor_coalesced",
    "ALLGATHER_INTO_TENSOR_COALESCED": "all_gather_into_tensor_coalesced",
}
"""torch's ``OpType`` names (``Work.hpp``) → the op as the bridge names it elsewhere (the
Flight Recorder's profiling name without ``nccl:``); another name is lower-cased."""

COMMUNICATOR_ABORTED = "communicator_aborted"
"""The NCCL error of a worker whose communicator had been aborted (after an error or a timeout
seen by its watchdog, or another rank's abort)."""

NCCL_RESULTS = (
    "ncclRemoteError",
    "ncclSystemError",
    "ncclInternalError",
    "ncclUnhandledCudaError",
    "ncclInvalidArgument",
    "ncclInvalidUsage",
)
"""NCCL's result codes as torch names them (``getNcclErrorDetailStr``)."""

# ncclGetErrorString's texts, after torch's "NCCL error: " / "NCCL error in: <file>:<line>, "
_RESULT_TEXTS = (
    ("remote process exited or there was a network error", "ncclRemoteError"),
    ("unhandled system error", "ncclSystemError"),
    ("unhandled cuda error", "ncclUnhandledCudaError"),
    ("internal error", "ncclInternalError"),
    ("invalid argument", "ncclInvalidArgument"),
    ("invalid usage", "ncclInvalidUsage"),
)

# torch's WorkNCCL operator<<: "WorkNCCL(SeqNum=11, OpType=ALLREDUCE, NumelIn=1, NumelOut=1,
# Timeout(ms)=600000)"; checkTimeout: "<prefix>Watchdog caught collective operation timeout:
# <work> ran for <n> milliseconds before timing out."
_TIMEOUT = re.compile(
    r"(?:\[Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: "
    r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
    r"(?:, NumelIn=(?P<numel_in>\d+), NumelOut=(?P<numel_out>\d+))?"
    r"(?:, TensorShape=\[[^\]]*\])?"
    r", Timeout\(ms\)=(?P<timeout>\d+)\)"
    r"(?: ran for (?P<ran>\d+) milliseconds before timing out)?"
)
# ProcessGroupNCCL::createLogPrefix: "[PG ID 0 PG GUID 0(default_pg) Rank 1] " (2.4 on),
# "[PG 0 (default_pg) Rank 1] " / "[PG 2 Rank 1] " (2.3)
_PG_PREFIX = re.compile(
    r"\[PG ID \d+ PG GUID (?P<guid>[^\s()\]]+)(?:\((?P<desc>[^)]*)\))? Rank \d+\]"
    r"|\[PG (?P<uid>[^\s()\]]+)(?: \((?P<desc_old>[^)]*)\))? Rank \d+\]"
)
# the watchdog's line about the failed work, after the group's prefix
_PG_WORK = re.compile(
    r"(?:failure detected by watchdog at work sequence id: |detected by watchdog at work: "
    r"|Timeout at NCCL work: )(?P<seq>\d+)"
)
_RESULT_NAME = re.compile(r"\b(" + "|".join(NCCL_RESULTS) + r")\b")
_RESULT_TEXT = re.compile(
    r"NCCL error(?: in: [^,\n]*,|:) (" + "|".join(re.escape(t) for t, _ in _RESULT_TEXTS) + ")"
)
_ABORTED = re.compile(r"NCCL communicator was aborted (?:on rank \d+|after a previous error)")


@dataclass(frozen=True, slots=True)
class WatchdogTimeout:
    """The collective torch's NCCL watchdog timed out."""

    number: int  # its sequence number in its process group (SeqNum)
    op: str  # as the bridge names ops: all_reduce
    op_type: str  # as torch prints it: ALLREDUCE
    timeout_ms: int
    ran_for_ms: int | None = None
    numel_in: int | None = None
    numel_out: int | None = None
    rank: int | None = None  # the rank in its process group ("[Rank 1]")
    group: str | None = None  # torch's group name (PG GUID; "0": the default group)
    group_desc: str | None = None  # its description ("default_pg")


@dataclass(frozen=True, slots=True)
class NcclFailure:
    """What a worker's text says of NCCL: a watchdog timeout, an NCCL error, or both."""

    timeout: WatchdogTimeout | None
    error: str | None  # one of NCCL_RESULTS, or COMMUNICATOR_ABORTED
    abort_reason: str | None = None  # why torch aborted the communicator, where it says


def read_nccl_failure(*texts: str | None) -> NcclFailure | None:
    """The watchdog timeout and NCCL error in ``texts`` (an exception's message, the end of the
    worker's stderr), the first text that names one winning; ``None`` when none does."""
    timeout: WatchdogTimeout | None = None
    error: str | None = None
    reason: str | None = None
    for text in texts:
        if not isinstance(text, str) or not text:
            continue
        timeout = timeout or find_timeout(text)
        if error is None:
            error = find_error(text)
            reason = abort_reason(text) if error == COMMUNICATOR_ABORTED else None
    if timeout is None and error is None:
        return None
    return NcclFailure(timeout, error, reason)


def find_timeout(text: str) -> WatchdogTimeout | None:
    """The last watchdog timeout in ``text``, with its process group where a line of the
    watchdog's names it (the line that carries the timeout, or one about the same work)."""
    found = _last(_TIMEOUT.finditer(text))
    if found is None:
        return None
    seq = int(found["seq"])
    group, desc = _group_of(text, found, seq)
    return WatchdogTimeout(
        number=seq,
        op=op_name(found["op"]),
        op_type=found["op"],
        timeout_ms=int(found["timeout"]),
        ran_for_ms=_int(found["ran"]),
        numel_in=_int(found["numel_in"]),
        numel_out=_int(found["numel_out"]),
        rank=_int(found["rank"]),
        group=group,
        group_desc=desc,
    )


def find_error(text: str) -> str | None:
    """The NCCL error ``text`` names last: one of :data:`NCCL_RESULTS`, or
    :data:`COMMUNICATOR_ABORTED`; ``None`` for none."""
    best: tuple[int, str] | None = None
    for match in _RESULT_NAME.finditer(text):
        best = (match.start(), match[1])
    for match in _RESULT_TEXT.finditer(text):
        name = dict(_RESULT_TEXTS)[match[1]]
        if best is None or match.start() > best[0]:
            best = (match.start(), name)
    if best is not None:
        return best[1]
    return COMMUNICATOR_ABORTED if _ABORTED.search(text) else None


def abort_reason(text: str) -> str | None:
    """The reason ``NCCLComm::getNcclComm`` gives for an aborted communicator: "NCCL
    communicator was aborted on rank 1.  Original reason for failure was: <reason>"."""
    aborted = _ABORTED.search(text)
    if aborted is None:
        return None
    _, found, reason = text[aborted.end() :].partition("Original reason for failure was: ")
    reason = reason.strip().partition("\n")[0].strip() if found else ""
    return reason or None


def op_name(op_type: str) -> str:
    """``ALLREDUCE`` → ``all_reduce``."""
    return OP_NAMES.get(op_type, op_type.lower())


def read_tail(path: str | None, max_bytes: int = MAX_TAIL_BYTES) -> str:
    """The last ``max_bytes`` of a regular file, as text (``""``: none, or unreadable)."""
    if not path:
        return ""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return ""  # a FIFO or a device would block, or never end
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            return f.read(max_bytes).decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""


def _group_of(text: str, timeout: re.Match[str], seq: int) -> tuple[str | None, str | None]:
    line_start = text.rfind("\n", 0, timeout.start()) + 1
    prefix = _last(_PG_PREFIX.finditer(text, line_start, timeout.start()))
    if prefix is None:
        for line in text.splitlines():
            work = _PG_WORK.search(line)
            if work is None or int(work["seq"]) != seq:
                continue
            prefix = _last(_PG_PREFIX.finditer(line, 0, work.start())) or prefix
    if prefix is None:
        return None, None
    desc = prefix["desc"] if prefix["guid"] is not None else prefix["desc_old"]
    return prefix["guid"] or prefix["uid"], desc or None


def _last(matches: Iterator[re.Match[str]]) -> re.Match[str] | None:
    last = deque(matches, maxlen=1)
    return last[0] if last else None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None else None
