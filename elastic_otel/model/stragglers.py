"""Stragglers: a rank that keeps its peers waiting at every collective, named while the job runs.

A slow rank makes every peer wait at each collective, and no stall report says so. From the
device's time inside each collective where the Flight Recorder times it (NCCL with timing
events), else from when each local rank issued it, :class:`StragglerWatch` scores every rank
against its local peers, window by window, and names a rank that stays clearly the worst of its
node for :data:`WINDOWS` windows. Pure: no torch, no SDK, no clock of its own.
Design: ``docs/hangs.md`` (Stragglers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from elastic_otel.model.spans import SpanAttributes
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import group_name

STRAGGLER_EVENT_NAME = "torchelastic.straggler"
STRAGGLER_STATE = "STRAGGLER"
WINDOWS = 3
"""Consecutive windows a rank must be the node's straggler before it is reported."""
REPORT_EVERY = 10
"""While it stays one, it is reported again every this many windows."""
DOMINANCE = 2.0
"""A straggler's lateness is at least this many times every local peer's."""
MIN_COLLECTIVES = 3
"""Collectives a window needs in a group to score it (fewer: an idle or hung job)."""
MAX_PENDING = 4096
"""Collectives per group kept waiting for the arrivals of the other local ranks."""
ISSUED = "issued"
"""Scored from when each rank issued each collective (its arrival)."""
INSIDE = "inside"
"""Scored from the device's time inside each collective (NCCL with timing events): a rank's
lateness is how much less time it spent inside than the local rank that spent the most."""


@dataclass(frozen=True, slots=True)
class RankScore:
    """A rank's score over the last window, in the process group where it was worst."""

    global_rank: int
    score: float  # 1 - lateness / interval, clamped to [0, 1]
    lateness_s: float  # mean seconds per collective after the earliest local arrival
    interval_s: float  # mean seconds between consecutive collectives of the group
    waited_share: float  # share of the interval its local peers waited for it
    group: str
    collectives: int  # collectives of the window scored
    basis: str = "issued"  # ISSUED: from when each rank issued them; INSIDE: from device time


@dataclass(frozen=True, slots=True)
class Straggler:
    """A rank reported as the node's straggler."""

    rank: RankScore
    waiting: tuple[int, ...]  # the local peers that wait for it
    windows: int  # consecutive windows it has been the node's straggler


class Streak:
    """Consecutive windows one candidate (a rank, a node) was the worst: a report is due at the
    :data:`WINDOWS`-th and every :data:`REPORT_EVERY` windows after it."""

    def __init__(self, windows: int = WINDOWS) -> None:
        self.windows = windows
        self._candidate: int | None = None
        self._count = 0

    def update(self, candidate: int | None) -> int:
        """This window's worst (``None``: none); the streak's length if a report is due, else 0."""
        if candidate is None:
            self._candidate, self._count = None, 0
            return 0
        if candidate == self._candidate:
            self._count += 1
        else:
            self._candidate, self._count = candidate, 1
        due = self._count >= self.windows and (self._count - self.windows) % REPORT_EVERY == 0
        return self._count if due else 0


