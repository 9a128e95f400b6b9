"""The worker start-up, in real worker processes: plain Python started with the environment the
instrumented agent gives a worker (the start-up's directory first on ``PYTHONPATH``,
``ELASTIC_OTEL_WORKER_REPORTS=1``, ``TORCHELASTIC_ERROR_FILE`` in a private directory), and
what :func:`read_worker_report` makes of what they leave. No torch in the scripts: each runs in
a few tens of milliseconds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from elastic_otel.names import environment_variables as env
from elastic_otel.parsing.worker_reports import MAX_REPORT_BYTES, read_worker_report
from elastic_otel.worker import startup
from tests.support.worker_env import (
    SITE,
    agent_environment,
    json_lines,
    line_of,
    plain_environment,
    run,
    write_script,
)

INSTRUMENT = shutil.which("opentelemetry-instrument", path=str(Path(sys.executable).parent))
# What the scripts print about themselves (and their children) as JSON lines.
REPORT_ITSELF = textwrap.dedent(
    """
    import json, os, sys
    NAMES = ("PYTHONPATH", "ELASTIC_OTEL_WORKER_REPORTS", "ELASTIC_OTEL_WORKER_PYTHONPATH")
    def describe():
        return {
            "environ": {name: os.environ.get(name) for name in NAMES},
            "startup": "elastic_otel.worker.startup" in sys.modules,
            "otel": "opentelemetry.instrumentation.auto_instrumentation" in sys.modules,
        }
    """
)
CHILD = REPORT_ITSELF + "print(json.dumps(describe()))\n"


def test_the_name_start_reads_is_the_documented_variable() -> None:
    assert startup.REPORTS_VARIABLE == env.ELASTIC_OTEL_WORKER_REPORTS


@pytest.mark.parametrize(
    ("statement", "signal_name"),
    [("ctypes.string_at(0)", "SIGSEGV"), ("os.abort()", "SIGABRT")],
)
def test_a_fatal_signal_leaves_the_python_stack(
    tmp_path: Path, error_file: Path, statement: str, signal_name: str
) -> None:
    script = write_script(
        tmp_path,
        f"""
        import ctypes, os

        def load_batch():
            {statement}  # CRASH

        def main():
            load_batch()

        main()
        """,
    )
    done = run(script, agent_environment(error_file))
    assert done.returncode == -getattr(signal, signal_name), done.stderr
    assert done.stdout == ""
    report = read_worker_report(str(error_file))
    assert report is not None
    assert report.fault_signal == signal_name
    assert report.fault_stack is not None
    assert report.fault_stack.startswith("Fatal Python error: ")
    assert f'File "{script}", line {line_of(script, "CRASH")} in load_batch' in report.fault_stack
    assert report.exception_type is None
    assert (error_file.parent / env.WORKER_FAULT_FILE).stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    ("statement", "exception_type", "message"),
    [
        ("raise RuntimeError('boom')", "RuntimeError", "boom"),
        ("raise Trainer.Diverged('loss is nan')", "__main__.Trainer.Diverged", "loss is nan"),
        ("raise KeyboardInterrupt", "KeyboardInterrupt", ""),
    ],
)
def test_an_uncaught_exception_is_recorded(
    tmp_path: Path, error_file: Path, statement: str, exception_type: str, message: str
) -> None:
    script = write_script(
        tmp_path,
        f"""
        class Trainer:
            class Diverged(Exception):
                pass

        def step():
            {statement}  # RAISE

        step()
        """,
    )
    before = time.time_ns()
    done = run(script, agent_environment(error_file))
    after = time.time_ns()
    assert done.returncode != 0
    assert "Traceback (most recent call last):" in done.stderr  # the previous hook still ran
    record = json.loads((error_file.parent / env.WORKER_ERROR_FILE).read_text())
    assert set(record) == {"type", "message", "traceback", "time_unix_nano"}
    report = read_worker_report(str(error_file))
    assert report is not None
    assert report.exception_type == exception_type
    assert report.message == message
    assert report.traceback is not None
    assert f'File "{script}", line {line_of(script, "RAISE")}, in step' in report.traceback
    last_line = report.traceback.rstrip().splitlines()[-1]
    assert last_line.startswith(exception_type.removeprefix("__main__."))
    assert report.time_ns is not None and before <= report.time_ns <= after
    assert report.fault_stack is None and report.fault_signal is None


def test_a_worker_that_exits_normally_leaves_no_report(tmp_path: Path, error_file: Path) -> None:
    script = write_script(tmp_path, "print('done')\n")
    done = run(script, agent_environment(error_file))
    assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", "")
    assert read_worker_report(str(error_file)) is None
    assert not (error_file.parent / env.WORKER_ERROR_FILE).exists()


def test_a_huge_or_unprintable_exception_still_gives_a_readable_report(
    tmp_path: Path, error_file: Path
) -> None:
    # Control characters are the worst case of JSON escaping (one byte becomes six).
    script = write_script(
        tmp_path,
        """
        def recurse(n):
            return recurse(n + 1)

        try:
            recurse(0)
        except RecursionError:
            raise ValueError("\\x01" * 300_000)  # RAISE
        """,
    )
    done = run(script, agent_environment(error_file))
    assert done.returncode == 1
    assert (error_file.parent / env.WORKER_ERROR_FILE).stat().st_size <= MAX_REPORT_BYTES
    report = read_worker_report(str(error_file))
    assert report is not None and report.exception_type == "ValueError"
    assert report.message is not None and set(report.message) == {"\x01"}
    assert report.traceback is not None
    assert f'File "{script}", line {line_of(script, "RAISE")}, in <module>' in report.traceback


@pytest.mark.parametrize("worker_pythonpath", [None, "/opt/team-lib"])
def test_the_workers_children_neither_inherit_nor_run_the_start_up(
    tmp_path: Path, error_file: Path, worker_pythonpath: str | None
) -> None:
    write_script(tmp_path, CHILD, "child.py")
    script = write_script(
        tmp_path,
        """
        print(json.dumps(describe()))
        __import__("subprocess").run([sys.executable, "child.py"])
        """,
        prefix=REPORT_ITSELF,
    )
    done = run(script, agent_environment(error_file, worker_pythonpath))
    assert done.returncode == 0, done.stderr
    worker, child = json_lines(done.stdout)
    unarmed = {
        "PYTHONPATH": worker_pythonpath,
        "ELASTIC_OTEL_WORKER_REPORTS": None,
        "ELASTIC_OTEL_WORKER_PYTHONPATH": None,
    }
    assert worker == {"environ": unarmed, "startup": True, "otel": False}
    assert child == {"environ": unarmed, "startup": False, "otel": False}


def test_a_forked_childs_crash_or_exception_is_not_the_workers(
    tmp_path: Path, error_file: Path
) -> None:
    script = write_script(
        tmp_path,
        """
        import ctypes, os

        for crash in ("ctypes.string_at(0)", "raise RuntimeError('child')"):
            pid = os.fork()
            if pid == 0:
                exec(crash)
            os.waitpid(pid, 0)
        print("worker done")
        """,
    )
    done = run(script, agent_environment(error_file))
    assert (done.returncode, done.stdout) == (0, "worker done\n")
    assert "RuntimeError: child" in done.stderr  # the child's own traceback, as without us
    assert read_worker_report(str(error_file)) is None


def test_an_exec_hands_the_start_up_on_to_the_program_it_becomes(
    tmp_path: Path, error_file: Path
) -> None:
    write_script(tmp_path, CHILD, "child.py")
    write_script(
        tmp_path,
        """
        print(json.dumps(describe()), flush=True)
        __import__("subprocess").run([sys.executable, "child.py"])
        raise RuntimeError("after exec")
        """,
        "real_train.py",
        prefix=REPORT_ITSELF,
    )
    script = write_script(
        tmp_path,
        """
        import os, sys
        os.execv(sys.executable, [sys.executable, "real_train.py"])
        """,
    )
    done = run(script, agent_environment(error_file, "/opt/team-lib"))
    assert done.returncode == 1
    exec_ed, child = json_lines(done.stdout)
    assert exec_ed["startup"] and not child["startup"]
    assert (
        exec_ed["environ"]
        == child["environ"]
        == {
            "PYTHONPATH": "/opt/team-lib",
            "ELASTIC_OTEL_WORKER_REPORTS": None,
            "ELASTIC_OTEL_WORKER_PYTHONPATH": None,
        }
    )
    report = read_worker_report(str(error_file))
    assert report is not None
    assert (report.exception_type, report.message) == ("RuntimeError", "after exec")


def test_an_exec_that_fails_leaves_the_worker_as_it_was(tmp_path: Path, error_file: Path) -> None:
    script = write_script(
        tmp_path,
        """
        try:
            os.execv("/nonexistent/python", ["python"])
        except OSError:
            pass
        print(json.dumps(describe()))
        """,
        prefix=REPORT_ITSELF,
    )
    done = run(script, agent_environment(error_file))
    assert done.returncode == 0, done.stderr
    (worker,) = json_lines(done.stdout)
    assert worker["environ"] == dict.fromkeys(worker["environ"])


def test_an_existing_sitecustomize_still_runs_once(tmp_path: Path, error_file: Path) -> None:
    theirs = tmp_path / "team-site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("print('team sitecustomize ran')\n")
    script = write_script(
        tmp_path,
        """
        import sitecustomize  # already imported: runs nothing again
        print(json.dumps(describe()))
        raise RuntimeError("boom")
        """,
        prefix=REPORT_ITSELF,
    )
    done = run(script, agent_environment(error_file, str(theirs)))
    assert done.returncode == 1
    assert done.stdout.count("team sitecustomize ran") == 1
    (worker,) = json_lines(done.stdout)
    assert worker["environ"]["PYTHONPATH"] == str(theirs)
    report = read_worker_report(str(error_file))
    assert report is not None and report.exception_type == "RuntimeError"


def test_a_failing_sitecustomize_is_reported_as_without_the_start_up(
    tmp_path: Path, error_file: Path
) -> None:
    theirs = tmp_path / "team-site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import missing_module_xyz\n")
    script = write_script(tmp_path, "print('script ran')\n")
    without = plain_environment() | {env.PYTHONPATH: str(theirs)}
    expected = run(script, without)
    done = run(script, agent_environment(error_file, str(theirs)))
    assert "Error in sitecustomize" in expected.stderr
    assert (done.returncode, done.stdout, done.stderr) == (
        expected.returncode,
        expected.stdout,
        expected.stderr,
    )


@pytest.mark.skipif(INSTRUMENT is None, reason="opentelemetry-instrumentation is not installed")
@pytest.mark.parametrize("instrumented", ["agent", "worker"])
def test_both_run_under_opentelemetry_instrument(
    tmp_path: Path, error_file: Path, instrumented: str
) -> None:
    """``opentelemetry-instrument torchrun``: the agent's ``PYTHONPATH`` has the
    auto-instrumentation's directory, after ours; ``torchrun --no-python
    opentelemetry-instrument python``: the launcher puts it before ours and execs the script."""
    assert INSTRUMENT is not None
    from opentelemetry.instrumentation import auto_instrumentation

    otel_site = os.path.dirname(os.path.abspath(auto_instrumentation.__file__))
    write_script(tmp_path, CHILD, "child.py")
    script = write_script(
        tmp_path,
        """
        print(json.dumps(describe()), flush=True)
        __import__("subprocess").run([sys.executable, "child.py"])
        raise RuntimeError("instrumented boom")
        """,
        prefix=REPORT_ITSELF,
    )
    environ = agent_environment(error_file, otel_site if instrumented == "agent" else None)
    for signal_kind in ("TRACES", "METRICS", "LOGS"):
        environ[f"OTEL_{signal_kind}_EXPORTER"] = "none"
    done = run(script, environ, command=(INSTRUMENT,) if instrumented == "worker" else ())
    assert done.returncode == 1, done.stderr
    worker, child = json_lines(done.stdout)
    assert worker["startup"] and worker["otel"]
    assert not child["startup"] and child["otel"]  # the auto-instrumentation's own choice
    assert worker["environ"]["ELASTIC_OTEL_WORKER_REPORTS"] is None
    assert SITE not in (worker["environ"]["PYTHONPATH"] or "").split(os.pathsep)
    report = read_worker_report(str(error_file))
    assert report is not None
    assert (report.exception_type, report.message) == ("RuntimeError", "instrumented boom")


@pytest.mark.parametrize(
    "source",
    [
        "import os, sys\nprint(sorted(os.environ))\nprint(sys.argv)\nsys.exit(3)\n",
        "print('before')\nraise ValueError('user error')\n",
    ],
)
def test_a_start_up_that_cannot_work_changes_nothing(tmp_path: Path, source: str) -> None:
    """An error file in a directory that does not exist: the worker runs exactly as without
    the start-up (same exit code, output and environment)."""
    missing = tmp_path / "gone" / "error.json"
    script = write_script(tmp_path, source)
    expected = run(script, plain_environment() | {env.TORCHELASTIC_ERROR_FILE: str(missing)})
    done = run(script, agent_environment(missing))
    assert (done.returncode, done.stdout, done.stderr) == (
        expected.returncode,
        expected.stdout,
        expected.stderr,
    )
    assert not missing.parent.exists()


def test_without_the_agents_request_the_start_up_does_nothing(
    tmp_path: Path, error_file: Path
) -> None:
    script = write_script(
        tmp_path,
        "print(json.dumps(describe()))\nraise RuntimeError('boom')\n",
        prefix=REPORT_ITSELF,
    )
    environ = agent_environment(error_file)
    del environ[env.ELASTIC_OTEL_WORKER_REPORTS]
    done = run(script, environ)
    assert done.returncode == 1
    (worker,) = json_lines(done.stdout)
    assert worker["environ"]["PYTHONPATH"] == SITE  # nothing touched
    assert list(error_file.parent.iterdir()) == []


def test_without_an_error_file_it_only_puts_the_environment_back(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "print(json.dumps(describe()))\nraise RuntimeError('boom')\n",
        prefix=REPORT_ITSELF,
    )
    done = run(script, agent_environment(None, "/opt/team-lib"))
    assert done.returncode == 1
    (worker,) = json_lines(done.stdout)
    assert worker["environ"] == {
        "PYTHONPATH": "/opt/team-lib",
        "ELASTIC_OTEL_WORKER_REPORTS": None,
        "ELASTIC_OTEL_WORKER_PYTHONPATH": None,
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_a_faulthandler_the_user_enabled_wins(tmp_path: Path, error_file: Path) -> None:
    script = write_script(tmp_path, "import ctypes\nctypes.string_at(0)\n")
    done = run(script, agent_environment(error_file) | {"PYTHONFAULTHANDLER": "1"})
    assert done.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert not (error_file.parent / env.WORKER_FAULT_FILE).exists()
    assert read_worker_report(str(error_file)) is None


def test_a_process_that_is_no_worker_loads_nothing_more() -> None:
    code = textwrap.dedent(
        """
        import sys
        before = set(sys.modules)
        from elastic_otel.worker import startup
        startup.start()
        print(" ".join(sorted(set(sys.modules) - before)))
        """
    )
    environ = plain_environment()
    done = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True
    )
    loaded = set(done.stdout.split())
    assert {m for m in loaded if m.startswith("elastic_otel")} <= {
        "elastic_otel",
        "elastic_otel.version",
        "elastic_otel.worker",
        "elastic_otel.worker.progress",  # elastic_otel.mark_step, unarmed: imports nothing
        "elastic_otel.worker.startup",
    }
    assert not loaded & {
        "faulthandler",
        "json",
        "logging",
        "traceback",
        "mmap",
        "threading",
        "dataclasses",
        "elastic_otel.names",
        "elastic_otel.parsing.worker_progress",
    }
