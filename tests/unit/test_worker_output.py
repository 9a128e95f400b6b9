"""A worker's output bytes → records (elastic_otel.parsing.worker_output): lines, levels,
tracebacks as one record, the bounds (line cap, rate limit, invalid UTF-8) and last words."""

from __future__ import annotations

import tracemalloc

from elastic_otel.parsing.worker_output import (
    LAST_WORDS_BYTES,
    SEVERITY_ERROR,
    SEVERITY_FATAL,
    SEVERITY_INFO,
    SEVERITY_WARN,
    STDERR,
    STDOUT,
    OutputReader,
    RateLimit,
)


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
