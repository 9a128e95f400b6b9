"""A CPU worker whose torch answers as a CUDA build in a NCCL job does, for the end-to-end tests.

In a NCCL job torch keeps every collective in NCCL's own Flight Recorder record, read only
through ``_dump_nccl_trace_json`` / ``_dump_nccl_trace``, and gloo's record is empty (checked on
an H100: ``tests/data/nccl-flight-recorder/probe.txt``). NCCL needs a GPU per rank, so on this
machine the job runs on gloo and this ``sitecustomize`` (put on the workers' ``PYTHONPATH``; the
worker start-up chains to it) moves torch's real gloo record behind the NCCL functions, with
their signatures, and leaves the gloo functions an empty record of the same shape. What is
read is torch's own record of the job; only the functions it is read through are moved.
"""

from __future__ import annotations

import json
import pickle

import torch

_EMPTY = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}


def _install() -> None:
    extension = torch._C._distributed_c10d
    gloo_json, gloo_pickle = extension._dump_fr_trace_json, extension._dump_fr_trace

    def nccl_json(includeCollectives: bool = True, onlyActive: bool = False) -> bytes:
        return gloo_json(includeCollectives, onlyActive)

    def nccl_pickle(
        includeCollectives: bool = True, includeStackTraces: bool = True, onlyActive: bool = False
    ) -> bytes:
        return gloo_pickle(includeCollectives, includeStackTraces, onlyActive)

    def empty_json(includeCollectives: bool = True, onlyActive: bool = False) -> bytes:
        return json.dumps(_EMPTY).encode()

    def empty_pickle(
        includeCollectives: bool = True, includeStackTraces: bool = True, onlyActive: bool = False
    ) -> bytes:
        return pickle.dumps(_EMPTY)

    extension._dump_nccl_trace_json, extension._dump_nccl_trace = nccl_json, nccl_pickle
    extension._dump_fr_trace_json, extension._dump_fr_trace = empty_json, empty_pickle


_install()
