"""Collection order and markers for the suite; fixtures: ``tests/support/fixtures.py``."""

from __future__ import annotations

import compileall
import os
import resource
from pathlib import Path

import pytest

pytest_plugins = ["tests.support.fixtures"]

SLOWEST_FIRST = (  # seconds per file in a whole run, loaded (CPU seconds: TESTS_CPU_LOG)
    "test_fork_safety.py",  # 160 s (70)
    "test_reliability.py",  # 150 s (68)
    "test_hangs_ddp.py",  # 121 s (75)
    "test_e2e_torchrun.py",  # 109 s (46)
    "test_rendezvous_backends.py",  # 109 s (45)
    "test_registration.py",  # 97 s (40)
    "test_sigterm_blocked.py",  # 90 s (25)
    "test_torch_rendezvous.py",  # 85 s (6)
    "test_security.py",  # 82 s (22)
    "test_root_cause.py",  # 78 s (72)
    "test_hangs.py",  # 74 s (61)
    "test_replay.py",  # 63 s (49)
    "test_cli_demo.py",  # 62 s (36)
    "test_host_loss.py",  # 49 s (22)
    "test_worker_output_job.py",  # 45 s (33)
    "test_instrument.py",  # 43 s (24)
    "test_straggler_jobs.py",  # 42 s (43)
    "test_agent_outcomes.py",  # 39 s (36)
    "test_goodput_job.py",  # 34 s (29)
    "test_bad_input.py",  # 31 s (17)
    "test_stalls.py",  # 15 s (3)
    "test_metrics.py",  # 12 s (4)
)
"""The files that take longest, started first: with ``-n N --dist loadfile`` each worker takes
whole files in collection order, so a long file collected last would run alone at the end while
the other workers idle. On two cores the suite is CPU-bound (each process that imports torch
costs ~3 CPU-seconds), so the wall times are those of a loaded machine."""


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist hands out files with the most tests first unless told not to, which put
    the longest file (three tests) near the end of a run: keep the order above instead."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if not hasattr(config, "workerinput"):  # once, in the process that starts the others
        _compile_sources()


def _compile_sources() -> None:
    """Write the bytecode of this checkout's modules and scripts, as pip does for an installed
    package: an editable install under ``PYTHONDONTWRITEBYTECODE`` (this machine's default) has
    none, and every agent and worker of every job would compile the package again (~0.9
    CPU-seconds a process)."""
    root = Path(__file__).parent.parent
    for folder in ("elastic_otel", "tests", "examples", "benchmarks"):
        compileall.compile_dir(root / folder, quiet=2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/e2e/ is marked ``e2e`` (real torchrun jobs, receivers, collectors):
    ``pytest tests/unit`` and ``pytest -m "not e2e"`` run the same fast tests. The slowest
    files come first (:data:`SLOWEST_FIRST`), the rest in their usual order."""
    jobs = (Path(__file__).parent / "e2e", Path(__file__).parent / "multinode")
    for item in items:
        if any(folder in Path(str(item.fspath)).parents for folder in jobs):
            item.add_marker(pytest.mark.e2e)
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))


CPU_LOG = "TESTS_CPU_LOG"
"""A file to append each test's CPU seconds to (this process's and its finished children's,
torchrun jobs included), one ``path::test<TAB>seconds`` line each: the suite is CPU-bound on
two cores, so that, not wall time, says which tests make it slow. Unset: nothing is measured."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    log = os.environ.get(CPU_LOG)
    if not log:
        yield
        return
    before = _cpu_seconds()
    yield
    with open(log, "a") as out:
        out.write(f"{item.nodeid}\t{_cpu_seconds() - before:.2f}\n")


def _cpu_seconds() -> float:
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
