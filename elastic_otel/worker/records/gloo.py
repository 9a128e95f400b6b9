"""gloo's record (and any CPU backend's): ``_dump_fr_trace_json`` and ``_dump_fr_trace``, in
every build since torch 2.8 (empty in a job whose groups run on NCCL)."""

from __future__ import annotations

from elastic_otel.worker.records.record import FlightRecord


class GlooRecord(FlightRecord):
    backend = "gloo"
    status_function = "_dump_fr_trace_json"
    record_function = "_dump_fr_trace"
