"""A job's :class:`~elastic_otel.cli.timeline.analysis.timeline.Timeline` from its exported
spans and logs: the rounds and node rows (:mod:`.rounds`), each round's failure, stalls,
stragglers, slowdowns, slow links and lost progress, the per-run summaries (:mod:`.runs`), the
goodput records and the error log records, each joined to its round and node. A record the
backend holds twice (delivery is at least once) is read once.
"""

from __future__ import annotations

from collections.abc import Iterable

from elastic_otel.cli.timeline.analysis.failures import Failure
from elastic_otel.cli.timeline.analysis.goodput import goodput_records
from elastic_otel.cli.timeline.analysis.items import (
    Item,
    distinct,
    instance_id,
    source_event_name,
    with_last_words,
    with_logged_exceptions,
)
from elastic_otel.cli.timeline.analysis.lost import lost_spans
from elastic_otel.cli.timeline.analysis.rounds import ROW_SPANS, RoundBuilder
from elastic_otel.cli.timeline.analysis.runs import RunSummary, summarize
from elastic_otel.cli.timeline.analysis.slowdowns import LinkFinding, Slowdown, links, slowdowns
from elastic_otel.cli.timeline.analysis.stalls import Stall, stalled_root, stalls
from elastic_otel.cli.timeline.analysis.stragglers import StragglerSpell, stragglers
from elastic_otel.cli.timeline.analysis.timeline import ErrorNote, LostProgress, Round, Timeline
from elastic_otel.model.stalls import TRAINING
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import STATUS_PREFIX

_ERROR_SEVERITY = 17


def build_timeline(spans: Iterable[Item], logs: Iterable[Item] = ()) -> Timeline:
    """Group spans and logs by round and node (as
    :func:`~elastic_otel.cli.otlp_json_reader.read_otlp_json` returns them)."""
    spans, logs = in_round_traces(distinct(spans), distinct(logs))
    spans += lost_spans(spans, logs)
    spans = with_last_words(with_logged_exceptions(spans, logs), logs)
    spans = [_with_resource_identity(s) for s in spans]
    builder = RoundBuilder()
    rdzv = [s for s in spans if s["name"] in (A.SPAN_RDZV_JOIN, A.SPAN_RDZV_MEMBER)]
    for span in sorted(rdzv, key=lambda s: s["start_ns"]):
        builder.add_rendezvous(span)
    recoveries = {s["span_id"] for s in spans if s["name"] == A.SPAN_AGENT_RECOVERY}
    others = [s for s in spans if s["name"] in ROW_SPANS and s["parent_span_id"] not in recoveries]
    for span in sorted(others, key=lambda s: s["start_ns"]):
        builder.add_agent_span(span)
    runs = summarize(spans)
    # After the agents' spans: a round's label comes from its workers, not from a recovery.
    recovery_of = {r.span_id: r for run in runs for r in run.recoveries}
    for span in spans:
        if span["span_id"] in recovery_of and span["name"] == A.SPAN_AGENT_RECOVERY:
            builder.add_recovery(span, recovery_of[span["span_id"]])
    rounds = builder.finish()
    failures = {f.trace_id: f for run in runs for f in run.failures}
    for rnd in rounds:
        traces = {w.trace_id for n in rnd.nodes for w in n.workers}
        rnd.failure = next((failures[t] for t in sorted(traces) if t in failures), None)
    _add_stalls_and_stragglers(spans, logs, builder, rounds, runs)
    _add_stalled_roots(rounds, runs)
    times = [s["start_ns"] for s in spans] + [s["end_ns"] for s in spans]
    times += [r["time_ns"] for r in logs if r.get("time_ns")]
    times = [t for t in times if t]
    timeline = Timeline(rounds, min(times, default=0), max(times, default=0))
    timeline.errors = _errors(logs, builder)
    timeline.runs = runs
    timeline.goodput = goodput_records(logs)
    _add_lost_progress(timeline, builder)
    return timeline


def _add_stalled_roots(rounds: list[Round], runs: list[RunSummary]) -> None:
    """A round whose training stall named the rank the others waited for, in which no worker
    failed on its own, and which ended the job (an agent's run FAILED: a scheduler's signal
    during the stall) or ended its workers after a peer's failure: that rank is its root
    cause (its latest such stall's)."""
    by_run = {run.run_id: run for run in runs}
    for rnd in rounds:
        named = [s for s in rnd.stalls if s.kind == TRAINING and s.waited_for]
        failure = rnd.failure
        if not named or (failure is not None and failure.root is not None):
            continue
        if failure is None and not rnd.outcome.job_failed:
            continue
        stall = max(named, key=lambda s: s.end_ns)
        root = stalled_root(stall)
        if root is None:
            continue
        if failure is None:
            failure = Failure(stall.trace_id, rnd.number, [], [])
            rnd.failure = failure
            run = by_run.get(rnd.run_id)
            if run is not None:
                run.failures.append(failure)
        failure.stalled = root
    for run in runs:
        run.failures.sort(key=lambda f: f.time_ns)


