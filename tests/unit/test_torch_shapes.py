"""The recorded shapes of torch's elastic internals (``integration/torch_shapes.py``) against the
installed torch and against what the agent instrumentation checks before it wraps anything.

Why: the wrappers rely on private methods, attributes and call orders of torch's agent; a torch
release that changes one must fail here, naming what changed, before it misleads a trace. A
release not in the table fails too: its shape is unknown until someone records it.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Any

import pytest

from elastic_otel.integration import agent_instrumentation, torch_shapes
from elastic_otel.integration.torch_shapes import (
    RELEASES,
    REQUIREMENTS,
    SHAPES,
    WRAPPED,
    differences,
    problems,
    shape_of_installed_torch,
    shape_of_source,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "torch-versions.md"
RECORD_HOW = (
    "python -c 'from elastic_otel.integration.torch_shapes import shape_of_installed_torch as s; "
    "print(s())' with that torch installed, or shape_of_source() on its unpacked wheel "
    "(docs/torch-versions.md)"
)


def _installed() -> tuple[int, int]:
    torch = pytest.importorskip("torch")
    major, minor = str(torch.__version__).split(".")[:2]
    return int(major), int(minor)


def _recorded(version: tuple[int, int]) -> dict[str, tuple[str, ...]]:
    if version not in SHAPES:
        pytest.fail(
            f"torch {version[0]}.{version[1]} is not in the table: record its shapes in "
            f"elastic_otel/integration/torch_shapes.py ({RECORD_HOW})"
        )
    return SHAPES[version]


def _targets(monkeypatch: pytest.MonkeyPatch) -> list[tuple[type, str, Any, int]]:
    """The ``targets`` :meth:`AgentInstrumentation.instrument` hands to ``_shape_problem``,
    caught there: the check answers with a problem, so nothing is wrapped."""
    caught: list[tuple[type, str, Any, int]] = []

    def catch(agent_cls: type, targets: list[tuple[type, str, Any, int]]) -> str:
        caught.extend(targets)
        return "caught by the test"

    monkeypatch.setattr(agent_instrumentation, "_shape_problem", catch)
    assert not agent_instrumentation.AgentInstrumentation().instrument(
        force=True,
        handler=object(),  # type: ignore[arg-type]  # the wrappers are made, never called
    )
    assert caught, "instrument() did not reach the shape check"
    return caught


# --- the installed torch ------------------------------------------------------------------------


def test_installed_torch_has_its_recorded_shape() -> None:
    version = _installed()
    recorded = _recorded(version)
    changed = differences(recorded, shape_of_installed_torch())
    assert not changed, (
        f"torch {version[0]}.{version[1]} is not shaped as recorded (key: recorded -> "
        f"installed); update SHAPES and DIFFERENCES, and the wrappers if they rely on it:\n  "
        + "\n  ".join(changed)
    )


def test_reading_the_source_agrees_with_inspect() -> None:
    """The releases not installed were recorded from their source: on the installed one, the
    source reading and :mod:`inspect` must agree, or the table's other rows mean nothing."""
    _installed()
    import torch.distributed

    from_source = shape_of_source(os.path.dirname(torch.distributed.__file__))
    assert differences(shape_of_installed_torch(), from_source) == []


def test_shape_check_targets_are_the_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seven methods ``instrument`` wraps, and the arity ``_shape_problem`` checks for
    each, are the table's: every release the table calls instrumentable has that arity."""
    _installed()
    targets = _targets(monkeypatch)
    arities = {f"{cls.__name__}.{name}": arity for cls, name, _, arity in targets}
    assert sorted(arities) == sorted(WRAPPED)
    expected = {key: values for key, relation, values, _, _ in REQUIREMENTS if key in WRAPPED}
    assert arities == {key: len(values) for key, values in expected.items()}
    for version, shape in SHAPES.items():
        if not problems(shape):
            assert {key: len(shape[key]) for key in WRAPPED} == arities, version


