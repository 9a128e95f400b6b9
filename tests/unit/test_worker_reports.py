"""Reading a dead worker's reports, and cutting stacks to a byte limit, on real input: Python
tracebacks raised through nested functions here, ``faulthandler`` dumps from real fatal signals
in subprocesses, torch's own error file written by torch's own ``ErrorHandler``."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_otel.names import environment_variables as env
from elastic_otel.parsing.worker_reports import (
    FAULT_SIGNALS,
    WorkerReport,
    innermost_frames,
    read_worker_report,
    with_source_lines,
)

MESSAGE = "innermost boom: é"
MARKER = re.compile(r"^  \.\.\. (\d+) outer frames? omitted \.\.\.$", re.MULTILINE)


def _descend(depth: int) -> None:
    if depth == 0:
        raise RuntimeError(MESSAGE)
    if depth % 2:
        return _descend(depth - 1)
    return _descend(depth - 1)  # a line of its own: no "[Previous line repeated]" folding


def deep_traceback(depth: int = 40) -> str:
    """A real traceback, ``depth + 2`` frames deep (this function's is the outermost)."""
    try:
        _descend(depth)
    except RuntimeError as e:
        return "".join(traceback.format_exception(e))
    raise AssertionError("unreachable")


def _wrap(depth: int) -> None:
    try:
        _descend(depth)
    except RuntimeError as e:
        raise ValueError("wrapped") from e


def chained_traceback(depth: int = 30) -> str:
    try:
        _wrap(depth)
    except ValueError as e:
        return "".join(traceback.format_exception(e))
    raise AssertionError("unreachable")


def frames_of(text: str) -> list[str]:
    """A traceback's frames (a ``File`` line and the lines below it), outermost first."""
    frames: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("  File "):
            frames.append(line)
        elif frames and line.startswith("    "):
            frames[-1] += line
    return frames


def size(text: str) -> int:
    return len(text.encode("utf-8"))


DEEP = deep_traceback()
CHAINED = chained_traceback()


# --- innermost_frames on Python tracebacks --------------------------------------------------------


@pytest.mark.parametrize("limit", [300, 700, 2048])
def test_a_long_traceback_keeps_the_exception_and_the_innermost_frames(limit: int) -> None:
    text = deep_traceback()
    assert size(text) > limit
    cut = innermost_frames(text, limit)
    assert size(cut) <= limit
    assert cut.startswith("Traceback (most recent call last):\n")
    assert cut.endswith(f"RuntimeError: {MESSAGE}\n")
    every, kept = frames_of(text), frames_of(cut)
    assert kept and kept == every[-len(kept) :]  # whole frames, the innermost ones
    assert "raise RuntimeError(MESSAGE)" in kept[-1]
    assert "in deep_traceback" not in cut  # the outermost frame is the one left out
    (omitted,) = MARKER.findall(cut)
    assert int(omitted) + len(kept) == len(every)


def test_a_traceback_that_fits_is_unchanged() -> None:
    text = deep_traceback(2)
    assert innermost_frames(text, size(text)) == text


def test_a_chained_traceback_keeps_the_root_cause_and_the_final_exception() -> None:
    text = chained_traceback()
    cut = innermost_frames(text, 1200)
    assert size(cut) <= 1200
    assert cut.endswith("ValueError: wrapped\n")
    assert f"RuntimeError: {MESSAGE}\n" in cut
    assert "The above exception was the direct cause of the following exception:" in cut
    assert "raise RuntimeError(MESSAGE)" in cut  # the root cause's innermost frame
    assert "raise ValueError" in cut


def test_a_chain_left_out_is_said_so() -> None:
    cut = innermost_frames(chained_traceback(), 260)
    assert size(cut) <= 260
    assert cut.endswith("ValueError: wrapped\n")


def test_a_huge_message_keeps_its_beginning_and_where_it_came_from() -> None:
    try:
        _descend_with("é" * 5000)
    except RuntimeError as e:
        text = "".join(traceback.format_exception(e))
    cut = innermost_frames(text, 512)
    assert size(cut) <= 512
    assert "RuntimeError: ééé" in cut and "\ufffd" not in cut  # never half a character
    assert "raise RuntimeError(message)" in cut


def _descend_with(message: str) -> None:
    raise RuntimeError(message)


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(min_value=0, max_value=6000))
def test_never_more_than_the_limit(fault_dump: str, limit: int) -> None:
    for text in (DEEP, CHAINED, fault_dump, "no traceback here\n" * 300):
        cut = innermost_frames(text, limit)
        assert size(cut) <= limit
        if size(text) <= limit:
            assert cut == text


