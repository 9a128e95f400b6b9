"""NCCL's Flight Recorder record as an H100 returned it (``tests/data/nccl-flight-recorder/``,
whose README says how it was made), served through torch's two NCCL dump functions, for the
tests that read it with the worker's own reader."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from elastic_otel.worker.collectives import CollectivesWatch
from elastic_otel.worker.records.gloo import GlooRecord
from elastic_otel.worker.records.nccl import NcclRecord

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "nccl-flight-recorder"


class RecordedExtension:
    """torch's NCCL dump functions, answering with a record an H100 returned."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def _view(self, include_collectives: bool | None) -> dict[str, Any]:
        if include_collectives is False:
            return {k: v for k, v in self.record.items() if k != "entries"}
        return self.record

    def _dump_nccl_trace_json(
        self, includeCollectives: bool | None = None, onlyActive: bool | None = None
    ) -> bytes:
        return json.dumps(self._view(includeCollectives)).encode()

    def _dump_nccl_trace(
        self,
        includeCollectives: bool | None = None,
        includeStackTraces: bool | None = None,
        onlyActive: bool | None = None,
    ) -> bytes:
        return pickle.dumps(self._view(includeCollectives))


def recorded(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def watch_of(record: dict[str, Any], directory: Path) -> CollectivesWatch:
    reader = NcclRecord(RecordedExtension(record))
    assert reader.available and not GlooRecord(RecordedExtension(record)).available
    return CollectivesWatch(str(directory), 1.0, identify_after_s=1.0, records=[reader])