class StragglerWatch:
    """The arrivals (and device times, where recorded) of a node's local ranks, scored window
    by window."""

    def __init__(self, threshold: float, windows: int = WINDOWS) -> None:
        self.threshold = threshold
        self.windows = windows
        self.scores: dict[int, RankScore] = {}
        """Each local rank's score over the last window scored (read by the gauges)."""
        self.inside: dict[str, GroupInside] = {}
        """Per group, its local ranks' device time inside over the last window where the
        record times collectives (what the node publishes for :mod:`.slow_nodes`)."""
        self.earliest: dict[str, tuple[int, ...]] = {}
        """Per group, the earliest local arrival (ns) of each collective every local member
        issued in the last window, in order (what :mod:`.slowdowns` reads)."""
        self._arrivals = _Pending()  # group → seq → rank → when it issued it (ns)
        self._durations = _Pending()  # group → seq → rank → ns its device spent inside
        self._members: dict[str, tuple[int, ...]] = {}
        self._interval: dict[str, float] = {}  # group → its last interval measured (ns)
        self._streak = Streak(windows)

    def observe(
        self,
        global_rank: int,
        arrivals: Iterable[tuple[str, Iterable[tuple[int, int]]]],
        members: Mapping[str, tuple[int, ...]] | None = None,
        durations: Iterable[tuple[str, Iterable[tuple[int, int]]]] = (),
    ) -> None:
        """Add a rank's arrivals and device times (per group, (sequence number, ns));
        ``members``: each group's global ranks, where known. Values seen before, or of
        collectives scored, are ignored."""
        self._arrivals.add(global_rank, arrivals)
        self._durations.add(global_rank, durations)
        for group, ranks in (members or {}).items():
            if ranks:
                self._members[group] = tuple(ranks)

    def close_window(self, local_ranks: Iterable[int]) -> Straggler | None:
        """Score the collectives every local member issued (or, where timed, completed) since
        the last window; the straggler to report now, if any."""
        local = set(local_ranks)
        scores: dict[int, RankScore] = {}
        candidates: list[tuple[RankScore, tuple[int, ...]]] = []
        inside: dict[str, GroupInside] = {}
        earliest_by_group: dict[str, tuple[int, ...]] = {}
        for group in sorted(self._arrivals.groups() | self._durations.groups()):
            known = self._members.get(group)
            seen = self._arrivals.ranks(group) | self._durations.ranks(group)
            ranks = sorted(local & set(known) if known else seen & local)
            if not ranks or (len(ranks) < 2 and not known):
                continue  # one rank, and whether it is the only local member is not known
            rows = self._arrivals.complete(group, ranks)
            if rows:
                earliest_by_group[group] = tuple(min(row[r] for r in ranks) for row in rows)
            if len(rows) >= MIN_COLLECTIVES:
                earliest = earliest_by_group[group]
                if earliest[-1] > earliest[0]:
                    self._interval[group] = (earliest[-1] - earliest[0]) / (len(rows) - 1)
            interval = self._interval.get(group, 0.0)
            timed = self._durations.complete(group, ranks)
            group_scores: list[RankScore] = []
            if len(timed) >= MIN_COLLECTIVES and interval > 0:
                inside[group] = GroupInside(
                    collectives=len(timed),
                    mean_ns={r: sum(row[r] for row in timed) / len(timed) for r in ranks},
                    interval_ns=interval,
                )
                # Less time inside is a later arrival: the same score, on device time.
                flipped = [{r: -ns for r, ns in row.items()} for row in timed]
                if len(ranks) >= 2:
                    group_scores = _score(group, ranks, flipped, interval, INSIDE)
            elif len(ranks) >= 2 and len(rows) >= MIN_COLLECTIVES and interval > 0:
                group_scores = _score(group, ranks, rows, interval, ISSUED)
            if not group_scores:
                continue
            for score in group_scores:
                held = scores.get(score.global_rank)
                if held is None or score.score < held.score:
                    scores[score.global_rank] = score
            worst = min(group_scores, key=lambda s: (s.score, -s.lateness_s))
            peers = [s for s in group_scores if s is not worst]
            if worst.score < self.threshold and all(
                worst.lateness_s >= DOMINANCE * p.lateness_s for p in peers
            ):
                candidates.append((worst, tuple(p.global_rank for p in peers)))
        self.inside, self.earliest = inside, earliest_by_group
        if not scores:  # nothing to score (an idle or hung job, arrivals yet to come): no evidence
            return None
        self.scores = scores
        if not candidates:
            self._streak.update(None)
            return None
        worst, waiting = min(candidates, key=lambda c: c[0].score)
        windows = self._streak.update(worst.global_rank)
        return Straggler(worst, waiting, windows) if windows else None


@dataclass(frozen=True, slots=True)
class GroupInside:
    """A node's local ranks' device time inside one group's collectives over a window."""

    collectives: int  # collectives every local member completed, timed
    mean_ns: dict[int, float]  # global rank → its mean ns inside per collective
    interval_ns: float  # mean ns between consecutive collectives of the group


