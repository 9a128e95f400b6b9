"""NCCL's record: ``_dump_nccl_trace_json`` and ``_dump_nccl_trace``, in CUDA builds only. The
device's start of a collective is in it only with timing events (``TORCH_NCCL_ENABLE_TIMING``):
``docs/hangs.md`` (On GPUs) says what that costs and why it is off by default."""

from __future__ import annotations

from elastic_otel.worker.records.record import FlightRecord


class NcclRecord(FlightRecord):
    backend = "nccl"
    status_function = "_dump_nccl_trace_json"
    record_function = "_dump_nccl_trace"
