"""A worker's stdout or stderr bytes → log records: lines, levels, tracebacks, last words.

One :class:`OutputReader` per stream cuts the bytes the agent reads into lines, keeps a
traceback or a ``faulthandler`` dump as one record, and gives each record a severity. What a
worker prints is untrusted and unbounded: every line and record is bounded, lines past the rate
are counted, not parsed, and the last words of stderr and a fatal error's dump are kept whatever
the rate dropped. Pure standard library. Design: ``docs/worker-output.md``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from elastic_otel.parsing.worker_reports import FATAL_ERROR_PREFIX, TRACEBACK_HEADER

STDOUT = "stdout"
STDERR = "stderr"

SEVERITY_TRACE = (1, "TRACE")
SEVERITY_DEBUG = (5, "DEBUG")
SEVERITY_INFO = (9, "INFO")
SEVERITY_WARN = (13, "WARN")
SEVERITY_ERROR = (17, "ERROR")
SEVERITY_FATAL = (21, "FATAL")

RECORD_MAX_BYTES = 65536
"""Bytes of text one record (a traceback, a fatal error's dump) keeps; later lines are counted
and the record flagged truncated."""
LAST_WORDS_LINES = 20
LAST_WORDS_BYTES = 4096
FAULT_MAX_BYTES = 65536
"""Bytes of a ``faulthandler`` dump kept for the root cause (as read from its fault file)."""

_LEVEL_WORDS = {
    "trace": SEVERITY_TRACE,
    "trc": SEVERITY_TRACE,
    "debug": SEVERITY_DEBUG,
    "dbg": SEVERITY_DEBUG,
    "d": SEVERITY_DEBUG,
    "info": SEVERITY_INFO,
    "inf": SEVERITY_INFO,
    "information": SEVERITY_INFO,
    "success": SEVERITY_INFO,
    "i": SEVERITY_INFO,
    "warning": SEVERITY_WARN,
    "warn": SEVERITY_WARN,
    "wrn": SEVERITY_WARN,
    "w": SEVERITY_WARN,
    "error": SEVERITY_ERROR,
    "err": SEVERITY_ERROR,
    "e": SEVERITY_ERROR,
    "critical": SEVERITY_FATAL,
    "crit": SEVERITY_FATAL,
    "fatal": SEVERITY_FATAL,
    "panic": SEVERITY_FATAL,
    "f": SEVERITY_FATAL,
}
"""Level words (lower case) → severity; which of them count where is the regex's business."""
_WORD = "TRACE|DEBUG|INFO|SUCCESS|WARNING|WARN|ERROR|CRITICAL|FATAL"
_VALUE = (
    "trace|trc|debug|dbg|information|info|inf|warning|warn|wrn|error|err|critical|crit|fatal|panic"
)
_KEY = r"level|lvl|severity|severity_?text|log\.level|loglevel|levelname"
_TIME = r"(?:\d{2,4}[-/.]\d\d[-/.]\d{2,4}[ T])?\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
_RANK_PREFIX = re.compile(r"\[rank\d{1,7}\]: ?")
"""What torch's excepthook (and its C++ logging) puts before every line a rank writes once its
process group is up: ``[rank5]: Traceback (most recent call last):``."""


def _without_rank(text: str) -> str:
    """``text`` without torch's rank prefix, to tell what the line is (the record keeps it)."""
    found = _RANK_PREFIX.match(text)
    return text[found.end() :] if found else text


# Anchored at the line's start and every repeat bounded: a line that matches no format fails
# within a few hundred steps whatever its length.
_LINE_LEVEL = re.compile(
    rf"""(?:\[rank\d+\]:)?                              # torch's rank prefix
    (?:
        \[?([DIWEF])\d{{4}}\ \d\d:\d\d:\d\d             # glog: I1126 12:00:00.000 ...
      | (?:\[?{_TIME}\]?[\ \t]{{0,4}}                   # a timestamp, then ' - ', ' | ' or ' '
           (?:[-|][\ \t]{{1,4}})?
           (?:[\w.<>-]{{1,128}}\ [-|]\ )?)?             # and maybe a logger's name: 'name - '
        (?:
            ({_WORD})(?=[\s:|]|$)                       # INFO:name:, INFO: , INFO     | , INFO -
          | \[\ {{0,8}}((?i:{_WORD}))\ {{0,8}}[\]|]     # [INFO|file.py:1], [INFO], [info     ]
        )
      | (?:[\w.@-]{{1,64}}=(?:"(?:[^"\\\n]|\\.){{0,512}}"|[^\s"]{{0,512}})[\ \t]{{1,8}}){{0,16}}
        (?i:{_KEY})="?((?i:{_VALUE}))"?(?=\s|$)         # logfmt: ... level=info
    )""",
    re.VERBOSE,
)
_JSON_VALUES = frozenset(_VALUE.split("|"))
_JSON_KEYS = frozenset(
    (
        "level",
        "lvl",
        "severity",
        "severity_text",
        "severitytext",
        "log.level",
        "loglevel",
        "levelname",
    )
)
_CHAIN_SEPARATORS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_FAULT_MARK = FATAL_ERROR_PREFIX.encode()


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One log record of a worker's output."""

    body: str
    severity: tuple[int, str]
    truncated: bool = False
    """A line was longer than the cap, or the record than :data:`RECORD_MAX_BYTES`."""
    length: int = 0
    """Bytes the worker wrote for it (newlines excluded), before any cut."""
    invalid_utf8: bool = False
    """Bytes that were not UTF-8 became U+FFFD."""
    dropped_before: int = 0
    """Lines the rate limit dropped since the previous record of this worker."""


def line_severity(text: str, stream: str) -> tuple[int, str]:
    """The level the line states where its format puts one (the formats of
    ``docs/worker-output.md``), else the stream's: WARN on stderr, INFO on stdout."""
    match = _LINE_LEVEL.match(text)
    if match is not None:
        return _LEVEL_WORDS[match.group(match.lastindex or 0).lower()]
    if text.startswith("{"):
        severity = _json_severity(text)
        if severity is not None:
            return severity
    return SEVERITY_WARN if stream == STDERR else SEVERITY_INFO


def _json_severity(text: str) -> tuple[int, str] | None:
    """The level of a JSON line: the first level key with a string value, at the top or one
    object down (``{"log": {"level": "info"}}``)."""
    if not text.rstrip().endswith("}"):
        return None
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    for objects in ([document], [v for v in document.values() if isinstance(v, dict)]):
        for obj in objects:
            for key, value in obj.items():
                if isinstance(value, str) and key.lower() in _JSON_KEYS:
                    word = value.lower()
                    return _LEVEL_WORDS[word] if word in _JSON_VALUES else None
    return None


def decode(data: bytes, cut: bool) -> tuple[str, bool]:
    """UTF-8 text of ``data`` and whether bytes were invalid; a ``cut`` line may end inside a
    character, which is dropped rather than flagged."""
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        pass
    if cut:
        for end in range(len(data) - 1, max(-1, len(data) - 4), -1):
            try:
                return data[:end].decode("utf-8"), False
            except UnicodeDecodeError:
                continue
    return data.decode("utf-8", "replace"), True


class RateLimit:
    """A token bucket: ``rate`` lines a second, up to ``rate`` at once (0: no limit)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = rate
        self.last_ns: int | None = None
        self.dropped = 0
        """Lines dropped since the last record let through (reported on it)."""
        self.dropped_total = 0

    def refill(self, now_ns: int) -> None:
        if self.last_ns is not None:
            self.tokens = min(self.rate, self.tokens + self.rate * (now_ns - self.last_ns) / 1e9)
        self.last_ns = now_ns

    def take(self) -> bool:
        if self.rate <= 0:
            return True
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.dropped += 1
        self.dropped_total += 1
        return False


class _Pending:
    """A record being assembled (a traceback, a fatal error's dump)."""

    __slots__ = ("fault", "invalid", "length", "lines", "size", "truncated", "waiting_chain")

    def __init__(self, fault: bool) -> None:
        self.fault = fault
        self.lines: list[str] = []
        self.size = 0
        self.length = 0
        self.truncated = False
        self.invalid = False
        self.waiting_chain = False  # the exception line came: only a chained one continues it

    def add(self, text: str, length: int, truncated: bool, invalid: bool) -> None:
        self.length += length
        self.invalid |= invalid
        if self.size + len(text) + 1 > RECORD_MAX_BYTES:
            self.truncated = True
            return
        self.lines.append(text)
        self.size += len(text) + 1
        self.truncated |= truncated


class OutputReader:
    """One stream of one worker: bytes in (:meth:`feed`), records out (:meth:`take`)."""

    def __init__(self, stream: str, line_max: int, limit: RateLimit, keep_last: bool) -> None:
        self.stream = stream
        self.line_max = max(1, line_max)
        self.limit = limit
        self.keep_last = keep_last
        self._partial = bytearray()
        self._partial_length = 0  # bytes of the current line, counted past the cap
        self._pending: _Pending | None = None
        self._records: list[OutputRecord] = []
        self._tail = b""  # the stream's last LAST_WORDS_BYTES bytes
        self._fault: bytearray | None = None

    # --- bytes in ---------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Take a chunk of the stream (any size; memory stays bounded by the caps)."""
        if not data:
            return
        if self.keep_last:
            self._keep_last(data)
        start = 0
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                self._add_partial(data, start, len(data))
                return
            self._add_partial(data, start, newline)
            self._end_line()
            start = newline + 1

    def end(self) -> None:
        """The stream ended (or paused): what is held becomes records."""
        if self._partial_length:
            self._end_line()
        self._flush_pending()

    def idle(self) -> None:
        """Nothing new since the last poll: a finished record is not held for a chained one,
        and a traceback cut short is let out."""
        if self._pending is not None and not self._pending.fault:
            self._flush_pending()

    def take(self) -> list[OutputRecord]:
        records, self._records = self._records, []
        return records

    # --- last words -------------------------------------------------------------------------

    def last_words(self) -> str:
        """The stream's last lines (at most :data:`LAST_WORDS_LINES`, within
        :data:`LAST_WORDS_BYTES`), as text."""
        text, _ = decode(self._tail, cut=False)
        lines = text.splitlines()
        if len(self._tail) >= LAST_WORDS_BYTES and lines:
            lines = lines[1:]  # the first may be a line's end only
        return "\n".join(lines[-LAST_WORDS_LINES:])

    def fault_stack(self) -> str | None:
        """The last ``faulthandler`` dump the stream carried (``Fatal Python error: ...``)."""
        if not self._fault:
            return None
        text, _ = decode(bytes(self._fault), cut=True)
        return text.rstrip() or None

    def _keep_last(self, data: bytes) -> None:
        if self._fault is not None:
            if len(self._fault) < FAULT_MAX_BYTES:
                self._fault += data[: FAULT_MAX_BYTES - len(self._fault)]
        else:
            # a dump begins at a line's start in this chunk, or across the previous one's end
            seen = self._tail[-len(_FAULT_MARK) - 1 :] + data
            at = seen.find(_FAULT_MARK)
            while at > 0 and seen[at - 1 : at] != b"\n":
                at = seen.find(_FAULT_MARK, at + 1)
            if at >= 0:
                self._fault = bytearray(seen[at : at + FAULT_MAX_BYTES])
        self._tail = (self._tail + data[-LAST_WORDS_BYTES:])[-LAST_WORDS_BYTES:]

    # --- lines ------------------------------------------------------------------------------

    def _add_partial(self, data: bytes, start: int, end: int) -> None:
        length = end - start
        if length <= 0:
            return
        room = self.line_max - len(self._partial)
        if room > 0:
            self._partial += data[start : start + min(room, length)]
        self._partial_length += length

    def _end_line(self) -> None:
        raw = bytes(self._partial)
        length = self._partial_length
        self._partial.clear()
        self._partial_length = 0
        pending = self._pending
        if pending is None and not self.limit.take():
            return  # counted, not parsed
        truncated = length > len(raw)
        text, invalid = decode(raw, truncated)
        if text.endswith("\r"):
            text = text[:-1]
        if "\r" in text:
            text = text.rpartition("\r")[2]  # what a terminal shows of a redrawn line
        if pending is not None:
            if self._continues(pending, text):
                pending.add(text, length, truncated, invalid)  # a record let in goes on
                return
            self._flush_pending()
            if not self.limit.take():
                return  # counted, not kept
        if not text.strip():
            return
        bare = _without_rank(text)
        if bare.startswith(TRACEBACK_HEADER) or bare.startswith(FATAL_ERROR_PREFIX):
            self._pending = _Pending(fault=bare.startswith(FATAL_ERROR_PREFIX))
            self._pending.add(text, length, truncated, invalid)
            return
        self._emit(text, line_severity(text, self.stream), truncated, length, invalid)

    @staticmethod
    def _continues(pending: _Pending, text: str) -> bool:
        if pending.fault:
            return True  # faulthandler writes its dump, then the process dies
        text = _without_rank(text)
        if not text.strip():
            return True
        if pending.waiting_chain:
            if text.startswith(_CHAIN_SEPARATORS):
                pending.waiting_chain = False
                return True
            return False
        if text[:1].isspace() or text.startswith((*_CHAIN_SEPARATORS, TRACEBACK_HEADER)):
            return True
        pending.waiting_chain = True  # the exception line ends it, but for a chained one
        return True

    def _flush_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None or not pending.lines:
            return
        while pending.lines and not pending.lines[-1].strip():
            pending.lines.pop()
        severity = SEVERITY_FATAL if pending.fault else SEVERITY_ERROR
        self._emit(
            "\n".join(pending.lines), severity, pending.truncated, pending.length, pending.invalid
        )

    def _emit(
        self, body: str, severity: tuple[int, str], truncated: bool, length: int, invalid: bool
    ) -> None:
        dropped, self.limit.dropped = self.limit.dropped, 0
        self._records.append(OutputRecord(body, severity, truncated, length, invalid, dropped))
