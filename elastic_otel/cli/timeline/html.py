"""The timeline's HTML page for the commands: :mod:`.render.html`, and the data its chart
draws (:mod:`.render.chart`)."""

from elastic_otel.cli.timeline.render.chart import timeline_data
from elastic_otel.cli.timeline.render.html import render_html

__all__ = ["render_html", "timeline_data"]