def _add_lost_progress(timeline: Timeline, builder: RoundBuilder) -> None:
    """Mark each failure's lost progress on the round (trace) its summary record is in."""
    for item in timeline.goodput:
        lost = item.breakdown.lost_ns
        if lost is None:
            continue
        for rnd in timeline.rounds:
            traces = {w.trace_id for n in rnd.nodes for w in n.workers}
            if item.trace_id in traces:
                node = builder.span_node.get(item.span_id, "")
                rnd.lost.append(LostProgress(node, lost[0], lost[1], item.attempt, item.breakdown))
                break


def in_round_traces(spans: list[Item], logs: list[Item]) -> tuple[list[Item], list[Item]]:
    """Both trace layouts as one picture: in a large round each node's spans have a trace of
    their own (docs/trace-model.md, "Large jobs"); here they, and their logs, take the round's
    trace id again, found on the member span's link back to it. The round's own copies of
    root-cause failures (``worker.failure``) are left out: their ``worker`` spans are here."""
    round_of: dict[str, str] = {}
    for span in spans:
        if span["name"] != A.SPAN_RDZV_MEMBER:
            continue
        for link in span.get("links", ()):
            if link.get("attributes", {}).get(A.LINK_KIND) == A.LINK_ROUND:
                round_of[span["trace_id"]] = link["trace_id"]
    spans = [s for s in spans if s["name"] != A.SPAN_WORKER_FAILURE]
    if not round_of:
        return spans, logs

    def moved(item: Item) -> Item:
        trace = round_of.get(item.get("trace_id", ""))
        return item if trace is None else {**item, "trace_id": trace}

    return [moved(s) for s in spans], [moved(r) for r in logs]


def _with_resource_identity(span: Item) -> Item:
    """The node's host and pid, which the bridge leaves to the resource when they are the
    resource's (``elastic_otel.emit.emitter``), back among the span's attributes."""
    attributes, resource = span["attributes"], span.get("resource") or {}
    missing = {
        key: resource[key]
        for key in (A.HOST_NAME, A.PROCESS_PID)
        if key not in attributes and key in resource
    }
    return {**span, "attributes": {**attributes, **missing}} if missing else span


def _add_stalls_and_stragglers(
    spans: list[Item],
    logs: list[Item],
    builder: RoundBuilder,
    rounds: list[Round],
    runs: list[RunSummary],
) -> None:
    """Join the stall, straggler, slowdown and link reports per round and hand each to its round
    and its run.
    A report is on its node's span; without one (no rendezvous spans) its process names it."""
    by_instance = {
        instance_id(s): builder.span_node[s["span_id"]]
        for s in spans
        if s["span_id"] in builder.span_node and instance_id(s)
    }
    traces = {t: builder.rounds[key] for t, key in builder.trace_round.items()}
    traces.update({key[2]: rnd for key, rnd in builder.rounds.items() if key[1] == "trace"})
    numbers = {t: rnd.number for t, rnd in traces.items() if rnd.number is not None}
    nodes = {t: [n.label for n in rnd.nodes] for t, rnd in traces.items()}

    def node_of(record: Item) -> str:
        label = builder.span_node.get(str(record.get("span_id", "")))
        label = label or by_instance.get(instance_id(record))
        if label:
            return label
        host = record.get("attributes", {}).get(A.HOST_NAME)
        host = host or record.get("resource", {}).get(A.HOST_NAME)
        return str(host or "?")

    by_run = {run.run_id: run for run in runs}
    shown = {id(rnd) for rnd in rounds}
    found: dict[str, list[Stall] | list[StragglerSpell] | list[Slowdown] | list[LinkFinding]] = {
        "stalls": stalls(logs, node_of, numbers, nodes),
        "stragglers": stragglers(logs, node_of, numbers, nodes),
        "slowdowns": slowdowns(logs, node_of, numbers, nodes),
        "links": links(logs, node_of, numbers),
    }
    for field_name, reports in found.items():  # each on its round (when shown) and its run
        for report in reports:
            rnd = traces.get(report.trace_id)
            if rnd is not None and id(rnd) in shown:
                getattr(rnd, field_name).append(report)
            run = by_run.get(report.run_id)
            if run is not None:
                getattr(run, field_name).append(report)


def _errors(logs: list[Item], builder: RoundBuilder) -> list[ErrorNote]:
    notes = []
    for record in logs:
        if record.get("severity_number", 0) < _ERROR_SEVERITY:
            continue
        attrs = record.get("attributes", {})
        node = builder.span_node.get(record.get("span_id", "")) or str(attrs.get(A.HOST_NAME, ""))
        source = attrs.get(A.EVENT_SOURCE)
        rank = attrs.get(A.GLOBAL_RANK)
        message = str(record.get("body", ""))
        if "\n" in message:  # a worker's whole traceback: its exception below says it in a line
            message = source_event_name(record) or message.strip().splitlines()[-1]
        if message.startswith(STATUS_PREFIX):
            message = message[len(STATUS_PREFIX) :]
        error = ": ".join(
            str(attrs[k]) for k in (A.EXCEPTION_TYPE, A.EXCEPTION_MESSAGE) if k in attrs
        )
        notes.append(
            ErrorNote(
                record.get("time_ns", 0),
                node,
                f"{message}: {error}" if error else message,
                "" if source is None else str(source),
                None if rank is None else str(rank),
            )
        )
    notes.sort(key=lambda n: n.time_ns)
    return notes
