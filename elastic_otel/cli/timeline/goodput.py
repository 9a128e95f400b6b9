"""The goodput of a run for the commands: its records (:mod:`.analysis.goodput`) and their
text and tables (:mod:`.render.goodput`)."""

from elastic_otel.cli.timeline.analysis.goodput import AttemptGoodput, goodput_records
from elastic_otel.cli.timeline.render.goodput import goodput_headlines, goodput_html, goodput_lines

__all__ = [
    "AttemptGoodput",
    "goodput_headlines",
    "goodput_html",
    "goodput_lines",
    "goodput_records",
]
