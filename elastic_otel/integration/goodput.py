"""The agent's goodput accounting, fed by what the instrumented agent sees.

:class:`GoodputWatch`, held by the agent instrumentation, keeps one :class:`AgentGoodput` per
agent: it opens an attempt when torch starts the workers, takes the training watch's stall
intervals, and when the attempt ends reads its workers' progress records once more, accounts
for it (:mod:`elastic_otel.model.goodput`) and, on the node that ran global rank 0, reports
the summary; the metrics read :meth:`GoodputWatch.points`. Design: ``docs/goodput.md``.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field

from elastic_otel.emit.goodput_metrics import GoodputPoint
from elastic_otel.integration.training_watch import WatchedWorker
from elastic_otel.model.goodput import GoodputLedger, Summary
from elastic_otel.parsing.worker_progress import WorkerProgress, read_progress

_logger = logging.getLogger("elastic_otel")

Report = Callable[[Summary], None]

ACTIVATED_NS = time.time_ns()
"""When this module was loaded: the agent's activation, near torchrun's start (the job's
wall time begins here unless :attr:`GoodputWatch.start_ns` says otherwise)."""


@dataclass(eq=False)
class AgentGoodput:
    """One agent's ledger, and what it needs to report and read its attempt."""

    ledger: GoodputLedger
    run_id: str
    report: Report
    workers: list[tuple[int, int, str]] = field(default_factory=list)  # global rank, pid, dir


class GoodputWatch:
    """The ledgers of the agents of this process (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # every agent's ledger while its agent's state has it (a weak set, in order)
        self._ledgers: MutableMapping[AgentGoodput, None] = weakref.WeakKeyDictionary()
        self.start_ns = ACTIVATED_NS

    def started(
        self,
        entry: AgentGoodput | None,
        run_id: str,
        workers: list[WatchedWorker],
        stall_after_s: float,
        report: Report,
    ) -> AgentGoodput:
        """torch started ``workers`` for the agent whose ledger is ``entry`` (``None``: it has
        none yet): the current attempt has them. The agent's ledger, to keep."""
        with self._lock:
            if entry is None:
                stall_ns = int(stall_after_s * 1e9) if stall_after_s > 0 else 0
                entry = AgentGoodput(GoodputLedger(self.start_ns, stall_ns), run_id, report)
                self._ledgers[entry] = None
            entry.run_id, entry.report = run_id, report
            entry.workers = [(w.global_rank, w.pid, w.directory) for w in workers]
            entry.ledger.begin(w.global_rank for w in workers)
            return entry

    def observe(self, entry: AgentGoodput, now_ns: int, readings: list[WorkerProgress]) -> None:
        """The training watch read the workers' records (stalls)."""
        with self._lock:
            entry.ledger.observe(now_ns, readings)

    def ended(
        self,
        entry: AgentGoodput,
        end_ns: int,
        lost: bool,
        final: bool,
        failure_ns: int | None = None,
    ) -> Summary | None:
        """The current attempt of ``entry``'s agent ended at ``end_ns``; ``lost``: the progress
        after its last checkpoint is lost (a restart follows, or the job failed). Reports it
        when this node ran global rank 0; the summary (``None``: no attempt under way)."""
        with self._lock:
            if not entry.ledger.open:
                return None
            readings = _read(entry.workers)
            summary = entry.ledger.end(end_ns, readings, lost, failure_ns, final)
        if summary.reporter:
            entry.report(summary)
        return summary

    def points(self) -> list[GoodputPoint]:
        """What the metrics export now: per agent of this process that reports."""
        now = time.time_ns()
        with self._lock:
            entries = list(self._ledgers)
        out = []
        for entry in entries:
            ledger = entry.ledger
            live = ledger.live(now, _read(entry.workers)) if ledger.open else None
            reported = ledger.reported
            if live is not None and ledger.reporter:
                reported = reported + live
            job = ledger.job() + live if live is not None else ledger.job()
            if not ledger.reporter and not ledger.attempt:
                continue
            ratio = job.ratio if ledger.reporter and job.wall_s > 0 else None
            out.append(GoodputPoint(entry.run_id, ratio, dict(reported.badput_s)))
        return out


def _read(workers: list[tuple[int, int, str]]) -> list[WorkerProgress]:
    """The records of these workers that are theirs (a pid that matches)."""
    out = []
    for _, pid, directory in workers:
        try:
            record = read_progress(directory)
        except Exception:  # the reader never raises for a bad file; be sure
            _logger.debug("elastic-otel: progress record not read", exc_info=True)
            continue
        if record is not None and record.pid == pid:
            out.append(record)
    return out
