"""The worker start-up: what a worker leaves for its agent to report, when it dies or hangs.

torch's agent learns only an exit code when a worker dies, and nothing while it hangs. Run by
the ``sitecustomize`` the agent puts first on each worker's ``PYTHONPATH``, :func:`start` arms,
each on its own, ``faulthandler`` and an exception hook into report files, stacks on a signal,
the progress record and the collectives thread; the agent, which outlives the worker, reads
the files. It also makes the rank's ``worker`` span the current OpenTelemetry context once the
process imports OpenTelemetry. A feature that fails changes nothing for the worker.
Design: ``docs/architecture.md`` (The worker start-up).
"""

from __future__ import annotations

import os
import sys

SITE_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
"""The directory whose ``sitecustomize`` runs :func:`start`; the agent prepends it to
``PYTHONPATH``."""

REPORTS_VARIABLE = "ELASTIC_OTEL_WORKER_REPORTS"
# environment_variables.ELASTIC_OTEL_WORKER_REPORTS (a test keeps them equal), spelled here so
# that a process without it imports nothing more than os and sys.

MESSAGE_LIMIT = 8192
"""Characters of an exception's message kept in the report."""
TRACEBACK_LIMIT = 32768
"""Bytes of an exception's traceback kept in the report (its innermost frames)."""

_worker_pid: list[int] = []  # the process start() armed: its forked children are not the worker
_stack_signal: list[int] = []  # the signal armed for stack dumps, for the progress record

DEFAULT_STACK_SIGNAL = "SIGRTMIN+3"
"""``ELASTIC_OTEL_STACK_SIGNAL``'s default: a real-time signal, which no library of a training
job uses (glibc keeps the two below ``SIGRTMIN`` for itself)."""
C10D_MODULE = "torch.distributed.distributed_c10d"
DISTRIBUTED_MODULE = "torch.distributed"
TRACE_MODULE = "opentelemetry.trace"

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType


def start() -> None:
    """Arm this worker's reports when its agent asked for them (``ELASTIC_OTEL_WORKER_REPORTS``
    is ``1``); do nothing otherwise. Never raises."""
    if os.environ.get(REPORTS_VARIABLE) != "1":
        return
    try:
        directory = _take_environment()
    except Exception:
        return
    if directory is None:
        return  # torch gave this worker no error file: nowhere to write
    import contextlib  # already loaded by the interpreter's start-up

    _worker_pid[:] = [os.getpid()]
    for feature in FEATURES:
        # A feature that fails is one feature less; the worker runs on as without it.
        with contextlib.suppress(Exception):
            feature(directory)


def _take_environment() -> str | None:
    """Put the worker's own ``PYTHONPATH`` back and remove the start-up's variables (before
    anything else: the worker's children must not inherit them); the directory of torch's error
    file, where the reports go."""
    from elastic_otel.names import environment_variables as env

    os.environ.pop(env.ELASTIC_OTEL_WORKER_REPORTS, None)
    worker_path = os.environ.pop(env.ELASTIC_OTEL_WORKER_PYTHONPATH, None)
    if worker_path is None:  # not from our agent: take our directory out of what is there
        worker_path = _without_site(os.environ.get(env.PYTHONPATH, ""))
    if worker_path:
        os.environ[env.PYTHONPATH] = worker_path
    else:
        os.environ.pop(env.PYTHONPATH, None)
    error_file = os.environ.get(env.TORCHELASTIC_ERROR_FILE)
    return os.path.dirname(os.path.abspath(error_file)) if error_file else None


def _without_site(path: str) -> str:
    """``path`` (a ``PYTHONPATH`` value) without :data:`SITE_DIRECTORY`."""
    return os.pathsep.join(p for p in path.split(os.pathsep) if p and not _is_site(p))


def _is_site(entry: str) -> bool:
    return os.path.normcase(os.path.realpath(entry)) == os.path.normcase(
        os.path.realpath(SITE_DIRECTORY)
    )


