"""Where this worker's training thread is, in a record its agent reads while the job hangs.

The training thread writes the record itself, an ``mmap`` of a small file beside its error file
(read by :mod:`elastic_otel.parsing.worker_progress`): no thread, no system call, no lock, so
the wrapped collectives, :func:`mark_step` and the goodput calls cost the training loop little,
and the agent reads the record while the worker runs, hangs, or after it died. Design, and why
each store is written as it is: ``docs/hangs.md`` (The progress record).
"""

from __future__ import annotations

import os
import sys
import time
from _thread import get_ident

# Nothing more at import (not even typing): ``import elastic_otel`` loads this module, for
# mark_step, in every process; what only a worker needs is imported by arm() and wrap().
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any, TypeVar

    _F = TypeVar("_F", bound=Callable[..., Any])

_WRAPPED_MARK = "_elastic_otel_collective"
"""Attribute of a wrapper: the index of its collective (a second wrap leaves it as it is)."""

# Bound once: a global load on the hot path instead of an attribute lookup.
_get_ident = get_ident
_time_ns = time.time_ns

_view: memoryview | None = None
"""The mapping as signed 8-byte words; ``None`` while unarmed."""
_writer = 0
"""``get_ident()`` of the thread that writes; 0 (no thread's) while unarmed and while the
writer is inside a recorded collective, so that calls made inside it go through."""
_state = [0, 0, 0]
"""seq, entered, completed: the values last stored, read here rather than from the mapping."""
# Where mark_step and leave store, as indices of 8-byte words (set by arm, from the layout).
_SEQ = _STEP = _STEP_NS = _PROGRESS = _COLLECTIVE = _SINCE = 0
_LEFT = 0
"""LEFT_TRAINING (set by arm): resolved there, not at the interpreter's exit."""
# The goodput extension's words (set by arm) and what was last stored there.
_EXT_SEQ = _FIRST_STEP = _FIRST_NS = _CKPT_STEP = _CKPT_NS = _SAVE_NS = _SAVES = 0
_first_ns = 0
"""When this process marked its first step (0: not yet): mark_step's one extra check."""
_ext = [0, 0, 0]
"""ext_seq, save_ns, saves: the values last stored in the extension."""
_fork_hook = False


