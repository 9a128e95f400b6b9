"""The package's structure as docs/architecture.md (Layout) describes it, checked on the source.

Imports run one way (no module reaches back to one that imports it, not even from inside a
function), the runtime never imports the command-line tools, no module imports another's
private names, and the modules that must stay free of torch and the OpenTelemetry SDK are.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "elastic_otel"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The project module ``name`` refers to (a package's attribute may be a submodule)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> list[tuple[str, str, int]]:
    """(imported module, imported name, line) for every project import in ``module``."""
    tree = ast.parse(MODULES[module].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("elastic_otel"):
                    found.append((_resolve(alias.name), "", node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("elastic_otel"):
                continue
            for alias in node.names:
                target = _resolve(f"{node.module}.{alias.name}") or _resolve(node.module)
                found.append((target, alias.name, node.lineno))
    return [(t, n, line) for t, n, line in found if t is not None and t != module]


GRAPH = {m: sorted({t for t, _, _ in _imports(m)}) for m in MODULES}


def test_imports_run_one_way() -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in GRAPH[module]:
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target]
                pytest.fail("import cycle: " + " → ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in MODULES:
        if module not in state:
            visit(module)


def test_runtime_never_imports_the_command_line_tools() -> None:
    runtime = [m for m in MODULES if not m.startswith("elastic_otel.cli")]
    offenders = [(m, t) for m in runtime for t in GRAPH[m] if t.startswith("elastic_otel.cli")]
    assert offenders == []


def test_no_private_names_across_modules() -> None:
    offenders = [
        (m, name, line)
        for m in MODULES
        for _, name, line in _imports(m)
        if name.startswith("_") and not name.startswith("__")
    ]
    assert offenders == []


@pytest.mark.parametrize(
    ("modules", "without_torch"),
    [
        # Pure parsing and state machines: testable without torch and without an SDK.
        (
            ["parsing", "logs", "trace_ids", "spans", "rendezvous_model", "agent_model", "tracing"],
            True,
        ),
        # What torch's entry point and `import elastic_otel` load before the bridge starts.
        (["__init__", "handler", "registration", "activation", "entry_points"], False),
    ],
)
def test_modules_that_must_not_import_the_sdk(modules: list[str], without_torch: bool) -> None:
    names = ["elastic_otel" if m == "__init__" else f"elastic_otel.{m}" for m in modules]
    code = (
        "import sys\n"
        + ("sys.modules['torch'] = None  # any torch import fails\n" if without_torch else "")
        + "".join(f"import {n}\n" for n in names)
        + "bad = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))\n"
        + "print(bad)\n"
        + "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
