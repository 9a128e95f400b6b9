"""A worker process as the instrumented agent starts it, without torchrun: its environment (the
worker start-up on ``PYTHONPATH``), a script to run, and what it printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from elastic_otel.names import environment_variables as env
from elastic_otel.worker import startup

SITE = startup.SITE_DIRECTORY


def plain_environment() -> dict[str, str]:
    """The environment a worker gets without the start-up."""
    leave_out = {
        env.PYTHONPATH,
        env.ELASTIC_OTEL_STACK_SIGNAL,
        "PYTHONFAULTHANDLER",
        "PYTHONSTARTUP",
        "PYTHONINSPECT",
    }
    return {k: v for k, v in os.environ.items() if k not in leave_out}


def agent_environment(
    error_file: Path | None, pythonpath: str | None = None, **extra: str
) -> dict[str, str]:
    """What the instrumented agent gives a worker (the worker's own ``PYTHONPATH``, if any)."""
    environ = plain_environment()
    environ[env.PYTHONPATH] = SITE + (os.pathsep + pythonpath if pythonpath else "")
    environ[env.ELASTIC_OTEL_WORKER_PYTHONPATH] = pythonpath or ""
    environ[env.ELASTIC_OTEL_WORKER_REPORTS] = "1"
    if error_file is not None:
        environ[env.TORCHELASTIC_ERROR_FILE] = str(error_file)
    return environ | extra


def write_script(directory: Path, source: str, name: str = "train.py", prefix: str = "") -> Path:
    """``prefix`` and the dedented ``source`` as ``directory/name``."""
    script = directory / name
    script.write_text(prefix + textwrap.dedent(source))
    return script


def run(
    script: Path, environ: dict[str, str], *args: str, command: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``[command...] python script args...`` in the script's directory, to its end."""
    return subprocess.run(
        [*command, sys.executable, str(script), *args],
        env=environ,
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def line_of(script: Path, marker: str) -> int:
    """The 1-based number of the line of ``script`` that carries ``# <marker>``."""
    lines = script.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(f"# {marker}"))


def json_lines(stdout: str) -> list[dict]:
    """The JSON objects a script printed, one per line."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
