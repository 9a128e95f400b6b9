"""A worker's output bytes → records (elastic_otel.parsing.worker_output): lines, levels,
tracebacks as one record, the bounds (line cap, rate limit, invalid UTF-8) and last words."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import tracemalloc
from pathlib import Path

import pytest

from elastic_otel.parsing.worker_output import (
    LAST_WORDS_BYTES,
    SEVERITY_DEBUG,
    SEVERITY_ERROR,
    SEVERITY_FATAL,
    SEVERITY_INFO,
    SEVERITY_TRACE,
    SEVERITY_WARN,
    STDERR,
    STDOUT,
    OutputReader,
    RateLimit,
    line_severity,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "worker-output.md"


def _reader(stream: str = STDERR, line_max: int = 100, rate: float = 0) -> OutputReader:
    return OutputReader(stream, line_max, RateLimit(rate), keep_last=stream == STDERR)


def _records(data: bytes, stream: str = STDERR, **kw: float) -> list:
    reader = _reader(stream, **kw)  # type: ignore[arg-type]
    for i in range(0, len(data), 7):  # chunks that cut lines and characters
        reader.feed(data[i : i + 7])
    reader.end()
    return reader.take()


def test_levels_in_the_line_win_over_the_stream() -> None:
    text = (
        b"plain\nWARNING:train:low lr\nINFO:root:ok\n"
        b"[rank0]:[W1126 12:00:00.000000 pg.cpp:1] nccl\nE1126 12:00:01.000 x.py:3] boom\n"
    )
    got = [(r.body, r.severity) for r in _records(text)]
    assert got == [
        ("plain", SEVERITY_WARN),
        ("WARNING:train:low lr", SEVERITY_WARN),
        ("INFO:root:ok", SEVERITY_INFO),
        ("[rank0]:[W1126 12:00:00.000000 pg.cpp:1] nccl", SEVERITY_WARN),
        ("E1126 12:00:01.000 x.py:3] boom", SEVERITY_ERROR),
    ]
    assert [r.severity for r in _records(b"plain\nERROR:a:b\n", STDOUT)] == [
        SEVERITY_INFO,
        SEVERITY_ERROR,
    ]


def _logged(fmt: str, level: int, message: str, datefmt: str | None = None) -> str:
    """The line Python's logging writes with ``fmt``: the real formatter, a real record."""
    record = logging.LogRecord("__main__", level, "/x/trainer.py", 2134, message, None, None)
    return logging.Formatter(fmt, datefmt).format(record)


HF_EXPLICIT = "[%(levelname)s|%(filename)s:%(lineno)s] %(asctime)s >> %(message)s"
"""transformers.utils.logging.enable_explicit_format's."""
HF_EXAMPLES = "%(asctime)s - %(levelname)s - %(name)s - %(message)s"
"""The Hugging Face examples' ``logging.basicConfig`` (with ``datefmt="%m/%d/%Y %H:%M:%S"``)."""
LIGHTNING = "%(levelname)s: %(message)s"
"""What Lightning's console lines read as (``INFO: GPU available: True (cuda), used: True``)."""


@pytest.mark.parametrize(
    "fmt",
    [logging.BASIC_FORMAT, HF_EXPLICIT, HF_EXAMPLES, LIGHTNING, "%(levelname)-8s %(message)s"],
)
@pytest.mark.parametrize(
    ("level", "severity"),
    [
        (logging.DEBUG, SEVERITY_DEBUG),
        (logging.INFO, SEVERITY_INFO),
        (logging.WARNING, SEVERITY_WARN),
        (logging.ERROR, SEVERITY_ERROR),
        (logging.CRITICAL, SEVERITY_FATAL),
    ],
)
def test_python_logging_formats_keep_their_level(
    fmt: str, level: int, severity: tuple[int, str]
) -> None:
    line = _logged(fmt, level, "GPU available: True (cuda), used: True", "%m/%d/%Y %H:%M:%S")
    for stream in (STDERR, STDOUT):
        assert line_severity(line, stream) == severity, line


# Lines as the libraries print them (loguru's default format, structlog's ConsoleRenderer, a
# Go-style logfmt logger, python-json-logger, ECS logging).
INFO_LINES = [
    "2024-05-01 12:00:00.123 | INFO     | __main__:main:12 - step 10",
    "2024-05-01 12:00:00.123 | SUCCESS  | __main__:main:14 - saved",
    "2024-05-01T12:00:00.123456Z [info     ] epoch done                     epoch=1",
    'time=2024-05-01T12:00:00Z level=info msg="step 10" loss=0.25',
    'ts=2024-05-01T12:00:00.000Z caller=train.go:12 msg="an \\"error\\" quoted" lvl=INFO',
    json.dumps({"time": "2024-05-01T12:00:00Z", "level": "info", "msg": "error: none"}),
    json.dumps({"message": "step 10", "levelname": "INFO", "name": "train"}),
    json.dumps({"@timestamp": "2024-05-01T12:00:00Z", "log": {"level": "info"}, "msg": "x"}),
    json.dumps({"severity": "INFO", "message": "Cloud Logging"}),
    "[2024-05-01 12:00:00,123] [INFO] [engine.py:1164:_configure_optimizer] Using client Adam",
    "[rank0]:INFO: seed set to 42",
]


