"""Read where a live worker is: its progress record and the Python stacks it dumps on request.

A hung job looks the same from every agent: workers alive, no exit code. What each worker's
training thread leaves in its progress record (the collective it waits in and since when, its
last step, the goodput extension) points at the late rank, and its stacks show where it is.
A worker's files are untrusted input: every read is bounded and nothing here raises. Pure
standard library. Design, the layout and its seqlock: ``docs/hangs.md`` (The progress record).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import stat
import struct
import time
from dataclasses import dataclass

from elastic_otel.names.environment_variables import WORKER_PROGRESS_FILE

MAGIC = b"EOTP"
VERSION = 1
HEADER = struct.Struct("<4sIIi")
"""magic, version, pid, stack signal: written once, when the record is created."""
BODY_FIELDS = (
    "entered",
    "completed",
    "collective",
    "since_ns",
    "progress_ns",
    "step",
    "step_ns",
    "seq",
)
"""The 8-byte words after the header, in order; the writer stores each on its own."""
BODY = struct.Struct("<" + "q" * len(BODY_FIELDS))
BODY_OFFSET = HEADER.size
SEQ = struct.Struct("<q")
SEQ_OFFSET = BODY_OFFSET + BODY_FIELDS.index("seq") * SEQ.size
RECORD_SIZE = HEADER.size + BODY.size
NO_STEP = -1

EXTENSION_MAGIC = b"EOTG"
EXTENSION_VERSION = 1
EXTENSION_HEADER = struct.Struct("<4sI")
EXTENSION_FIELDS = (
    "first_step",
    "first_step_ns",
    "checkpoint_step",
    "checkpoint_ns",
    "save_ns",
    "saves",
    "ext_seq",
)
"""The extension's 8-byte words after its header, in order."""
EXTENSION_BODY = struct.Struct("<" + "q" * len(EXTENSION_FIELDS))
EXTENSION_OFFSET = RECORD_SIZE
EXTENSION_BODY_OFFSET = EXTENSION_OFFSET + EXTENSION_HEADER.size
EXTENSION_SEQ_OFFSET = EXTENSION_BODY_OFFSET + EXTENSION_FIELDS.index("ext_seq") * SEQ.size
EXTENSION_SIZE = EXTENSION_HEADER.size + EXTENSION_BODY.size
FULL_SIZE = RECORD_SIZE + EXTENSION_SIZE
"""The size of a record the worker writes now: the record and its goodput extension."""

COLLECTIVES = (
    "",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "barrier",
    "monitored_barrier",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "batch_isend_irecv",
    "send_object_list",
    "recv_object_list",
    "all_reduce_coalesced",
    "all_gather_coalesced",
    "all_gather_single",
    "reduce_scatter_single",
    "(left training)",
    "init_process_group",
    "(past init_process_group)",
)
"""``torch.distributed`` functions the worker records, by the index the record stores (0: none).
Append only: the indices are the file format. :data:`LEFT_TRAINING` and :data:`PAST_INIT` are no
function: see there; ``init_process_group`` is recorded without a call counted (:data:`IN_INIT`)."""
LEFT_TRAINING = COLLECTIVES.index("(left training)")
IN_INIT = COLLECTIVES.index("init_process_group")
"""Stored as the collective, with no call counted, while the training thread is inside
``init_process_group``: start-up, not training (docs/hangs.md, Start-up)."""
PAST_INIT = COLLECTIVES.index("(past init_process_group)")
"""Stored when ``init_process_group`` returned, until the first recorded collective replaces it:
the rank has reached every rank's rendezvous of the default group."""
"""Stored as the collective, with no call counted, when the training thread destroyed its
default process group or its interpreter began to exit: past the job's last collective, so a
worker slow to exit is not a training stall, and a rank the others still wait for is named as
one that left (a rank that ran out of data first: uneven inputs)."""

MAX_STACK_BYTES = 65536
"""Bytes :func:`read_new_stacks` returns at most per call."""

_QUICK_TRIES = 64
"""Reads of a record that changed meanwhile before pausing: a training thread that updates it
every microsecond or so still leaves gaps longer than one read."""
_PAUSES_S = (0.001, 0.01)
"""Pauses before the last reads: a writer between its two stores of ``seq`` when the kernel
took its CPU finishes once it gets it back."""
_THREAD_HEADERS = ("Thread 0x", "Current thread 0x")
_ONE_THREAD_HEADER = "Stack (most recent call first):"
"""faulthandler's header of a dump of one thread (the stack signal's: the main thread)."""