class _Pending:
    """Per group, per collective (sequence number), each rank's value, until scored."""

    def __init__(self) -> None:
        self._values: dict[str, dict[int, dict[int, int]]] = {}
        self._scored: dict[str, int] = {}  # group → the newest sequence number scored

    def add(self, rank: int, by_group: Iterable[tuple[str, Iterable[tuple[int, int]]]]) -> None:
        for group, pairs in by_group:
            seqs = self._values.setdefault(group, {})
            scored = self._scored.get(group, 0)
            for seq, value in pairs:
                if seq > scored:
                    seqs.setdefault(seq, {}).setdefault(rank, value)
            if len(seqs) > MAX_PENDING:
                for seq in sorted(seqs)[: len(seqs) - MAX_PENDING]:
                    del seqs[seq]

    def groups(self) -> set[str]:
        return set(self._values)

    def ranks(self, group: str) -> set[int]:
        return {r for by_rank in self._values.get(group, {}).values() for r in by_rank}

    def complete(self, group: str, ranks: list[int]) -> list[dict[int, int]]:
        """The rows (in order) every one of ``ranks`` has a value in, taken out; rows older
        than the newest of them never will be (a rank's values were lost): dropped."""
        seqs = self._values.get(group, {})
        complete = sorted(s for s, by_rank in seqs.items() if all(r in by_rank for r in ranks))
        if not complete:
            return []
        rows = [seqs[seq] for seq in complete]
        self._scored[group] = complete[-1]
        for seq in [s for s in seqs if s <= complete[-1]]:
            del seqs[seq]
        return rows


def _score(
    group: str, ranks: list[int], rows: list[dict[int, int]], interval: float, basis: str
) -> list[RankScore]:
    """Each rank's score over ``rows`` (one per collective: rank → arrival, ns; or minus its
    time inside, which orders the ranks the same way) against ``interval`` (ns)."""
    out = []
    earliest = [min(row[r] for r in ranks) for row in rows]
    for rank in ranks:
        late = sum(row[rank] - first for row, first in zip(rows, earliest, strict=True))
        waited = sum(
            sum(max(0, row[rank] - row[p]) for p in ranks if p != rank) / (len(ranks) - 1)
            for row in rows
        )
        lateness = late / len(rows)
        out.append(
            RankScore(
                global_rank=rank,
                score=min(max(1.0 - lateness / interval, 0.0), 1.0),
                lateness_s=lateness / 1e9,
                interval_s=interval / 1e9,
                waited_share=min(waited / len(rows) / interval, 1.0),
                group=group,
                collectives=len(rows),
                basis=basis,
            )
        )
    return out


def straggler_attributes(straggler: Straggler) -> SpanAttributes:
    """The report's facts, as the log record's attributes."""
    rank = straggler.rank
    return {
        A.STRAGGLER_RANK: rank.global_rank,
        A.STRAGGLER_SCORE: round(rank.score, 3),
        A.STRAGGLER_LATENESS: round(rank.lateness_s, 4),
        A.STRAGGLER_INTERVAL: round(rank.interval_s, 4),
        A.STRAGGLER_WAITED_SHARE: round(rank.waited_share, 3),
        A.STRAGGLER_WAITING: straggler.waiting,
        A.STRAGGLER_WINDOWS: straggler.windows,
        A.STRAGGLER_PROCESS_GROUP: group_name(rank.group),
        A.STRAGGLER_BASIS: rank.basis,
    }


def describe_straggler(attributes: SpanAttributes) -> str:
    """The body of a straggler report: "global rank 1 is a straggler: score 0.02 over 3
    windows; it issues each collective of process group 0 0.300 s after its fastest local peer
    (every 0.306 s); global ranks 0 spend 98 % of that time waiting for it"."""
    rank = attributes.get(A.STRAGGLER_RANK)
    text = f"global rank {rank} is a straggler"
    score, windows = attributes.get(A.STRAGGLER_SCORE), attributes.get(A.STRAGGLER_WINDOWS)
    if isinstance(score, int | float):
        text += f": score {score:.2f}"
        text += f" over {windows} windows" if isinstance(windows, int) else ""
    lateness, interval = attributes.get(A.STRAGGLER_LATENESS), attributes.get(A.STRAGGLER_INTERVAL)
    if isinstance(lateness, int | float) and isinstance(interval, int | float):
        group = attributes.get(A.STRAGGLER_PROCESS_GROUP)
        of = f" of process group {group}" if group is not None else ""
        if attributes.get(A.STRAGGLER_BASIS) == INSIDE:
            text += (
                f"; its device spends {lateness:.3f} s less inside each collective{of} than"
                f" its local peer that spends the most (one every {interval:.3f} s)"
            )
        else:
            text += (
                f"; it issues each collective{of} {lateness:.3f} s after its fastest local peer"
                f" (every {interval:.3f} s)"
            )
    waiting = attributes.get(A.STRAGGLER_WAITING)
    share = attributes.get(A.STRAGGLER_WAITED_SHARE)
    if isinstance(waiting, tuple | list) and waiting and isinstance(share, int | float):
        ranks = ",".join(map(str, waiting))
        text += f"; global ranks {ranks} spend {share * 100:.0f} % of that time waiting for it"
    return text