@pytest.mark.parametrize("line", INFO_LINES)
def test_an_info_line_of_a_structured_format_is_info_on_stderr(line: str) -> None:
    assert line_severity(line, STDERR) == SEVERITY_INFO


@pytest.mark.parametrize(
    ("line", "severity"),
    [
        ("2024-05-01 12:00:00.123 | TRACE    | m:f:1 - x", SEVERITY_TRACE),
        ("2024-05-01 12:00:00.123 | ERROR    | m:f:1 - x", SEVERITY_ERROR),
        ("level=DBG msg=x", SEVERITY_DEBUG),
        ("level=warning msg=x", SEVERITY_WARN),
        ('level="err" msg=x', SEVERITY_ERROR),
        ("level=panic msg=x", SEVERITY_FATAL),
        ('{"lvl": "Critical"}', SEVERITY_FATAL),
        ('{"SeverityText": "trc"}', SEVERITY_TRACE),
        ("[ERROR|trainer.py:1] 2024-05-01 12:00:00,123 >> x", SEVERITY_ERROR),
        ("2024-05-01T12:00:00Z [warning  ] x", SEVERITY_WARN),
    ],
)
def test_other_levels_of_those_formats_on_stdout(line: str, severity: tuple[int, str]) -> None:
    assert line_severity(line, STDOUT) == severity


@pytest.mark.parametrize(
    "line",
    [
        "loss is NaN, error in step 3",
        "err: 0.3 in step 12",
        "grad norm info: 3.2",
        "Error: the dataset is empty",  # a word, not a logger's level
        "info: loading shards",
        "RuntimeError: CUDA error: out of memory",
        "INFORMATION about the run",
        "step 3 [ERROR rate 0.1]",
        "a=1 b=2 error=3",
        "level=3 msg=x",
        "level=verbose msg=x",
        '{"level": 3, "msg": "error"}',
        '{"level": "notice"}',
        '{"msg": "level=info"}',
        '{"a": {"b": {"level": "info"}}}',
        '{"level": "info"',
        "{not json}",
        "[1, 2, 3]",
        "2024-05-01 12:00:00 step 3 ERROR",
        "\x1b[32mINFO\x1b[0m: coloured",
    ],
)
def test_a_line_that_states_no_level_keeps_the_streams(line: str) -> None:
    assert line_severity(line, STDERR) == SEVERITY_WARN
    assert line_severity(line, STDOUT) == SEVERITY_INFO


@pytest.mark.parametrize(
    "line",
    [
        "a=" * 8000,
        'level="' + "\\" * 8000,
        "2024-05-01 12:00:00" + " " * 16000 + "INFO",
        "[" * 16000,
        "{" * 16000 + "}",
        '{"a":' * 5000 + "1" + "}" * 5000,
        '{"a": 1' + "0" * 8000 + "}",
        '{"level": "\\ud800"}',  # a lone surrogate, valid JSON
        "\ufffd" * 16000,
    ],
)
def test_hostile_lines_keep_the_default_and_never_raise(line: str) -> None:
    assert line_severity(line, STDERR) == SEVERITY_WARN


def _documented_formats() -> list[tuple[str, str, str]]:
    """docs/worker-output.md's table of formats: (format, line, severity)."""
    text = DOCS.read_text()
    table = text[text.index("| format | a line it writes") :].split("\n\n", 1)[0]
    rows = []
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        rows.append((cells[0], cells[1].strip("`").replace("\\|", "|"), cells[2]))
    return rows


def test_the_documented_formats_read_as_documented() -> None:
    rows = _documented_formats()
    assert len(rows) >= 15
    for name, line, severity in rows:
        for stream, default in ((STDERR, "WARN"), (STDOUT, "INFO")):
            expected = default if severity == "the stream's" else severity
            assert line_severity(line, stream)[1] == expected, (name, line, stream)


