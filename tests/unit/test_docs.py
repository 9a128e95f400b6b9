"""The reference in ``docs/`` agrees with the code: every variable the package reads is
documented with the default the code uses, every attribute key it emits is documented, and
every relative link in the README and ``docs/`` resolves. The README stays a landing page."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from tests.support.helpers import as_documented, documented_defaults

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "elastic_otel"
DOCS = ROOT / "docs"
READERS = {"env_flag", "env_int", "env_float", "env_switch"}
VARIABLE = re.compile(r"^ELASTIC_OTEL_[A-Z_]+$")


def _sources() -> dict[str, ast.Module]:
    trees = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        trees[".".join(parts)] = ast.parse(path.read_text())
    return trees


SOURCES = _sources()


def _variables_in_code() -> set[str]:
    """Every ``ELASTIC_OTEL_*`` name the package spells out."""
    names = set()
    for tree in SOURCES.values():
        for node in ast.walk(tree):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and VARIABLE.match(value):
                names.add(value)
    return names


def _value(module: str, node: ast.expr) -> object:
    """A reader's default argument, evaluated in the module that passes it."""
    if isinstance(node, ast.Constant):
        return node.value
    return eval(
        compile(ast.Expression(node), module, "eval"), vars(importlib.import_module(module))
    )


def _defaults_in_code() -> dict[str, set[object]]:
    """Variable → the defaults the package passes to ``env_flag``/``env_int``/``env_float``
    (``None`` for ``env_switch``: unset means "decide from context")."""
    found: dict[str, set[object]] = {}
    for module, tree in SOURCES.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in READERS:
                continue
            try:
                variable = _value(module, node.args[0])
            except NameError:  # a reader's own parameter (inside environment_variables)
                continue
            if not isinstance(variable, str) or not VARIABLE.match(variable):
                continue
            default = None if name == "env_switch" else _value(module, node.args[1])
            found.setdefault(variable, set()).add(default)
    return found


def test_every_variable_isdocumented_defaults() -> None:
    documented = documented_defaults()
    missing = sorted(_variables_in_code() - documented.keys())
    assert not missing, f"not in docs/configuration.md: {missing}"


@pytest.mark.parametrize("variable", sorted(_defaults_in_code()))
def test_documented_default_is_the_code_default(variable: str) -> None:
    defaults = _defaults_in_code()[variable]
    assert len(defaults) == 1, f"{variable} is read with different defaults: {defaults}"
    (default,) = defaults
    documented = documented_defaults().get(variable)
    assert documented == as_documented(default), (
        f"{variable}: docs/configuration.md says {documented}, the code uses {default!r}"
    )


def test_every_attribute_key_isdocumented_defaults() -> None:
    from elastic_otel.names import attributes

    text = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    keys = [
        value
        for name, value in vars(attributes).items()
        if name.isupper() and isinstance(value, str) and value.startswith("torchelastic.")
        and not value.endswith(".")
    ]  # fmt: skip
    assert keys
    missing = sorted(key for key in keys if f"`{key}`" not in text)
    assert not missing, f"attribute keys not in docs/: {missing}"


def test_relative_links_resolve() -> None:
    pages = [ROOT / "README.md", *DOCS.glob("*.md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert not broken, broken


def test_readme_is_a_landing_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 15_000
    for page in DOCS.glob("*.md"):
        assert f"docs/{page.name}" in readme, f"README does not link {page.name}"