@settings(max_examples=100, deadline=None)
@given(limit=st.integers(min_value=260, max_value=6000))
def test_the_exception_and_innermost_frame_survive_any_reasonable_limit(limit: int) -> None:
    cut = innermost_frames(DEEP, limit)
    assert cut.endswith(f"RuntimeError: {MESSAGE}\n")
    assert "raise RuntimeError(MESSAGE)" in cut


def test_text_of_neither_shape_keeps_its_last_lines() -> None:
    text = "".join(f"line {i}\n" for i in range(1000))
    cut = innermost_frames(text, 100)
    assert size(cut) <= 100
    assert cut.endswith("line 999\n")
    assert cut.startswith("... ") and " lines omitted ...\n" in cut


def test_undecodable_file_names_do_not_break_the_cut() -> None:
    text = deep_traceback().replace("test_worker_reports", "test_\udcffworker")
    cut = innermost_frames(text, 500)
    assert size(cut) <= 500
    assert cut.endswith(f"RuntimeError: {MESSAGE}\n")


# --- faulthandler dumps ---------------------------------------------------------------------------

CRASHING = textwrap.dedent(
    """
    import ctypes, faulthandler, sys, threading, time

    try:
        import _cffi_backend  # an extension module: faulthandler lists those after the stacks
    except ImportError:
        pass
    faulthandler.enable(open(sys.argv[1], "w"), all_threads=True)
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()

    def crash():
        ctypes.string_at(0)  # INNERMOST

    def nest(depth):
        if depth == 0:
            crash()
        nest(depth - 1)

    nest(30)
    """
)