def test_a_chained_traceback_is_one_record() -> None:
    tb = (
        "Traceback (most recent call last):\n"
        '  File "t.py", line 3, in <module>\n'
        "    f()\n"
        "KeyError: 'x'\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "t.py", line 5, in <module>\n'
        "RuntimeError: the loss is NaN\n"
    )
    records = _records(b"before\n" + tb.encode() + b"after\n")
    assert [r.body for r in records] == ["before", tb.rstrip("\n"), "after"]
    assert records[1].severity == SEVERITY_ERROR


def test_a_traceback_with_torchs_rank_prefix_is_one_record() -> None:
    """Once its process group is up, torch's excepthook writes an uncaught exception with
    ``[rank5]: `` before every line (seen on 2 nodes x 8 ranks: tests/scale/)."""
    tb = (
        "[rank5]: Traceback (most recent call last):\n"
        '[rank5]:   File "/x/ddp_train.py", line 80, in <module>\n'
        "[rank5]:     main()\n"
        "[rank5]: RuntimeError: a bad batch at step 12\n"
    )
    records = _records(b"[rank5]: loss 0.25\n" + tb.encode() + b"[rank5]: after\n")
    assert [r.body for r in records] == ["[rank5]: loss 0.25", tb.rstrip("\n"), "[rank5]: after"]
    assert records[1].severity == SEVERITY_ERROR


def test_a_fatal_error_dump_is_one_fatal_record_and_kept_for_the_root_cause() -> None:
    dump = (
        "Fatal Python error: Segmentation fault\n\n"
        "Current thread 0x00007f (most recent call first):\n"
        '  File "/x/train.py", line 27 in fail\n'
        '  File "/x/train.py", line 40 in main\n\n'
        "Extension modules: numpy (total: 1)\n"
    )
    reader = _reader(line_max=1000)
    reader.feed(b"step 3\n" + dump.encode())
    reader.end()
    records = reader.take()
    assert [r.severity for r in records] == [SEVERITY_WARN, SEVERITY_FATAL]
    assert records[1].body == dump.rstrip("\n")
    assert reader.fault_stack() == dump.rstrip("\n")
    assert reader.last_words().splitlines()[0] == "step 3"


def test_a_long_line_is_cut_and_flagged_in_bounded_memory() -> None:
    reader = _reader(line_max=1000)
    chunk = b"x" * 65536
    tracemalloc.start()
    for _ in range(160):  # 10 MiB, no newline
        reader.feed(chunk)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    reader.feed(b"\nnext\n")
    (long, short) = reader.take()
    assert peak < 1_000_000
    assert long.truncated and long.length == 160 * 65536 and long.body == "x" * 1000
    assert not short.truncated and short.body == "next"
    assert len(reader.last_words()) <= LAST_WORDS_BYTES


def test_invalid_utf8_becomes_replacement_text_and_is_flagged() -> None:
    (bad, good) = _records(b"ok \xff\xfe junk\n\xc3\xa9t\xc3\xa9\n")
    assert bad.invalid_utf8 and bad.body == "ok \ufffd\ufffd junk"
    assert not good.invalid_utf8 and good.body == "été"
    # a cut inside a character is the cut, not junk
    (cut,) = _records("é".encode() * 10 + b"\n", line_max=5)
    assert cut.truncated and not cut.invalid_utf8 and cut.body == "éé"


def test_the_rate_limit_counts_what_it_drops() -> None:
    limit = RateLimit(10)
    reader = OutputReader(STDOUT, 100, limit, keep_last=False)
    limit.refill(0)
    reader.feed(b"".join(b"line %d\n" % i for i in range(25)))
    first = reader.take()
    assert len(first) == 10 and limit.dropped_total == 15
    limit.refill(1_000_000_000)  # a second later: ten more
    reader.feed(b"again\n")
    (again,) = reader.take()
    assert again.dropped_before == 15


def test_a_console_nobody_drains_never_blocks_the_echo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent echoes its workers' output on the bridge's event thread: a full console pipe
    keeps the bytes for later instead of blocking that thread; they go out in order once the
    console takes them."""
    import os
    import sys
    import threading

    from elastic_otel.integration.worker_output import _echo

    r, w = os.pipe()
    console = os.fdopen(w, "w")
    monkeypatch.setattr(sys, "stderr", console)
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"." * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)  # a console pipe is a blocking one
    data = b"a worker's line\n" * 1000
    left: list[bytes] = []
    echo = threading.Thread(target=lambda: left.append(_echo(STDERR, data)), daemon=True)
    echo.start()
    echo.join(5.0)
    assert not echo.is_alive(), "the echo blocked on a full console"
    assert left == [data]  # nothing fitted: all of it kept
    os.set_blocking(r, False)
    with contextlib.suppress(BlockingIOError):
        while os.read(r, 65536):
            pass
    assert _echo(STDERR, left[0]) == b""
    assert os.read(r, 65536) == data
    console.close()
    os.close(r)
