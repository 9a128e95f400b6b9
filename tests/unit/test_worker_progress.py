"""Where a live worker is: its progress record and the stacks it dumps on request, in real worker
processes started with the environment the instrumented agent gives them (the start-up's
directory first on ``PYTHONPATH``, ``ELASTIC_OTEL_WORKER_REPORTS=1``, ``TORCHELASTIC_ERROR_FILE``
in a private directory), read from this process as the agent reads them. The scripts that use
torch run a real gloo process group on this machine.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from elastic_otel.integration.training_watch import signal_main_thread
from elastic_otel.names import environment_variables as env
from elastic_otel.parsing import worker_progress as wp
from elastic_otel.parsing.worker_progress import (
    WorkerProgress,
    read_new_stacks,
    read_progress,
    split_dumps,
)
from elastic_otel.parsing.worker_reports import main_thread_frame
from elastic_otel.worker import startup
from tests.support.worker_env import (
    agent_environment,
    json_lines,
    line_of,
    plain_environment,
    run,
    write_script,
)

T = TypeVar("T")
RTMIN3 = int(signal.SIGRTMIN) + 3
DUMP_WITHIN_S = 0.5


# --- helpers ---------------------------------------------------------------------------------


def wait_for(condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Worker processes a test starts; killed (by pid) and reaped at its end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record_bytes(**fields: int) -> bytes:
    """A record as the worker writes it, with ``fields`` changed."""
    header = {"magic": wp.MAGIC, "version": wp.VERSION, "pid": 1234, "stack_signal": RTMIN3}
    body = dict.fromkeys(wp.BODY_FIELDS, 0) | {"step": wp.NO_STEP, "seq": 2}
    for key, value in fields.items():
        (header if key in header else body)[key] = value
    return wp.HEADER.pack(*header.values()) + wp.BODY.pack(*(body[k] for k in wp.BODY_FIELDS))


# --- the record and its reader ---------------------------------------------------------------


def test_the_record_is_small_and_laid_out_as_documented() -> None:
    assert wp.RECORD_SIZE == 80 <= 128
    offsets = {name: wp.BODY_OFFSET + 8 * i for i, name in enumerate(wp.BODY_FIELDS)}
    assert offsets == {
        "entered": 16,
        "completed": 24,
        "collective": 32,
        "since_ns": 40,
        "progress_ns": 48,
        "step": 56,
        "step_ns": 64,
        "seq": 72,
    }
    assert wp.SEQ_OFFSET == 72
    assert wp.COLLECTIVES[0] == "" and len(set(wp.COLLECTIVES)) == len(wp.COLLECTIVES)
    layout = (Path(__file__).parents[2] / "docs" / "hangs.md").read_text()
    for name, offset in offsets.items():  # the progress record's table in docs/hangs.md
        assert f"{offset:<6} q      {name}" in layout


def test_a_record_reads_from_its_directory_or_error_file(tmp_path: Path) -> None:
    (tmp_path / env.WORKER_PROGRESS_FILE).write_bytes(
        record_bytes(
            entered=7,
            completed=6,
            collective=wp.COLLECTIVES.index("barrier"),
            since_ns=10,
            progress_ns=20,
            step=41,
            step_ns=15,
        )
    )
    expected = WorkerProgress(
        pid=1234,
        stack_signal=RTMIN3,
        entered=7,
        completed=6,
        collective="barrier",
        since_ns=10,
        step=41,
        step_ns=15,
        progress_ns=20,
    )
    assert read_progress(str(tmp_path)) == expected
    assert read_progress(str(tmp_path / "error.json")) == expected  # need not exist
    assert expected.in_collective
    # Where the file cannot be mapped, the same reads go through pread.
    fd = os.open(tmp_path / env.WORKER_PROGRESS_FILE, os.O_RDONLY)
    try:
        assert (
            wp._consistent_record(wp._Pread(fd))
            == (tmp_path / env.WORKER_PROGRESS_FILE).read_bytes()
        )
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "damage",
    ["missing", "empty", "short", "long", "magic", "version", "odd seq", "fifo", "directory"],
)
def test_a_bad_record_reads_as_none(tmp_path: Path, damage: str) -> None:
    path = tmp_path / env.WORKER_PROGRESS_FILE
    data = record_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "short":
        path.write_bytes(data[:-8])
    elif damage == "long":
        path.write_bytes(data + bytes(8))
    elif damage == "magic":
        path.write_bytes(b"XXXX" + data[4:])
    elif damage == "version":
        path.write_bytes(record_bytes(version=wp.VERSION + 1))
    elif damage == "odd seq":  # a writer killed between its two stores of seq
        path.write_bytes(record_bytes(seq=7))
    elif damage == "fifo":
        os.mkfifo(path)  # must not block
    elif damage == "directory":
        path.mkdir()
    started = time.monotonic()
    assert read_progress(str(tmp_path)) is None
    assert time.monotonic() - started < 1


def test_no_step_and_an_unknown_collective(tmp_path: Path) -> None:
    record = record_bytes(collective=999, entered=1)
    (tmp_path / env.WORKER_PROGRESS_FILE).write_bytes(record)
    progress = read_progress(str(tmp_path))
    assert progress is not None
    assert (progress.step, progress.step_ns, progress.collective) == (None, None, "#999")


def test_a_collective_left_is_over_whatever_the_last_entered(tmp_path: Path) -> None:
    """Leaving a collective stores progress and completed only (the hot path): the last one
    entered stays in the record, and the counts say it is over."""
    barrier = wp.COLLECTIVES.index("barrier")
    (tmp_path / env.WORKER_PROGRESS_FILE).write_bytes(
        record_bytes(collective=barrier, entered=3, completed=3, since_ns=10, progress_ns=20)
    )
    progress = read_progress(str(tmp_path))
    assert progress is not None and not progress.in_collective
    assert (progress.collective, progress.since_ns, progress.progress_ns) == (None, 10, 20)


def test_the_reader_never_sees_a_torn_record_while_a_worker_writes(tmp_path: Path) -> None:
    """A writer updating as fast as it can; every reading is one the writer left whole: each
    iteration enters and leaves a collective, then marks its step."""
    script = write_script(
        tmp_path,
        """
        import sys, time
        from elastic_otel.worker import progress

        progress.arm(sys.argv[1])
        collective = progress.wrap(lambda: None, 1)
        print("ready", flush=True)
        deadline = time.monotonic() + 30
        i = 0
        while time.monotonic() < deadline:
            collective()
            progress.mark_step(i)
            i += 1
        """,
    )
    writer = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / env.WORKER_PROGRESS_FILE)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        readings = [read_progress(str(tmp_path)) for _ in range(3000)]
    finally:
        writer.kill()
        writer.communicate()
    seen = [r for r in readings if r is not None]
    print(f"\n{len(seen)} of {len(readings)} readings whole")
    assert len(seen) > 0.9 * len(readings)
    for r in seen:
        step = -1 if r.step is None else r.step
        assert r.entered - r.completed in (0, 1), r
        assert (r.collective is not None) == (r.entered > r.completed), r
        assert step in (r.completed - 1, r.completed - 2), r
        assert r.since_ns <= r.progress_ns or r.collective is not None, r
    assert seen[-1].completed > seen[0].completed  # it did move meanwhile


# --- stacks ----------------------------------------------------------------------------------


def test_read_new_stacks_returns_whole_lines_once(tmp_path: Path) -> None:
    path = tmp_path / env.WORKER_STACKS_FILE
    assert read_new_stacks(str(path), 0) == ("", 0)  # missing
    path.write_bytes(b"Thread 0x1 (most recent call first):\n  File ")
    text, offset = read_new_stacks(str(path), 0)
    assert (text, offset) == ("Thread 0x1 (most recent call first):\n", 37)
    assert read_new_stacks(str(path), offset) == ("", offset)  # the rest is not a line yet
    with path.open("ab") as f:
        f.write(b'"a.py", line 3 in f\n')
    assert read_new_stacks(str(path), offset) == (
        '  File "a.py", line 3 in f\n',
        path.stat().st_size,
    )
    path.write_bytes(b"new\n")  # written anew (shorter than the offset): from its start
    assert read_new_stacks(str(path), 500) == ("new\n", 4)


def test_read_new_stacks_is_bounded_and_keeps_the_newest_lines(tmp_path: Path) -> None:
    path = tmp_path / env.WORKER_STACKS_FILE
    lines = [f"line {i:04d}\n" for i in range(1000)]  # 10 bytes each
    path.write_text("".join(lines))
    text, offset = read_new_stacks(str(path), 0, max_bytes=95)
    assert text == "".join(lines[-9:])
    assert offset == path.stat().st_size
    text, _ = read_new_stacks(str(path), 0, max_bytes=100)  # the cut falls at a line's start
    assert text == "".join(lines[-10:])


def test_read_new_stacks_opens_only_regular_files(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_new_stacks(str(fifo), 3) == ("", 3)
    assert read_new_stacks(str(tmp_path), 3) == ("", 3)


def test_split_dumps_cuts_where_a_thread_comes_again() -> None:
    one = (
        "Thread 0x00007f01 (most recent call first):\n"
        '  File "t.py", line 3 in helper\n'
        "\n"
        "Current thread 0x00007f00 (most recent call first):\n"
        '  File "t.py", line 8 in main\n'
    )
    assert split_dumps(one + one + one.replace("Current thread", "Thread")) == [
        one,
        one,
        one.replace("Current thread", "Thread"),
    ]
    assert split_dumps("") == []


# --- the stack signal ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, RTMIN3),
        ("", RTMIN3),
        ("SIGRTMIN+3", RTMIN3),
        ("rtmin+5", int(signal.SIGRTMIN) + 5),
        ("SIGRTMAX-1", int(signal.SIGRTMAX) - 1),
        ("SIGRTMIN", int(signal.SIGRTMIN)),
        ("SIGUSR2", int(signal.SIGUSR2)),
        ("usr1", int(signal.SIGUSR1)),
        (str(int(signal.SIGUSR2)), int(signal.SIGUSR2)),
        ("40", 40),
        ("none", None),
        ("off", None),
        ("SIGTERM", None),
        ("15", None),
        ("SIGKILL", None),
        ("SIGUSR2+1", None),
        ("SIGRTMAX+1", None),
        ("0", None),
        ("-3", None),
        ("rtmin+x", None),
    ],
)
def test_the_stack_signal_variable(value: str | None, expected: int | None) -> None:
    assert startup.parse_stack_signal(value) == expected


def _ready(
    processes: list[subprocess.Popen[str]], env: dict[str, str], script: Path, *args: str
) -> subprocess.Popen[str]:
    """Start ``script`` as a worker and wait for its ``ready`` line."""
    worker = subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    processes.append(worker)
    assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
    return worker


SLEEPER = """
    import os, select, signal, sys, threading, time

    def helper():
        threading.Event().wait(60)  # HELPER

    threading.Thread(target=helper, name="helper", daemon=True).start()

    def main():
        print("ready", flush=True)
        if sys.argv[1] == "select":
            select.select([], [], [], 60)  # select
        else:
            time.sleep(60)  # sleep

    main()
    """


@pytest.mark.parametrize(
    ("blocked_in", "variable", "number"),
    [
        ("sleep", None, RTMIN3),
        ("select", None, RTMIN3),
        ("sleep", "SIGUSR2", int(signal.SIGUSR2)),
    ],
)
def test_the_signal_appends_the_main_threads_stack_while_the_worker_is_blocked(
    tmp_path: Path,
    error_file: Path,
    processes: list[subprocess.Popen[str]],
    blocked_in: str,
    variable: str | None,
    number: int,
) -> None:
    script = write_script(tmp_path, SLEEPER)
    extra = {env.ELASTIC_OTEL_STACK_SIGNAL: variable} if variable else {}
    worker = _ready(processes, agent_environment(error_file, **extra), script, blocked_in)
    progress = read_progress(str(error_file))
    assert progress is not None
    assert (progress.pid, progress.stack_signal) == (worker.pid, number)
    stacks = error_file.parent / env.WORKER_STACKS_FILE
    assert stacks.stat().st_mode & 0o777 == 0o600
    blocked = f'File "{script}", line {line_of(script, blocked_in)} in main'
    helper = f'File "{script}", line {line_of(script, "HELPER")} in helper'
    time.sleep(0.2)  # well inside the blocking call
    offset = 0
    for _ in range(2):  # and again: the worker lives on, the dumps add up
        signal_main_thread(worker.pid, number)
        sent = time.monotonic()

        def dumped(offset: int = offset) -> str:
            text = read_new_stacks(str(stacks), offset)[0]
            return text if blocked in text else ""

        wait_for(dumped, 5, "a dump")
        assert time.monotonic() - sent < DUMP_WITHIN_S
        time.sleep(0.1)  # the dump is a write per line: let it end
        text, offset = read_new_stacks(str(stacks), offset)
        (dump,) = split_dumps(text)
        assert dump.startswith("Stack (most recent call first):\n") and helper not in dump
        assert main_thread_frame(dump) == f"main at {script.name}:{line_of(script, blocked_in)}"
        assert worker.poll() is None
    assert len(split_dumps(stacks.read_text())) == 2


BUSY_THREADS = """
    import pickle, sys, threading, time

    def deep(n):
        return deep(n - 1) if n else pickle.loads(pickle.dumps(list(range(50))))

    def busy():
        while True:  # frames pushed and popped, data-stack chunks freed, all the time
            deep(400)

    for _ in range(2):
        threading.Thread(target=busy, daemon=True).start()
    print("ready", flush=True)
    time.sleep(60)
    """


def test_stack_requests_never_crash_a_worker_whose_other_threads_run_python(
    tmp_path: Path, error_file: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """faulthandler's dump of every thread walks the frames of threads that run meanwhile: such
    a worker died of SIGSEGV within 20,000 requests, 3 runs of 3 (a hung rank, killed by the
    request for its stack, in CI). One thread's dump, the main thread's, reads only frames
    that stand still."""
    script = write_script(tmp_path, BUSY_THREADS)
    worker = _ready(processes, agent_environment(error_file), script)
    progress = read_progress(str(error_file))
    assert progress is not None and progress.stack_signal == RTMIN3
    for _ in range(20_000):
        signal_main_thread(worker.pid, RTMIN3)
    time.sleep(0.2)
    assert worker.poll() is None, worker.communicate()[1][-2000:]
    dumps = split_dumps((error_file.parent / env.WORKER_STACKS_FILE).read_text())
    assert dumps and all("in deep" not in dump for dump in dumps)


def test_none_arms_no_signal(
    tmp_path: Path, error_file: Path, processes: list[subprocess.Popen[str]]
) -> None:
    script = write_script(tmp_path, SLEEPER)
    worker = subprocess.Popen(
        [sys.executable, str(script), "sleep"],
        env=agent_environment(error_file, **{env.ELASTIC_OTEL_STACK_SIGNAL: "none"}),
        stdout=subprocess.PIPE,
        text=True,
    )
    processes.append(worker)
    assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
    progress = read_progress(str(error_file))
    assert progress is not None and progress.stack_signal == 0
    assert not (error_file.parent / env.WORKER_STACKS_FILE).exists()


def test_a_signal_the_worker_ignores_stays_ignored(tmp_path: Path, error_file: Path) -> None:
    script = write_script(
        tmp_path,
        """
        import os, signal
        os.kill(os.getpid(), signal.SIGUSR2)
        print(signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN)
        """,
    )
    environ = agent_environment(error_file, **{env.ELASTIC_OTEL_STACK_SIGNAL: "SIGUSR2"})
    done = subprocess.run(
        [sys.executable, str(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN),
    )
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr
    progress = read_progress(str(error_file))
    assert progress is not None and progress.stack_signal == 0


# --- mark_step and forks (no torch) ----------------------------------------------------------


def test_mark_step_other_threads_and_forked_children_leave_the_record_alone(
    tmp_path: Path, error_file: Path
) -> None:
    """Only the thread that armed the record writes it: not another thread, not a forked
    child (which shares the mapping), and a stray stack signal in the child harms nothing."""
    script = write_script(
        tmp_path,
        """
        import json, os, signal, sys, threading
        import elastic_otel
        from elastic_otel.worker import progress

        collective = progress.wrap(lambda: None, 1)  # stands for a wrapped torch collective
        collective()
        for step in range(5):
            elastic_otel.mark_step(step)
        elastic_otel.mark_step("not a step")  # ignored, never raises
        elastic_otel.mark_step(2**70)

        def elsewhere():
            collective()
            elastic_otel.mark_step(50)

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        pid = os.fork()
        if pid == 0:
            collective()
            elastic_otel.mark_step(999)
            os.kill(os.getpid(), signal.SIGRTMIN + 3)
            os._exit(7)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": os.getpid(), "child": os.waitstatus_to_exitcode(status)}))
        """,
    )
    done = run(script, agent_environment(error_file))
    assert (done.returncode, done.stderr) == (0, "")
    (worker,) = json_lines(done.stdout)
    assert worker["child"] == 7
    progress = read_progress(str(error_file))
    assert progress is not None
    assert progress.pid == worker["pid"]
    assert (progress.entered, progress.completed, progress.collective) == (1, 1, None)
    assert progress.step == 4 and progress.step_ns is not None
    # the worker's exit left training (since then), not the child's
    assert progress.progress_ns == progress.step_ns <= progress.since_ns and progress.left
    assert (error_file.parent / env.WORKER_STACKS_FILE).read_text() == ""


def test_an_exec_starts_a_new_record_for_the_same_pid(tmp_path: Path, error_file: Path) -> None:
    write_script(
        tmp_path,
        """
        import elastic_otel
        elastic_otel.mark_step(3)
        """,
        "real_train.py",
    )
    script = write_script(
        tmp_path,
        """
        import os, sys
        import elastic_otel
        elastic_otel.mark_step(100)
        print(os.getpid(), flush=True)
        os.execv(sys.executable, [sys.executable, "real_train.py"])
        """,
    )
    done = run(script, agent_environment(error_file))
    assert done.returncode == 0, done.stderr
    progress = read_progress(str(error_file))
    assert progress is not None
    assert (progress.pid, progress.step, progress.stack_signal) == (int(done.stdout), 3, RTMIN3)
    assert sorted(p.name for p in error_file.parent.iterdir()) == sorted(
        [
            env.WORKER_FAULT_FILE,
            env.WORKER_PROGRESS_FILE,
            env.WORKER_STACKS_FILE,
            env.WORKER_REQUESTS_FIFO,  # the collectives thread's, kept across the exec
        ]
    )


def test_without_the_start_up_nothing_is_written_and_nothing_wrapped(
    tmp_path: Path, error_file: Path
) -> None:
    script = write_script(
        tmp_path,
        """
        import json, sys
        import elastic_otel
        from elastic_otel.worker import progress

        elastic_otel.mark_step(1)
        import torch.distributed as dist
        print(json.dumps({
            "armed": progress.armed(),
            "wrapped": hasattr(dist.all_reduce, "_elastic_otel_collective"),
            "hooks": [type(f).__name__ for f in sys.meta_path],
        }))
        """,
    )
    environ = plain_environment() | {env.TORCHELASTIC_ERROR_FILE: str(error_file)}
    done = run(script, environ)
    assert done.returncode == 0, done.stderr
    (state,) = json_lines(done.stdout)
    assert state["armed"] is False and state["wrapped"] is False
    assert "_CollectivesFinder" not in state["hooks"]
    assert list(error_file.parent.iterdir()) == []


# --- torch: collectives ----------------------------------------------------------------------


def test_collectives_are_wrapped_as_torch_imports_them_and_counted(
    tmp_path: Path, error_file: Path
) -> None:
    script = write_script(
        tmp_path,
        f"""
        import inspect, json, os, sys, warnings
        import torch
        import torch.distributed as dist
        import elastic_otel
        from elastic_otel.parsing.worker_progress import COLLECTIVES, read_progress

        directory = os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"])
        c10d = dist.distributed_c10d

        def report(label):
            p = read_progress(directory)
            print(json.dumps({{"label": label, "entered": p.entered, "completed": p.completed,
                              "collective": p.collective, "step": p.step, "left": p.left}}),
                  flush=True)

        wrapped = sorted(n for n in COLLECTIVES[1:] if hasattr(getattr(c10d, n, None),
                         "_elastic_otel_collective"))
        unwrapped = [getattr(c10d, n).__wrapped__ for n in wrapped]
        ids = {{id(f) for f in unwrapped}}  # alive, so their ids are theirs
        with warnings.catch_warnings():  # reading deprecated attributes warns
            warnings.simplefilter("ignore")
            left = sorted(
                f"{{name}}.{{key}}"
                for name, module in list(sys.modules.items())
                for key, value in list(getattr(module, "__dict__", {{}}).items())
                if id(value) in ids
            )
        same = all(getattr(dist, n) is getattr(c10d, n) for n in wrapped if hasattr(dist, n))
        signature = inspect.signature
        meta = all(
            f.__name__ == n
            and f.__module__ == c10d.__name__
            and f.__doc__ == f.__wrapped__.__doc__
            and signature(f) == signature(f.__wrapped__)
            for n, f in ((n, getattr(c10d, n)) for n in wrapped)
        )
        print(json.dumps({{"wrapped": wrapped, "left": left, "same": same, "meta": meta,
                          "loader": type(c10d.__loader__).__name__,
                          "finders": [type(f).__name__ for f in sys.meta_path]}}))

        dist.init_process_group("gloo", rank=0, world_size=1,
                                init_method="tcp://127.0.0.1:{free_port()}")
        report("initialised")
        t = torch.ones(2)
        for step in range(3):
            dist.all_reduce(t)
            elastic_otel.mark_step(step)
        report("three all_reduce")
        out = [None]
        dist.all_gather_object(out, {{"rank": 0}})  # calls all_gather inside: counted once
        report("all_gather_object")
        work = dist.all_reduce(t, async_op=True)  # counted at issue
        report("async issued")
        work.wait()
        dist.barrier()
        dist.broadcast(t, src=0)
        report("barrier, broadcast")
        try:
            dist.all_reduce("not a tensor")
        except Exception as e:
            print(json.dumps({{"raised": type(e).__name__}}))
        report("raised")
        sub = dist.new_group([0])
        dist.destroy_process_group(sub)  # a subgroup's: training goes on
        report("subgroup destroyed")
        dist.destroy_process_group()
        report("destroyed")
        left_at = read_progress(directory).since_ns
        from elastic_otel.worker import progress
        progress.leave()  # as the exit does: when it left stays
        print(json.dumps({{"kept": read_progress(directory).since_ns == left_at}}), flush=True)
        elastic_otel.mark_step(9)  # a step marked after it: back in training
        report("stepped again")
        """,
    )
    done = run(script, agent_environment(error_file))
    assert done.returncode == 0, done.stderr
    lines = json_lines(done.stdout)
    info = lines[0]
    expected = {
        "all_reduce", "all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single",
        "broadcast", "reduce", "reduce_scatter", "reduce_scatter_tensor", "barrier",
        "monitored_barrier", "gather", "scatter", "send", "recv", "isend", "irecv",
        "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
        "batch_isend_irecv",
    }  # fmt: skip
    assert expected <= set(info["wrapped"])
    assert info["left"] == []  # no module kept an unwrapped original
    assert info["same"] and info["meta"]
    assert info["loader"] == "SourceFileLoader"  # the module keeps its own loader
    assert "_CollectivesFinder" not in info["finders"]  # one-shot
    counts = {line["label"]: line for line in lines if "label" in line}
    base = counts["initialised"]["entered"]  # torch's own, if any, during set-up
    assert counts["initialised"]["entered"] == counts["initialised"]["completed"]

    def delta(label: str) -> tuple[int, int]:
        return counts[label]["entered"] - base, counts[label]["completed"] - base

    assert delta("three all_reduce") == (3, 3)
    assert counts["three all_reduce"]["step"] == 2
    assert delta("all_gather_object") == (4, 4)
    assert delta("async issued") == (5, 5)
    assert delta("barrier, broadcast") == (7, 7)
    assert any("raised" in line for line in lines)
    assert delta("raised") == (8, 8)  # raised: completed all the same
    assert all(line["collective"] is None for line in counts.values())
    # destroying the default group leaves training; no call counted, a subgroup's stays in it
    assert [counts[k]["left"] for k in ("raised", "subgroup destroyed", "destroyed")] == [
        False,
        False,
        True,
    ]
    assert counts["destroyed"]["entered"] == counts["subgroup destroyed"]["entered"]
    assert counts["stepped again"]["left"] is False
    assert {"kept": True} in lines


HANG = """
    import os, sys, time
    import torch
    import torch.distributed as dist
    import elastic_otel

    rank = int(sys.argv[1])
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=sys.argv[2])
    t = torch.ones(4)
    for step in range(5):
        dist.all_reduce(t)
        elastic_otel.mark_step(step)

    def wait_for_the_other():
        dist.all_reduce(t)  # WAIT

    def main():
        print("looping", flush=True)
        if rank == 0:
            time.sleep(120)  # SLEEP
        else:
            wait_for_the_other()

    main()
    """


def test_a_hang_shows_in_the_records_and_the_stacks(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """Two ranks: rank 0 sleeps outside any collective, rank 1 waits for it in all_reduce."""
    script = write_script(tmp_path, HANG)
    init_method = f"tcp://127.0.0.1:{free_port()}"
    directories = []
    for rank in range(2):
        directory = tmp_path / "attempt_0" / str(rank)
        directory.mkdir(parents=True)
        directories.append(directory)
        processes.append(
            subprocess.Popen(
                [sys.executable, str(script), str(rank), init_method],
                env=agent_environment(directory / "error.json"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    sleeper, waiter = processes

    def records() -> tuple[WorkerProgress, WorkerProgress] | None:
        first, second = (read_progress(str(d)) for d in directories)
        if first is None or second is None or second.entered < 6:
            return None
        if first.completed < 5 or first.step != 4:
            return None  # rank 0's last stores may land after rank 1 entered its sixth
        return first, second

    started = time.time_ns()
    slept, waits = wait_for(records, 90, "rank 1 to wait in its sixth all_reduce")
    assert (slept.pid, waits.pid) == (sleeper.pid, waiter.pid)
    assert (slept.entered, slept.completed, slept.collective, slept.step) == (5, 5, None, 4)
    assert (waits.entered, waits.completed, waits.collective, waits.step) == (6, 5, "all_reduce", 4)
    assert waits.in_collective and not slept.in_collective
    assert slept.step_ns is not None
    assert started <= slept.step_ns <= slept.progress_ns <= time.time_ns()
    assert waits.step_ns is not None and waits.step_ns <= waits.since_ns <= time.time_ns()
    assert slept.stack_signal == waits.stack_signal == RTMIN3
    time.sleep(0.3)
    again = read_progress(str(directories[1]))
    assert again is not None and (again.entered, again.since_ns) == (6, waits.since_ns)

    sleeping = f'File "{script}", line {line_of(script, "SLEEP")} in main'
    waiting = f'File "{script}", line {line_of(script, "WAIT")} in wait_for_the_other'
    for process, progress in ((sleeper, slept), (waiter, waits)):
        os.kill(process.pid, progress.stack_signal)
    stacks = [str(d / env.WORKER_STACKS_FILE) for d in directories]

    def dumps() -> tuple[str, str] | None:
        first, second = (read_new_stacks(path, 0)[0] for path in stacks)
        return (first, second) if sleeping in first and waiting in second else None

    texts = wait_for(dumps, 5, "both dumps")
    assert re.search(r'distributed_c10d\.py", line \d+ in all_reduce', texts[1])
    assert "distributed_c10d.py" not in texts[0]
    assert sleeper.poll() is None and waiter.poll() is None  # a dump does not stop them


def test_a_record_left_by_a_process_that_exits(tmp_path: Path) -> None:
    """The record outlives its writer: the agent reads a dead worker's last state."""
    path = tmp_path / env.WORKER_PROGRESS_FILE
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom elastic_otel.worker import progress\n"
            "progress.arm(sys.argv[1], 12)\nprogress.mark_step(9)\n",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    progress = read_progress(str(tmp_path))
    assert progress is not None and (progress.step, progress.stack_signal) == (9, 12)
    # its interpreter's exit left training: a slow exit is no training stall
    assert progress.left and progress.step_ns is not None
    assert progress.step_ns <= progress.since_ns
    assert struct.unpack_from("<4s", path.read_bytes())[0] == wp.MAGIC
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [env.WORKER_PROGRESS_FILE]
