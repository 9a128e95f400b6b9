"""Read what a dead worker left beside its error file, and cut its stacks to what matters.

A worker's fatal signal or uncaught exception reaches its agent as an exit code only; the
worker start-up leaves ``faulthandler``'s text and a JSON record of the exception, read here
(torch's own error file is the fallback). Backends cap attribute values, so
:func:`innermost_frames` keeps the exception and the innermost frames, and
:func:`with_source_lines` adds each frame's source line. Untrusted input: bounded reads, never
raises. Design: ``docs/trace-model.md`` (Root cause or victim).
"""

from __future__ import annotations

import json
import linecache
import os
import re
import stat
from dataclasses import dataclass

from elastic_otel.names.environment_variables import WORKER_ERROR_FILE, WORKER_FAULT_FILE

MAX_REPORT_BYTES = 65536
"""Bytes read of each report file; the worker start-up writes its exception record within it."""

FAULT_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
"""``faulthandler``'s names of the fatal signals it handles (its first line) → the signal."""

FATAL_ERROR_PREFIX = "Fatal Python error: "
TRACEBACK_HEADER = "Traceback (most recent call last):"
_MOST_RECENT_FIRST = "(most recent call first):"
_CHAIN_SEPARATORS = frozenset(
    {
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    }
)
_TYPE_PREFIX = re.compile(r"([A-Za-z_][\w.]*): ")

_Exception = tuple[str | None, str | None, str | None, int | None]
"""(type, message, traceback, time in ns) of an uncaught exception."""


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """How a worker died, as far as its files tell (any field may be ``None``)."""

    exception_type: str | None = None
    """``module.Qualname`` of an uncaught exception (``Qualname`` for builtins; torch's
    fallback has the bare class name)."""
    message: str | None = None
    traceback: str | None = None
    time_ns: int | None = None
    """When the exception reached the top, else when ``faulthandler`` wrote the fault stack
    (ns since the epoch): the moment of death, where torch's own failure time has whole
    seconds."""
    fault_stack: str | None = None
    """``faulthandler``'s text: the fatal error line and every thread's Python stack (with
    source lines, :func:`with_source_lines`)."""
    fault_signal: str | None = None
    """``SIGSEGV``, ``SIGABRT``, ``SIGBUS``, ``SIGFPE`` or ``SIGILL``, from that text."""


def read_worker_report(
    error_file: str | None, max_bytes: int = MAX_REPORT_BYTES
) -> WorkerReport | None:
    """The reports beside ``error_file`` (a worker's ``TORCHELASTIC_ERROR_FILE``), with torch's
    own error file as the fallback for the exception; ``None`` when there is nothing to tell."""
    if not error_file:
        return None
    directory = os.path.dirname(error_file)
    fault_file = os.path.join(directory, WORKER_FAULT_FILE)
    fault_stack = _fault_text(_read(fault_file, max_bytes), max_bytes)
    if fault_stack is not None:
        fault_stack = with_source_lines(fault_stack, max_bytes)
    ours = _json_object(_read(os.path.join(directory, WORKER_ERROR_FILE), max_bytes), max_bytes)
    exception = _startup_exception(ours)
    if exception is None:
        exception = _torch_exception(_json_object(_read(error_file, max_bytes), max_bytes))
    if exception is None and fault_stack is None:
        return None
    exception_type, message, traceback, time_ns = exception or (None, None, None, None)
    if time_ns is None and fault_stack is not None:
        time_ns = _written_ns(fault_file)
    return WorkerReport(
        exception_type=exception_type,
        message=message,
        traceback=traceback,
        time_ns=time_ns,
        fault_stack=fault_stack,
        fault_signal=fault_signal(fault_stack) if fault_stack else None,
    )


def fault_signal(fault_stack: str) -> str | None:
    """The signal ``faulthandler``'s first line names (``None`` for anything else)."""
    first = fault_stack.lstrip().partition("\n")[0].strip()
    if not first.startswith(FATAL_ERROR_PREFIX):
        return None
    return FAULT_SIGNALS.get(first[len(FATAL_ERROR_PREFIX) :])


def _read(path: str, max_bytes: int) -> bytes | None:
    """At most ``max_bytes + 1`` bytes of a regular file (one more than allowed says "too
    long"); ``None`` when it is missing, unreadable or not a regular file. Non-blocking open: a
    FIFO planted there must not hang the agent."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _written_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _fault_text(data: bytes | None, max_bytes: int) -> str | None:
    if not data:
        return None
    text = data[:max_bytes].decode("utf-8", "replace")
    return text if text.strip() else None


def _json_object(data: bytes | None, max_bytes: int) -> dict[str, object] | None:
    if not data or len(data) > max_bytes:
        return None  # a cut JSON document is no document
    try:
        value = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _startup_exception(record: dict[str, object] | None) -> _Exception | None:
    """The worker start-up's record: {"type", "message", "traceback", "time_unix_nano"}."""
    exception_type = _str(record.get("type")) if record is not None else None
    if record is None or exception_type is None:
        return None
    return (
        exception_type,
        _str(record.get("message")),
        _str(record.get("traceback")),
        _int(record.get("time_unix_nano")),
    )


