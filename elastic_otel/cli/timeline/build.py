"""The timeline's entry points for the commands (``elastic-otel timeline``, ``demo``): a job's
timeline from its spans and logs (:mod:`.analysis.build`), and as the terminal's text
(:mod:`.render.text`)."""

from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.analysis.timeline import Timeline
from elastic_otel.cli.timeline.render.text import render_text, use_color

__all__ = ["Timeline", "build_timeline", "render_text", "use_color"]
