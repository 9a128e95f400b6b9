"""Root cause or victim: how a worker that did not succeed ended, decided from facts.

In a distributed job every rank spends most of its time in a collective, so one rank's death
makes its peers fail within seconds with a collective error of their own, and the agent then
stops the rest of its group (SIGTERM, SIGKILL after a grace period). Exit codes alone cannot
tell the culprit from its victims: a rank killed by the kernel's OOM killer (SIGKILL) looks
like a rank its agent killed, and a peer's "Connection closed by peer" exits 1 like any
exception. So each worker end is classified from what its agent knows:

* ``stopped``: the agent had begun to stop the group when the worker's end was seen
  (torch's ``PContext.close``, observed by the agent instrumentation), whatever its code;
* ``peer_failure``: it raised an exception whose text is one of the collective errors that
  mean "a peer died" (:data:`PEER_FAILURE_PATTERNS`: gloo's and NCCL's, and c10d's store
  connection errors);
* ``root_cause``: anything else: an exception that is not a peer's death, a signal its agent
  did not send (SIGKILL, SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, a SIGTERM from outside), or
  a non-zero exit with nothing said. When nothing is known of an exit 1 (no error file, no
  worker start-up) it stays a suspect: ``root_cause``, never a guess that it was a victim.

Only a root cause is an error (``error.type``, ERROR status); the earliest one is the node's
root cause, which the others link to. Pure: no torch, no OpenTelemetry.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from elastic_otel.names import attributes as A

PEER_FAILURE_PATTERNS: tuple[str, ...] = (
    # gloo (tcp transport): the peer's socket closed or reset under a collective, e.g.
    # "[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:15771. This is
    # typically caused by a remote worker crashing. ..." (only gloo's: a "Connection reset by
    # peer" from a dataset download is an error of the worker's own)
    r"gloo/transport/\S*\].*(Connection closed by peer|Connection reset by peer|Broken pipe)",
    r"typically caused by a remote worker crashing",
    # NCCL: ncclRemoteError and its text
    r"ncclRemoteError",
    r"remote process exited or there was a network error",
    # c10d: the store (hosted by an agent) went away under a worker
    r"DistNetworkError",
)
"""Exception texts that mean "a peer died", matched anywhere in the type and message."""
_PEER_FAILURE = re.compile("|".join(PEER_FAILURE_PATTERNS), re.IGNORECASE)

_SIGNAL_MEANINGS = {
    "SIGKILL": "killed",
    "SIGSEGV": "segmentation fault",
    "SIGABRT": "aborted",
    "SIGBUS": "bus error",
    "SIGFPE": "floating-point exception",
    "SIGILL": "illegal instruction",
    "SIGTERM": "terminated",
}


@dataclass(frozen=True, slots=True)
class WorkerEnd:
    """What the agent knows of one worker that ended without success."""

    global_rank: int
    exit_code: int | None
    stopped_by_agent: bool = False  # its end was seen after the agent began to stop the group
    exception_type: str | None = None
    message: str | None = None
    time_ns: int = 0


def classify(end: WorkerEnd) -> str:
    """``root_cause``, ``peer_failure`` or ``stopped`` (see the module docstring)."""
    if end.stopped_by_agent:
        return A.KIND_STOPPED
    if is_peer_failure(end.exception_type, end.message):
        return A.KIND_PEER_FAILURE
    return A.KIND_ROOT_CAUSE


def is_peer_failure(exception_type: str | None, message: str | None) -> bool:
    text = f"{exception_type or ''}: {message or ''}"
    return _PEER_FAILURE.search(text) is not None


def root_cause(ends: list[WorkerEnd]) -> WorkerEnd | None:
    """The earliest root-cause end (ties: the lowest rank); ``None`` when all are victims."""
    causes = [e for e in ends if classify(e) == A.KIND_ROOT_CAUSE]
    return min(causes, key=lambda e: (e.time_ns, e.global_rank), default=None)


def signal_name(exit_code: object) -> str | None:
    """``SIGKILL`` for torch's exit code ``-9``; ``None`` for an exit that was not a signal."""
    if not isinstance(exit_code, int) or isinstance(exit_code, bool) or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def error_type(exit_code: object, exception_type: str | None) -> str:
    """``error.type`` of a failed worker: the signal that killed it, else the exception's type,
    else ``exit_code_<n>`` (low cardinality, as the convention asks)."""
    name = signal_name(exit_code)
    if name is not None:
        return name.replace(" ", "_")
    if exception_type:
        return exception_type
    return f"exit_code_{exit_code}" if exit_code is not None else "_OTHER"


def describe(exit_code: object, exception: str | None = None, oom_kill: bool = False) -> str:
    """The status message of a failed worker: "killed by SIGKILL (the kernel's OOM killer)",
    "segmentation fault (SIGSEGV)", the exception's first line, or "exit code 1"."""
    name = signal_name(exit_code)
    if name == "SIGKILL":
        return "killed by SIGKILL" + (" (the kernel's OOM killer)" if oom_kill else "")
    if name is not None:
        meaning = _SIGNAL_MEANINGS.get(name)
        return f"{meaning} ({name})" if meaning else f"killed by {name}"
    if exception:
        return exception.strip().splitlines()[0][:256] if exception.strip() else exception
    return f"exit code {exit_code}"
