"""Names torch elastic uses that the bridge must match exactly.

They are torch's, not ours: the destination names of its event handler registry
(``torch.distributed.elastic.events.handlers``), the prefix of the loggers it caches per
destination, and the event-name prefix of its agent's status events.
"""

from __future__ import annotations

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