@pytest.fixture(scope="module")
def fault_dump(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real dump: a segfault 32 frames deep, beside a sleeping thread."""
    directory = tmp_path_factory.mktemp("crash")
    script = directory / "crash.py"
    script.write_text(CRASHING)
    dump = directory / env.WORKER_FAULT_FILE
    done = subprocess.run([sys.executable, str(script), str(dump)], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGSEGV
    return dump.read_text()


def test_a_fault_dump_keeps_the_fatal_line_and_the_crashing_threads_innermost_frames(
    fault_dump: str,
) -> None:
    assert "Thread 0x" in fault_dump and "Current thread 0x" in fault_dump
    cut = innermost_frames(fault_dump, 400)
    assert size(cut) <= 400
    assert cut.startswith("Fatal Python error: Segmentation fault\n\nCurrent thread 0x")
    frames = [line for line in cut.splitlines() if line.startswith("  File ")]
    section = fault_dump.split("Current thread")[1].split("\n\n")[0]
    every = section.splitlines()[1:]
    assert frames == every[: len(frames)]  # the innermost, first
    assert any(" in crash" in line for line in frames)
    assert "in <module>" not in cut  # the outermost frame is the one left out
    (omitted,) = MARKER.findall(cut)
    assert int(omitted) + len(frames) == len(every)
    assert "... 1 other thread omitted ...\n" in cut


def test_the_extension_module_list_goes_before_the_other_threads(fault_dump: str) -> None:
    if "Extension modules: " not in fault_dump:
        pytest.skip("no extension module outside the standard library (cffi) is installed")
    cut = innermost_frames(fault_dump, size(fault_dump) - 1)
    assert "Extension modules" not in cut
    assert "Thread 0x" in cut and "other thread" not in cut


@pytest.mark.parametrize("name", ["SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL"])
def test_every_fatal_signal_is_named(tmp_path: Path, name: str) -> None:
    error_file = tmp_path / "error.json"
    code = textwrap.dedent(
        f"""
        import faulthandler, os, signal
        faulthandler.enable(open({str(tmp_path / env.WORKER_FAULT_FILE)!r}, "w"))
        os.kill(os.getpid(), signal.{name})
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == -getattr(signal, name)
    report = read_worker_report(str(error_file))
    assert report is not None and report.fault_signal == name
    assert report.fault_stack is not None
    assert report.fault_stack.splitlines()[0] in {f"Fatal Python error: {n}" for n in FAULT_SIGNALS}
    assert report.exception_type is None


# --- read_worker_report ---------------------------------------------------------------------------


def _torch_error_handler() -> type | None:
    """torch's ``ErrorHandler`` (what ``@record`` writes with), loaded from torch's installed
    source without importing torch itself (seconds, for one class of the standard library)."""
    spec = importlib.util.find_spec("torch")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / "distributed" / "elastic" / "multiprocessing" / "errors" / "error_handler.py"
    module_spec = importlib.util.spec_from_file_location("torch_error_handler", path)
    if module_spec is None or module_spec.loader is None:
        return None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.ErrorHandler  # type: ignore[no-any-return]


def test_no_error_file_no_report(tmp_path: Path) -> None:
    assert read_worker_report(None) is None
    assert read_worker_report("") is None
    assert read_worker_report(str(tmp_path / "missing" / "error.json")) is None
    assert read_worker_report(str(tmp_path / "error.json")) is None


def test_torch_error_file_is_the_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handler_class = _torch_error_handler()
    if handler_class is None:
        pytest.skip("torch is not installed")
    error_file = tmp_path / "error.json"
    monkeypatch.setenv(env.TORCHELASTIC_ERROR_FILE, str(error_file))
    try:
        _descend(3)
    except RuntimeError as e:
        handler_class().record_exception(e)
    assert json.loads(error_file.read_text())["message"]["message"] == f"RuntimeError: {MESSAGE}"
    report = read_worker_report(str(error_file))
    assert report is not None
    assert (report.exception_type, report.message) == ("RuntimeError", MESSAGE)
    assert report.traceback is not None
    assert report.traceback.endswith(f"RuntimeError: {MESSAGE}\n")
    assert report.time_ns is not None and report.time_ns % 1_000_000_000 == 0
    assert report.fault_stack is None


def test_the_start_ups_record_wins_over_torchs(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": {"message": "RuntimeError: torch's"}}))
    record = {"type": "mod.Error", "message": "ours", "traceback": "tb", "time_unix_nano": 7}
    (tmp_path / env.WORKER_ERROR_FILE).write_text(json.dumps(record))
    assert read_worker_report(str(error_file)) == WorkerReport(
        exception_type="mod.Error", message="ours", traceback="tb", time_ns=7
    )


@pytest.mark.parametrize(
    ("torch_file", "expected"),
    [
        ({"message": "ValueError: new format"}, ("ValueError", "new format")),
        ({"message": {"message": "KeyboardInterrupt: "}}, ("KeyboardInterrupt", "")),
        ({"message": {"message": "no type here"}}, (None, "no type here")),
        ({"message": "<NONE>"}, None),
        ({"message": 7}, None),
        ([1, 2], None),
    ],
)
def test_torch_error_file_shapes(
    tmp_path: Path, torch_file: object, expected: tuple[str | None, str] | None
) -> None:
    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps(torch_file))
    report = read_worker_report(str(error_file))
    if expected is None:
        assert report is None
    else:
        assert report is not None
        assert (report.exception_type, report.message) == expected


@pytest.mark.parametrize(
    "ours",
    [
        b"{not json",
        b'{"type": 5, "message": "m"}',
        b"[]",
        b"\xff\xfe garbage",
        b'{"type": "E", "message": "' + b"x" * 70_000 + b'"}',  # over the bound: cut, ignored
    ],
)
def test_a_garbled_record_falls_back_without_raising(tmp_path: Path, ours: bytes) -> None:
    error_file = tmp_path / "error.json"
    (tmp_path / env.WORKER_ERROR_FILE).write_bytes(ours)
    assert read_worker_report(str(error_file)) is None
    error_file.write_text(json.dumps({"message": {"message": "OSError: disk"}}))
    report = read_worker_report(str(error_file))
    assert report is not None and report.exception_type == "OSError"


def test_wrongly_typed_fields_are_left_out(tmp_path: Path) -> None:
    record = {"type": "E", "message": ["m"], "traceback": None, "time_unix_nano": True}
    (tmp_path / env.WORKER_ERROR_FILE).write_text(json.dumps(record))
    assert read_worker_report(str(tmp_path / "error.json")) == WorkerReport(exception_type="E")


def test_reads_are_bounded(tmp_path: Path, fault_dump: str) -> None:
    dump = fault_dump + '  File "x.py", line 1 in f\n' * 100_000
    (tmp_path / env.WORKER_FAULT_FILE).write_text(dump)
    report = read_worker_report(str(tmp_path / "error.json"), max_bytes=4096)
    assert report is not None and report.fault_signal == "SIGSEGV"
    assert report.fault_stack is not None and size(report.fault_stack) <= 4096 + 3


def test_an_empty_or_binary_fault_file(tmp_path: Path) -> None:
    fault_file = tmp_path / env.WORKER_FAULT_FILE
    fault_file.write_bytes(b"")
    assert read_worker_report(str(tmp_path / "error.json")) is None
    fault_file.write_bytes(b"\x00\xff\xfe\n")
    report = read_worker_report(str(tmp_path / "error.json"))
    assert report is not None and report.fault_signal is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_in_place_of_a_report_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / env.WORKER_FAULT_FILE)
    os.mkfifo(tmp_path / env.WORKER_ERROR_FILE)
    assert read_worker_report(str(tmp_path / "error.json")) is None


