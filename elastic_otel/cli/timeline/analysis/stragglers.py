"""Stragglers, from the ``torchelastic.straggler`` reports of a round.

Each node scores only its own ranks (:mod:`elastic_otel.model.stragglers`); one spell of
straggling is a rank's consecutive reports (its window count growing), beside the round's nodes
that named none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from elastic_otel.cli.timeline.analysis.items import Item, as_int, as_number, as_ranks
from elastic_otel.model.stragglers import STRAGGLER_EVENT_NAME
from elastic_otel.names import attributes as A


@dataclass
class StragglerReport:
    """One node's ``torchelastic.straggler`` record: a local rank its local peers wait for."""

    node: str
    rank: int
    time_ns: int
    score: float
    lateness_s: float | None = None  # mean seconds per collective after the fastest local peer
    interval_s: float | None = None  # mean seconds between collectives of the group
    waited_share: float | None = None  # share of that interval its local peers wait for it
    waiting: tuple[int, ...] = ()  # its local peers
    windows: int | None = None  # consecutive windows it has been the node's straggler
    group: str = ""  # the process group
    basis: str = ""  # "issued" (arrivals) or "inside" (device time); "": older records
    run_id: str = ""
    trace_id: str = ""


@dataclass
class StragglerSpell:
    """One rank straggling in a round: its node's consecutive reports of it."""

    rank: int
    node: str
    run_id: str
    trace_id: str
    reports: list[StragglerReport]  # in order of time
    round: int | None = None
    quiet: list[str] = field(default_factory=list)  # the round's nodes that named no straggler

    @property
    def start_ns(self) -> int:
        """Its first report (it straggled for some windows before)."""
        return self.reports[0].time_ns

    @property
    def end_ns(self) -> int:
        return self.reports[-1].time_ns

    @property
    def latest(self) -> StragglerReport:
        return self.reports[-1]

    @property
    def lowest(self) -> float:
        return min(r.score for r in self.reports)

    @property
    def waiting(self) -> list[tuple[int, str]]:
        """(global rank, node) of the local peers that wait for it."""
        return [(rank, self.node) for rank in sorted({p for r in self.reports for p in r.waiting})]


def stragglers(
    logs: Iterable[Item],
    node_of: Callable[[Item], str],
    rounds: dict[str, int] | None = None,
    round_nodes: dict[str, list[str]] | None = None,
) -> list[StragglerSpell]:
    """The stragglers the ``torchelastic.straggler`` records report, per round (trace) and
    rank, in order of first report. A rank's reports are one spell while its window count
    grows; a count that starts again is a new one. ``round_nodes`` names each round's nodes (to
    say which named none)."""
    rounds, round_nodes = rounds or {}, round_nodes or {}
    by_rank: dict[tuple[str, str, str, int], list[StragglerReport]] = {}
    for record in logs:
        attrs = record.get("attributes", {})
        if (record.get("event_name") or attrs.get(A.EVENT_NAME)) != STRAGGLER_EVENT_NAME:
            continue
        report = _straggler_report(record, node_of)
        if report is not None:
            key = (report.run_id, report.trace_id, report.node, report.rank)
            by_rank.setdefault(key, []).append(report)
    named: dict[str, set[str]] = {}
    for _, trace_id, node, _ in by_rank:
        named.setdefault(trace_id, set()).add(node)
    found = []
    for (run_id, trace_id, node, rank), reports in by_rank.items():
        quiet = [n for n in round_nodes.get(trace_id, []) if n not in named[trace_id]]
        for spell in _spells(sorted(reports, key=lambda r: r.time_ns)):
            found.append(
                StragglerSpell(rank, node, run_id, trace_id, spell, rounds.get(trace_id), quiet)
            )
    found.sort(key=lambda s: (s.start_ns, s.rank))
    return found


def _straggler_report(record: Item, node_of: Callable[[Item], str]) -> StragglerReport | None:
    attrs = record.get("attributes", {})
    rank, score = as_int(attrs.get(A.STRAGGLER_RANK)), as_number(attrs.get(A.STRAGGLER_SCORE))
    if rank is None or score is None:
        return None
    return StragglerReport(
        node=node_of(record),
        rank=rank,
        time_ns=int(record.get("time_ns", 0)),
        score=score,
        lateness_s=as_number(attrs.get(A.STRAGGLER_LATENESS)),
        interval_s=as_number(attrs.get(A.STRAGGLER_INTERVAL)),
        waited_share=as_number(attrs.get(A.STRAGGLER_WAITED_SHARE)),
        waiting=as_ranks(attrs.get(A.STRAGGLER_WAITING)),
        windows=as_int(attrs.get(A.STRAGGLER_WINDOWS)),
        group=str(attrs.get(A.STRAGGLER_PROCESS_GROUP, "") or ""),
        basis=str(attrs.get(A.STRAGGLER_BASIS, "") or ""),
        run_id=str(attrs.get(A.RUN_ID, "") or ""),
        trace_id=str(record.get("trace_id", "") or ""),
    )


def _spells(reports: list[StragglerReport]) -> list[list[StragglerReport]]:
    """A rank's reports, in order of time → its straggling spells: a report whose window
    count does not exceed the one before began anew (the rank kept up in between)."""
    spells: list[list[StragglerReport]] = []
    for report in reports:
        before = spells[-1][-1] if spells else None
        if (
            before is not None
            and report.windows is not None
            and before.windows is not None
            and report.windows > before.windows
        ):
            spells[-1].append(report)
        else:
            spells.append([report])
    return spells
