"""Names torch elastic uses that the bridge must match exactly.

They are torch's, not ours: the destination names of its event handler registry
(``torch.distributed.elastic.events.handlers``), the prefix of the loggers it caches per
destination, the event-name prefix of its agent's status events, and the states its events
carry (:class:`WorkerState`, :class:`NodeState`). They live here, at the bottom of the layers, so
that parsing and the model compare against the same members instead of repeating the text.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

DESTINATION: Final = "otel"
"""The event destination this package registers (``torchrun --event-log-handler otel``)."""

RDZV_DESTINATION: Final = "dynamic_rendezvous"
"""Where torch records every ``RdzvEvent``; torch skips building them while it is a NullHandler."""

STATUS_PREFIX: Final = "torchelastic.worker.status."
"""Name prefix of the agent's events (``torchelastic.worker.status.<STATE>``)."""

TORCH_EVENT_LOGGER_PREFIX: Final = "torchelastic-events-"
"""torch's ``events.record`` logs through ``logging.getLogger(prefix + destination)``."""

AGENT_STEP_PREFIX: Final = "elastic_otel.agent."
"""Not torch's: name prefix of the agent steps the bridge observes itself
(:mod:`elastic_otel.integration.agent_instrumentation`), e.g.
``elastic_otel.agent.exit_barrier``."""


STACKS_STATE: Final = "STACKS"
"""Not torch's: the state of the record of a worker's Python stacks, which the agent
instrumentation takes (:mod:`elastic_otel.integration.training_watch`) and the agent model logs
on the worker's span."""

WORKER_STACKS_EVENT: Final = AGENT_STEP_PREFIX + "worker_stacks"
"""Not torch's: the event name of those records."""

NCCL_TIMING_STATE: Final = "NCCL_TIMING"
"""Not torch's: the state of the record of a worker's NCCL timing decision (on or off, and
why), which the agent model logs on the worker's span."""

NCCL_TIMING_EVENT: Final = AGENT_STEP_PREFIX + "nccl_timing"
"""Not torch's: the event name of those records."""


class WorkerState(str, Enum):
    """The ``state`` of torch's agent and worker events (``torchelastic.worker.status.<STATE>``),
    and the states the bridge gives a worker's span for moments torch has no event for.

    A ``str`` enum, so a member compares and hashes as its text (``ev.state == FAILED``) and
    ``str()`` / f-strings give the text. Attribute values are set from ``.value``, so that
    what is exported is a plain ``str`` whatever an exporter does with ``str`` subclasses.
    """

    # torch's WorkerState (torch.distributed.elastic.agent.server.api), a worker group's state.
    UNKNOWN = "UNKNOWN"
    INIT = "INIT"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    STOPPED = "STOPPED"
    """Stopped by its agent: after another worker failed, for a membership change, or at the end
    (torch's, and the bridge's when its agent instrumentation sees the agent stop a worker)."""
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    # torch's own event states beside WorkerState.
    START = "START"
    """A worker started (torch records one per worker it starts)."""
    TERMINATED = "TERMINATED"
    """torch's, for a worker it SIGTERMed; the bridge's for spans ended by a signal."""
    # The bridge's: a worker whose end torch never reported (agent instrumentation off).
    REPLACED = "REPLACED"
    """Its group was restarted after a failure (a START with higher ``agent_restarts``)."""
    RESTARTED = "RESTARTED"
    """Its group was restarted for a membership change (a START of a rank still running)."""
    PEER_FAILED = "PEER_FAILED"
    """It failed because a peer died (its collective lost the peer): a victim, not a cause."""

    def __str__(self) -> str:
        return self.value


class NodeState(str, Enum):
    """torch's rendezvous ``NodeState`` (``torch.distributed.elastic.events.NodeState``): the
    ``node_state`` of its ``RdzvEvent``s. A ``str`` enum, as :class:`WorkerState`."""

    INIT = "INIT"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    def __str__(self) -> str:
        return self.value


NVRX_ELASTIC: Final = "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat"
"""nvidia-resiliency-ext 0.4's copy of torch 2.3's ``torch.distributed.elastic``, on which its
``ft_launcher`` runs (``elastic_otel/integration/ft_launcher.py``)."""
NVRX_EVENT_HANDLERS: Final = f"{NVRX_ELASTIC}.events.handlers"
"""The copy's handler registry module (``_log_handlers``: destination → handler)."""
