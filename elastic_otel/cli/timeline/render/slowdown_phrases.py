"""The words for slowdowns and slow links: when a process group slowed, by how much and in which
part, what it cost, and the link, node, fabric or NIC named for it, shared by the text and the
HTML page."""

from __future__ import annotations

import datetime

from elastic_otel.cli.timeline.analysis.slowdowns import (
    LOCAL,
    LinkFinding,
    LinkReport,
    Slowdown,
    SlowdownReport,
)
from elastic_otel.cli.timeline.render.phrases import Rel

COMMUNICATION = "communication"
SAMPLED = "sampled"


def clock(ns: int) -> str:
    """``12:01:14``: a time of day in UTC, as the records' ``began`` says it."""
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).strftime("%H:%M:%S")


def secs(value: float) -> str:
    """``48``, ``0.41``, ``0.0052``: seconds to the digits that matter."""
    if value >= 10:
        return f"{value:.0f}"
    return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"


def _short(value: float) -> str:
    """``110``, ``3.5``, ``0.06``."""
    if value >= 10 or value == 0:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def slowdown_what(slowdown: Slowdown) -> str:
    """``process group 0 from 12:01:14 for 48 s``."""
    latest = slowdown.latest
    so_far = "" if slowdown.ended else " so far"
    return (
        f"process group {slowdown.group} from {clock(slowdown.start_ns)} for"
        f" {secs(latest.seconds)} s{so_far}"
    )


def interval_text(report: SlowdownReport) -> str:
    """``collectives every 0.41 s (2.0x the 0.21 s before)``."""
    if report.interval_now_s is None:
        return ""
    text = f"collectives every {secs(report.interval_now_s)} s"
    if report.ratio is not None and report.interval_before_s is not None:
        text += f" ({report.ratio:.1f}x the {secs(report.interval_before_s)} s before)"
    return text


def inside_text(report: SlowdownReport) -> str:
    """``0.30 s inside each (4.1x, sampled)``: sampled from the collectives' open time, not
    timed by the device."""
    if report.inside_now_s is None:
        return ""
    notes = [f"{report.inside_ratio:.1f}x"] if report.inside_ratio is not None else []
    notes += [SAMPLED] if report.basis == SAMPLED else []
    note = f" ({', '.join(notes)})" if notes else ""
    return f"{secs(report.inside_now_s)} s inside each{note}"


def alike_text(report: SlowdownReport) -> str:
    """``every rank alike`` for a communication slowdown (no rank is its cause)."""
    if report.part != COMMUNICATION or report.alike is None:
        return ""
    return "every rank alike" if report.alike else "not every rank alike"


def slowdown_facts(slowdown: Slowdown) -> str:
    """``collectives every 0.41 s (1.9x the 0.21 s before), 0.30 s inside each (4.1x), every
    rank alike: communication; 19.6 s of training lost``."""
    r = slowdown.latest
    text = ", ".join(p for p in (interval_text(r), inside_text(r), alike_text(r)) if p)
    if r.part:
        text += f": {r.part}" if text else r.part
    if r.lost_s is not None:
        text += f"; {r.lost_s:.1f} s of training lost" + ("" if slowdown.ended else " so far")
    return text


def slowdown_text(slowdown: Slowdown) -> str:
    """A slowdown in the run summary: ``process group 0 from 12:01:14 for 48 s, 1.9x slower,
    communication, 19.6 s lost``."""
    r = slowdown.latest
    parts = [slowdown_what(slowdown)]
    if r.ratio is not None:
        parts.append(f"{r.ratio:.1f}x slower")
    if r.part:
        parts.append(r.part)
    if r.lost_s is not None:
        parts.append(f"{r.lost_s:.1f} s lost")
    return ", ".join(parts)


def slowdown_line(slowdown: Slowdown) -> str:
    """A slowdown below its round: ``SLOWDOWN of process group 0 from 12:01:14 for 48 s:
    collectives every 0.41 s (1.9x the 0.21 s before), ...; 19.6 s of training lost``."""
    facts = slowdown_facts(slowdown)
    return f"SLOWDOWN of {slowdown_what(slowdown)}" + (f": {facts}" if facts else "")


def slowdown_when(slowdown: Slowdown, rel: Rel) -> str:
    """``round 0, +61.000s to +109.000s, ended; seen by node-a pid 100, node-b pid 200``."""
    where = f"round {slowdown.round}, " if slowdown.round is not None else ""
    end = "ended" if slowdown.ended else "last reported"
    text = f"{where}from {rel(slowdown.start_ns)}, {end} at {rel(slowdown.end_ns)}"
    return text + f"; seen by {', '.join(slowdown.seen_by)}"


