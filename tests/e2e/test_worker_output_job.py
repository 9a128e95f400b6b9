"""Worker output in the trace (issue 29), on real two-node torchrun jobs (c10d, gloo, two
workers per node) with a real OTLP receiver: each rank's stdout and stderr lines arrive as log
records on its own ``worker`` span with its rank and stream; the SIGSEGV of global rank 1,
whose ``main`` has torch's ``@record``, arrives with the Python stack faulthandler printed on
its stderr, naming the script's line, and with its last words; a 10 MB line without a newline
and invalid UTF-8 arrive bounded and flagged; an INFO line on stderr in each logging format a
level is read from (issue 36) arrives as INFO. The same job without the bridge prints the same
console output, line by line, in the same order per rank and stream.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from elastic_otel.model.agent_outcome import CHILD_FAILED
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import STATUS_PREFIX
from tests.support.jobs import ROOT, SCRIPTS, TORCHRUN, job_env, span_attr
from tests.support.otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "output_train.py"
FAULT_LINE = next(
    n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# FAULT LINE" in line
)
BLOB = 10 * 1024 * 1024


@dataclass
class Console:
    stdout: str
    stderr: str


def _run(env: dict[str, str], handler: str) -> list[Console]:
    """Two agents of one job, their stdout and stderr apart."""
    port, run_id = free_port(), f"run-{uuid.uuid4().hex[:6]}"
    cmd = [
        TORCHRUN,
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={run_id}",
        "--monitor-interval=0.5",
        "--max-restarts=0",
        "--event-log-handler",
        handler,
        str(SCRIPT),
    ]
    procs = [
        subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT)
        )
        for _ in range(2)
    ]
    with ThreadPoolExecutor(2) as pool:  # both read at once: a full pipe blocks its writer
        done = list(pool.map(lambda p: p.communicate(timeout=120), procs))
    for proc, (_, err) in zip(procs, done, strict=True):
        assert proc.returncode != 0, err[-3000:]  # the job failed on both nodes
    return [
        Console(out.decode("utf-8", "replace"), err.decode("utf-8", "replace")) for out, err in done
    ]


@dataclass
class Job:
    spans: list[dict]
    logs: list[dict]
    with_bridge: list[Console]
    without_bridge: list[Console]


def _buffered(env: dict[str, str]) -> dict[str, str]:
    """Python's default stdio, as a user's job has it: a line is one write. (Unbuffered, a
    print's text and its newline are two, and another worker's line can land between them.)"""
    env.pop("PYTHONUNBUFFERED")
    return env


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    tmp_path = tmp_path_factory.mktemp("worker_output")
    with OtlpReceiver("grpc") as receiver:
        with_bridge = _run(
            _buffered(job_env(receiver, tmp_path, ELASTIC_OTEL_WORKER_OUTPUT="all")), "otel"
        )
        receiver.wait_for_spans(4, timeout=30, where=lambda s: s["name"] == A.SPAN_WORKER)
        receiver.wait_for_logs(1, timeout=30, where=lambda r: A.LAST_WORDS in r["attributes"])
        spans, logs = receiver.spans(), receiver.logs()
    without_bridge = _run(_buffered(job_env(None, tmp_path)), "null")
    return Job(spans, logs, with_bridge, without_bridge)


def _workers(job: Job) -> dict[int, dict]:
    """Each rank's worker span of the first attempt."""
    spans = sorted(
        (s for s in job.spans if s["name"] == A.SPAN_WORKER), key=lambda s: -s["start_ns"]
    )
    return {span_attr(s, A.GLOBAL_RANK): s for s in spans}


def _output(job: Job, rank: int, stream: str) -> list[dict]:
    return [
        r
        for r in job.logs
        if r["attributes"].get(A.LOG_IOSTREAM) == stream
        and r["attributes"].get(A.GLOBAL_RANK) == rank
    ]


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_each_ranks_lines_are_records_on_its_worker_span(job: Job, rank: int) -> None:
    span = _workers(job)[rank]
    for stream, word in (("stdout", "out"), ("stderr", "err")):
        records = _output(job, rank, stream)
        assert {(r["trace_id"], r["span_id"]) for r in records} == {
            (span["trace_id"], span["span_id"])
        }
        bodies = [r["body"] for r in records]
        mine = [b for b in bodies if b.startswith(f"rank {rank} {word} ")]
        assert mine == [f"rank {rank} {word} {i}" for i in range(5)], bodies
        assert {r["attributes"][A.AGENT_RESTARTS] for r in records} == {0}
        assert {r["attributes"][A.LOCAL_RANK] for r in records} == {rank % 2}
        plain = [r for r in records if r["body"] in mine]
        assert {r["severity_text"] for r in plain} == {"INFO" if stream == "stdout" else "WARN"}
    (warned,) = [r for r in _output(job, rank, "stdout") if "warned" in r["body"]]
    assert warned["severity_text"] == "WARN"
    (handled,) = [r for r in _output(job, rank, "stderr") if "Traceback" in r["body"]]
    assert handled["severity_text"] == "ERROR"
    assert handled["body"].endswith(f"ValueError: rank {rank} handled"), handled["body"]
    assert 'output_train.py", line' in handled["body"]


FORMATS = ["hf-explicit", "hf-examples", "lightning", "loguru", "logfmt", "json"]
"""The formats ``output_train.py`` prints an INFO line in (its ``info_in_each_format``)."""


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_an_info_line_in_each_format_is_info(job: Job, rank: int) -> None:
    found = {}
    for record in _output(job, rank, "stderr"):
        match = re.search(r"format ([\w-]+)", record["body"])
        if match:
            found[match.group(1)] = (record["severity_text"], record["body"])
    assert sorted(found) == sorted(FORMATS), found
    assert {name: text for name, (text, _) in found.items()} == dict.fromkeys(FORMATS, "INFO"), (
        found
    )