@dataclass(frozen=True, slots=True)
class WorkerProgress:
    """One reading of a worker's progress record (times in ns since the epoch)."""

    pid: int
    stack_signal: int
    """The signal that makes the worker append its stacks to the stacks file; 0: none armed,
    and then no signal must be sent (an unhandled real-time signal kills the process)."""
    entered: int
    completed: int
    collective: str | None
    """The ``torch.distributed`` function the training thread is in (``None``: none)."""
    since_ns: int
    """When it entered that collective (outside one: the last it entered, or the start)."""
    step: int | None
    step_ns: int | None
    progress_ns: int
    """The last progress of any kind: a collective completed, a step marked (else the start)."""
    first_step: int | None = None
    """The first step this process marked (the goodput extension; ``None``: none, or none)."""
    first_step_ns: int | None = None
    checkpoint_step: int | None = None
    """The step the last checkpoint it marked covers (``None``: none)."""
    checkpoint_ns: int | None = None
    """When that checkpoint was marked: its save had ended."""
    save_ns: int = 0
    """Blocking time of the checkpoint saves it measured, after its first step."""
    saves: int = 0
    left: bool = False
    """The training thread left training (:data:`LEFT_TRAINING`) and marked no step since."""
    init: int = 0
    """Where the training thread is in ``init_process_group``: 0 not reached (or not recorded),
    1 inside it (``collective`` says so, ``since_ns`` since when), 2 past it."""

    @property
    def in_collective(self) -> bool:
        return self.collective is not None


def progress_path(directory_or_error_file: str) -> str:
    """The progress file of the worker whose error-file directory (or error file) is given."""
    directory = directory_or_error_file
    if not os.path.isdir(directory):
        directory = os.path.dirname(directory)
    return os.path.join(directory, WORKER_PROGRESS_FILE)


def read_progress(directory_or_error_file: str) -> WorkerProgress | None:
    """The worker's progress record; ``None`` when it is missing, not ours or never whole."""
    try:
        fd = _open_regular(progress_path(directory_or_error_file))
    except (OSError, ValueError):
        return None
    try:
        size = os.fstat(fd).st_size
        if size not in (RECORD_SIZE, FULL_SIZE):
            return None
        # Mapped, the seqlock's reads are loads a few nanoseconds apart, where each pread is a
        # system call: a busy writer changes the record less often than that. The worker
        # never shrinks a record it wrote (a new one is renamed over it), so the mapping stays
        # whole; a copy of the bytes is read when the file cannot be mapped.
        try:
            mapping: mmap.mmap | None = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            mapping = None
        try:
            source = mapping if mapping is not None else _Pread(fd)
            record = _consistent_record(source)
            extension = _consistent_extension(source) if size == FULL_SIZE else None
        finally:
            if mapping is not None:
                mapping.close()
    except OSError:
        return None
    finally:
        os.close(fd)
    if record is None:
        return None
    magic, version, pid, stack_signal = HEADER.unpack_from(record)
    if magic != MAGIC or version != VERSION:
        return None
    entered, completed, index, since, progress, step, step_ns, _ = BODY.unpack_from(
        record, BODY_OFFSET
    )
    if index == IN_INIT:
        collective: str | None = COLLECTIVES[IN_INIT]  # no call counted: start-up
    elif index <= 0 or completed >= entered:
        collective = None
    else:
        collective = COLLECTIVES[index] if index < len(COLLECTIVES) else f"#{index}"
    progress_record = WorkerProgress(
        pid=pid,
        stack_signal=max(stack_signal, 0),
        entered=entered,
        completed=completed,
        collective=collective,
        since_ns=since,
        step=step if step >= 0 else None,
        step_ns=step_ns if step >= 0 else None,
        progress_ns=progress,
        left=index == LEFT_TRAINING and collective is None and (step < 0 or step_ns <= since),
        init=1 if index == IN_INIT else 2 if index == PAST_INIT else 0,
    )
    return _with_extension(progress_record, extension)


def _with_extension(progress: WorkerProgress, extension: bytes | None) -> WorkerProgress:
    """``progress`` with the goodput extension's fields (unchanged when there is none, or it is
    not one this reader knows: the record itself stays readable)."""
    if extension is None:
        return progress
    magic, version = EXTENSION_HEADER.unpack_from(extension)
    if magic != EXTENSION_MAGIC or version != EXTENSION_VERSION:
        return progress
    first, first_ns, checkpoint, checkpoint_ns, save_ns, saves, _ = EXTENSION_BODY.unpack_from(
        extension, EXTENSION_HEADER.size
    )
    return dataclasses.replace(
        progress,
        first_step=first if first >= 0 and first_ns > 0 else None,
        first_step_ns=first_ns if first >= 0 and first_ns > 0 else None,
        checkpoint_step=checkpoint if checkpoint >= 0 and checkpoint_ns > 0 else None,
        checkpoint_ns=checkpoint_ns if checkpoint >= 0 and checkpoint_ns > 0 else None,
        save_ns=max(save_ns, 0),
        saves=max(saves, 0),
    )


