"""Root cause or victim: how a worker that did not succeed ended, decided from facts.

One rank's death makes its peers fail in their collectives within seconds and its agent stop
the rest, and exit codes alone cannot tell the culprit from its victims. So each worker end is
classified from what its agent knows: ``stopped`` (its agent had begun to stop the group),
``peer_failure`` (a collective error that means a peer died: :data:`PEER_FAILURE_PATTERNS`) or
``root_cause`` (anything else, an exit nobody explained included). Pure: no torch, no
OpenTelemetry. Design: ``docs/trace-model.md`` (Root cause or victim).
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
    left_training: bool = False
    """It left training while its peers trained, and did not fail (``early_exits``)."""
    kind: str | None = None
    """Decided from what its peers show (:mod:`elastic_otel.model.collective_timeouts`: a rank
    that never entered the collective they timed out in); ``None``: from its own end."""


def classify(end: WorkerEnd) -> str:
    """``root_cause``, ``peer_failure`` or ``stopped`` (see the module docstring)."""
    if end.kind is not None:
        return end.kind
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
