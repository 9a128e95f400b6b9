"""torch's NCCL watchdog in the instrumented agent's view of a failure.

When workers fail, the agent reads what each said (its exception, the end of its stderr) for
a watchdog timeout or an NCCL error, and every worker's last collectives reading; the model
decides who timed out waiting and who never entered the collective
(:mod:`elastic_otel.model.collective_timeouts`). torch's own dumps on the timeout, which the
worker start-up points into each worker's directory, are linked into the attempt's
``flight_recorder`` directory, ``rank_<global rank>`` each. Design: ``docs/hangs.md``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Mapping
from typing import Any

from elastic_otel.model.collective_timeouts import collective_attributes, collective_facts
from elastic_otel.model.worker_outcomes import Ended
from elastic_otel.names import attributes as A
from elastic_otel.names.environment_variables import WORKER_NCCL_DUMP_PREFIX
from elastic_otel.parsing.collectives import CollectiveProgress, read_collectives
from elastic_otel.parsing.nccl_errors import NcclFailure, read_nccl_failure, read_tail
from elastic_otel.parsing.records import AttrValue

_logger = logging.getLogger("elastic_otel")

DUMPS_DIRECTORY = "flight_recorder"  # the training watch's, beside the attempt's workers
DUMPS_REASON = "watchdog"

RecordAttributes = dict[str, AttrValue | None]


def nccl_story(
    pcontext: Any, workers: Mapping[int, int], ended: Ended, pids: Mapping[int, int]
) -> tuple[Ended, dict[int, RecordAttributes]]:
    """``ended`` with the kinds the workers' watchdog timeouts and NCCL errors decide, and what
    each failed worker's record adds (its collective, its NCCL error, torch's dumps).
    ``workers``: global rank → local rank of every worker of the group; ``pids``: global rank
    → pid of those torch reported. Never raises."""
    try:
        directories = worker_directories(pcontext, workers)
        streams = getattr(pcontext, "stderrs", None) or {}
        stderrs = {rank: streams.get(local_rank) for rank, local_rank in workers.items()}
        return story_from_files(directories, stderrs, ended, pids)
    except Exception:  # never the agent's problem
        _logger.debug("elastic-otel: NCCL watchdog facts not read", exc_info=True)
        return ended, {}


def story_from_files(
    directories: Mapping[int, str],
    stderrs: Mapping[int, str | None],
    ended: Ended,
    pids: Mapping[int, int],
) -> tuple[Ended, dict[int, RecordAttributes]]:
    """:func:`nccl_story` from each worker's directory and stderr file (by global rank)."""
    found: dict[int, NcclFailure] = {}
    for rank, (end, _) in ended.items():
        exception = f"{end.exception_type or ''}: {end.message}" if end.message else None
        failure = read_nccl_failure(exception, read_tail(stderrs.get(rank)))
        if failure is not None:
            found[rank] = failure
    dumps = gather_watchdog_dumps(directories) if ended else None
    if not found and dumps is None:
        return ended, {}
    readings: dict[int, CollectiveProgress] = {}
    for rank, directory in directories.items():
        reading = read_collectives(directory)
        if reading is not None and pids.get(rank, reading.pid) == reading.pid:
            readings[rank] = reading
    facts = collective_facts(found, readings, set(directories) | set(stderrs))
    attributes: dict[int, RecordAttributes] = {}
    updated = dict(ended)
    for rank, (end, report) in ended.items():
        said = facts.get(rank)
        record: RecordAttributes = {}
        if said is not None:
            if said.kind is not None:
                updated[rank] = (dataclasses.replace(end, kind=said.kind), report)
            record.update(collective_attributes(said))
        if dumps is not None:
            record[A.FLIGHT_RECORDER_DUMP] = dumps
        if record:
            attributes[rank] = record
    return updated, attributes


def worker_directories(pcontext: Any, workers: Mapping[int, int]) -> dict[int, str]:
    """Global rank → the worker's private directory (torch's error file's)."""
    error_files = getattr(pcontext, "error_files", None) or {}
    directories = {}
    for rank, local_rank in workers.items():
        path = error_files.get(local_rank)
        if isinstance(path, str) and path and path != os.devnull:
            directories[rank] = os.path.dirname(path)
    return directories


def gather_watchdog_dumps(directories: Mapping[int, str]) -> str | None:
    """Link torch's dumps on a watchdog timeout (one per worker that wrote one) into a new
    ``flight_recorder/watchdog-<ms>`` directory of the attempt, ``rank_<global rank>`` each,
    as ``torchfrtrace`` reads them; the directory, or ``None`` when no worker wrote one."""
    found = {}
    for rank, directory in directories.items():
        try:
            names = [n for n in os.listdir(directory) if n.startswith(WORKER_NCCL_DUMP_PREFIX)]
        except OSError:
            continue
        files = [os.path.join(directory, n) for n in sorted(names)]
        files = [f for f in files if os.path.isfile(f) and not os.path.islink(f)]
        if files:
            found[rank] = max(files, key=_mtime)  # the newest: one per worker in practice
    if not found:
        return None
    attempt = os.path.dirname(next(iter(directories.values())))
    target = os.path.join(attempt, DUMPS_DIRECTORY, f"{DUMPS_REASON}-{time.time_ns() // 1_000_000}")
    try:
        os.makedirs(target, exist_ok=True)
        for rank, source in sorted(found.items()):
            path = os.path.join(target, f"rank_{rank}")
            try:
                os.link(source, path)
            except OSError:
                shutil.copyfile(source, path)
    except OSError:
        _logger.debug("elastic-otel: NCCL watchdog dumps not gathered", exc_info=True)
        return None
    return target


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
