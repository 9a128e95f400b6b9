"""The one exit path: each registered step runs once, together with the others, within one
bound; at interpreter exit and on an unhandled SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from elastic_otel.bridge.process_exit import ExitPath


def test_each_step_runs_once_together_within_the_bound() -> None:
    path = ExitPath()
    calls: list[tuple[str, str, bool]] = []
    blocked = threading.Event()

    def fast(reason: str, error: bool) -> None:
        calls.append(("fast", reason, error))

    def stuck(reason: str, error: bool) -> None:  # an export retrying against a dead collector
        calls.append(("stuck", reason, error))
        blocked.wait(30)

    def failing(reason: str, error: bool) -> None:
        calls.append(("failing", reason, error))
        raise RuntimeError("never the host's problem")

    path.add("fast", fast, 0.5, sigterm=False)
    path.add("stuck", stuck, 0.5, sigterm=False)
    path.add("failing", failing, 0.2, sigterm=False)
    path.add("fast", fast, 0.5, sigterm=False)  # the same name: replaced, not added
    assert path.steps() == ["fast", "stuck", "failing"]
    assert path.remove("failing") and not path.remove("failing")
    path.add("failing", failing, 0.2, sigterm=False)

    started = time.monotonic()
    assert path.run("why", True) is False  # one step did not finish in time
    elapsed = time.monotonic() - started
    blocked.set()
    assert 0.45 <= elapsed < 1.5, "one bound, the largest registered, not the sum"
    assert sorted(calls) == [
        ("failing", "why", True),
        ("fast", "why", True),
        ("stuck", "why", True),
    ]
    assert path.steps() == []
    assert path.run() is True and len(calls) == 3, "each step runs once"


def _run(code: str, tmp_path: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=timeout
    )


STEPS = textwrap.dedent("""
    import sys, threading, time
    from elastic_otel.bridge.process import bridge_process
    exit_path = bridge_process().exit_path
    out = open(sys.argv[0] + ".out", "a")
    def step(name):
        def run(reason, error):
            print(name, reason, error, file=out, flush=True)
            if name == "stuck":
                threading.Event().wait()  # never returns: abandoned at the bound
        return run
    exit_path.add("a", step("a"), 1.0)
    exit_path.add("stuck", step("stuck"), 1.0)
    exit_path.add("b", step("b"), 1.0, sigterm=False)
""")


def test_at_interpreter_exit_each_step_runs_once_within_the_bound(tmp_path: Path) -> None:
    started = time.monotonic()
    done = _run(STEPS, tmp_path)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    lines = sorted((tmp_path / "script.py.out").read_text().splitlines())
    assert lines == ["a process exit False", "b process exit False", "stuck process exit False"]
    assert elapsed < 15, "the stuck step is abandoned at the bound"


def test_an_unhandled_sigterm_runs_the_path_once_and_keeps_the_exit_status(
    tmp_path: Path,
) -> None:
    done = _run(
        STEPS + "\nimport os, signal\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(20)\n",
        tmp_path,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    reason = f"process terminated (SIGTERM, signal {int(signal.SIGTERM)})"
    lines = sorted((tmp_path / "script.py.out").read_text().splitlines())
    assert lines == [f"a {reason} True", f"b {reason} True", f"stuck {reason} True"]
