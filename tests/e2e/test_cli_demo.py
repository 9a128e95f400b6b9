"""``elastic-otel demo`` for real: a two-agent job with a failure and a restart, and the CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from elastic_otel.cli.demo import ProgressFollower
from elastic_otel.cli.otlp_json_reader import read_otlp_json
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import STATUS_PREFIX
from tests.support.otlp_receiver import OtlpReceiver

SCRIPT = Path(sys.executable).with_name("elastic-otel")
CLI = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "elastic_otel.cli"]


def job_processes(run_id: str) -> list[str]:
    """Processes of the demo job still alive: agents name the run id on their command line,
    workers carry it in their environment."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if run_id.encode() in cmdline or f"TORCHELASTIC_RUN_ID={run_id}\0".encode() in environ:
            found.append(f"{entry}: {cmdline.decode(errors='replace')[:200]}")
    return found


def run_id_of(output: str) -> str:
    match = re.search(r"run id (demo-[0-9a-f]+)", output)
    assert match, output
    return match.group(1)


def demo_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ELASTIC_OTEL_"))}
    env.update(extra)
    return env


def round_block(output: str, number: int) -> list[str]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"ROUND {number} "))
    block = []
    for line in lines[start:]:
        if not line.strip():
            break
        block.append(line)
    return block


@dataclass
class Demo:
    """One ``elastic-otel demo`` run, exporting over OTLP and to a local file and a page."""

    done: subprocess.CompletedProcess[str]
    out: Path
    page: Path
    endpoint: str
    received: list[dict]  # the spans the OTLP receiver got


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    tmp_path = tmp_path_factory.mktemp("demo")
    out, page = tmp_path / "demo.jsonl", tmp_path / "demo.html"
    with OtlpReceiver("grpc") as receiver:
        done = subprocess.run(
            [*CLI, "demo", "--out", str(out), "--html", str(page)],
            capture_output=True,
            text=True,
            timeout=150,
            env=demo_env(**receiver.exporter_env()),
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        receiver.wait_for_spans(2, where=lambda s: s["name"] == "agent.run")
        yield Demo(done, out, page, receiver.endpoint, receiver.spans())


@pytest.mark.e2e
def test_demo_runs_a_job_with_a_failure_and_a_restart(demo: Demo) -> None:
    out, page = demo.out, demo.page
    text = demo.done.stdout
    run_id = run_id_of(text)

    # Progress while the job ran.
    assert "agent 0: joined rendezvous round 0" in text
    assert "agent 1: joined rendezvous round 0" in text
    assert re.search(r"agent \d: worker rank 1 FAILED: RuntimeError: injected failure", text)
    assert re.search(r"agent \d: worker rank 0 STOPPED: stopped by the agent", text)
    assert "joined rendezvous round 1" in text and "job SUCCEEDED" in text
    # each worker end once, though the agent's monitor and torch's late event both report it
    for rank in (0, 1):
        assert len(re.findall(rf"agent \d: worker rank {rank} SUCCEEDED\n", text)) == 1, text
    assert len(re.findall(r"agent \d: worker rank 1 FAILED", text)) == 1

    # The timeline: both nodes in both rounds, the failure in round 0, the restart in round 1.
    pids = set(re.findall(r"localhost pid (\d+)", text))
    assert len(pids) == 2
    first, second = round_block(text, 0), round_block(text, 1)
    for block in (first, second):
        assert {p for p in pids if any(f"localhost pid {p} " in line for line in block)} == pids
    assert "worker failure" in first[0]
    failed = [line for line in first if " FAILED " in line]
    assert len(failed) == 1 and " x  rank 1 " in failed[0] and "RuntimeError" in failed[0]
    assert any("STOPPED" in line and "rank 0" in line for line in first)
    assert "RESTART after a failure (agent restarts: 1)" in second[0]
    assert "job succeeded" in second[0]
    assert sum("SUCCEEDED" in line and " rank " in line for line in second) == 2

    # The root cause below round 0's table, across nodes.
    root = re.search(
        r"\n  ROOT CAUSE at \+[\d.]+s: global rank 1 RuntimeError on localhost pid (\d+)"
        r" \(exit code 1\): injected failure on rank 1 \(restart 0\)\n",
        text,
    )
    assert root and root.group(1) in pids, text

    # The summary: one job restart for both nodes, what it cost, each node's recovery phase by
    # phase.
    assert f"SUMMARY · run {run_id} · wall " in text and " · 1 restart cost " in text
    assert re.search(
        r"\n  at \+[\d.]+s in round 0 · 1 failure: global rank 1 RuntimeError on localhost pid"
        r" \d+ → restart, cost [\d.]+s\n",
        text,
    )
    recoveries = [line for line in text.splitlines() if line.startswith("    recovery on ")]
    assert len(recoveries) == 2 and any("worker_failure" in line for line in recoveries)
    for line in recoveries:
        assert all(f"{p} " in line for p in ("stop_workers", "rendezvous", "start_workers"))
        assert "training resumed after" in line

    # The file the agents wrote, and the page.
    spans, logs = read_otlp_json(out)
    agents = [s for s in spans if s["name"] == "agent.run"]
    assert len(agents) == 2
    assert {s["attributes"][A.RUN_ID] for s in spans if A.RUN_ID in s["attributes"]} == {run_id}
    assert len({s["resource"]["service.instance.id"] for s in agents}) == 2  # two processes
    # the training script's own spans, in its worker span (it exports to the same file)
    by_id = {s["span_id"]: s for s in spans}
    own = [s for s in spans if s["name"] in ("init_process_group", A.SPAN_WORKER_FIRST_STEP)]
    assert own and all(by_id[s["parent_span_id"]]["name"] == A.SPAN_WORKER for s in own)
    assert any(r["event_name"] == "torchelastic.rendezvous.joined" for r in logs)
    assert "<script" in page.read_text() and f"{len(spans)} spans" in text

    assert job_processes(run_id) == []


def goodput_shares(output: str, attempt: str) -> dict[str, float]:
    """An attempt's row of the printed GOODPUT table: per column, its share of wall time (%)."""
    lines = output.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["ATTEMPT", "WALL"])
    columns = lines[head].split()[2:]  # GOODPUT, STARTUP, RECOVERY, ...
    row = next(line for line in lines[head + 1 :] if line.split()[:1] == [attempt])
    shares = [float(v) for v in re.findall(r"([\d.]+) %", row)]
    return dict(zip(columns, shares, strict=False))