class _Pread:
    """A file read by slices, as a mapping is."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __getitem__(self, span: slice) -> bytes:
        return os.pread(self.fd, span.stop - span.start, span.start)


def _consistent_record(record: mmap.mmap | _Pread) -> bytes | None:
    """The record's bytes as one update left them (see the module docstring)."""
    for pause in (0.0,) * _QUICK_TRIES + _PAUSES_S:
        if pause:
            time.sleep(pause)
        before = record[SEQ_OFFSET:RECORD_SIZE]
        data = record[0:SEQ_OFFSET]
        after = record[SEQ_OFFSET:RECORD_SIZE]
        if len(before) != SEQ.size or len(data) != SEQ_OFFSET:
            return None
        if before == after and SEQ.unpack(before)[0] % 2 == 0:
            return data + after
    return None


def _consistent_extension(record: mmap.mmap | _Pread) -> bytes | None:
    """The goodput extension's bytes as one update left them (its own seqlock)."""
    end = EXTENSION_OFFSET + EXTENSION_SIZE
    for pause in (0.0,) * _QUICK_TRIES + _PAUSES_S:
        if pause:
            time.sleep(pause)
        before = record[EXTENSION_SEQ_OFFSET:end]
        data = record[EXTENSION_OFFSET:EXTENSION_SEQ_OFFSET]
        after = record[EXTENSION_SEQ_OFFSET:end]
        if len(before) != SEQ.size or len(data) != EXTENSION_SEQ_OFFSET - EXTENSION_OFFSET:
            return None
        if before == after and SEQ.unpack(before)[0] % 2 == 0:
            return data + after
    return None


def read_new_stacks(path: str, offset: int, max_bytes: int = MAX_STACK_BYTES) -> tuple[str, int]:
    """What the worker appended to its stacks file (``path``) since ``offset``, decoded, and the
    offset to pass next time.

    Whole lines only: a dump being written is returned once complete. When more than
    ``max_bytes`` were appended, the newest whole lines that fit are returned (``faulthandler``
    writes the main thread last) and the older ones skipped. A file shorter than ``offset``
    (written anew) is read from its start. Missing, unreadable or not a regular file:
    ``("", offset)``.
    """
    offset = max(offset, 0)
    try:
        fd = _open_regular(path)
    except (OSError, ValueError):
        return "", offset
    try:
        size = os.fstat(fd).st_size
        if size < offset:
            offset = 0
        # One byte before a cut shows whether it falls at the start of a line.
        start = max(offset, size - max(max_bytes, 0) - 1)
        data = os.pread(fd, size - start, start) if size > start else b""
    except OSError:
        return "", offset
    finally:
        os.close(fd)
    end = data.rfind(b"\n") + 1
    if start > offset:  # older bytes skipped: begin at a line
        first = data.find(b"\n") + 1
        if first == end:
            return "", start + end  # a line longer than max_bytes: skipped
        data, consumed = data[first:end], start + end
    elif end == 0:
        return "", offset  # not a whole line yet
    else:
        data, consumed = data[:end], start + end
    return data.decode("utf-8", "replace"), consumed


def split_dumps(text: str) -> list[str]:
    """``text`` (stacks-file content) cut into one string per dump: a dump lists every thread
    once (or one thread, under faulthandler's ``Stack`` header), so a thread seen again starts
    the next one."""
    dumps: list[list[str]] = []
    seen: set[str] = set()
    for line in text.splitlines(keepends=True):
        thread = _thread_id(line)
        if thread is not None and (thread in seen or not dumps):
            dumps.append([])
            seen = set()
        if thread is not None:
            seen.add(thread)
        if not dumps:
            dumps.append([])
        dumps[-1].append(line)
    return ["".join(lines) for lines in dumps if "".join(lines).strip()]


def _thread_id(line: str) -> str | None:
    """The thread a ``faulthandler`` section header names (``Thread 0x…`` / ``Current thread
    0x…``; ``""`` for a one-thread dump's, which names none)."""
    if line.startswith(_ONE_THREAD_HEADER):
        return ""
    for prefix in _THREAD_HEADERS:
        if line.startswith(prefix):
            return line[len(prefix) - 2 :].split(" ", 1)[0]
    return None


def _open_regular(path: str) -> int:
    """A read-only descriptor on ``path`` when it is a regular file. Non-blocking open: a FIFO
    planted there must not hang the agent."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"not a regular file: {path}")
    except BaseException:
        os.close(fd)
        raise
    return fd