def _is_worker() -> bool:
    return _worker_pid == [os.getpid()]


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _create(path: str) -> int:
    """A new, private file descriptor on ``path``, truncated; never through a symbolic link
    (the directory is torch's private one, this keeps it so)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags, 0o600)


# --- fatal signals -------------------------------------------------------------------------------


def _record_fatal_signals(directory: str) -> None:
    """``faulthandler`` into the fault file (``docs/architecture.md``, The worker start-up)."""
    import faulthandler

    from elastic_otel.names import environment_variables as env

    if faulthandler.is_enabled():
        return  # the user's own choice of where fatal-signal stacks go wins
    fd = _create(os.path.join(directory, env.WORKER_FAULT_FILE))
    # A descriptor, not a file object: nothing can close it behind faulthandler's back. It is
    # not inherited across exec (os.open's default).
    faulthandler.enable(fd, all_threads=True)
    # A forked child (a DataLoader worker) inherits the handler and the descriptor; its crash
    # must not read as the worker's. Without the start-up it would print nothing.
    _silence_in_children(fd)


def _silence_in_children(fd: int) -> None:
    """In a forked child, ``fd`` (one of the worker's report files) writes to ``/dev/null``."""

    def silence() -> None:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd, inheritable=False)
            os.close(null)
        except OSError:
            pass

    os.register_at_fork(after_in_child=silence)


# --- uncaught exceptions -------------------------------------------------------------------------


