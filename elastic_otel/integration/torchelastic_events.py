"""torchelastic 0.2's event API (the ``torchelastic`` package) into the bridge.

``torchelastic.events.configure(OtelEventHandler(), event_type="torchelastic")`` sends its
events to the process-wide bridge handler, read in the shape of torch's ``Event`` (the same log
records and spans, plus ``torchelastic.event.type``). Imports neither torch nor the
OpenTelemetry SDK; ``torchelastic`` only if installed. Design: ``docs/attributes.md`` (How
torch's events are read).
"""

from __future__ import annotations

from typing import Any

from elastic_otel.bridge.handler import OtelHandler, get_handler
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import STATUS_PREFIX

try:
    from torchelastic.events.api import EventHandler as _EventHandlerBase
except ImportError:  # torchelastic is optional: the handler works by duck typing without it

    class _EventHandlerBase:  # type: ignore[no-redef]
        pass


_SOURCES = frozenset({A.SOURCE_AGENT, A.SOURCE_WORKER})
_TYPE_KEY = A.EVENT_TYPE[len(A.NS) :]  # "event.type": metadata keys become torchelastic.<key>


def to_payload(event: Any) -> Any:
    """What the bridge handler parses for one torchelastic 0.2 event (a dict like torch's)."""
    if hasattr(event, "source"):  # already torch's Event (or shaped like it)
        return event
    raw = getattr(event, "metadata", None)
    metadata: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
    if raw is not None and not isinstance(raw, dict):
        metadata["metadata"] = raw
    name = str(getattr(event, "name", "") or "")
    source = str(metadata.get("source") or "").upper()
    if source not in _SOURCES:
        source = A.SOURCE_AGENT if name.startswith(STATUS_PREFIX) else A.SOURCE_UNKNOWN
    metadata.pop("source", None)
    event_type = getattr(event, "type", None)
    if event_type is not None:
        metadata.setdefault(_TYPE_KEY, str(event_type))
    timestamp = getattr(event, "timestamp", 0)
    return {"name": name, "source": source, "timestamp": timestamp, "metadata": metadata}


class OtelEventHandler(_EventHandlerBase):
    """A ``torchelastic.events.EventHandler`` feeding the bridge.

    ``handler`` defaults to the shared :func:`elastic_otel.get_handler`; it is started (its
    pipeline built from the environment) on the first event.
    """

    def __init__(self, handler: OtelHandler | None = None) -> None:
        self._handler = handler

    def record(self, event: Any) -> None:
        try:
            payload = to_payload(event)
        except Exception:  # a hostile event object: the bridge flags what it cannot parse
            payload = event
        self.handler.info(payload)

    @property
    def handler(self) -> OtelHandler:
        if self._handler is None:
            self._handler = get_handler()
        return self._handler


def configure(event_type: str = "torchelastic") -> OtelEventHandler:
    """``torchelastic.events.configure(OtelEventHandler(), event_type)``; returns the handler.

    ``event_type=""`` makes it torchelastic's default handler, for every type not configured.
    """
    from torchelastic import events

    handler = OtelEventHandler()
    events.configure(handler, event_type=event_type)
    return handler
