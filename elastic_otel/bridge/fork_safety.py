"""Fork safety: a forked child's new threads never take a thread id that an inherited torch
store still holds, so the store joins its own, finished thread as it would without the bridge.

In a forked child, before the bridge's threads start there, a native thread that ends at once
and is never joined is started on each stack inherited from the parent, so that no new thread
and no glibc cache takes it; for the threads gRPC restarts inside ``fork()``, the parent raises
the default stack size just for the fork. Design: ``docs/guarantees.md`` (Forked processes).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable

from elastic_otel.emit.export_gate import ExportGate

_logger = logging.getLogger("elastic_otel")

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_ATTR_BYTES = 256  # >= sizeof(pthread_attr_t) on every glibc platform (56 or 64)


_MAX_GUARD = 1 << 20
"""A thread's guard is a page or a few (``pthread_attr_setguardsize``); a larger inaccessible
mapping under a read-write one is a malloc arena's reserve under the next arena."""


def thread_stack_sizes() -> list[int]:
    """Sizes in bytes of the thread stacks mapped in this process, guard page included (empty
    where the OS does not say). A stack is an anonymous read-write mapping right above its
    guard; besides running threads' this finds the stacks of exited threads nobody joined and
    those in glibc's cache. A mapping of that shape that is no stack costs one idle mapping."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            text = maps.read()
    except OSError:
        return []
    sizes = []
    guard: tuple[int, int] | None = None
    # An anonymous mapping's line ends with its inode, 0: only those few dozen of the
    # process's hundreds of lines are parsed (this runs at every fork).
    for line in text.split(b"\n"):
        if not line.endswith((b" 0", b" 0 ")):
            continue
        fields = line.split()
        if len(fields) != 5:
            guard = None
            continue
        start_hex, _, end_hex = fields[0].partition(b"-")
        start, end = int(start_hex, 16), int(end_hex, 16)
        if fields[1] == b"rw-p" and guard is not None and guard[1] == start:
            sizes.append(end - guard[0])
        small = end - start <= _MAX_GUARD
        guard = (start, end) if fields[1] == b"---p" and small else None
    return sizes


def stack_size_above(blocks: list[int], current: int) -> int:
    """The smallest stack size, at least ``current``, for which glibc reuses none of ``blocks``.

    glibc serves a request of ``size + guard`` from the smallest cached block at least that
    large, unless that block is over four times larger."""
    size = current
    for block in sorted(blocks):
        if size + _PAGE <= block <= 4 * (size + _PAGE):
            size = block
    return size


class _Pthreads:
    """The few glibc calls the guard needs, through ``ctypes``: the process's default thread
    stack size (used by threads created without one: Python's, gRPC's, ``std::thread``) and
    native threads that end at once."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._get_default = libc.pthread_getattr_default_np
        self._set_default = libc.pthread_setattr_default_np
        self._init = libc.pthread_attr_init
        self._get_size = libc.pthread_attr_getstacksize
        self._set_size = libc.pthread_attr_setstacksize
        self._set_size.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self._destroy = libc.pthread_attr_destroy
        self._create = libc.pthread_create
        self._create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        # A start routine that returns at once: pthread_self ignores the argument it is given.
        self._noop = ctypes.cast(libc.pthread_self, ctypes.c_void_p)

    def default_stack_size(self) -> int:
        return self._with_default(lambda attr: self._read_size(attr))

    def set_default_stack_size(self, size: int) -> bool:
        def update(attr: ctypes.Array[ctypes.c_char]) -> int:
            ok = self._set_size(attr, size) == 0 and self._set_default(attr) == 0
            return 1 if ok else 0

        return self._with_default(update) == 1

    def start_finished_thread(self, stack_size: int) -> int:
        """Start a joinable native thread with a stack of ``stack_size`` that ends at once
        and is left unjoined; its id, 0 if it could not start."""
        attr = ctypes.create_string_buffer(_ATTR_BYTES)
        if self._init(attr) != 0:
            return 0
        try:
            if self._set_size(attr, stack_size) != 0:
                return 0
            ident = ctypes.c_ulong()
            ok = self._create(ctypes.byref(ident), attr, self._noop, None) == 0
            return ident.value if ok else 0
        finally:
            self._destroy(attr)

    def _read_size(self, attr: ctypes.Array[ctypes.c_char]) -> int:
        size = ctypes.c_size_t()
        return size.value if self._get_size(attr, ctypes.byref(size)) == 0 else 0

    def _with_default(self, use: Callable[[ctypes.Array[ctypes.c_char]], int]) -> int:
        attr = ctypes.create_string_buffer(_ATTR_BYTES)
        if self._get_default(attr) != 0:
            return 0
        try:
            return use(attr)
        finally:
            self._destroy(attr)


def _pthreads() -> _Pthreads | None:
    try:
        return _Pthreads()
    except (AttributeError, OSError):
        return None  # not glibc: no stack cache of this kind to guard