def _slots() -> dict[str, int]:
    """Each field's index in the mapping seen as 8-byte words."""
    from elastic_otel.parsing.worker_progress import BODY_FIELDS, BODY_OFFSET, SEQ

    return {name: BODY_OFFSET // SEQ.size + i for i, name in enumerate(BODY_FIELDS)}


def arm(path: str, stack_signal: int = 0) -> None:
    """Create the record at ``path`` (replacing any there: a program this process exec'd from
    left it) and write to it from the calling thread on. ``stack_signal``: the signal the
    worker dumps its stacks on, for the agent (0: none)."""
    global _view, _writer, _fork_hook, _SEQ, _STEP, _STEP_NS, _PROGRESS, _first_ns
    global _COLLECTIVE, _SINCE, _LEFT
    global _EXT_SEQ, _FIRST_STEP, _FIRST_NS, _CKPT_STEP, _CKPT_NS, _SAVE_NS, _SAVES
    import mmap

    from elastic_otel.parsing.worker_progress import (
        BODY,
        BODY_FIELDS,
        EXTENSION_BODY,
        EXTENSION_BODY_OFFSET,
        EXTENSION_FIELDS,
        EXTENSION_HEADER,
        EXTENSION_MAGIC,
        EXTENSION_VERSION,
        HEADER,
        LEFT_TRAINING,
        MAGIC,
        NO_STEP,
        SEQ,
        VERSION,
    )

    if sys.byteorder != "little":
        raise OSError("the progress record is little-endian; its stores are native")
    now = time.time_ns()
    seq = 2
    values = {name: 0 for name in BODY_FIELDS}
    values.update(since_ns=now, progress_ns=now, step=NO_STEP, seq=seq)
    extension = {name: 0 for name in EXTENSION_FIELDS}
    extension.update(first_step=NO_STEP, checkpoint_step=NO_STEP, ext_seq=seq)
    data = (
        HEADER.pack(MAGIC, VERSION, os.getpid(), stack_signal)
        + BODY.pack(*(values[name] for name in BODY_FIELDS))
        + EXTENSION_HEADER.pack(EXTENSION_MAGIC, EXTENSION_VERSION)
        + EXTENSION_BODY.pack(*(extension[name] for name in EXTENSION_FIELDS))
    )
    # Written whole under another name, then renamed: a reader never sees a part of it.
    temporary = f"{path}.{os.getpid()}.tmp"
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(temporary, flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        mapping = mmap.mmap(fd, len(data))
    except BaseException:
        os.close(fd)
        os.unlink(temporary)
        raise
    os.close(fd)  # the mapping keeps the file
    try:
        os.replace(temporary, path)
    except BaseException:
        mapping.close()
        os.unlink(temporary)
        raise
    _writer = 0  # nothing writes while the state is replaced
    _view = memoryview(mapping).cast("q")
    _state[:] = [seq, 0, 0]
    slots = _slots()
    _SEQ, _STEP, _STEP_NS, _PROGRESS = (slots[k] for k in ("seq", "step", "step_ns", "progress_ns"))
    _COLLECTIVE, _SINCE, _LEFT = slots["collective"], slots["since_ns"], LEFT_TRAINING
    ext = {name: EXTENSION_BODY_OFFSET // SEQ.size + i for i, name in enumerate(EXTENSION_FIELDS)}
    _EXT_SEQ, _FIRST_STEP, _FIRST_NS = ext["ext_seq"], ext["first_step"], ext["first_step_ns"]
    _CKPT_STEP, _CKPT_NS = ext["checkpoint_step"], ext["checkpoint_ns"]
    _SAVE_NS, _SAVES = ext["save_ns"], ext["saves"]
    _ext[:] = [seq, 0, 0]
    _first_ns = 0
    _writer = _get_ident()
    if not _fork_hook:
        os.register_at_fork(after_in_child=_disarm)
        # Run when the main thread returns, before the interpreter waits for other threads
        # and runs atexit handlers (torch's among them): the worker's exit may take a while.
        import contextlib
        import threading

        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            with contextlib.suppress(RuntimeError):  # the interpreter is shutting down already
                register(leave)
        _fork_hook = True


def armed() -> bool:
    """Whether this process writes a record (a worker the start-up armed)."""
    return _view is not None


def _disarm() -> None:
    """Write no more: in a forked child, whose mapping is its parent's record."""
    global _writer, _view
    _writer = 0
    _view = None


def mark_step(step: int) -> None:
    """Record that the training thread reached ``step`` (an ``int`` ≥ 0), and when. A no-op
    outside a worker the start-up armed, or on another thread; never raises."""
    if _view is None:
        return
    if _get_ident() != _writer:
        return
    now = _time_ns()
    view, seq = _view, _state[0]
    try:
        view[_SEQ] = seq + 1
        try:
            view[_STEP] = step
        except Exception:  # not an int a record can store: nothing changed
            view[_SEQ] = seq
            return
        view[_STEP_NS] = now
        view[_PROGRESS] = now
        view[_SEQ] = _state[0] = seq + 2
        if not _first_ns:
            _mark_first(view, step, now)
    except Exception:
        pass


def leave() -> None:
    """Record that the training thread left training: it destroyed its default process group,
    or the interpreter began to exit (:data:`~elastic_otel.parsing.worker_progress.LEFT_TRAINING`).
    A no-op outside an armed worker or on another thread; never raises."""
    if _view is None or _get_ident() != _writer:
        return
    view = _view
    try:
        if view[_COLLECTIVE] == _LEFT and view[_STEP_NS] <= view[_SINCE]:
            return  # left already (destroy_process_group, then the exit): keep when
    except Exception:
        return
    _store_phase(_LEFT)


def _mark_first(view: memoryview, step: int, now: int) -> None:
    """The first step this process marked, in the goodput extension (once)."""
    global _first_ns
    _first_ns = now
    seq = _ext[0]
    view[_EXT_SEQ] = seq + 1
    view[_FIRST_STEP] = step
    view[_FIRST_NS] = now
    view[_EXT_SEQ] = _ext[0] = seq + 2


def mark_checkpoint(step: int, _save_ns: int = 0) -> None:
    """Record that a checkpoint covering ``step`` (an ``int`` ≥ 0) is saved, now: the steps up
    to it need not be redone after a failure. Call it when the save has ended (or use
    :func:`saving_checkpoint`, which also measures how long the save blocked training). A no-op
    outside a worker the start-up armed, or on another thread; never raises."""
    if _view is None:
        return
    if _get_ident() != _writer:
        return
    now = _time_ns()
    view, seq, ext = _view, _state[0], _ext[0]
    try:
        view[_SEQ] = seq + 1
        view[_EXT_SEQ] = ext + 1
        try:
            view[_CKPT_STEP] = step
        except Exception:  # not an int a record can store: nothing changed
            view[_EXT_SEQ] = ext
            view[_SEQ] = seq
            return
        view[_CKPT_NS] = now
        if _save_ns > 0 and _first_ns:  # a save before the first step is start-up
            view[_SAVE_NS] = _ext[1] = _ext[1] + _save_ns
            view[_SAVES] = _ext[2] = _ext[2] + 1
        view[_PROGRESS] = now
        view[_EXT_SEQ] = _ext[0] = ext + 2
        view[_SEQ] = _state[0] = seq + 2
    except Exception:
        pass


class _Saving:
    """The context of :func:`saving_checkpoint` in an armed worker."""

    __slots__ = ("start", "step")

    def __init__(self, step: int) -> None:
        self.step = step
        self.start = 0

    def __enter__(self) -> _Saving:
        self.start = _time_ns()
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if kind is None:  # a save that raised covers nothing
            mark_checkpoint(self.step, _time_ns() - self.start)


class _NotSaving:
    """The context of :func:`saving_checkpoint` outside an armed worker: nothing."""

    __slots__ = ()

    def __enter__(self) -> _NotSaving:
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        return None


_NOT_SAVING = _NotSaving()


def saving_checkpoint(step: int) -> _Saving | _NotSaving:
    """``with elastic_otel.saving_checkpoint(step): save(...)``: when the block ends without an
    exception, :func:`mark_checkpoint` ``(step)`` with the time the block took as the save's
    blocking time. Outside an armed worker (or on another thread) it does nothing."""
    if _view is None or _get_ident() != _writer:
        return _NOT_SAVING
    return _Saving(step)


# The wrapper of one collective, with its parameters. Entering, between the odd and the even
# store of seq it calls nothing: no other thread and no signal handler can run there
# (docs/hangs.md, the progress record). Leaving stores two words, progress then completed,
# outside the seqlock: a reader between them sees the collective under way with fresh
# progress, never a stall. The stores are guarded so that a collective's failure cannot leave them
# unpaired, and nothing of ours raises.
_WRAPPER_SOURCE = """
def _make(_eo_function, _eo_index{defaults}):
    def {name}({parameters}):
        global _writer
        _eo_me = _writer
        if _eo_me != _get_ident():
            return _eo_function({arguments})
        _eo_in = False
        try:
            _writer = 0
            try:
                _eo_seq = _state[0]
                _view[{seq}] = _eo_seq + 1
                _view[{collective}] = _eo_index
                _view[{since}] = _time_ns()
                _view[{entered}] = _state[1] = _state[1] + 1
                _view[{seq}] = _state[0] = _eo_seq + 2
                _eo_in = True
            except Exception:
                pass
            return _eo_function({arguments})
        finally:
            if _eo_in:
                try:
                    _view[{progress}] = _time_ns()
                    _view[{completed}] = _state[2] = _state[2] + 1
                except Exception:
                    pass
            _writer = _eo_me
    return {name}
"""


def wrap(function: _F, index: int) -> _F:
    """``function`` (the collective ``COLLECTIVES[index]``), recording its outermost calls on
    the writer thread; same name, documentation and signature (``__wrapped__``)."""
    import functools
    import linecache

    name = getattr(function, "__name__", "")
    shape = _parameters(function)
    if not name.isidentifier() or name.startswith("_"):
        name = "collective"  # not a name that would hide one the wrapper reads
    parameters, arguments, defaults = shape or ("*args, **kwargs", "*args, **kwargs", {})
    slots = _slots()
    source = _WRAPPER_SOURCE.format(
        name=name,
        parameters=parameters,
        arguments=arguments,
        defaults="".join(f", {key}" for key in defaults),
        seq=slots["seq"],
        collective=slots["collective"],
        since=slots["since_ns"],
        entered=slots["entered"],
        progress=slots["progress_ns"],
        completed=slots["completed"],
    )
    filename = f"<elastic_otel.worker.progress: {name}>"
    namespace: dict[str, Any] = {}
    # This module's globals: the wrapper reads and sets _writer, _view and _state here.
    exec(compile(source, filename, "exec"), globals(), namespace)
    # Its lines in tracebacks that pass through it.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    wrapper = namespace["_make"](function, index, *defaults.values())
    functools.update_wrapper(wrapper, function)
    setattr(wrapper, _WRAPPED_MARK, index)
    return wrapper


def _parameters(function: Callable[..., Any]) -> tuple[str, str, dict[str, Any]] | None:
    """``function``'s parameter list, the arguments that pass them on (by position, but
    keyword-only ones: a keyword costs a tenth of a microsecond more), and the names its
    defaults are bound to; ``None`` for a signature that is not plain enough."""
    import inspect

    try:
        # Through __wrapped__: torch's decorators on the collectives (_exception_logger,
        # deprecated) forward *args, **kwargs unchanged, as inspect and help() assume.
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    kind = inspect.Parameter
    parameters: list[str] = []
    arguments: list[str] = []
    defaults: dict[str, Any] = {}
    star = False  # the "*" before keyword-only parameters is in the list
    for i, parameter in enumerate(signature.parameters.values()):
        name = parameter.name
        # A leading underscore could hide a global the wrapper reads; before *args, a keyword
        # argument would take a positional one's place.
        if name.startswith("_") or parameter.kind in (kind.POSITIONAL_ONLY, kind.VAR_POSITIONAL):
            return None
        if parameter.kind is kind.VAR_KEYWORD:
            parameters.append(f"**{name}")
            arguments.append(f"**{name}")
        elif parameter.default is parameter.empty:
            if parameter.kind is kind.KEYWORD_ONLY:
                if not star:
                    parameters.append("*")
                    star = True
                arguments.append(f"{name}={name}")
            else:
                arguments.append(name)
            parameters.append(name)
        else:
            if parameter.kind is kind.KEYWORD_ONLY and not star:
                parameters.append("*")
                star = True
            default = f"_eo_default_{i}"
            defaults[default] = parameter.default
            parameters.append(f"{name}={default}")
            arguments.append(f"{name}={name}" if parameter.kind is kind.KEYWORD_ONLY else name)
    return ", ".join(parameters), ", ".join(arguments), defaults


def _wrap_destroy(function: _F, index: int) -> _F:
    """``destroy_process_group``: destroying the default group (no ``group``) leaves training,
    recorded as it begins (a teardown that hangs is not a training stall); a subgroup's does
    not."""
    import functools

    def destroy_process_group(group: Any = None) -> Any:
        if group is None:
            leave()
        return function(group)

    functools.update_wrapper(destroy_process_group, function)
    setattr(destroy_process_group, _WRAPPED_MARK, index)
    return destroy_process_group  # type: ignore[return-value]


def _wrap_init(function: _F, index: int, past: int) -> _F:
    """``init_process_group``: the training thread is in it from its call to its return, stored
    as the collective ``index`` with no call counted (start-up, not training), then ``past``
    until its first recorded collective; calls it makes inside are not recorded."""
    import functools

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        global _writer
        me = _writer
        if _view is None or _get_ident() != me:
            return function(*args, **kwargs)
        _store_phase(index)
        _writer = 0  # what torch calls inside is start-up too
        try:
            return function(*args, **kwargs)
        finally:
            _writer = me
            _store_phase(past)

    functools.update_wrapper(init_process_group, function)
    setattr(init_process_group, _WRAPPED_MARK, index)
    return init_process_group  # type: ignore[return-value]


def _store_phase(index: int) -> None:
    """Store ``index`` as the collective, and since when, counting no call."""
    view, seq = _view, _state[0]
    if view is None:
        return
    try:
        view[_SEQ] = seq + 1
        view[_COLLECTIVE] = index
        view[_SINCE] = _time_ns()
        view[_SEQ] = _state[0] = seq + 2
    except Exception:
        pass


_DESTROY = "destroy_process_group"
_INIT = "init_process_group"


def wrap_collectives(module: ModuleType, *copies: ModuleType | None) -> list[str]:
    """Wrap the collectives ``module`` (``torch.distributed.distributed_c10d``) has, and its
    ``destroy_process_group``, in place; in ``copies`` (modules that imported them already),
    replace the originals too. The names wrapped."""
    from elastic_otel.parsing.worker_progress import COLLECTIVES, IN_INIT, LEFT_TRAINING, PAST_INIT

    wrapped = []
    for index, name in [*enumerate(COLLECTIVES), (LEFT_TRAINING, _DESTROY)]:
        original = module.__dict__.get(name) if index else None
        if not callable(original) or hasattr(original, _WRAPPED_MARK):
            continue
        if name == _DESTROY:
            wrapper = _wrap_destroy(original, index)
        elif index == IN_INIT:
            wrapper = _wrap_init(original, IN_INIT, PAST_INIT)
        else:
            wrapper = wrap(original, index)
        setattr(module, name, wrapper)
        for copy in copies:
            if copy is not None and copy.__dict__.get(name) is original:
                setattr(copy, name, wrapper)
        wrapped.append(name)
    return wrapped
