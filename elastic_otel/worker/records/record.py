"""One kind of torch's Flight Recorder record, read through the two functions torch dumps it with.

torch keeps a record per kind of backend: gloo's (and any CPU backend's) and, in CUDA builds,
NCCL's; a process group's collectives are in the record of the backend that runs them, and the
other record is empty. Each kind is a subclass naming its two functions (one module per
backend, :data:`elastic_otel.worker.collectives.RECORDS` lists them), so that the watch above it
stays backend-neutral. Design: ``docs/hangs.md`` (Releases and backends).
"""

from __future__ import annotations

import json
import pickle
from typing import Any


class FlightRecord:
    """A backend's record in this process: a cheap status read and a whole-record read."""

    backend = ""
    status_function = ""  # (includeCollectives, onlyActive) -> JSON bytes
    record_function = ""  # (includeCollectives, includeStackTraces, onlyActive) -> pickle bytes

    def __init__(self, extension: Any) -> None:
        self._json = getattr(extension, self.status_function, None)
        self._pickle = getattr(extension, self.record_function, None)

    @property
    def available(self) -> bool:
        """This torch build has both functions (NCCL's: CUDA builds only)."""
        return self._json is not None and self._pickle is not None

    def status(self) -> dict[str, dict[str, Any]]:
        """Each process group's ``pg_status``: the last collective enqueued, started (``-1``
        where the record does not track it) and completed; tens of µs, no entries."""
        assert self._json is not None
        status = json.loads(self._json(False, False))
        return status.get("pg_status") or {}

    def status_from(self, record: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
        """The status as ``record`` (a whole read) settles it where this kind's status read
        can be behind (gloo's); ``None`` where the status read is right."""
        return None

    def record(self) -> dict[str, Any]:
        """The whole record (torch's own pickle, from this process), without stack traces:
        symbolizing them holds the GIL for seconds on the first dump."""
        assert self._pickle is not None
        record = pickle.loads(self._pickle(True, False, False))
        return record if isinstance(record, dict) else {}