class ForkGuard:
    """Keeps the stacks the parent's threads leave in a forked child as fork left them.

    One per process (glibc's stack cache and default thread attributes are process-wide), held
    by :class:`elastic_otel.bridge.process.BridgeProcess`; :meth:`watch` hooks it, and the
    process's export ``gate``, into ``os.fork`` once.
    """

    def __init__(self, gate: ExportGate) -> None:
        self._gate = gate
        self._hooked = False
        self._lock = threading.Lock()
        self.bridge_running = False  # set by the bridge once it has started its threads
        self.forked = False  # a forked child whose inherited stacks are not held yet
        self._restore = 0  # the default stack size the parent raised for a fork, or 0
        self._pthreads = _pthreads()
        self._at_fork: list[int] | None = None  # the stacks read for the fork under way
        self._read: tuple[bytes, list[int]] | None = None  # (virtual size, stacks) last read
        self._raised_block = 0  # the stack block of a thread started while the size is raised

    def watch(self) -> None:
        """Guard every fork from now on (idempotent)."""
        with self._lock:
            if self._hooked or not hasattr(os, "register_at_fork") or self._pthreads is None:
                return
            self._hooked = True
        os.register_at_fork(
            before=self._before_fork,
            after_in_parent=self._after_fork_in_parent,
            after_in_child=self._after_fork_in_child,
        )

    def _before_fork(self) -> None:
        self._gate.before_fork()  # no export inside gRPC at the fork (emit/export_gate.py)
        self._at_fork = None
        if self.bridge_running:
            # gRPC restarts its threads inside fork(), before any Python code runs in the
            # child: with a default stack size above every stack here, they take none of them.
            self._restore = self._raise_default_stack_size()

    def _after_fork_in_parent(self) -> None:
        self._gate.after_fork_in_parent()
        self._restore_default_stack_size()

    def _after_fork_in_child(self) -> None:
        self._gate.after_fork_in_child()
        self._lock = threading.Lock()  # another thread may have held it at fork
        self.forked = True
        if self.bridge_running:
            # The child starts threads of its own (its bridge's, at its first event), which must
            # not land on a stack the parent's threads left in glibc's cache. The child's map
            # is the parent's at the fork, read just before it (gRPC's threads, stopped for the
            # fork, left their stacks in glibc's cache): not read again.
            self.hold_inherited_stacks(self._at_fork)
        self.bridge_running = False
        self._restore_default_stack_size()

    def hold_inherited_stacks(self, stacks: list[int] | None = None) -> int:
        """In a forked child, once, before the bridge's first thread there: put a finished,
        unjoined thread on each stack the parent left (``stacks``: their sizes, read from the
        parent's map at the fork; by default from the child's map now). How many; never
        raises."""
        with self._lock:
            if not self.forked or self._pthreads is None:
                return 0
            self.forked = False
            held = 0
            try:
                for block in self._stacks() if stacks is None else stacks:
                    # The request (size + guard page) equals the block: glibc hands out the
                    # cached block of exactly that size while one is left.
                    held += self._pthreads.start_finished_thread(block - _PAGE) != 0
            except Exception:
                _logger.debug("elastic-otel: inherited thread stacks not held", exc_info=True)
            return held

    def _raise_default_stack_size(self) -> int:
        """Raise the default stack size above every thread stack mapped and over four times
        itself; the size it had, or 0 if unchanged. Never raises."""
        try:
            assert self._pthreads is not None
            current = self._pthreads.default_stack_size()
            self._at_fork = self._stacks()
            # Over four times the default: glibc never serves such a block, once cached, to a
            # thread started with the default size (a store's daemon), so the threads started
            # while it is raised (gRPC's) are the only ones on blocks of that size.
            size = stack_size_above(self._at_fork, 4 * (current + _PAGE))
            if current > 0 and size != current and self._pthreads.set_default_stack_size(size):
                self._raised_block = size + _PAGE
                return current
        except Exception:
            _logger.debug("elastic-otel: default stack size not raised", exc_info=True)
        return 0

    def _stacks(self) -> list[int]:
        """The stacks a fork keeps as it found them: :func:`thread_stack_sizes` but those of
        the threads gRPC restarted inside an earlier fork (the raised size's blocks: no torch
        store joins them), so that every fork raises the size to the same value and gRPC's
        threads in the parent take back their own cached stacks, not new ones.

        The map is read again only when the process's virtual size changed since the last
        read: a stack is mapped or unmapped whole (an exited thread's stays mapped, joined or
        not), so the sizes cannot change alone, and a fork reads 50 bytes instead of a map of
        hundreds of lines (~0.5 ms in a process with torch)."""
        try:
            with open("/proc/self/statm", "rb") as statm:
                size = statm.read().split(b" ", 1)[0]
        except OSError:
            size = b""
        read = self._read
        if not size or read is None or read[0] != size:
            read = self._read = (size, thread_stack_sizes())
        return [block for block in read[1] if block != self._raised_block]

    def _restore_default_stack_size(self) -> None:
        restore, self._restore = self._restore, 0
        if restore and self._pthreads is not None:
            self._pthreads.set_default_stack_size(restore)
