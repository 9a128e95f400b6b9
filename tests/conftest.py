"""Collection order and markers for the suite; fixtures: ``tests/support/fixtures.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.support.fixtures"]

SLOWEST_FIRST = (  # measured (seconds per file, run alone on 2 cores), slowest first
    "test_hangs_ddp.py",  # 68 s (48 CPU-seconds)
    "test_reliability.py",  # 64 s (54)
    "test_fork_safety.py",  # 48 s (48)
    "test_hangs.py",  # 44 s (41)
    "test_host_loss.py",  # 41 s (13)
    "test_root_cause.py",  # 39 s (50)
    "test_registration.py",  # 38 s (32)
    "test_cli_demo.py",  # 36 s (35)
    "test_e2e_torchrun.py",  # 35 s (30)
    "test_rendezvous_backends.py",  # 33 s (33)
    "test_straggler_jobs.py",  # 30 s (26)
    "test_replay.py",  # 29 s (38)
    "test_security.py",  # 28 s (20)
    "test_goodput_job.py",  # 26 s (24)
    "test_sigterm_blocked.py",  # 26 s (20)
    "test_agent_outcomes.py",  # 26 s (31)
    "test_worker_output_job.py",  # 21 s (21)
    "test_torch_rendezvous.py",  # 19 s (7)
    "test_instrument.py",  # 15 s (18)
    "test_bad_input.py",  # 14 s (15)
    "test_stalls.py",  # 13 s (4)
    "test_metrics.py",  # 12 s (9)
    "test_rotel.py",  # 11 s (7)
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
