"""The shape of torch's elastic internals that the agent instrumentation touches, per release:
test support for ``tests/unit/test_torch_shapes.py``.

The agent instrumentation wraps private methods of torch's agent (its table,
:data:`elastic_otel.integration.agent_instrumentation.WRAPPED`) and reads private attributes and
orders of calls: nothing in torch keeps them stable. :data:`SHAPES` records what each torch minor
release from 2.4 on has, read from its wheel (docs/torch-versions.md says how, and what changed
release by release), and :func:`shape_of_installed_torch` computes the same keys from the
installed torch, so a test can tell when a release changed something the wrappers rely on, and
name it. :data:`REQUIREMENTS` says which values the wrappers need (:func:`problems`) and which
only make them report more (:func:`limitations`).

Keys and values (all ``tuple[str, ...]``):

* ``"Class.method"``: the parameter names of the method defined in that class's own body
  (``("<missing>",)`` when it is not: the wrappers replace ``cls.__dict__`` entries);
* ``"<Class> fields"`` / ``"slots"`` / ``"members"``: a dataclass's fields, ``__slots__``, an
  enum's members; ``"(read)"``: only those of the names the bridge reads that exist;
* the rest, from the source (:mod:`ast`): where the wrapped methods are defined, which agent
  methods call them, the order of the failure capture and ``close()`` in
  ``SubprocessContext._poll`` (``"capture"``, ``"close"``), the calls in ``_start_workers`` that
  hand the workers' environments to the watchdog and to ``start_processes``, the names in
  ``events/handlers.py``, the ``torchrun.*`` entry-point groups torch loads, torchrun's
  ``--event-log-handler`` spellings.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Mapping
from typing import Any

from elastic_otel.integration import agent_instrumentation

Shape = dict[str, tuple[str, ...]]

WRAPPED: tuple[str, ...] = tuple(f"{m.owner}.{m.name}" for m in agent_instrumentation.WRAPPED)
"""The methods the agent instrumentation replaces, as ``Class.method`` (from its table)."""

SIGNATURES: tuple[str, ...] = (
    *WRAPPED,
    "SimpleElasticAgent._construct_event",
    "RendezvousHandler.get_run_id",
    "SubprocessContext.pids",
)

# Where each class lives, relative to torch/distributed (a file, and a module when installed).
_AGENT_API = "elastic/agent/server/api.py"
_LOCAL_AGENT = "elastic/agent/server/local_elastic_agent.py"
_MP_API = "elastic/multiprocessing/api.py"
_HANDLERS = "elastic/events/handlers.py"
_REGISTRY = "elastic/rendezvous/registry.py"
_RUN = "run.py"
_CLASSES: dict[str, str] = {
    "SimpleElasticAgent": _AGENT_API,
    "RunResult": _AGENT_API,
    "Worker": _AGENT_API,
    "WorkerGroup": _AGENT_API,
    "WorkerSpec": _AGENT_API,
    "WorkerState": _AGENT_API,
    "LocalElasticAgent": _LOCAL_AGENT,
    "PContext": _MP_API,
    "SubprocessContext": _MP_API,
    "ProcessFailure": "elastic/multiprocessing/errors/__init__.py",
    "Event": "elastic/events/api.py",
    "EventSource": "elastic/events/api.py",
    "RendezvousHandler": "elastic/rendezvous/api.py",
}
_FACT_FILES = (_AGENT_API, _LOCAL_AGENT, _MP_API, _HANDLERS, _REGISTRY, _RUN)
_FIELDS = ("RunResult", "ProcessFailure", "Event")
_SLOTS = ("Worker", "WorkerGroup")
_MEMBERS = ("EventSource", "WorkerState")
_SPEC_READ = ("event_log_handler", "rdzv_handler")
_ATTRIBUTES_READ = (
    ("LocalElasticAgent", "_pcontext"),
    ("SimpleElasticAgent", "_worker_group"),
    ("PContext", "error_files"),
    ("SubprocessContext", "_failures"),
)
_AGENT_CLASSES = ("SimpleElasticAgent", "LocalElasticAgent")
_STEP_NAMES = frozenset(w.split(".")[1] for w in WRAPPED) - {"close"}
_MISSING = ("<missing>",)


def shape_of_installed_torch() -> Shape:
    """The installed torch's shape: signatures as :func:`inspect.signature` sees them on the
    classes (what the wrappers meet), the rest from the modules' source."""
    import dataclasses
    import importlib
    import inspect

    def module(path: str) -> Any:
        name = "torch.distributed." + path.removesuffix(".py").removesuffix("/__init__")
        return importlib.import_module(name.replace("/", "."))

    def cls(name: str) -> Any:
        return getattr(module(_CLASSES[name]), name)

    shape: Shape = {}
    for key in SIGNATURES:
        owner, name = key.split(".")
        method = cls(owner).__dict__.get(name)
        try:
            shape[key] = _MISSING if method is None else tuple(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            shape[key] = ("<no signature>",)
    for name in _FIELDS:
        shape[f"{name} fields"] = tuple(f.name for f in dataclasses.fields(cls(name)))
    for name in _SLOTS:
        shape[f"{name} slots"] = tuple(cls(name).__slots__)
    for name in _MEMBERS:
        shape[f"{name} members"] = tuple(m.name for m in cls(name))
    spec = {f.name for f in dataclasses.fields(cls("WorkerSpec"))}
    shape["WorkerSpec fields (read)"] = tuple(f for f in _SPEC_READ if f in spec)
    shape.update(_facts({path: inspect.getsource(module(path)) for path in _FACT_FILES}))
    return shape


def shape_of_source(distributed: str) -> Shape:
    """The shape of the torch whose ``torch/distributed`` directory is ``distributed``, from
    its source alone: a release's wheel, unpacked, need not be installed (nor importable)."""
    sources: dict[str, str] = {}
    for path in {*_CLASSES.values(), *_FACT_FILES}:
        with open(os.path.join(distributed, path), encoding="utf-8") as f:
            sources[path] = f.read()
    trees = {path: ast.parse(text) for path, text in sources.items()}

    def body(name: str) -> list[ast.stmt]:
        found = _class(trees[_CLASSES[name]], name)
        return found.body if found is not None else []

    shape: Shape = {}
    for key in SIGNATURES:
        owner, name = key.split(".")
        method = next((f for f in _functions(body(owner)) if f.name == name), None)
        shape[key] = _MISSING if method is None else _parameters(method.args)
    for name in _FIELDS:
        shape[f"{name} fields"] = _annotated(body(name))
    for name in _SLOTS:
        shape[f"{name} slots"] = _assigned_strings(body(name), "__slots__")
    for name in _MEMBERS:
        shape[f"{name} members"] = tuple(
            t.id
            for s in body(name)
            if isinstance(s, ast.Assign)
            for t in s.targets
            if isinstance(t, ast.Name) and not t.id.startswith("_")
        )
    spec = _annotated(body("WorkerSpec"))
    shape["WorkerSpec fields (read)"] = tuple(f for f in _SPEC_READ if f in spec)
    shape.update(_facts({path: sources[path] for path in _FACT_FILES}))
    return shape


# --- what the wrappers need ---------------------------------------------------------------------

AGENT_CALLS = (
    "LocalElasticAgent._shutdown -> _pcontext.close",
    "LocalElasticAgent._start_workers -> _setup_local_watchdog",
    "SimpleElasticAgent._initialize_workers -> _start_workers",
    "SimpleElasticAgent._invoke_run -> _exit_barrier",
    "SimpleElasticAgent._invoke_run -> _monitor_workers",
    "SimpleElasticAgent._invoke_run -> _restart_workers",
    "SimpleElasticAgent._invoke_run -> _stop_workers",
    "SimpleElasticAgent._restart_workers -> _stop_workers",
)
"""The calls inside torch's agent that lead to the wrapped methods: every release read has them
(the base shape), and the wrappers need them (a requirement)."""

REQUIREMENTS: tuple[tuple[str, str, tuple[str, ...], bool, str], ...] = (
    # (key, relation: "is" / "has" / "starts", values, needed, why)
    *(
        (f"{m.owner}.{m.name}", "is", m.parameters, True, "wrapped")
        for m in agent_instrumentation.WRAPPED
    ),
    (
        "SimpleElasticAgent._construct_event",
        "has",
        ("state", "source", "worker", "raw_error"),
        True,
        "the events are the agent's own",
    ),
    ("RendezvousHandler.get_run_id", "is", ("self",), True, "the run id of the worker spans"),
    ("RunResult fields", "has", ("state", "return_values", "failures"), True, "outcomes"),
    (
        "ProcessFailure fields",
        "has",
        ("local_rank", "pid", "exitcode", "error_file", "error_file_data"),
        True,
        "a failed worker's facts",
    ),
    ("Event fields", "has", ("name", "timestamp", "metadata"), True, "set on each event"),
    ("Worker slots", "has", ("local_rank", "global_rank"), True, "a worker's ranks"),
    ("WorkerGroup slots", "has", ("spec", "workers", "state"), True, "restart cause, workers"),
    ("WorkerSpec fields (read)", "has", _SPEC_READ, True, "the destination and the run id"),
    ("EventSource members", "has", ("AGENT", "WORKER"), True, "event sources"),
    (
        "WorkerState members",
        "has",
        ("HEALTHY", "UNHEALTHY", "SUCCEEDED", "FAILED"),
        True,
        "the states the monitor reports on",
    ),
    (
        "attributes (read)",
        "has",
        tuple(f"{c}.{a}" for c, a in _ATTRIBUTES_READ),
        True,
        "the process context, its error files and the failures seen before close()",
    ),
    (
        "SubprocessContext._poll order",
        "starts",
        ("capture", "close"),
        True,
        "failures captured before the first close() are the workers that ended on their own",
    ),
    (
        "LocalElasticAgent._start_workers order",
        "is",
        ("_setup_local_watchdog(envs=envs)", "start_processes(envs=envs)"),
        True,
        "the variables added to envs in _setup_local_watchdog reach the workers",
    ),
    (
        "agent calls",
        "has",
        AGENT_CALLS,
        True,
        "the agent steps happen where the wrappers expect them",
    ),
    ("events.handlers names", "has", ("_log_handlers",), True, "the bridge's destination"),
    (
        "torchrun options",
        "has",
        ("--event-log-handler",),
        True,
        "the only way torchrun's agent sends its events to the bridge",
    ),
    (
        "SimpleElasticAgent._construct_event",
        "has",
        ("duration_ms",),
        False,
        "step events carry duration_ms",
    ),
    (
        "SimpleElasticAgent._construct_event",
        "has",
        ("exit_code", "worker_pid"),
        False,
        "worker events carry exit_code and worker_pid",
    ),
    (
        "SubprocessContext._poll order",
        "is",
        ("capture", "close", "capture"),
        False,
        "the workers torch stopped are in RunResult.failures: reported STOPPED",
    ),
    (
        "SubprocessContext.pids",
        "is",
        ("self",),
        False,
        "the training watch finds the workers' pids",
    ),
    (
        "entry-point groups",
        "has",
        ("rendezvous.registry:torchrun.handlers",),
        False,
        "zero-code activation (the otel-* rendezvous backends)",
    ),
)
"""What the wrappers rely on: ``needed`` (without it, :func:`problems`) or not (a lesser
report, :func:`limitations`); ``why`` names what depends on it."""


def problems(shape: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Why the agent instrumentation cannot work as written on a torch of this shape."""
    return _unmet(shape, needed=True)


def limitations(shape: Mapping[str, tuple[str, ...]]) -> list[str]:
    """What the agent instrumentation reports less of on a torch of this shape."""
    return _unmet(shape, needed=False)


def differences(
    old: Mapping[str, tuple[str, ...]], new: Mapping[str, tuple[str, ...]]
) -> list[str]:
    """Each key whose value differs, as ``key: old -> new``."""
    keys = [*old, *(k for k in new if k not in old)]
    return [
        f"{key}: {old.get(key, _MISSING)} -> {new.get(key, _MISSING)}"
        for key in keys
        if old.get(key) != new.get(key)
    ]


def _unmet(shape: Mapping[str, tuple[str, ...]], needed: bool) -> list[str]:
    unmet = []
    for key, relation, values, is_needed, why in REQUIREMENTS:
        if is_needed != needed:
            continue
        found = shape.get(key, _MISSING)
        ok = {
            "is": found == values,
            "has": set(values) <= set(found),
            "starts": found[: len(values)] == values,
        }[relation]
        if not ok:
            unmet.append(f"{key} {relation} {values}, found {found} ({why})")
    return unmet


# --- reading the source -------------------------------------------------------------------------


def _facts(sources: Mapping[str, str]) -> Shape:
    """The keys read from the source: the same for an installed torch and an unpacked wheel."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    classes = {name: _class(trees[path], name) for name, path in _CLASSES.items() if path in trees}

    def methods(name: str) -> list[ast.FunctionDef]:
        found = classes.get(name)
        return _functions(found.body) if found is not None else []

    definitions = sorted(
        f"{c}.{f.name}"
        for c in (*_AGENT_CLASSES, "PContext", "SubprocessContext")
        for f in methods(c)
        if f.name in _STEP_NAMES or (c.endswith("Context") and f.name == "close")
    )
    attributes = tuple(f"{c}.{a}" for c, a in _ATTRIBUTES_READ if a in _self_assigned(methods(c)))
    calls = sorted(
        {
            f"{c}.{f.name} -> {callee}"
            for c in _AGENT_CLASSES
            for f in methods(c)
            for callee in _step_calls(f)
        }
    )
    poll = next((f for f in methods("SubprocessContext") if f.name == "_poll"), None)
    start = next((f for f in methods("LocalElasticAgent") if f.name == "_start_workers"), None)
    handlers = trees[_HANDLERS]
    return {
        "definitions": tuple(definitions),
        "attributes (read)": attributes,
        "agent calls": tuple(calls),
        "SubprocessContext._poll order": _poll_order(poll) if poll else _MISSING,
        "LocalElasticAgent._start_workers order": _env_hand_off(start) if start else _MISSING,
        "events.handlers names": tuple(
            n for n in ("_log_handlers", "get_logging_handler") if n in _module_names(handlers)
        ),
        "entry-point groups": tuple(
            f"{module}:{group}"
            for module, path in (("events.handlers", _HANDLERS), ("rendezvous.registry", _REGISTRY))
            for group in _unique(
                n.value
                for n in _in_order(ast.walk(trees[path]))
                if isinstance(n, ast.Constant)
                and isinstance(n.value, str)
                and n.value.startswith("torchrun.")
            )
        ),
        "torchrun options": tuple(
            _unique(
                a.value
                for n in _in_order(ast.walk(trees[_RUN]))
                if isinstance(n, ast.Call) and _attr(n.func) == "add_argument"
                for a in n.args
                if isinstance(a, ast.Constant)
                and isinstance(a.value, str)
                and a.value.replace("_", "-") == "--event-log-handler"
            )
        ),
    }


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _functions(body: list[ast.stmt]) -> list[ast.FunctionDef]:
    return [s for s in body if isinstance(s, ast.FunctionDef)]


def _parameters(args: ast.arguments) -> tuple[str, ...]:
    names = [a.arg for a in (*args.posonlyargs, *args.args)]
    names += [args.vararg.arg] if args.vararg else []
    names += [a.arg for a in args.kwonlyargs]
    names += [args.kwarg.arg] if args.kwarg else []
    return tuple(names)


def _annotated(body: list[ast.stmt]) -> tuple[str, ...]:
    return tuple(
        s.target.id for s in body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    )


def _assigned_strings(body: list[ast.stmt], name: str) -> tuple[str, ...]:
    for s in body:
        targets = s.targets if isinstance(s, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            value = getattr(s, "value", None)
            elements = value.elts if isinstance(value, (ast.List, ast.Tuple)) else []
            return tuple(
                e.value
                for e in elements
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return ()


def _module_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for s in tree.body:
        if isinstance(s, (ast.FunctionDef, ast.ClassDef)):
            names.add(s.name)
        elif isinstance(s, ast.Assign):
            names |= {t.id for t in s.targets if isinstance(t, ast.Name)}
        elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
            names.add(s.target.id)
    return names


def _is_self(node: ast.expr, attr: str | None = None) -> bool:
    """``self.<attr>`` (any attribute when ``attr`` is None)."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attr is None or node.attr == attr)
    )


def _attr(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else ""


def _self_assigned(functions: list[ast.FunctionDef]) -> set[str]:
    found: set[str] = set()
    for f in functions:
        for n in ast.walk(f):
            targets = n.targets if isinstance(n, ast.Assign) else []
            targets = [n.target] if isinstance(n, ast.AnnAssign) else targets
            found |= {t.attr for t in targets if isinstance(t, ast.Attribute) and _is_self(t)}
    return found


def _in_order(nodes: Iterable[ast.AST]) -> list[ast.AST]:
    """Nodes in the order they appear in the source (:func:`ast.walk` goes breadth first)."""
    return sorted(
        (n for n in nodes if hasattr(n, "lineno")),
        key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)),
    )


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _step_calls(function: ast.FunctionDef) -> list[str]:
    """The wrapped methods ``function`` calls on ``self`` (``_pcontext.close``: its context's)."""
    found = []
    for n in ast.walk(function):
        if not isinstance(n, ast.Call):
            continue
        if _is_self(n.func) and _attr(n.func) in _STEP_NAMES:
            found.append(_attr(n.func))
        elif _attr(n.func) == "close" and _is_self(getattr(n.func, "value", n), "_pcontext"):
            found.append("_pcontext.close")
    return found


def _poll_order(poll: ast.FunctionDef) -> tuple[str, ...]:
    """``capture`` (a failure recorded in ``self._failures``) and ``close`` (``self.close()``),
    in source order, repeats folded."""
    steps = []
    for n in _in_order(ast.walk(poll)):
        if isinstance(n, ast.Call) and _is_self(n.func, "close"):
            steps.append("close")
        if _is_capture(n):
            steps.append("capture")
    return tuple(s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s)


def _is_capture(n: ast.AST) -> bool:
    """A call of ``self._capture_process_failures`` or an assignment to ``self._failures[i]``."""
    if isinstance(n, ast.Call):
        return _is_self(n.func, "_capture_process_failures")
    targets = n.targets if isinstance(n, ast.Assign) else []
    return any(isinstance(t, ast.Subscript) and _is_self(t.value, "_failures") for t in targets)


def _env_hand_off(start: ast.FunctionDef) -> tuple[str, ...]:
    """How ``_start_workers`` hands the workers' environments on, in source order."""
    steps = []
    for n in _in_order(ast.walk(start)):
        if isinstance(n, ast.Call) and _is_self(n.func, "_setup_local_watchdog"):
            steps.append(ast.unparse(n).removeprefix("self."))
        elif isinstance(n, ast.Call) and getattr(n.func, "id", "") == "start_processes":
            envs = [ast.unparse(k.value) for k in n.keywords if k.arg == "envs"]
            steps.append(f"start_processes(envs={envs[0]})" if envs else "start_processes()")
    return tuple(steps)


# --- the table ----------------------------------------------------------------------------------

RELEASES: dict[tuple[int, int], str] = {
    (2, 4): "2.4.1",
    (2, 5): "2.5.1",
    (2, 6): "2.6.0",
    (2, 7): "2.7.1",
    (2, 8): "2.8.0",
    (2, 9): "2.9.1",
    (2, 10): "2.10.0",
    (2, 11): "2.11.0",
    (2, 12): "2.12.1",
    (2, 13): "2.13.0",
    (2, 14): "2.14.1",
    (2, 15): "2.15.0",
}
"""The release of each minor whose wheel was read (the latest patch on PyPI then)."""

_BASE: Shape = {  # torch 2.4
    "LocalElasticAgent._monitor_workers": ("self", "worker_group"),
    "LocalElasticAgent._stop_workers": ("self", "worker_group", "is_restart"),
    "LocalElasticAgent._start_workers": ("self", "worker_group"),
    "LocalElasticAgent._setup_local_watchdog": ("self", "envs"),
    "SimpleElasticAgent._exit_barrier": ("self",),
    "SimpleElasticAgent._restart_workers": ("self", "worker_group"),
    "PContext.close": ("self", "death_sig", "timeout"),
    "SimpleElasticAgent._construct_event": (
        "self",
        "state",
        "source",
        "worker",
        "raw_error",
        "duration_ms",
    ),
    "RendezvousHandler.get_run_id": ("self",),
    "SubprocessContext.pids": ("self",),
    "RunResult fields": ("state", "return_values", "failures"),
    "ProcessFailure fields": (
        "local_rank",
        "pid",
        "exitcode",
        "error_file",
        "error_file_data",
        "message",
        "timestamp",
    ),
    "Event fields": ("name", "source", "timestamp", "metadata"),
    "Worker slots": (
        "id",
        "local_rank",
        "global_rank",
        "role_rank",
        "world_size",
        "role_world_size",
    ),
    "WorkerGroup slots": (
        "spec",
        "workers",
        "store",
        "group_rank",
        "group_world_size",
        "state",
        "master_addr",
        "master_port",
    ),
    "EventSource members": ("AGENT", "WORKER"),
    "WorkerState members": (
        "UNKNOWN",
        "INIT",
        "HEALTHY",
        "UNHEALTHY",
        "STOPPED",
        "SUCCEEDED",
        "FAILED",
    ),
    "WorkerSpec fields (read)": ("rdzv_handler",),
    "definitions": (
        "LocalElasticAgent._monitor_workers",
        "LocalElasticAgent._setup_local_watchdog",
        "LocalElasticAgent._start_workers",
        "LocalElasticAgent._stop_workers",
        "PContext.close",
        "SimpleElasticAgent._exit_barrier",
        "SimpleElasticAgent._monitor_workers",
        "SimpleElasticAgent._restart_workers",
        "SimpleElasticAgent._start_workers",
        "SimpleElasticAgent._stop_workers",
    ),
    "attributes (read)": (
        "LocalElasticAgent._pcontext",
        "SimpleElasticAgent._worker_group",
        "PContext.error_files",
        "SubprocessContext._failures",
    ),
    "agent calls": AGENT_CALLS,
    "SubprocessContext._poll order": ("capture", "close"),
    "LocalElasticAgent._start_workers order": (
        "_setup_local_watchdog(envs=envs)",
        "start_processes(envs=envs)",
    ),
    "events.handlers names": ("_log_handlers", "get_logging_handler"),
    "entry-point groups": (),
    "torchrun options": (),
}
_CHANGES: dict[tuple[int, int], Shape] = {  # each release: what differs from the one before
    (2, 4): {},
    (2, 5): {},
    (2, 6): {
        "entry-point groups": ("rendezvous.registry:torchrun.handlers",),
    },
    (2, 7): {},
    (2, 8): {
        "LocalElasticAgent._stop_workers": ("self", "worker_group"),
        "WorkerSpec fields (read)": ("event_log_handler", "rdzv_handler"),
        "torchrun options": ("--event-log-handler", "--event_log_handler"),
    },
    (2, 9): {},
    (2, 10): {
        "SimpleElasticAgent._construct_event": (
            "self",
            "state",
            "source",
            "worker",
            "raw_error",
            "duration_ms",
            "exit_code",
            "worker_pid",
        ),
        "SubprocessContext._poll order": ("capture", "close", "capture"),
    },
    (2, 11): {},
    (2, 12): {},
    (2, 13): {},
    (2, 14): {},
    (2, 15): {},
}


SHAPES: dict[tuple[int, int], Shape] = {}
"""(major, minor) → the shape of that torch release: :data:`_BASE` with each release's
:data:`_CHANGES` applied in turn."""
_shape: Shape = {}
for _release, _changes in _CHANGES.items():
    _shape = {**(_shape or _BASE), **_changes}
    SHAPES[_release] = _shape