def _torch_exception(record: dict[str, object] | None) -> _Exception | None:
    """torch's ``@record`` file: {"message": {"message": "Type: text", "extraInfo":
    {"py_callstack": ..., "timestamp": "<seconds>"}}}, or {"message": "Type: text"}."""
    if record is None:
        return None
    body = record.get("message")
    extra: object = None
    if isinstance(body, dict):
        extra = body.get("extraInfo")
        body = body.get("message")
    text = _str(body)
    if not text or text == "<NONE>":
        return None
    match = _TYPE_PREFIX.match(text + " ")  # "Type: " with an empty str(e) ends in ":"
    if match:
        exception_type, message = match.group(1), text[match.end() :]
    else:
        exception_type, message = None, text
    traceback = time_ns = None
    if isinstance(extra, dict):
        traceback = _str(extra.get("py_callstack"))
        seconds = _int(extra.get("timestamp"))
        time_ns = seconds * 1_000_000_000 if seconds is not None else None
    return exception_type, message, traceback, time_ns


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value.strip())
    return None


# --- cutting stacks to a byte limit ------------------------------------------------------------


def innermost_frames(text: str, limit: int = 2048) -> str:
    """``text`` (a Python traceback or a ``faulthandler`` dump) in at most ``limit`` UTF-8
    bytes: unchanged when it fits; else the exception line(s) or the fatal error line, the
    innermost frames that fit (whole) and a line saying how many outer frames were left out.

    A traceback lists the innermost frame last ("most recent call last"); the exceptions chained
    before the final one (often the root cause) are cut the same way in the room the final one
    leaves, at least half of it. ``faulthandler`` lists the innermost frame first ("most recent
    call first"), one section per thread: the failing thread's comes first, the others and the
    extension-module list as room allows. Text of neither shape keeps its last lines.
    """
    if limit <= 0:
        return ""
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates (undecodable bytes of a file name): "?"
        encoded = text.encode("utf-8", "replace")
        text = encoded.decode("utf-8")
    if len(encoded) <= limit:
        return text
    lines = text.splitlines(keepends=True)
    if any(line.rstrip().endswith(_MOST_RECENT_FIRST) for line in lines):
        return _cut_fault_dump(lines, limit)
    headers = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK_HEADER]
    if headers:
        return _cut_traceback(lines, headers[-1], limit)
    return _last_lines(lines, limit)


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _outer_marker(count: int) -> str:
    return f"  ... {count} outer frame{'s' if count != 1 else ''} omitted ...\n"


