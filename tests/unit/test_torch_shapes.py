"""The recorded shapes of torch's elastic internals (``tests/support/torch_shapes.py``) against
the installed torch, against what the agent instrumentation wraps (its table, ``WRAPPED``) and
checks before it wraps anything, and against docs/torch-versions.md.

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

from elastic_otel.integration import agent_instrumentation
from elastic_otel.integration.agent_instrumentation import AgentInstrumentation, shape_problem
from tests.support.torch_shapes import (
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
    "python -c 'from tests.support.torch_shapes import shape_of_installed_torch as s; "
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
            f"tests/support/torch_shapes.py ({RECORD_HOW})"
        )
    return SHAPES[version]


def _targets(classes: dict[str, type]) -> list[tuple[type, str, Any, int]]:
    """The targets :meth:`AgentInstrumentation.instrument` hands to ``shape_problem``: the
    table's methods of ``classes`` (by name), with the number of parameters each takes."""
    return [
        (classes[m.owner], m.name, None, len(m.parameters)) for m in agent_instrumentation.WRAPPED
    ]


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


def test_instrument_wraps_exactly_the_table() -> None:
    """What ``instrument`` replaces in torch's classes is the table's methods, no other."""
    _installed()
    installed = AgentInstrumentation.installed()  # a registration in this process, maybe
    if installed is not None:
        installed.uninstrument()
    classes = agent_instrumentation.torch_classes()
    before = {name: dict(vars(cls)) for name, cls in classes.items()}
    agent = AgentInstrumentation()
    try:
        assert agent.instrument(force=True, handler=object())  # type: ignore[arg-type]
        changed = sorted(
            f"{name}.{attr}"
            for name, cls in classes.items()
            for attr, value in vars(cls).items()
            if before[name].get(attr) is not value
        )
    finally:
        agent.uninstrument()
    assert changed == sorted(WRAPPED)
    assert {name: dict(vars(cls)) for name, cls in classes.items()} == before


def test_wrapped_parameters_are_the_tables() -> None:
    """The parameters each wrapper takes are the ones the table requires, and every release
    the table calls instrumentable has them."""
    wrapped = {f"{m.owner}.{m.name}": m.parameters for m in agent_instrumentation.WRAPPED}
    expected = {key: values for key, _, values, _, _ in REQUIREMENTS if key in WRAPPED}
    assert wrapped == expected
    for version, shape in SHAPES.items():
        if not problems(shape):
            assert {key: len(shape[key]) for key in WRAPPED} == {
                key: len(values) for key, values in wrapped.items()
            }, version


def test_shape_check_agrees_with_the_table() -> None:
    """``shape_problem`` on the installed torch passes exactly when the table finds the
    wrapped methods and ``_construct_event`` as the wrappers need them."""
    recorded = _recorded(_installed())
    installed = AgentInstrumentation.installed()
    if installed is not None:
        installed.uninstrument()  # a wrapped method is a problem of its own
    classes = agent_instrumentation.torch_classes()
    found = shape_problem(classes["SimpleElasticAgent"], _targets(classes))
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


def test_shape_check_agrees_with_every_recorded_release() -> None:
    """``shape_problem``, run on stand-ins shaped like each release in the table, refuses
    exactly the releases whose recorded signatures the table says the wrappers cannot take."""
    checked = (*WRAPPED, "SimpleElasticAgent._construct_event")
    for version, shape in SHAPES.items():
        fakes = _shaped_like(shape, checked)
        found = shape_problem(fakes["SimpleElasticAgent"], _targets(fakes))
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


def test_the_versions_page_history_matches_the_table() -> None:
    """Each release docs/torch-versions.md says changed nothing in the table ("none") has the
    shape of the one before, and each other one does not."""
    section = DOC.read_text().split("\n## Changes, release by release\n")[1].split("\n## ")[0]
    said = dict(re.findall(r"^\| (\d+\.\d+) \| ([^|]*?) \|", section, flags=re.MULTILINE))
    versions = sorted(SHAPES)
    assert sorted(said) == sorted(f"{a}.{b}" for a, b in versions)
    for before, version in itertools.pairwise(versions):
        unchanged = said[f"{version[0]}.{version[1]}"] == "none"
        assert unchanged == (SHAPES[before] == SHAPES[version]), version


def test_the_versions_page_lists_every_release() -> None:
    text = DOC.read_text()
    missing = [release for release in RELEASES.values() if f"| {release} |" not in text]
    assert not missing, f"not in docs/torch-versions.md: {missing}"
