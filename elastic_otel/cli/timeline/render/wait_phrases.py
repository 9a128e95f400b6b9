"""The words for stalls and stragglers: what the ranks wait in and for whom, and who keeps
its peers waiting, shared by the text and the HTML page."""

from __future__ import annotations

from elastic_otel.cli.timeline.analysis.stalls import Stall, StallReport
from elastic_otel.cli.timeline.analysis.stragglers import StragglerSpell
from elastic_otel.cli.timeline.render.phrases import Rel, global_ranks, ranks_text
from elastic_otel.model.stalls import STARTUP, TRAINING
from elastic_otel.model.stragglers import INSIDE


def stall_what(stall: Stall) -> str:
    """``62 s in all_reduce #4``; ``62 s in training`` (``in start-up``) when no rank is in a
    collective; ``120 s in rendezvous.join`` for an agent's wait."""
    collective, number = stall.collective
    what = f"{collective} #{number}" if collective and number else collective or phase_text(stall)
    return f"{stall.seconds:.0f} s in {what}"


def phase_text(stall: Stall) -> str:
    """``training``, ``start-up`` (before training began), or an agent's wait's kind."""
    return "start-up" if stall.phase == STARTUP else stall.kind


def waited_for_text(stall: Stall, detail: bool = True) -> str:
    """``waiting for global rank 1 on node-a (in hang at train.py:18)``; without ``detail``
    neither node nor frame. With no rank named, the nodes none of whose ranks wait."""
    named = stall.waited_for
    if named:
        items = []
        for rank, node in named:
            frame = stall.frame(rank) if detail else ""
            text = f"{rank} on {node}" if detail else str(rank)
            items.append(f"{text} (in {frame})" if frame else text)
        return f"waiting for {global_ranks(len(named))} {', '.join(items)}"
    if stall.suspects:
        return f"waiting for a rank on {', '.join(stall.suspects)}, where no rank waits in it"
    if stall.waiting:
        return "waiting for a rank no node names"
    return ""


def stall_text(stall: Stall) -> str:
    """A stall in the run summary: ``62 s in all_reduce #4, waiting for global rank 1``; an
    agent's wait: ``120 s in rendezvous.join on node-b``."""
    if stall.kind != TRAINING:
        return f"{stall_what(stall)} on {', '.join(r.node for r in stall.reports)}"
    waited = waited_for_text(stall, detail=False)
    return f"{stall_what(stall)}, {waited}" if waited else stall_what(stall)


def stall_line(stall: Stall) -> str:
    """A stall below its round: ``STALLED 62 s in all_reduce #4 (training): waiting for
    global rank 1 on node-a (in hang at train.py:18); global ranks 0 (node-a), 2, 3 (node-b)
    wait in it``; ``(start-up)`` before training began (``init_process_group``, the first
    collective). An agent's wait: ``STALLED in rendezvous.join: node-b 120 s, node-c 118 s``."""
    if stall.kind != TRAINING:
        nodes = ", ".join(f"{r.node} {r.seconds:.0f} s" for r in stall.reports)
        return f"STALLED in {stall.kind}: {nodes}"
    head = f"STALLED {stall_what(stall)}"
    if stall.collective[0]:
        head += f" ({phase_text(stall)})"
    parts = [waited_for_text(stall)]
    waiting = stall.waiting
    if waiting:
        verb = "waits" if len(waiting) == 1 else "wait"
        parts.append(f"{global_ranks(len(waiting))} {ranks_text(waiting)} {verb} in it")
    else:
        parts.append("no rank is in a collective")
    parts += [silence_text(r) for r in stall.reports if r.silent]
    return f"{head}: {'; '.join(p for p in parts if p)}"


def silence_text(report: StallReport) -> str:
    """What one node saw of the rendezvous keep-alives: ``node-b's keep-alives stopped (seen
    by node-a)``, or ``node-b reached no rendezvous store``."""
    if report.silent_self:
        return f"{report.node} reached no rendezvous store (its link may be cut)"
    return f"keep-alives stopped: {report.silent} (seen by {report.node})"


def stall_when(stall: Stall, rel: Rel) -> str:
    """``round 0, from +1.249s``."""
    where = f"round {stall.round}, " if stall.round is not None else ""
    return f"{where}from {rel(stall.start_ns)}"


def straggler_text(straggler: StragglerSpell) -> str:
    """``global rank 1 on node-a, score 0.02, 0.300 s late per collective of process group 0,
    its peers wait 98 % of the time``."""
    r = straggler.latest
    parts = [f"global rank {straggler.rank} on {straggler.node}", f"score {r.score:.2f}"]
    if r.lateness_s is not None:
        of = f" of process group {r.group}" if r.group else ""
        parts.append(f"{r.lateness_s:.3f} s late per collective{of}")
    if r.waited_share is not None:
        parts.append(f"its peers wait {r.waited_share * 100:.0f} % of the time")
    return ", ".join(parts)


def straggler_line(straggler: StragglerSpell) -> str:
    """A straggler below its round: ``STRAGGLER global rank 1 on node-a: score 0.02 (lowest
    0.01) over 13 windows; each collective of process group 0 0.300 s after its fastest local
    peer (one every 0.306 s); global rank 0 (node-a) waits 98 % of that time for it``."""
    r = straggler.latest
    head = f"STRAGGLER global rank {straggler.rank} on {straggler.node}: score {r.score:.2f}"
    if straggler.lowest < r.score:
        head += f" (lowest {straggler.lowest:.2f})"
    if r.windows is not None:
        head += f" over {r.windows} window{'s' if r.windows > 1 else ''}"
    parts = [head]
    if r.lateness_s is not None:
        of = f" of process group {r.group}" if r.group else ""
        every = f" (one every {r.interval_s:.3f} s)" if r.interval_s is not None else ""
        if r.basis == INSIDE:
            parts.append(
                f"its device {r.lateness_s:.3f} s less inside each collective{of} than its"
                f" local peer that spends the most{every}"
            )
        else:
            parts.append(
                f"each collective{of} {r.lateness_s:.3f} s after its fastest local peer{every}"
            )
    waiting = straggler.waiting
    if waiting and r.waited_share is not None:
        verb = "waits" if len(waiting) == 1 else "wait"
        parts.append(
            f"{global_ranks(len(waiting))} {ranks_text(waiting)} {verb} "
            f"{r.waited_share * 100:.0f} % of that time for it"
        )
    return "; ".join(parts)


def straggler_when(straggler: StragglerSpell, rel: Rel) -> str:
    """``round 0, reported +32.000s to +92.000s`` (``at`` for a single report)."""
    where = f"round {straggler.round}, " if straggler.round is not None else ""
    if len(straggler.reports) == 1:
        return f"{where}reported at {rel(straggler.start_ns)}"
    return f"{where}reported {rel(straggler.start_ns)} to {rel(straggler.end_ns)}"