# --- source lines under faulthandler's frames ---------------------------------------------------

HUNG = textwrap.dedent(
    """
    import faulthandler, sys, threading, time

    def dump():
        faulthandler.dump_traceback(open(sys.argv[1], "w"), all_threads=True)  # DUMP

    def wait_here():
        time.sleep(3600)  # SLEEPING

    def step(depth):
        if depth == 0:
            dump()
        else:
            step(depth - 1)  # DEEPER

    threading.Thread(target=wait_here, daemon=True).start()
    time.sleep(0.2)
    step(3)
    """
)


@pytest.fixture
def hung_dump(tmp_path: Path) -> tuple[str, Path]:
    """A real ``faulthandler`` dump of every thread of a script in ``tmp_path``, and the script."""
    script = tmp_path / "hung.py"
    script.write_text(HUNG)
    dump = tmp_path / "stacks.txt"
    done = subprocess.run([sys.executable, str(script), str(dump)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return dump.read_text(), script


def _frames_and_sources(text: str) -> list[tuple[str, str | None]]:
    """Each frame line with the source line under it (``None``: none)."""
    lines = text.splitlines()
    out: list[tuple[str, str | None]] = []
    for i, line in enumerate(lines):
        if line.startswith("  File "):
            below = lines[i + 1] if i + 1 < len(lines) else ""
            out.append((line, below if below.startswith("    ") else None))
    return out


def test_each_frame_gets_its_source_line_as_a_traceback_shows_it(
    hung_dump: tuple[str, Path],
) -> None:
    dump, script = hung_dump
    text = with_source_lines(dump, 65536)
    assert f'  File "{script}", line 8 in wait_here\n    time.sleep(3600)  # SLEEPING\n' in text
    assert f'  File "{script}", line 5 in dump\n    faulthandler.dump_traceback(' in text
    pairs = _frames_and_sources(text)
    assert [frame for frame, _ in pairs] == [
        line for line in dump.splitlines() if line.startswith("  File ")
    ]  # every frame kept, in order
    ours = [source for frame, source in pairs if str(script) in frame]
    assert ours.count("    step(depth - 1)  # DEEPER") == 3
    assert all(source is not None for source in ours)
    assert with_source_lines(text, 65536) == text  # lines already there are not added again


def test_source_lines_fit_the_limit_outermost_frames_first(hung_dump: tuple[str, Path]) -> None:
    dump, _ = hung_dump
    whole = with_source_lines(dump, 65536)
    for limit in range(len(dump.encode()), len(whole.encode()), 7):
        text = with_source_lines(dump, limit)
        assert size(text) <= limit
        pairs = _frames_and_sources(text)
        assert [frame for frame, _ in pairs] == [
            line for line in dump.splitlines() if line.startswith("  File ")
        ]
        for section in text.split("\n\n"):  # per thread: a prefix of frames keeps its source
            kept = [source is not None for _, source in _frames_and_sources(section)]
            assert kept == sorted(kept, reverse=True), section
    # room for the sleeping thread's innermost source line (listed first), not the next one
    tight = with_source_lines(dump, size(dump) + 40)
    assert "line 8 in wait_here\n    time.sleep(3600)  # SLEEPING\n" in tight
    assert "    faulthandler.dump_traceback(" not in tight and "# DEEPER" not in tight
    assert with_source_lines(dump, size(dump)) == dump
    assert with_source_lines(dump, 10) == dump  # over the limit already: unchanged


def test_a_file_it_cannot_read_or_a_bad_line_has_no_source_line(tmp_path: Path) -> None:
    source = tmp_path / "train.py"
    source.write_text("first()\nsecond()\n")
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    frames = [
        f'  File "{source}", line 2 in main',
        f'  File "{source}", line 0 in main',
        f'  File "{source}", line 99 in main',
        f'  File "{tmp_path / "missing.py"}", line 1 in main',
        '  File "train.py", line 1 in main',  # relative: to the worker's directory
        f'  File "{tmp_path}", line 1 in main',  # a directory
        f'  File "{fifo}", line 1 in main',  # would block a reader
        '  File "/proc/self/status", line 1 in main',
        '  File "<frozen importlib._bootstrap>", line 1 in _find_and_load',
        '  File "???", line 0 in ???',
    ]
    dump = "Stack (most recent call first):\n" + "\n".join(frames) + "\n"
    text = with_source_lines(dump, 65536)
    assert text == dump.replace(frames[0] + "\n", frames[0] + "\n    second()\n")
    no_newline = with_source_lines(dump.rstrip("\n"), 65536)
    assert no_newline == text.rstrip("\n")
    assert with_source_lines("not a dump\n\x00", 100) == "not a dump\n\x00"


def test_a_file_changed_since_is_read_again(tmp_path: Path) -> None:
    source = tmp_path / "train.py"
    source.write_text("old()\n")
    dump = f'Stack (most recent call first):\n  File "{source}", line 1 in main\n'
    assert with_source_lines(dump, 4096).endswith("\n    old()\n")
    source.write_text("the_new_one()\n")
    assert with_source_lines(dump, 4096).endswith("\n    the_new_one()\n")


def test_a_fault_stack_has_its_source_lines_and_cuts_with_them(
    tmp_path: Path, fault_dump: str
) -> None:
    (tmp_path / env.WORKER_FAULT_FILE).write_text(fault_dump)
    report = read_worker_report(str(tmp_path / "error.json"))
    assert report is not None and report.fault_stack is not None
    assert "in crash\n    ctypes.string_at(0)  # INNERMOST\n" in report.fault_stack
    cut = innermost_frames(report.fault_stack, 400)
    assert size(cut) <= 400
    lines = cut.splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    assert frames and all(lines[i + 1].startswith("    ") for i in frames)  # never apart
    assert all(lines[i - 1].startswith("  File ") for i, x in enumerate(lines) if x[:4] == "    ")
    (omitted,) = MARKER.findall(cut)
    section = report.fault_stack.split("Current thread")[1].split("\n\n")[0]
    every = [line for line in section.splitlines() if line.startswith("  File ")]
    assert int(omitted) + len(frames) == len(every)