def _record_uncaught_exceptions(directory: str) -> None:
    """Chain ``sys.excepthook``: the error file first, then the previous hook."""
    from types import TracebackType

    from elastic_otel.names import environment_variables as env

    path = os.path.join(directory, env.WORKER_ERROR_FILE)
    previous = sys.excepthook

    def excepthook(
        exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        if _is_worker():
            try:
                import time
                import traceback

                time_ns = time.time_ns()  # first: when the exception reached the top
                text = "".join(traceback.format_exception(exc_type, exc, tb))
                _write_exception(path, exc_type, exc, text, time_ns)
            except Exception:
                pass  # the report is lost; the previous hook still prints the traceback
        # Outside the try: the previous hook fails, or not, as it would without this one.
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook


def _write_exception(
    path: str,
    exc_type: type[BaseException],
    exc: BaseException,
    traceback_text: str,
    time_ns: int,
) -> None:
    """The error file: {"type", "message", "traceback", "time_unix_nano"}, within the bound
    :func:`~elastic_otel.parsing.worker_reports.read_worker_report` reads."""
    import json

    from elastic_otel.parsing.worker_reports import MAX_REPORT_BYTES, innermost_frames

    name = exc_type.__qualname__
    module = getattr(exc_type, "__module__", None)
    if module and module != "builtins":
        name = f"{module}.{name}"
    try:
        message: str | None = str(exc)
    except Exception:  # a broken __str__
        message = None
    message_limit, traceback_limit = MESSAGE_LIMIT, TRACEBACK_LIMIT
    while True:
        record = {
            "type": name,
            "message": message[:message_limit] if message is not None else None,
            "traceback": innermost_frames(traceback_text, traceback_limit),
            "time_unix_nano": time_ns,
        }
        data = json.dumps(record, ensure_ascii=False).encode("utf-8", "replace")
        # JSON escapes make some text up to six times longer: shrink to the reader's bound.
        if len(data) <= MAX_REPORT_BYTES or traceback_limit == 0:
            break
        message_limit, traceback_limit = message_limit // 4, traceback_limit // 4
    _write_atomically(path, data)


def _write_atomically(path: str, data: bytes) -> None:
    """``data`` at ``path`` whole or not at all: the agent may read it the moment the worker
    is gone."""
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = _create(temporary)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    try:
        os.replace(temporary, path)
    except OSError:
        os.unlink(temporary)
        raise


# --- exec ----------------------------------------------------------------------------------------


def _follow_exec(directory: str) -> None:
    """An ``exec`` in the worker process hands the start-up on to the program it becomes (see
    ``docs/architecture.md``); every ``os.exec*`` function goes through ``execv`` or ``execve``."""
    import functools
    from collections.abc import Mapping
    from typing import Any, NoReturn

    from elastic_otel.names import environment_variables as env

    def armed(environ: Mapping[str, str]) -> dict[str, str]:
        path = _without_site(environ.get(env.PYTHONPATH, ""))
        return {
            env.PYTHONPATH: SITE_DIRECTORY + (os.pathsep + path if path else ""),
            env.ELASTIC_OTEL_WORKER_PYTHONPATH: path,
            env.ELASTIC_OTEL_WORKER_REPORTS: "1",
        }

    original_execv, original_execve = os.execv, os.execve

    @functools.wraps(original_execv)
    def execv(path: Any, argv: Any) -> NoReturn:
        if not _is_worker():
            original_execv(path, argv)  # a forked child's exec: as it is (never returns)
        saved = {name: os.environ.get(name) for name in armed(os.environ)}
        os.environ.update(armed(os.environ))
        try:
            original_execv(path, argv)
        finally:  # reached only when the exec failed: the worker goes on as it was
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    @functools.wraps(original_execve)
    def execve(path: Any, argv: Any, environ: Any) -> NoReturn:
        if _is_worker() and isinstance(environ, Mapping) and all(map(_is_str, environ)):
            environ = {**environ, **armed(environ)}
        original_execve(path, argv, environ)

    os.execv = execv
    os.execve = execve  # type: ignore[assignment]


# --- stacks on request ---------------------------------------------------------------------------


def parse_stack_signal(value: str | None) -> int | None:
    """The signal ``ELASTIC_OTEL_STACK_SIGNAL`` names (unset or empty: the default):
    ``SIGUSR1``, ``SIGUSR2`` or a real-time signal, by name (``SIGRTMIN+3``, ``RTMAX-1``, any
    case) or number; ``None`` for ``none`` and for anything else: a signal that stops, kills or
    that torch uses (``SIGTERM``) must keep its meaning."""
    import signal

    text = (value or "").strip().upper() or DEFAULT_STACK_SIGNAL
    usr = {"USR1": int(signal.SIGUSR1), "USR2": int(signal.SIGUSR2)}
    rt_min = int(getattr(signal, "SIGRTMIN", 0))
    rt_max = int(getattr(signal, "SIGRTMAX", -1))  # none on macOS: no real-time signal
    name = text.removeprefix("SIG")
    number: int | None = usr.get(name)
    if text.isdigit():
        number = int(text)
    elif name.startswith(("RTMIN", "RTMAX")):
        start = rt_min if name.startswith("RTMIN") else rt_max
        sign, offset = name[5:6], name[6:].strip()
        if not sign:
            number = start
        elif sign in "+-" and offset.isdigit():
            number = start + int(offset) if sign == "+" else start - int(offset)
    if number in usr.values() or (number is not None and rt_min <= number <= rt_max):
        return number
    return None


def _dump_stacks_on_signal(directory: str) -> None:
    """``faulthandler.register``: the stack of the thread the stack signal interrupts (the
    agent sends it to the main thread) appended to the stacks file. Not every thread's:
    faulthandler walks another thread's frames while that thread runs, and a worker whose other
    threads run Python crashes (``docs/architecture.md``, The worker start-up)."""
    import faulthandler
    import signal

    from elastic_otel.names import environment_variables as env

    number = parse_stack_signal(os.environ.get(env.ELASTIC_OTEL_STACK_SIGNAL))
    if number is None or signal.getsignal(number) is not signal.SIG_DFL:
        return  # none asked for, or the worker's own (None: a handler set outside Python)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(os.path.join(directory, env.WORKER_STACKS_FILE), flags, 0o600)
    try:
        # chain=False: the default action of a real-time signal is to terminate.
        faulthandler.register(number, file=fd, all_threads=False, chain=False)
    except BaseException:
        os.close(fd)
        raise
    _silence_in_children(fd)
    _stack_signal[:] = [number]
    import atexit

    atexit.register(_ignore_stack_signal, number)


def _ignore_stack_signal(number: int) -> None:
    """At exit, before the interpreter's finalization puts the signal's default action
    (terminate) back: a stack request the agent sends to a worker that is shutting down must
    not kill it."""
    import faulthandler
    import signal

    try:
        faulthandler.unregister(number)
        signal.signal(number, signal.SIG_IGN)
    except (OSError, ValueError, RuntimeError):  # not the main thread, or already finalizing
        pass


# --- progress ------------------------------------------------------------------------------------


def _record_progress(directory: str) -> None:
    """The progress record, and the collectives wrapped as torch imports them (see the module
    docstring and :mod:`elastic_otel.worker.progress`)."""
    from elastic_otel.names import environment_variables as env
    from elastic_otel.worker import progress

    path = os.path.join(directory, env.WORKER_PROGRESS_FILE)
    progress.arm(path, _stack_signal[0] if _stack_signal else 0)
    c10d = sys.modules.get(C10D_MODULE)
    if c10d is not None:  # imported before the start-up ran (by a sitecustomize of its own)
        progress.wrap_collectives(c10d, sys.modules.get(DISTRIBUTED_MODULE))
    else:
        sys.meta_path.insert(0, _CollectivesFinder())


class _AfterImportFinder:
    """A one-shot ``sys.meta_path`` finder for the module :attr:`name`: the spec the other
    finders give, with a loader that calls :meth:`then` once the module has run, before whoever
    imported it goes on. It leaves the path when that loader runs: a spec asked for and not
    loaded (``importlib.util.find_spec``) must not use it up."""

    name = ""

    def __init__(self) -> None:
        self.searching = False  # the other finders may ask the import system again

    def then(self, module: ModuleType) -> None:
        """What to do with the module once it has run; its errors are swallowed."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != self.name or self.searching:
            return None
        self.searching = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None:
                    spec = find(name, path, target)
                    if spec is not None:
                        break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None  # the import goes on as without us, and finds what we found
            spec.loader = _AfterImportLoader(spec.loader, self)
            return spec
        except Exception:
            return None
        finally:
            self.searching = False

    def leave(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


class _CollectivesFinder(_AfterImportFinder):
    """``distributed_c10d``: its collectives wrapped once the module has run, before
    ``torch.distributed`` copies them (``from .distributed_c10d import *``)."""

    name = C10D_MODULE

    def then(self, module: ModuleType) -> None:
        from elastic_otel.worker import progress

        progress.wrap_collectives(module)


class _WorkerContextFinder(_AfterImportFinder):
    """OpenTelemetry's tracing API: the worker span attached once it has run (see
    :func:`_attach_worker_context`)."""

    name = TRACE_MODULE

    def then(self, module: ModuleType) -> None:
        _attach_to_main_thread()


class _AfterImportLoader:
    """The module's own loader, and the finder's :meth:`~_AfterImportFinder.then` once it has
    run. The module keeps its own loader: nothing of ours shows after."""

    def __init__(self, loader: Loader, finder: _AfterImportFinder) -> None:
        self.loader = loader
        self.finder = finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.finder.leave()
        try:
            self.loader.exec_module(module)
        finally:
            if module.__spec__ is not None and module.__spec__.loader is self:
                module.__spec__.loader = self.loader
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self.loader
        import contextlib

        # A failure: as without the start-up (unrecorded collectives, no worker context).
        with contextlib.suppress(Exception):
            self.finder.then(module)

    def __getattr__(self, name: str) -> object:
        # get_source, get_filename, is_package...: asked of the module's loader while it runs.
        return getattr(self.loader, name)


def _watch_collectives(directory: str) -> None:
    """The process groups' progress from torch's Flight Recorder, on a thread of its own
    (:mod:`elastic_otel.worker.collectives`)."""
    from elastic_otel.worker import collectives

    collectives.start(directory)


def _keep_nccl_dumps(directory: str) -> None:
    """torch's own Flight Recorder dump on an NCCL watchdog timeout lands in the worker's
    directory, beside the reports, unless the user chose where (docs/hangs.md, torch's NCCL
    watchdog). torch reads the variable when it first dumps: it stays in the environment."""
    from elastic_otel.names import environment_variables as env

    if any(os.environ.get(name) for name in env.TORCH_DUMP_FILE_VARIABLES):
        return
    if not os.path.isdir(directory):  # no reports there either: the environment stays as is
        return
    prefix = os.path.join(directory, env.WORKER_NCCL_DUMP_PREFIX)
    os.environ[env.TORCH_NCCL_DEBUG_INFO_TEMP_FILE] = prefix


# --- the worker span as the current context --------------------------------------------------


def _attach_worker_context(directory: str) -> None:
    """The rank's ``worker`` span (``TRACEPARENT``) as the main thread's current OpenTelemetry
    context, attached once the process imports OpenTelemetry's tracing API: a process that
    never does pays nothing (docs/trace-model.md, "The worker span as the current context").
    The hook is ``opentelemetry.trace``, not ``opentelemetry.context``: the tracing API imports
    the context API part-way through, and attaching the span needs the tracing API whole."""
    from elastic_otel.config.environment import env_flag
    from elastic_otel.names import environment_variables as env

    if not os.environ.get(env.TRACEPARENT):
        return  # the agent reserved no span for this worker
    if not env_flag(env.ELASTIC_OTEL_WORKER_CONTEXT, True):
        return
    if TRACE_MODULE in sys.modules:  # imported before the start-up ran (a .pth file)
        _attach_to_main_thread()
    else:
        sys.meta_path.insert(0, _WorkerContextFinder())


def _attach_to_main_thread() -> None:
    from elastic_otel.worker import trace_context

    trace_context.attach_to_main_thread()


FEATURES = (
    _record_fatal_signals,
    _record_uncaught_exceptions,
    _follow_exec,
    _dump_stacks_on_signal,
    _record_progress,
    _watch_collectives,
    _keep_nccl_dumps,
    _attach_worker_context,
)
"""What :func:`start` arms in a worker, in order, each on its own: a function of torch's
error-file directory. The stack signal comes before the progress record, which names it."""
