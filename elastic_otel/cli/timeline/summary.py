"""The per-run summary for the commands: the analysis (:mod:`.analysis.runs`), its text
(:mod:`.render.summary`), and how a log record names its event."""

from elastic_otel.cli.timeline.analysis.items import source_event_name, union_ns
from elastic_otel.cli.timeline.analysis.runs import RunSummary, summarize
from elastic_otel.cli.timeline.render.summary import render_summary

__all__ = ["RunSummary", "render_summary", "source_event_name", "summarize", "union_ns"]
