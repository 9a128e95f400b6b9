"""The package's structure as docs/architecture.md (Layout) describes it, checked on the source.

Every module sits in a folder that is a layer, in the order data flows (names → config → parsing →
model → emit → bridge → integration / worker → cli); imports run one way, downward (not even a
function-level import reaches back up), no module imports another's private names, and the
folders that must stay free of torch and OpenTelemetry are.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "elastic_otel"


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


LAYERS = {
    "names": 0,
    "version": 0,
    "config": 1,
    "parsing": 2,
    "model": 3,
    "emit": 4,
    "bridge": 5,
    "integration": 6,
    "worker": 6,
    "": 7,  # the package's public functions (elastic_otel/__init__.py)
    "frameworks": 7,  # optional hooks into training frameworks, beside the public functions
    "cli": 8,
}
"""Each folder's place in the flow of data; a module imports only from its own folder or from
folders below it (``integration`` and ``worker`` share a level and do not import each other,
nor do the public functions and ``frameworks``)."""

PURE = ("names", "config", "parsing", "model")
"""Folders that import neither torch nor OpenTelemetry: testable without either."""


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_is_in_a_layer() -> None:
    assert sorted({_folder(m) for m in MODULES} - LAYERS.keys()) == []


def test_layers_import_only_downward() -> None:
    offenders = [
        f"{m} → {t}"
        for m in MODULES
        for t in GRAPH[m]
        if _folder(t) != _folder(m)
        and (LAYERS[_folder(t)] >= LAYERS[_folder(m)] and _folder(t) != "version")
    ]
    assert offenders == []


def _third_party_imports(module: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & {"torch", "opentelemetry", "grpc", "google"}


def test_pure_folders_import_neither_torch_nor_opentelemetry() -> None:
    offenders = {m: sorted(_third_party_imports(m)) for m in MODULES if _folder(m) in PURE}
    assert {m: v for m, v in offenders.items() if v} == {}


@pytest.mark.parametrize(
    ("modules", "without_torch"),
    [
        # Pure parsing and state machines: they run with torch unimportable and load no SDK.
        (sorted(m for m in MODULES if _folder(m) in PURE), True),
        # What torch's entry point and `import elastic_otel` load before the bridge starts.
        (
            [
                "elastic_otel",
                "elastic_otel.bridge.handler",
                "elastic_otel.integration.registration",
                "elastic_otel.integration.activation",
                "elastic_otel.integration.entry_points",
            ],
            False,
        ),
    ],
)
def test_modules_that_must_not_import_the_sdk(modules: list[str], without_torch: bool) -> None:
    code = (
        "import sys\n"
        + ("sys.modules['torch'] = None  # any torch import fails\n" if without_torch else "")
        + "".join(f"import {n}\n" for n in modules)
        + "bad = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))\n"
        + "print(bad)\n"
        + "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_torch_loaded_subpackages_have_empty_inits() -> None:
    """torch and the SDK load ``integration`` and ``emit`` through entry points, torch while it
    imports itself: no runtime folder's ``__init__`` imports anything (``cli``'s names the
    console script)."""
    for folder in LAYERS:
        init = PACKAGE / folder / "__init__.py"
        if folder and folder != "cli" and init.exists():
            assert init.read_text().strip() == "", f"{init} is not empty"


MAX_CLASS_LINES = 300


def test_no_class_over_300_lines() -> None:
    """A class that long does several things: split it along a seam."""
    offenders = [
        f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for module, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    ]
    assert offenders == []


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _documented_modules() -> dict[str, set[str]]:
    """Folder → the modules its row of the Layout table in docs/architecture.md names."""
    section = ARCHITECTURE.read_text().split("\n## Layout\n")[1].split("\n## ")[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"`[\w/]+/`", cells[0]):
            rows[cells[0].strip("`/")] = set(re.findall(r"`(\w+)`", cells[1]))
    return rows


def _package_modules() -> dict[str, set[str]]:
    """Folder → its modules on disk (``__init__`` and the top level's two files aside)."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) > 1 and path.stem != "__init__":
            found.setdefault("/".join(parts[:-1]), set()).add(path.stem)
    return found


def test_the_layout_section_names_every_module_and_no_other() -> None:
    assert _documented_modules() == _package_modules()


def test_module_globals_have_few_owners() -> None:
    """Process-wide state has one owner: the bridge's (``bridge/process.py``), the
    registration's (``integration/registration.py``) and, for its measured hot path, the
    worker's progress (``worker/progress.py``). No other module rebinds a global."""
    owners = sorted(
        module
        for module, path in MODULES.items()
        if any(isinstance(node, ast.Global) for node in ast.walk(ast.parse(path.read_text())))
    )
    assert owners == [
        "elastic_otel.bridge.process",
        "elastic_otel.integration.registration",
        "elastic_otel.worker.progress",
    ]


def test_all_caps_module_names_are_not_mutable_singletons() -> None:
    """An all-caps module-level name is a constant: never an instance of a project class that
    can hold state (a singleton); a stateless sentinel (``__slots__ = ()``) is a constant."""
    offenders = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        classes = {
            n.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef) and "__slots__ = ()" not in ast.unparse(n)
        }
        for node in tree.body:
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
                continue
            func = node.value.func
            name = func.id if isinstance(func, ast.Name) else ""
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.isupper() and name in classes:
                    offenders.append(f"{module}.{target.id} = {name}()")
    assert offenders == []
