"""The timeline's output: the terminal's text and one self-contained HTML page, made from
:mod:`elastic_otel.cli.timeline.analysis`'s results. Here are only words, layout and colour:
what a job's records mean is decided there, never here.
"""