def _named(report: LinkReport) -> list[str]:
    """``host-b (10.1.0.12)`` for each node named."""
    names = []
    for i, host in enumerate(report.hosts):
        address = report.addresses[i] if i < len(report.addresses) else ""
        names.append(f"{host} ({address})" if address and address != host else host)
    return names or [f"{address}" for address in report.addresses]


def link_head(report: LinkReport) -> str:
    """What is named: ``host-b (10.1.0.12)``, ``the link between host-a (10.1.0.11) and host-b
    (10.1.0.12)``, ``every link (the fabric)``, ``host-b's RDMA port mlx5_0/1``."""
    named = _named(report)
    if report.scope == "link":
        return "the link between " + " and ".join(named) if named else "a link"
    if report.scope == "fabric":
        return "every link (the fabric, a switch)"
    if report.scope == "nic":
        owner = f"{named[0]}'s " if named else ""
        return f"{owner}RDMA port {report.device or '?'}"
    return ", ".join(named) or "?"


def link_stats(report: LinkReport) -> str:
    """``its connections to every peer deliver 0.06 MB/s (the others 110 MB/s), RTT 420 ms
    (0.1 ms), 31 retransmits/s``; a pipeline's edges: ``its sends and receives move at best
    450 MB/s (the others 10000 MB/s)``; an RDMA port's rate, state and counters that moved."""
    subject = {
        "node": "its connections to every peer",
        "link": "its connections",
        LOCAL: f"its connection to {report.peer}" if report.peer else "its worst connection",
    }.get(report.scope, "connections")
    single = report.scope == LOCAL
    verb = "delivers" if single else "deliver"
    if report.transport == "p2p" and not single:
        subject, verb = "its sends and receives", "move at best"
    others = "its others" if single else "the others"
    parts = []
    if report.rate is not None:
        text = f"{subject} {verb} {_short(report.rate / 1e6)} MB/s"
        if report.rate_others is not None:
            text += f" ({others} {_short(report.rate_others / 1e6)} MB/s)"
        parts.append(text)
    if report.rtt_s is not None:
        text = f"RTT {_short(report.rtt_s * 1000)} ms"
        if report.rtt_others_s is not None:
            text += f" ({_short(report.rtt_others_s * 1000)} ms)"
        parts.append(text)
    if report.retransmits is not None:
        text = f"{_short(report.retransmits)} retransmits/s"
        if report.retransmits_others is not None:
            text += f" ({_short(report.retransmits_others)}/s)"
        parts.append(text)
    port = [p for p in (report.rdma_rate, report.rdma_state) if p]
    if report.device and report.scope != "nic":
        port.insert(0, f"RDMA port {report.device}")
    if port:
        parts.append(", ".join(port))
    if report.counters:
        parts.append(" ".join(report.counters))
    return ", ".join(parts)


def link_line(finding: LinkFinding) -> str:
    """A finding below its round: ``SLOW LINK host-b (10.1.0.12): its connections to every peer
    deliver 0.06 MB/s (the others 110 MB/s), RTT 420 ms (0.1 ms), 31 retransmits/s``; a node's
    own evidence: ``LINK EVIDENCE from node-b pid 200: its connection to 10.1.0.11 ...``."""
    r = finding.latest
    stats = link_stats(r)
    if finding.local:
        return f"LINK EVIDENCE from {r.node}" + (f": {stats}" if stats else "")
    return f"SLOW LINK {link_head(r)}" + (f": {stats}" if stats else "")


def link_text(finding: LinkFinding) -> str:
    """A finding in the run summary: ``host-b (10.1.0.12), node, tcp``."""
    r = finding.latest
    return ", ".join(p for p in (link_head(r), r.scope, r.transport) if p)


def link_when(finding: LinkFinding, rel: Rel) -> str:
    """``tcp, from node-a pid 100, round 0, reported +70.000s to +100.000s``."""
    r = finding.latest
    where = f"round {finding.round}, " if finding.round is not None else ""
    by = f"{r.transport + ', ' if r.transport else ''}{'' if finding.local else f'from {r.node}, '}"
    if len(finding.reports) == 1:
        return f"{by}{where}reported at {rel(finding.start_ns)}"
    return f"{by}{where}reported {rel(finding.start_ns)} to {rel(finding.end_ns)}"
