"""Collection order and markers for the suite; fixtures: ``tests/support/fixtures.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.support.fixtures"]

SLOWEST_FIRST = (  # measured (pytest --junitxml: seconds per file), slowest first
    "test_e2e_torchrun.py",
    "test_reliability.py",
    "test_sigterm_blocked.py",
    "test_rendezvous_backends.py",
    "test_fork_safety.py",
    "test_hangs_ddp.py",
    "test_straggler_jobs.py",
    "test_root_cause.py",
    "test_registration.py",
    "test_hangs.py",
    "test_host_loss.py",
    "test_replay.py",
    "test_instrument.py",
    "test_cli_demo.py",
    "test_agent_outcomes.py",
    "test_trace_layout.py",
    "test_recovery.py",
    "test_goodput_job.py",
    "test_bad_input.py",
    "test_security.py",
    "test_torch_rendezvous.py",
    "test_job_attempts.py",
    "test_stalls.py",
)
"""The files that take longest, started first: with ``-n N --dist loadfile`` each worker takes
whole files in collection order, so a long file collected last would run alone at the end while
the other workers idle."""


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist hands out files with the most tests first unless told not to, which put
    the longest file (three tests) near the end of a run: keep the order above instead."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/e2e/ is marked ``e2e`` (real torchrun jobs, receivers, collectors):
    ``pytest tests/unit`` and ``pytest -m "not e2e"`` run the same fast tests. The slowest
    files come first (:data:`SLOWEST_FIRST`), the rest in their usual order."""
    e2e = Path(__file__).parent / "e2e"
    for item in items:
        if e2e in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))
