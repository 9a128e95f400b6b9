"""Benchmark suite for elastic-otel (issue 5): ``python -m benchmarks.run [--quick]``.

Every section runs its measured code in fresh subprocesses (one per variant), talks to a
real OTLP receiver in another process, and returns plain data; the section's module renders
it too, and :mod:`benchmarks.report` composes the sections into ``BENCHMARKS.md``. Nothing
here is collected by the default test run; the quick variant is exercised by
``benchmarks/test_quick.py`` (its own step in ``.ci/run``).
"""