@pytest.mark.e2e
def test_demo_s_goodput_reports_the_first_attempt_as_start_up(demo: Demo) -> None:
    # the node of rank 0 marked no step before its peer failed: its first attempt is the job's
    # start-up until the failure, not recovery (nothing was recovered before anything failed)
    text = demo.done.stdout
    first = goodput_shares(text, "0")
    assert first["STARTUP"] > 50 and first["RECOVERY"] < first["STARTUP"], text
    for attempt in ("0", "1", "total"):
        shares = goodput_shares(text, attempt)
        assert sum(shares.values()) == pytest.approx(100, abs=0.5), (attempt, text)


@pytest.mark.e2e
def test_demo_exports_over_otlp_and_keeps_the_local_file(demo: Demo) -> None:
    assert f"OTLP endpoint {demo.endpoint}" in demo.done.stdout
    received = [s for s in demo.received if s["name"] == "agent.run"]
    assert len(received) == 2 and {s["status_code"] for s in received} == {"OK"}
    spans, _ = read_otlp_json(demo.out)
    assert sorted(s["span_id"] for s in demo.received) == sorted(
        s["span_id"] for s in spans
    )  # the same spans went both ways
    assert "OTLP export problem" not in demo.done.stdout


FOREGROUND = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]
"""Runs a command as a terminal's foreground job has it, Ctrl-C at its default action. pytest
started as a shell's background job (``.ci/run &``) has SIGINT ignored, and an ignored signal
is inherited: the demo would rightly ignore the test's SIGINT, finish its job and exit 0."""


@pytest.mark.e2e
def test_ctrl_c_stops_every_process_of_the_job(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*FOREGROUND, *CLI, "demo", "--out", str(tmp_path / "demo.jsonl")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=demo_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "started worker rank" in line:
                break
        run_id = run_id_of("".join(seen))
        assert job_processes(run_id)  # the job is running, workers included
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)  # the demo is stopping the job: an impatient second Ctrl-C
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.stderr.read() == "elastic-otel: error: interrupted\n"
    assert job_processes(run_id) == []


@pytest.mark.e2e
def test_timeout_stops_the_job_and_fails(tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "demo", "--out", str(tmp_path / "demo.jsonl"), "--timeout", "4"],
        capture_output=True,
        text=True,
        timeout=60,
        env=demo_env(),
    )
    assert done.returncode == 1
    assert "timed out after 4s: stopped the job" in done.stdout
    assert done.stderr == (
        "elastic-otel: error: the demo job did not succeed (see the agents' logs above)\n"
    )
    assert job_processes(run_id_of(done.stdout)) == []