def _cut_traceback(lines: list[str], header: int, limit: int) -> str:
    """A traceback whose final exception's header is ``lines[header]``. What led to it (the
    chained exceptions before it, often the root cause) is cut the same way, in the room the
    final one leaves: it keeps at least half of the limit, and its exception line and innermost
    frame."""
    final = _Block(lines[header:])
    if header == 0:
        return final.cut(limit)
    prefix = lines[:header]
    joint_start = header
    while joint_start and (
        not prefix[joint_start - 1].strip() or prefix[joint_start - 1].strip() in _CHAIN_SEPARATORS
    ):
        joint_start -= 1
    earlier, joint = "".join(prefix[:joint_start]), "".join(prefix[joint_start:])
    reserved = max(min(final.size, limit // 2), min(final.least, limit))
    budget = limit - reserved - _size(joint) - 1  # 1: a newline after a cut line
    kept = innermost_frames(earlier, budget) if budget > 0 else ""
    if kept.strip():
        before = kept + ("" if kept.endswith("\n") else "\n") + joint
    else:
        chained = sum(1 for line in prefix if line.strip() in _CHAIN_SEPARATORS)
        what = f"{chained} chained exception{'s' if chained != 1 else ''}"
        before = f"... {what if chained else f'{header} earlier lines'} omitted ...\n"
    room = limit - _size(before)
    if room < min(final.least, limit):
        return final.cut(limit)
    return before + final.cut(room)


class _Block:
    """One exception's traceback: its header line, its frames (each a ``File`` line and the
    lines below it; outermost first) and its exception line(s)."""

    def __init__(self, lines: list[str]) -> None:
        self.head = lines[0]
        self.frames: list[str] = []
        tail_start = len(lines)
        for i in range(1, len(lines)):
            line = lines[i]
            if not line[:1].isspace():
                tail_start = i  # the exception line(s): the first line not indented
                break
            if line.startswith("  File ") or not self.frames:
                self.frames.append(line)
            else:
                self.frames[-1] += line  # source, carets, "[Previous line repeated N more times]"
        self.tail = "".join(lines[tail_start:])
        self.size = sum(map(_size, lines))
        # Bytes for the header, the exception line(s) and the innermost frame (with the marker).
        self.least = _size(self.head) + _size(self.tail)
        if self.frames:
            rest = len(self.frames) - 1
            self.least += _size(self.frames[-1]) + (_size(_outer_marker(rest)) if rest else 0)

    def cut(self, limit: int) -> str:
        """The header, the innermost frames that fit, the exception line(s)."""
        head, tail = self.head, self.tail
        if self.size <= limit:
            return head + "".join(self.frames) + tail
        if self.least > limit:
            # A message too long for the limit keeps its beginning, and leaves room for where
            # it came from: the header and the innermost frame (at worst, half of the limit).
            tail = _first_lines(tail, max(limit - (self.least - _size(tail)), limit // 2))
        budget = limit - _size(tail) - _size(head)
        kept, omitted = _fit_frames(self.frames[::-1], budget)
        if kept is None:
            return _first_lines(tail, limit)  # not even the header and a marker fit
        marker = _outer_marker(omitted) if omitted else ""
        return head + marker + "".join(reversed(kept)) + tail


def _fit_frames(innermost_first: list[str], budget: int) -> tuple[list[str] | None, int]:
    """The innermost frames that fit in ``budget`` bytes together with the marker for the
    rest (``None`` when not even the marker fits), and how many were left out."""
    total = len(innermost_first)
    if total == 0:
        return ([] if budget >= 0 else None), 0
    if _size(_outer_marker(total)) > budget:
        return None, total
    kept: list[str] = []
    used = 0
    for i, frame in enumerate(innermost_first):
        rest = total - i - 1
        needed = used + _size(frame) + (_size(_outer_marker(rest)) if rest else 0)
        if needed > budget:
            break
        kept.append(frame)
        used += _size(frame)
    return kept, total - len(kept)


def _cut_fault_dump(lines: list[str], limit: int) -> str:
    """``faulthandler``'s dump: the fatal error line, then the failing thread's innermost
    frames first; other threads and the extension-module list only as room allows."""
    sections: list[list[str]] = []
    head: list[str] = []
    trailer: list[str] = []
    for line in lines:
        if line.rstrip().endswith(_MOST_RECENT_FIRST):
            sections.append([line])
        elif sections and line.startswith(_SOURCE_INDENT) and len(sections[-1]) > 1:
            sections[-1][-1] += line  # a frame's source line (with_source_lines) goes with it
        elif sections and line.startswith("  "):
            sections[-1].append(line)
        elif sections:
            if line.strip():
                trailer.append(line)  # "Extension modules: ..." after the stacks
        else:
            head.append(line)
    fatal = "".join(line for line in head if line.strip())
    fatal += "\n" if fatal else ""
    if _size(fatal) >= limit:
        return _first_lines(fatal, limit)
    main = next(
        (s for s in sections if s[0].startswith("Current thread")),
        next((s for s in sections if s[0].startswith("Stack")), sections[0]),
    )
    others = [s for s in sections if s is not main]
    others_marker = _others_marker(len(others))
    budget = limit - _size(fatal) - _size(main[0]) - _size(others_marker)
    kept, omitted = _fit_frames(main[1:], budget)
    if kept is None:
        return _first_lines(fatal + main[0], limit)
    text = fatal + main[0] + "".join(kept) + (_outer_marker(omitted) if omitted else "")
    left = len(others)
    for section in others:
        block = "\n" + "".join(section)
        if _size(text + block + _others_marker(left - 1)) > limit:
            break
        text += block
        left -= 1
    text += _others_marker(left)
    for line in trailer:  # "Extension modules: ...", often long
        if _size(text + "\n" + line) <= limit:
            text += "\n" + line
    return text


def _others_marker(count: int) -> str:
    return f"... {count} other thread{'s' if count != 1 else ''} omitted ...\n" if count else ""


def _first_lines(text: str, limit: int) -> str:
    """The whole lines of ``text`` that fit; the first line cut when not even it fits."""
    out = ""
    for line in text.splitlines(keepends=True):
        if _size(out) + _size(line) > limit:
            break
        out += line
    return out or text.encode("utf-8")[: max(limit, 0)].decode("utf-8", "ignore")


def _last_lines(lines: list[str], limit: int) -> str:
    """The last whole lines that fit, after a line saying how many came before."""
    kept: list[str] = []
    used = 0
    for i in range(len(lines) - 1, -1, -1):
        marker = f"... {i} lines omitted ...\n" if i else ""
        if used + _size(lines[i]) + _size(marker) > limit:
            break
        kept.append(lines[i])
        used += _size(lines[i])
    if not kept:
        return _first_lines(lines[-1] if lines else "", limit)
    before = len(lines) - len(kept)
    return (f"... {before} lines omitted ...\n" if before else "") + "".join(reversed(kept))


_FRAME = re.compile(r'^\s+File "(?P<path>[^"]*)", line (?P<line>\d+) in (?P<function>.+)$')
_THREAD = re.compile(r"^((Current thread|Thread) 0x[0-9a-fA-F]+|Stack \(most recent call first\))")


def main_thread_frame(dump: str) -> str | None:
    """The innermost frame of the main thread in a ``faulthandler`` dump (of every thread, or of
    the main thread alone), as "sleep at train.py:42" (``None`` when there is none).
    faulthandler does not say which thread is the main one: it is the one whose outermost frame
    is the script's ``<module>``, else the first listed."""
    threads: list[list[re.Match[str]]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            threads.append([])
        elif threads and (frame := _FRAME.match(line)):
            threads[-1].append(frame)
    threads = [frames for frames in threads if frames]
    if not threads:
        return None
    main = next((t for t in threads if t[-1]["function"] == "<module>"), threads[0])
    inner = main[0]
    return f"{inner['function']} at {os.path.basename(inner['path'])}:{inner['line']}"


# --- source lines under faulthandler's frames --------------------------------------------------

_SOURCE_INDENT = "    "
"""How a traceback indents a frame's source line (``faulthandler``'s frame lines have two
spaces)."""
MAX_SOURCE_FILE_BYTES = 4 * 1024 * 1024
"""Larger files are not read for their source lines (the read would cost the agent)."""


def with_source_lines(text: str, limit: int) -> str:
    """``text`` (``faulthandler``'s dump) with each frame's line of source under it, stripped
    and indented as a traceback shows it (``    time.sleep(3600)``), in at most ``limit`` UTF-8
    bytes.

    Only frames with an absolute path to a regular file the agent can read get one (on the
    worker's host the path is the worker's file; a relative one is relative to the worker's
    directory). When not all fit, the source lines of the outermost frames of each thread go
    first; frame lines are never dropped, and text over ``limit`` already is returned
    unchanged. Lines are read through :mod:`linecache` (a file once, until it changes); a
    missing or unreadable file or a bad line number just has no source line. Never raises.
    """
    try:
        return _with_source_lines(text, limit)
    except Exception:  # an operator's aid: never a reason to lose the stacks
        return text


def _with_source_lines(text: str, limit: int) -> str:
    lines = text.splitlines(keepends=True)
    readable: dict[str, bool] = {}
    # (the frame's place in its thread, 1 the innermost; its line's index; its source line)
    found: list[tuple[int, int, str]] = []
    depth = 0
    for i, line in enumerate(lines):
        if _THREAD.match(line) or line.rstrip().endswith(_MOST_RECENT_FIRST):
            depth = 0
            continue
        frame = _FRAME.match(line.rstrip("\r\n"))
        if frame is None:
            continue
        depth += 1
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if following.startswith(_SOURCE_INDENT) and not _FRAME.match(following):
            continue  # it has its source line already
        path = frame["path"]
        if path not in readable:
            readable[path] = _readable_source(path)
        source = _source_line(path, int(frame["line"])) if readable[path] else ""
        if source:
            found.append((depth, i, source))
    room = limit - _size(text)
    added: dict[int, str] = {}
    for _, i, source in sorted(found):
        extra = _SOURCE_INDENT + source + "\n"
        if _size(extra) > room:
            break  # neither it nor any frame further out gets one
        added[i] = extra
        room -= _size(extra)
    if not added:
        return text
    out = []
    for i, line in enumerate(lines):
        below = added.get(i)
        if below is None:
            out.append(line)
        elif line.endswith("\n"):
            out.append(line + below)
        else:  # the last line, without its newline: keep the text's ending
            out.append(line + "\n" + below[:-1])
    return "".join(out)


def _readable_source(path: str) -> bool:
    """Whether ``path`` is a source file worth reading: absolute (a relative one is relative
    to the worker's directory, not the agent's), a regular file (a FIFO or a device would block
    or never end) and not empty (``/proc`` files say 0) nor huge."""
    if not os.path.isabs(path):
        return False
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    if not stat.S_ISREG(st.st_mode) or not 0 < st.st_size <= MAX_SOURCE_FILE_BYTES:
        return False
    linecache.checkcache(path)  # a file edited since it was cached is read again
    return True


def _source_line(path: str, number: int) -> str:
    if number <= 0:
        return ""
    return linecache.getline(path, number).strip()
