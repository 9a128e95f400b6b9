"""The goodput of a job per run and attempt, from the ``torchelastic.goodput`` summary records
its agents log (:mod:`elastic_otel.model.goodput` computes and names the breakdown)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from elastic_otel.cli.timeline.analysis.items import Item
from elastic_otel.model.goodput import Breakdown, from_attributes
from elastic_otel.names import attributes as A


@dataclass(frozen=True, slots=True)
class AttemptGoodput:
    """One attempt's summary record."""

    run_id: str
    attempt: int
    final: bool
    breakdown: Breakdown
    job: Breakdown
    job_ratio: float
    trace_id: str
    span_id: str
    time_ns: int


def goodput_records(logs: Iterable[Item]) -> list[AttemptGoodput]:
    """The summaries in ``logs``, by run and attempt (the latest record of each); records
    that lack a breakdown are left out."""
    found: dict[tuple[str, int], AttemptGoodput] = {}
    for record in logs:
        if record.get("event_name") != A.GOODPUT_EVENT_NAME:
            continue
        attrs = record.get("attributes") or {}
        attempt, job = from_attributes(attrs), from_attributes(attrs, job=True)
        number = attrs.get(A.GOODPUT_ATTEMPT)
        if attempt is None or job is None or not isinstance(number, int):
            continue
        ratio = attrs.get(A.GOODPUT_JOB_RATIO)
        item = AttemptGoodput(
            run_id=str(attrs.get(A.RUN_ID, "")),
            attempt=number,
            final=attrs.get(A.GOODPUT_FINAL) is True,
            breakdown=attempt,
            job=job,
            job_ratio=float(ratio) if isinstance(ratio, int | float) else job.ratio,
            trace_id=str(record.get("trace_id") or ""),
            span_id=str(record.get("span_id") or ""),
            time_ns=int(record.get("time_ns") or 0),
        )
        key = (item.run_id, item.attempt)
        if key not in found or found[key].time_ns <= item.time_ns:
            found[key] = item
    return sorted(found.values(), key=lambda g: (g.run_id, g.attempt))


def by_run(items: list[AttemptGoodput]) -> dict[str, list[AttemptGoodput]]:
    """``items`` per run id, each run's attempts in order: its last one says the job so far."""
    runs: dict[str, list[AttemptGoodput]] = {}
    for item in items:
        runs.setdefault(item.run_id, []).append(item)
    return runs