def test_a_segfault_under_record_carries_the_stack_from_stderr(job: Job) -> None:
    culprit = _workers(job)[1]
    assert span_attr(culprit, A.ERROR_TYPE) == "SIGSEGV"
    (failed,) = [
        r
        for r in job.logs
        if r["span_id"] == culprit["span_id"]
        and r["event_name"] == STATUS_PREFIX + "FAILED"
        and r["attributes"].get(A.OBSERVED_BY) == "monitor_workers"  # not torch's late repeat
    ]
    stack = failed["attributes"][A.EXCEPTION_STACKTRACE]
    assert f'output_train.py", line {FAULT_LINE} in main' in stack, stack
    words = failed["attributes"][A.LAST_WORDS]
    assert "rank 1 err 4" in words and "Fatal Python error: Segmentation fault" in words
    assert len(words.encode()) <= 4096
    (fatal,) = [r for r in _output(job, 1, "stderr") if r["severity_text"] == "FATAL"]
    assert fatal["body"].startswith("Fatal Python error: Segmentation fault")


def test_a_10_mb_line_and_invalid_utf8_are_bounded_and_flagged(job: Job) -> None:
    (blob,) = [r for r in _output(job, 3, "stdout") if r["body"].startswith("xxxx")]
    assert blob["attributes"][A.OUTPUT_TRUNCATED] is True
    assert blob["attributes"][A.OUTPUT_LENGTH] == BLOB
    assert len(blob["body"]) <= 16384
    (junk,) = [r for r in _output(job, 2, "stderr") if "junk" in r["body"]]
    assert junk["body"] == "rank 2 junk \ufffd\ufffd"
    assert junk["attributes"][A.OUTPUT_INVALID_UTF8] is True


CUT = (
    r"(?<=rank \d out \d)|(?<=rank \d err \d)|(?<=\d)(?=rank \d )"
    r"|(?<=.)(?=ValueError: rank \d handled)"
)
"""Where a console line holds two: after one of the script's numbered lines, before one, or
before a traceback's last line (another worker's line, not yet ended, runs into it)."""


def _lines(consoles: list[Console], stream: str) -> dict[str, list[str]]:
    """What the workers printed, by rank: the script's lines (each names its rank), in order;
    rank 3's blob and faulthandler's header (rank 1), counted. torch's agent lines (its failure
    summary, a lost store's traceback) are left out: they differ from run to run either way.
    Two workers share the console; should a line still be cut by another worker's, it is
    split after the script's line and where another's begins."""
    by_rank: dict[str, list[str]] = {}
    for console in consoles:
        lines = getattr(console, stream).splitlines()
        for line in (p for whole in lines for p in re.split(CUT, whole)):
            match = re.search(r"rank (\d)", line)
            if line.startswith("x" * 1000):
                key, line = "blob", str(len(line))
            elif line.startswith("Fatal Python error: Segmentation fault"):
                key = "fault"
            elif match:
                key = match.group(1)
            else:
                continue
            by_rank.setdefault(key, []).append(line)
    return by_rank


def _faults(consoles: list[Console]) -> str:
    """Each faulthandler header on the agents' stderr with the lines around it: which process
    printed it, should the consoles differ."""
    found = []
    for node, console in enumerate(consoles):
        lines = console.stderr.splitlines()
        for n, line in enumerate(lines):
            if "Fatal Python error" in line:
                found.append(f"node {node}:\n" + "\n".join(lines[max(n - 3, 0) : n + 12]))
    return "\n\n".join(found)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_the_console_is_the_same_without_the_bridge(job: Job, stream: str) -> None:
    with_bridge = _lines(job.with_bridge, stream)
    without = _lines(job.without_bridge, stream)
    assert with_bridge == without, _faults(job.with_bridge)
    if stream == "stdout":
        assert without["blob"] == [str(BLOB)]
        assert without["3"][:5] == [f"rank 3 out {i}" for i in range(5)]
    else:
        assert without["fault"] == ["Fatal Python error: Segmentation fault"]
        assert "rank 2 junk \ufffd\ufffd" in without["2"]


def test_a_job_whose_worker_failed_with_no_restart_left_failed(job: Job) -> None:
    """torch's launcher records SUCCEEDED for an agent whose run returned failed; both
    torchruns exit 1 (issue 36). The agent of the other node may instead see the store's host
    leave first: an exception leaves its run and torch itself records FAILED, exported as torch
    said it, with the exception's type."""
    runs = [s for s in job.spans if s["name"] == A.SPAN_AGENT_RUN]
    assert len(runs) == 2, runs
    restated = 0
    for run in runs:
        assert run["status_code"] == "ERROR", run
        assert span_attr(run, A.STATE) == "FAILED"
        assert span_attr(run, A.PROCESS_EXIT_CODE) == 1
        if span_attr(run, A.TORCH_STATE) == "SUCCEEDED":
            restated += 1
        else:
            assert span_attr(run, A.TORCH_STATE) is None, run
            assert span_attr(run, A.ERROR_TYPE) not in (None, CHILD_FAILED), run
    assert restated >= 1, runs
    messages = " ".join(r["status_message"] for r in runs)
    assert "worker global rank 1 FAILED" in messages, messages
    agent_records = [r for r in job.logs if r["attributes"].get(A.EVENT_SOURCE) == "AGENT"]
    names = {r["attributes"].get(A.EVENT_NAME) for r in agent_records}
    assert f"{STATUS_PREFIX}SUCCEEDED" in names  # torch's word, kept in an attribute
    succeeded = [r for r in agent_records if r["event_name"].endswith("status.SUCCEEDED")]
    assert succeeded == [], succeeded