def kvs(attrs: dict) -> list[dict]:
    """Attributes as OTLP/JSON key-values."""
    kind = {str: "stringValue", int: "intValue", bool: "boolValue"}
    return [{"key": k, "value": {kind[type(v)]: v}} for k, v in attrs.items()]


def otlp_json_line(instance: str, logs: list[dict], spans: list[dict]) -> str:
    """One line of the file the agents' bridges write: spans and log records of a process."""
    resource = {"attributes": kvs({"service.instance.id": instance})}
    scope = {"name": "elastic_otel"}
    spans = [{**span, "attributes": kvs(span["attributes"])} for span in spans]
    logs = [{**record, "attributes": kvs(record["attributes"])} for record in logs]
    return json.dumps(
        {
            "resourceLogs": [
                {"resource": resource, "scopeLogs": [{"scope": scope, "logRecords": logs}]}
            ],
            "resourceSpans": [
                {"resource": resource, "scopeSpans": [{"scope": scope, "spans": spans}]}
            ],
        }
    )


def worker_status(
    state: str, rank: int, span_id: str, at: int, monitor: bool = False, **extra: str
) -> dict:
    attrs = {
        A.EVENT_SOURCE: A.SOURCE_WORKER,
        A.GLOBAL_RANK: rank,
        A.STATE: state,
        A.AGENT_RESTARTS: 0,
        A.PROCESS_PID: 4242,
        **extra,
    }
    if monitor:
        attrs[A.OBSERVED_BY] = "monitor_workers"
    return {
        "timeUnixNano": str(at),
        "severityNumber": 17 if state == "FAILED" else 9,
        "body": {"stringValue": STATUS_PREFIX + state},
        "eventName": STATUS_PREFIX + state,
        "attributes": attrs,
        "traceId": "0a" * 16,
        "spanId": span_id,
    }


def test_progress_tells_each_worker_end_once(tmp_path: Path) -> None:
    """The agent's monitor reports a worker's end first, torch's own event repeats it after the
    exit barrier: both are log records of the worker's span; the demo prints one line."""
    out = tmp_path / "demo.jsonl"
    stopped = {
        "traceId": "0a" * 16,
        "spanId": "c" * 16,
        "name": A.SPAN_WORKER,
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "40",
        "attributes": {
            A.GLOBAL_RANK: 2,
            A.STATE: "STOPPED",
            A.END_REASON: "stopped by the agent after global rank 1 failed",
        },
    }
    error = {A.EXCEPTION_TYPE: "RuntimeError", A.EXCEPTION_MESSAGE: "boom"}
    early = [
        worker_status("START", 0, "a" * 16, 10),
        worker_status("FAILED", 1, "b" * 16, 30, monitor=True, **error),
        worker_status("STOPPED", 2, "c" * 16, 40, monitor=True),
        worker_status("SUCCEEDED", 0, "a" * 16, 50, monitor=True),
    ]
    late = [
        worker_status("FAILED", 1, "b" * 16, 60, **error),
        worker_status("SUCCEEDED", 0, "a" * 16, 70),
    ]
    follower = ProgressFollower(out, {4242: 0})
    out.write_text(otlp_json_line("agent-0", early, [stopped]) + "\n")
    assert follower.poll() == [
        "agent 0: started worker rank 0",
        "agent 0: worker rank 1 FAILED: RuntimeError: boom",
        "agent 0: worker rank 2 STOPPED: stopped by the agent after global rank 1 failed",
        "agent 0: worker rank 0 SUCCEEDED",
    ]
    with out.open("a") as f:  # torch's late events, and the STOPPED span once more
        f.write(otlp_json_line("agent-0", late, [stopped]) + "\n")
    assert follower.poll() == []


def test_help_for_every_command() -> None:
    done = subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    for command in ("demo", "replay", "timeline"):
        assert command in done.stdout
        sub = subprocess.run([*CLI, command, "--help"], capture_output=True, text=True, timeout=30)
        assert sub.returncode == 0 and f"usage: elastic-otel {command}" in sub.stdout


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["demo", "--timeout", "0"], {}, "--timeout must be positive"),
        (
            ["demo"],
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[broken"},
            "is not an endpoint URL",
        ),
        (["demo", "--out", "/nonexistent-dir/x.jsonl"], {}, "/nonexistent-dir: no such directory"),
    ],
)
def test_demo_refuses_bad_settings_in_one_line(
    args: list[str], env: dict[str, str], message: str
) -> None:
    done = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=30, env=demo_env(**env)
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
