"""What an exported job says, as plain typed results: its rounds, nodes and workers, and per
run its failures and their root causes, restarts and recoveries, stalls, stragglers and goodput.

Everything here reads OTLP items (spans and log records as
:func:`~elastic_otel.cli.otlp_json_reader.read_otlp_json` returns them) and returns data; the
words and the page are :mod:`elastic_otel.cli.timeline.render`'s, which imports this package and
never the reverse.
"""