def test_shape_check_agrees_with_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_shape_problem`` on the installed torch passes exactly when the table finds the
    wrapped methods and ``_construct_event`` as the wrappers need them."""
    recorded = _recorded(_installed())
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    shape_problem = agent_instrumentation._shape_problem  # before _targets replaces it
    targets = _targets(monkeypatch)
    found = shape_problem(SimpleElasticAgent, targets)
    checked = (*WRAPPED, "SimpleElasticAgent._construct_event")
    table = [p for p in problems(recorded) if p.startswith(checked)]
    assert (found == "") == (table == []), (found, table)


def _shaped_like(shape: dict[str, tuple[str, ...]], keys: tuple[str, ...]) -> dict[str, type]:
    """Stand-in classes whose methods take the parameters ``shape`` records for ``keys``."""
    methods: dict[str, dict[str, Any]] = {}
    for key in keys:
        owner, name = key.split(".")
        namespace: dict[str, Any] = {}
        if shape[key] != ("<missing>",):
            exec(f"def {name}({', '.join(shape[key])}): pass", namespace)
        methods.setdefault(owner, {}).update(namespace)
    return {owner: type(owner, (), body) for owner, body in methods.items()}


def test_shape_check_agrees_with_every_recorded_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_shape_problem``, run on stand-ins shaped like each release in the table, refuses
    exactly the releases whose recorded signatures the table says the wrappers cannot take."""
    _installed()
    shape_problem = agent_instrumentation._shape_problem
    targets = _targets(monkeypatch)
    checked = (*WRAPPED, "SimpleElasticAgent._construct_event")
    for version, shape in SHAPES.items():
        fakes = _shaped_like(shape, checked)
        faked = [(fakes[cls.__name__], name, wrap, arity) for cls, name, wrap, arity in targets]
        found = shape_problem(fakes["SimpleElasticAgent"], faked)
        table = [p for p in problems(shape) if p.startswith(checked)]
        assert (found == "") == (table == []), (version, found, table)


# --- the table itself (no torch needed) ---------------------------------------------------------


def test_every_release_has_every_key() -> None:
    keys = set(SHAPES[min(SHAPES)])
    assert all(set(shape) == keys for shape in SHAPES.values())
    assert sorted(SHAPES) == sorted(RELEASES)
    assert {key for key, *_ in REQUIREMENTS} <= keys


def test_a_changed_method_is_named_with_both_parameter_lists() -> None:
    """What the guard prints when a release changes a wrapped method: 2.8 dropped
    ``is_restart`` from ``_stop_workers``."""
    assert (
        "LocalElasticAgent._stop_workers: ('self', 'worker_group', 'is_restart') -> "
        "('self', 'worker_group')"
    ) in differences(SHAPES[(2, 7)], SHAPES[(2, 8)])


def test_instrumentable_releases() -> None:
    """2.4 to 2.7: ``_stop_workers`` takes ``is_restart`` and torchrun cannot send its agent's
    events to the bridge; from 2.8 on the wrappers find what they need."""
    assert [v for v, shape in SHAPES.items() if not problems(shape)] == [
        (2, minor) for minor in range(8, 16)
    ]


def test_tested_torch_is_in_the_table_and_instrumentable() -> None:
    oldest, newest = agent_instrumentation.TESTED_TORCH
    tested = [v for v in SHAPES if oldest <= v <= newest]
    assert tested and all(not problems(SHAPES[v]) for v in tested)


def test_differences_docstring_matches_the_table() -> None:
    """Each release the DIFFERENCES table says changed nothing ("table: none") has the shape
    of the one before, and each other one does not."""
    doc = torch_shapes.__doc__ or ""
    said = dict(re.findall(r"^ {4}(\d+\.\d+) +(\S.*)$", doc, flags=re.MULTILINE))
    versions = sorted(SHAPES)
    assert sorted(said) == sorted(f"{a}.{b}" for a, b in versions)
    for before, version in itertools.pairwise(versions):
        unchanged = said[f"{version[0]}.{version[1]}"].startswith("table: none")
        assert unchanged == (SHAPES[before] == SHAPES[version]), version


def test_the_versions_page_lists_every_release() -> None:
    text = DOC.read_text()
    missing = [release for release in RELEASES.values() if f"| {release} |" not in text]
    assert not missing, f"not in docs/torch-versions.md: {missing}"
