"""Goodput: what share of a job's wall time trained the model, and where the rest went.

Each agent accounts for its own wall time, attempt by attempt, from what its workers' progress
records say (marked steps and checkpoints) and what it saw itself (the failure, the recovery,
the job's end). Every rank marks the same steps, so every node computes the same breakdown
without talking to the others; only the node that ran global rank 0 reports it
(:class:`GoodputLedger`). Pure: no torch, no SDK, no clock (times are passed in).
Design, an attempt's points and the categories: ``docs/goodput.md`` (Attempts, Categories).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from elastic_otel.names import attributes as A
from elastic_otel.parsing.worker_progress import WorkerProgress

CATEGORIES = A.BADPUT_CATEGORIES
_ABSENT = {A.BADPUT_TEARDOWN: 0.0}
"""Categories a summary may lack (an older release's), and what they count then."""
_MAX_STALLS = 256
"""Stall intervals kept per attempt (the oldest are merged into one)."""


@dataclass(frozen=True, slots=True)
class Steps:
    """What a node's local ranks marked in one attempt, combined (times in ns)."""

    first_step: int | None = None
    first_step_ns: int | None = None
    last_step: int | None = None
    last_step_ns: int | None = None
    checkpoint_step: int | None = None
    checkpoint_ns: int | None = None
    save_ns: int = 0
    saves: int = 0
    progress_ns: int = 0


def combine(readings: Iterable[WorkerProgress]) -> Steps:
    """The local ranks' records as one: the earliest first step, the furthest step and
    checkpoint (the earliest rank to reach each), the longest save time (a save blocks the job
    as long as its slowest rank), the latest progress."""
    readings = list(readings)
    firsts = [(r.first_step_ns, r.first_step) for r in readings if r.first_step_ns is not None]
    lasts = [(r.step, r.step_ns) for r in readings if r.step is not None and r.step_ns]
    checkpoints = [
        (r.checkpoint_step, r.checkpoint_ns)
        for r in readings
        if r.checkpoint_step is not None and r.checkpoint_ns
    ]
    first_ns, first = min(firsts) if firsts else (None, None)
    last = max(s for s, _ in lasts) if lasts else None
    last_ns = min(t for s, t in lasts if s == last) if lasts else None
    checkpoint = max(s for s, _ in checkpoints) if checkpoints else None
    checkpoint_ns = min(t for s, t in checkpoints if s == checkpoint) if checkpoints else None
    return Steps(
        first_step=first,
        first_step_ns=first_ns,
        last_step=last,
        last_step_ns=last_ns,
        checkpoint_step=checkpoint,
        checkpoint_ns=checkpoint_ns,
        save_ns=max((r.save_ns for r in readings), default=0),
        saves=max((r.saves for r in readings), default=0),
        progress_ns=max((r.progress_ns for r in readings), default=0),
    )


class StallTracker:
    """Intervals of ``after_ns`` or more without progress, from successive readings of the
    latest progress (once training began)."""

    def __init__(self, after_ns: int) -> None:
        self.after_ns = after_ns
        self.intervals: list[tuple[int, int]] = []
        self._last = 0  # the latest progress seen once training began (0: not yet)
        self._stalled = False  # a reading saw it without progress for after_ns

    def observe(self, now_ns: int, progress_ns: int, training: bool) -> None:
        if self.after_ns <= 0 or not training:
            return
        if not self._last:
            self._last = progress_ns
        elif progress_ns > self._last:
            if self._stalled:
                self._add(self._last, progress_ns)
            self._last, self._stalled = progress_ns, False
        elif now_ns - self._last >= self.after_ns:
            self._stalled = True

    def close(self, end_ns: int) -> None:
        """The attempt ended at ``end_ns``: a stall under way ends there."""
        if self.after_ns > 0 and self._last and end_ns - self._last >= self.after_ns:
            self._add(self._last, end_ns)
        self._last, self._stalled = 0, False

    def _add(self, start: int, end: int) -> None:
        self.intervals.append((start, end))
        if len(self.intervals) > _MAX_STALLS:
            (a, _), (_, b) = self.intervals[0], self.intervals[1]
            self.intervals[:2] = [(a, b)]


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """What one attempt's accounting needs (times in ns on the node's clock)."""

    attempt: int
    start_ns: int
    end_ns: int
    steps: Steps
    restarted: bool
    """A restart followed: what came after the last checkpoint is redone."""
    failure_ns: int | None = None
    """When the failure that ended it happened (``None``: the end, as on a node whose workers
    did not fail)."""
    stalls: tuple[tuple[int, int], ...] = ()
    resumed_from: int | None = None
    final: bool = False
    """No restart follows: the time after the failure is its teardown, not a recovery."""
    """The checkpoint step the job had before this attempt (``None``: none known)."""


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Seconds of wall time, productive and per badput category; they add up to ``wall_s``."""

    wall_s: float = 0.0
    productive_s: float = 0.0
    badput_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    lost_steps: tuple[int, int] | None = None
    """First and last step a restart redoes (``None``: none)."""
    lost_ns: tuple[int, int] | None = None
    """When the progress a restart redoes began and ended (``None``: none lost)."""

    @property
    def ratio(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def __add__(self, other: Breakdown) -> Breakdown:
        return Breakdown(
            wall_s=self.wall_s + other.wall_s,
            productive_s=self.productive_s + other.productive_s,
            badput_s={
                c: self.badput_s.get(c, 0.0) + other.badput_s.get(c, 0.0) for c in CATEGORIES
            },
        )


def total(breakdowns: Iterable[Breakdown]) -> Breakdown:
    out = Breakdown()
    for breakdown in breakdowns:
        out = out + breakdown
    return out


def account(facts: AttemptFacts) -> Breakdown:
    """One attempt's breakdown (the categories: ``docs/goodput.md``)."""
    start = facts.start_ns
    end = max(facts.end_ns, start)
    steps = facts.steps
    ns = dict.fromkeys(CATEGORIES, 0)
    head = A.BADPUT_STARTUP if facts.attempt == 0 else A.BADPUT_RECOVERY
    tail = A.BADPUT_TEARDOWN if facts.final else A.BADPUT_RECOVERY  # after the failure

    def at(t: int | None, low: int) -> int:
        return min(max(t if t is not None else low, low), end)

    if steps.first_step_ns is None:  # the head until the failure (X, else E), recovery after
        failed = facts.failure_ns if facts.restarted and facts.failure_ns is not None else end
        cut = at(failed, start)
        ns[head] += cut - start
        ns[tail] += end - cut
        return _breakdown(end - start, 0, ns, None)
    first = at(steps.first_step_ns, start)
    last = at(steps.last_step_ns, first)
    checkpoint = steps.checkpoint_ns if steps.checkpoint_step is not None else None
    lost_steps = None
    lost_ns = None
    ns[head] += first - start
    if facts.restarted:
        safe_end = at(checkpoint, first)
        failed = at(facts.failure_ns if facts.failure_ns is not None else end, max(last, safe_end))
        lost = failed - safe_end
        lost_ns = (safe_end, failed) if lost > 0 else None
        ns[tail] += end - failed
        stalled_lost = min(_overlap(facts.stalls, safe_end, failed), lost)
        ns[A.BADPUT_STALL] += stalled_lost
        ns[A.BADPUT_LOST_PROGRESS] += lost - stalled_lost
        kept = steps.checkpoint_step if checkpoint is not None else _before(steps.first_step)
        if kept is not None and steps.last_step is not None and steps.last_step > kept:
            lost_steps = (kept + 1, steps.last_step)
    else:
        safe_end = at(max(last, checkpoint or 0), first)
        ns[A.BADPUT_UNEXPLAINED] += end - safe_end
    safe = safe_end - first
    saves = min(max(steps.save_ns, 0), safe)
    stalled = min(_overlap(facts.stalls, first, safe_end), safe - saves)
    ns[A.BADPUT_CHECKPOINT] += saves
    ns[A.BADPUT_STALL] += stalled
    out = _breakdown(end - start, safe - saves - stalled, ns, lost_steps)
    return replace(out, lost_ns=lost_ns) if lost_ns is not None else out


def _before(step: int | None) -> int | None:
    return step - 1 if step is not None else None


def _breakdown(
    wall_ns: int, productive_ns: int, ns: dict[str, int], lost: tuple[int, int] | None
) -> Breakdown:
    return Breakdown(
        wall_s=wall_ns / 1e9,
        productive_s=productive_ns / 1e9,
        badput_s={c: ns[c] / 1e9 for c in CATEGORIES},
        lost_steps=lost,
    )


def _overlap(intervals: Sequence[tuple[int, int]], start: int, end: int) -> int:
    return sum(max(0, min(b, end) - max(a, start)) for a, b in intervals)


def describe(breakdown: Breakdown) -> str:
    """``goodput 81.0 % of 62.3 s; badput: startup 6.0 %, recovery 8.0 %, …`` (categories
    with no time left out)."""
    wall = breakdown.wall_s
    parts = [
        f"{c} {100 * s / wall:.1f} %" for c, s in breakdown.badput_s.items() if s > 0 and wall > 0
    ]
    text = f"goodput {100 * breakdown.ratio:.1f} % of {wall:.1f} s"
    if parts:
        text += "; badput: " + ", ".join(parts)
    if breakdown.lost_steps is not None:
        first, last = breakdown.lost_steps
        text += f"; steps {first}-{last} lost" if last > first else f"; step {first} lost"
    return text


@dataclass(frozen=True, slots=True)
class Summary:
    """The end of one attempt: its breakdown, the job's so far, and whether to report it."""

    facts: AttemptFacts
    attempt: Breakdown
    job: Breakdown
    final: bool
    reporter: bool
    """This node ran global rank 0 in the attempt: it reports (once per job)."""

    def attributes(self) -> dict[str, object]:
        """The summary log record's attributes (see docs/goodput.md)."""
        a, job, steps = self.attempt, self.job, self.facts.steps
        out: dict[str, object] = {
            A.GOODPUT_ATTEMPT: self.facts.attempt,
            A.GOODPUT_FINAL: self.final,
            A.GOODPUT_RATIO: round(a.ratio, 6),
            A.GOODPUT_SECONDS: round(a.productive_s, 6),
            A.GOODPUT_WALL_SECONDS: round(a.wall_s, 6),
            A.GOODPUT_JOB_RATIO: round(job.ratio, 6),
            A.GOODPUT_JOB_SECONDS: round(job.productive_s, 6),
            A.GOODPUT_JOB_WALL_SECONDS: round(job.wall_s, 6),
            A.GOODPUT_SAVES: steps.saves,
        }
        for category in CATEGORIES:
            out[A.badput_seconds_key(category)] = round(a.badput_s[category], 6)
            out[A.badput_seconds_key(category, job=True)] = round(job.badput_s[category], 6)
        optional = {
            A.GOODPUT_FIRST_STEP: steps.first_step,
            A.GOODPUT_LAST_STEP: steps.last_step,
            A.GOODPUT_CHECKPOINT_STEP: steps.checkpoint_step,
        }
        if a.lost_steps is not None:
            optional[A.GOODPUT_LOST_STEPS_FIRST], optional[A.GOODPUT_LOST_STEPS_LAST] = a.lost_steps
        if a.lost_ns is not None:
            optional[A.GOODPUT_LOST_START], optional[A.GOODPUT_LOST_END] = a.lost_ns
        out.update({k: v for k, v in optional.items() if v is not None})
        return out


class GoodputLedger:
    """One agent's accounting: attempts begun and ended, the job so far.

    ``reported`` holds the attempts this node reported (it ran global rank 0 in them): their
    sum over every node of the job counts each attempt once, which is what the badput counter
    exports; ``job()`` is this node's own view of the whole job, for the ratio.
    """

    def __init__(self, start_ns: int, stall_after_ns: int = 0) -> None:
        self.start_ns = start_ns
        self.stall_after_ns = stall_after_ns
        self._ended = 0  # attempts ended
        self._job = Breakdown()  # their sum: this node's view of the job (a running total,
        # so that a job of thousands of restarts keeps nothing per attempt)
        self.reported = Breakdown()
        self._open_start = start_ns
        self._open_reporter = False
        self._open = False
        self._stalls = StallTracker(stall_after_ns)
        self._checkpoint: int | None = None  # the latest checkpoint step of the job

    @property
    def attempt(self) -> int:
        """Attempts ended so far: the number of the one under way (0: the first)."""
        return self._ended

    @property
    def open(self) -> bool:
        return self._open

    @property
    def reporter(self) -> bool:
        """Whether this node reports now: it runs global rank 0 in the attempt under way (or
        in the last one, between attempts)."""
        return self._open_reporter

    def begin(self, global_ranks: Iterable[int]) -> None:
        """Workers started: the current attempt has them (it began at the last end)."""
        self._open = True
        self._open_reporter = 0 in set(global_ranks)

    def observe(self, now_ns: int, readings: list[WorkerProgress]) -> None:
        """A reading of the workers' records while the attempt runs (for stalls)."""
        if not self._open or not readings:
            return
        steps = combine(readings)
        training = steps.first_step is not None or any(r.entered for r in readings)
        self._stalls.observe(now_ns, steps.progress_ns, training)

    def end(
        self,
        end_ns: int,
        readings: list[WorkerProgress],
        restarted: bool,
        failure_ns: int | None = None,
        final: bool | None = None,
    ) -> Summary:
        """The attempt ended at ``end_ns`` (the recovery's start, or the job's end).
        ``restarted``: what came after its last checkpoint is lost (a restart follows, or the
        job failed); ``final``: the job ended (default: when no restart follows)."""
        steps = combine(readings)
        stop = failure_ns if restarted and failure_ns is not None else end_ns
        final = not restarted if final is None else final
        self._stalls.close(max(stop, steps.progress_ns))
        facts = AttemptFacts(
            attempt=self.attempt,
            start_ns=self._open_start,
            end_ns=end_ns,
            steps=steps,
            restarted=restarted,
            failure_ns=failure_ns,
            stalls=tuple(self._stalls.intervals),
            resumed_from=self._checkpoint,
            final=final,
        )
        breakdown = account(facts)
        self._job = self._job + breakdown
        summary = Summary(facts, breakdown, self._job, final, self._open_reporter)
        self._ended += 1
        if summary.reporter:
            self.reported = self.reported + breakdown
        if steps.checkpoint_step is not None:
            self._checkpoint = steps.checkpoint_step
        self._open_start = max(end_ns, self._open_start)
        self._open = False
        self._stalls = StallTracker(self.stall_after_ns)
        return summary

    def job(self) -> Breakdown:
        """This node's view of the job's ended attempts."""
        return self._job

    def live(self, now_ns: int, readings: list[WorkerProgress]) -> Breakdown:
        """The attempt under way, up to its latest step or checkpoint (before its first step:
        up to now): what is known of it without guessing how it ends. Empty when none runs."""
        if not self._open:
            return Breakdown()
        steps = combine(readings)
        if steps.first_step_ns is None:
            end = now_ns
        else:
            end = max(steps.last_step_ns or 0, steps.checkpoint_ns or 0, steps.first_step_ns)
        facts = AttemptFacts(
            attempt=self.attempt,
            start_ns=self._open_start,
            end_ns=min(end, now_ns),
            steps=steps,
            restarted=False,
            stalls=tuple(self._stalls.intervals),
        )
        return account(facts)


def from_attributes(attrs: Mapping[str, object], job: bool = False) -> Breakdown | None:
    """The breakdown a summary record carries (the attempt's, or the job's so far); ``None``
    when it lacks one."""
    ratio_key = A.GOODPUT_JOB_SECONDS if job else A.GOODPUT_SECONDS
    wall_key = A.GOODPUT_JOB_WALL_SECONDS if job else A.GOODPUT_WALL_SECONDS
    values = [attrs.get(ratio_key), attrs.get(wall_key)]
    # teardown: absent from the summaries of releases before it (none counted then)
    values += [attrs.get(A.badput_seconds_key(c, job), _ABSENT.get(c)) for c in CATEGORIES]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return None
    numbers = [float(v) for v in values]  # type: ignore[arg-type]
    lost = lost_ns = None
    first, last = attrs.get(A.GOODPUT_LOST_STEPS_FIRST), attrs.get(A.GOODPUT_LOST_STEPS_LAST)
    if not job and isinstance(first, int) and isinstance(last, int):
        lost = (first, last)
    begin, end = attrs.get(A.GOODPUT_LOST_START), attrs.get(A.GOODPUT_LOST_END)
    if not job and isinstance(begin, int) and isinstance(end, int) and begin <= end:
        lost_ns = (begin, end)
    return Breakdown(
        wall_s=numbers[1],
        productive_s=numbers[0],
        badput_s=dict(zip(CATEGORIES, numbers[2:], strict=True)),
        lost_steps=lost,
        lost_ns=lost_ns,
    )


def describe_summary(attrs: Mapping[str, object]) -> str:
    """The summary record's body: the attempt's breakdown, then the job's so far."""
    attempt, job = from_attributes(attrs), from_attributes(attrs, job=True)
    if attempt is None or job is None:
        return A.GOODPUT_EVENT_NAME
    number = attrs.get(A.GOODPUT_ATTEMPT)
    return f"attempt {number}: {describe(attempt)}. Job so far: {describe(job)}"
