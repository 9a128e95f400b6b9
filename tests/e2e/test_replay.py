"""``elastic-otel replay``: torch elastic events found in log files, as the live bridge saw them."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from elastic_otel.cli import main
from elastic_otel.cli.otlp_json_reader import read_otlp_json
from elastic_otel.model.logs import event_name
from elastic_otel.model.spans import SpanRecord
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import parse_event
from tests.support.fixtures import captured_events
from tests.support.otlp_receiver import OtlpReceiver, free_port

CLI = [sys.executable, "-m", "elastic_otel.cli"]
NODE_FILES = ("restart_node0.tsv", "restart_node1.tsv")
SALT = "replay-test"


def glog_header(created: float, pid: int = 5550) -> str:
    """torch's log line header (local time, no year), e.g. ``I1121 23:23:40.128000 5550 ...] ``."""
    t = dt.datetime.fromtimestamp(created)
    return f"I{t:%m%d %H:%M:%S}.{t.microsecond:06d} {pid} torch/distributed/events/api.py:70] "


def write_log(path: Path, name: str, style: str = "glog") -> Path:
    """A recorded agent's events as a log file, each event on a line in ``style``."""
    lines = []
    for i, (created, payload) in enumerate(captured_events(name)):
        lines.append("W1121 noise that looks like a header but is not one")
        lines.append(f"[default0]: step {i} loss 0.{i:04d}")
        if style == "glog":
            lines.append(glog_header(created) + payload)
        elif style == "prefixed":
            lines.append(f"[default{i % 2}]:{payload}")
        else:
            lines.append(payload)
    path.write_text("\n".join(lines) + "\n")
    return path


def live_model(name: str) -> tuple[list, list]:
    """What the live bridge's model makes of the same events (spans, logs)."""
    model = TraceModel(salt=SALT)
    spans, logs = [], []
    last = 0
    for created, payload in captured_events(name):
        event = parse_event(payload, int(created * 1e9))
        last = event.time_ns
        out = model.process(event)
        spans += out.spans
        logs += out.logs
    out = model.close_all(last, "end")
    return spans + out.spans, logs + out.logs


def us(ns: int) -> int:
    return round(ns / 1000)


SPAN_KEYS = (A.ROUND, A.RANK, A.GLOBAL_RANK, A.STATE, A.WORLD_SIZE, A.PROCESS_PID, A.END_REASON)


def exported(span: dict) -> tuple:
    attrs = span["attributes"]
    key = (span["name"], span["trace_id"], span["status_code"], *map(attrs.get, SPAN_KEYS))
    return key, span["start_ns"], span["end_ns"]


def modelled(record: SpanRecord) -> tuple:
    attrs = record.attributes
    key = (record.name, f"{record.trace_id:032x}", record.status, *map(attrs.get, SPAN_KEYS))
    return key, record.start_ns, record.end_ns


def same_spans(got: list[tuple], want: list[tuple]) -> None:
    """(key, start_ns, end_ns) lists: equal keys, times equal to the microsecond (±2 µs for
    agent steps, back-dated by a float duration)."""
    assert Counter(k for k, _, _ in got) == Counter(k for k, _, _ in want)
    for (k1, s1, e1), (k2, s2, e2) in zip(sorted(got), sorted(want), strict=True):
        assert k1 == k2 and abs(us(s1) - us(s2)) <= 2 and abs(us(e1) - us(e2)) <= 2, (k1, k2)


def replay(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["replay", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_replayed_glog_logs_give_the_live_spans_and_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs_in = [write_log(tmp_path / f"agent{i}.log", n) for i, n in enumerate(NODE_FILES)]
    out = tmp_path / "replayed.jsonl"
    code, stdout, stderr = replay([*map(str, logs_in), "--out", str(out), "--job-id", SALT], capsys)
    assert code == 0, stderr
    spans, logs = read_otlp_json(out)

    expected_spans, expected_logs = [], []
    for name in NODE_FILES:
        s, lg = live_model(name)
        expected_spans += s
        expected_logs += lg
    same_spans([exported(s) for s in spans], [modelled(r) for r in expected_spans])
    assert Counter((r["event_name"], us(r["time_ns"]), r["trace_id"]) for r in logs) == Counter(
        (event_name(ev), us(ev.time_ns), f"{trace:032x}" if trace else "")
        for ev, trace, _ in expected_logs
    )
    events = sum(len(captured_events(n)) for n in NODE_FILES)
    assert f"{events:,} events" in stdout and "run id(s) job-cap" in stdout
    assert f"exported {len(spans)} spans and {len(logs)} log records" in stdout
    assert f"{len(spans) + len(logs):,} records delivered" in stdout
    # Each file is one agent: its spans carry the file as their resource.
    by_file = {s["resource"]["log.file.name"] for s in spans}
    assert by_file == {"agent0.log", "agent1.log"}


def test_gzip_and_stdin_give_the_same_result(tmp_path: Path) -> None:
    plain = write_log(tmp_path / "agent0.log", NODE_FILES[0])
    packed = tmp_path / "agent0.log.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    results = []
    for args, stdin in (
        ([str(plain)], None),
        ([str(packed)], None),
        (["-"], plain.read_bytes()),
        (["-"], packed.read_bytes()),
    ):
        out = tmp_path / f"out{len(results)}.jsonl"
        done = subprocess.run(
            [*CLI, "replay", *args, "--out", str(out), "--job-id", SALT],
            input=stdin,
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        spans, logs = read_otlp_json(out)
        results.append(
            sorted((s["name"], s["start_ns"], s["end_ns"], s["trace_id"]) for s in spans)
        )
        assert len(logs) == len(captured_events(NODE_FILES[0]))
    assert results[0] == results[1] == results[2] == results[3]


def test_events_are_found_behind_prefixes_and_junk_is_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [p for _, p in captured_events(NODE_FILES[1])]
    lines = [
        "plain text line",
        f"[default0]:{events[0]}",
        f"I1121 23:23:40.128000 5550 torch/distributed/elastic/agent/api.py:1028] {events[1]}",
        f"before {events[2]} between {events[3]} after",  # two on one line
        '{"name": "not an event", "size": 3}',
        '[default1]: {"name": "torchelastic.worker.status.START", "source": ',  # cut short
        *events[4:],
        "",
        "last line without newline",
    ]
    log = tmp_path / "mixed.log"
    log.write_text("\n".join(lines))
    out = tmp_path / "out.jsonl"
    code, stdout, _ = replay([str(log), "--out", str(out)], capsys)
    assert code == 0
    _, logs = read_otlp_json(out)
    assert len(logs) == len(events)
    assert f"{len(events)} events" in stdout
    assert "1 JSON that is not an event" in stdout and "1 invalid JSON" in stdout
    assert "3 no event" in stdout  # the plain text, the empty and the last line


def test_run_id_filter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = [p for _, p in captured_events(NODE_FILES[0])]
    other = [p.replace('"job-cap"', '"other-run"') for p in events]
    log = tmp_path / "two-runs.log"
    log.write_text("\n".join(events + other) + "\n")
    out = tmp_path / "out.jsonl"
    code, stdout, _ = replay([str(log), "--out", str(out), "--run-id", "other-run"], capsys)
    assert code == 0
    spans, logs = read_otlp_json(out)
    assert len(logs) == len(other)
    assert {s["attributes"][A.RUN_ID] for s in spans} == {"other-run"}
    assert f"{len(events)} event of another run id" in stdout

    code, _, stderr = replay([str(log), "--out", str(out), "--run-id", "nope"], capsys)
    assert code == 1
    assert stderr == "elastic-otel: error: no torch elastic events of run id nope found\n"


def test_nothing_found_and_bad_input_are_one_line_errors(tmp_path: Path) -> None:
    empty = tmp_path / "nothing.log"
    empty.write_text("hello\nworld\n")
    cases = [
        ([str(empty)], 1, "no torch elastic events found"),
        ([str(tmp_path / "missing.log")], 2, "missing.log: no such file"),
        ([str(tmp_path)], 2, "is not a file"),
        (["-", "-"], 2, "standard input (-) can be read only once"),
    ]
    for args, code, message in cases:
        done = subprocess.run(
            [*CLI, "replay", *args, "--out", str(tmp_path / "o.jsonl")],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == code, done.stderr
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_times_come_from_headers_the_file_year_or_file_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payloads = [p for _, p in captured_events(NODE_FILES[0])]
    # glog headers have no year: it is the file's modification year.
    log = tmp_path / "old.log"
    log.write_text(f"I0315 10:20:30.123456 1 x.py:1] {payloads[0]}\n")
    mtime = dt.datetime(2023, 6, 1, 12, 0).timestamp()
    os.utime(log, (mtime, mtime))
    out = tmp_path / "old.jsonl"
    assert replay([str(log), "--out", str(out)], capsys)[0] == 0
    (record,) = read_otlp_json(out)[1]
    expected = dt.datetime(2023, 3, 15, 10, 20, 30, 123456).timestamp()
    assert record["time_ns"] == round(expected * 1e6) * 1000

    # An ISO timestamp with a zone, e.g. from kubectl logs --timestamps.
    log.write_text(f"2024-02-29T23:59:58.5+02:00 {payloads[0]}\n")
    assert replay([str(log), "--out", str(out)], capsys)[0] == 0
    (record,) = read_otlp_json(out)[1]
    utc = dt.datetime(2024, 2, 29, 21, 59, 58, tzinfo=dt.timezone.utc)
    assert record["time_ns"] == int(utc.timestamp()) * 10**9 + 500_000_000

    # No header at all: synthetic times that keep the file's order, from its mtime.
    log.write_text("\n".join(payloads) + "\n")
    os.utime(log, (mtime, mtime))
    assert replay([str(log), "--out", str(out)], capsys)[0] == 0
    times = [r["time_ns"] for r in read_otlp_json(out)[1]]
    assert min(times) == int(mtime * 1e9)
    ordered = sorted(times)
    assert len(set(ordered)) == len(payloads)

    # An event's own timestamp wins over everything.
    own = json.loads(payloads[5])
    own["timestamp"] = 1_700_000_000_123  # torch Event timestamps are milliseconds
    log.write_text(f"I0315 10:20:30.123456 1 x.py:1] {json.dumps(own)}\n")
    assert replay([str(log), "--out", str(out)], capsys)[0] == 0
    (record,) = read_otlp_json(out)[1]
    assert record["time_ns"] == 1_700_000_000_123 * 1_000_000


def test_progress_bar_only_on_request_when_not_a_terminal(tmp_path: Path) -> None:
    log = write_log(tmp_path / "agent0.log", NODE_FILES[0])
    for flag, shown in (([], False), (["--progress"], True)):
        done = subprocess.run(
            [*CLI, "replay", str(log), "--out", str(tmp_path / "o.jsonl"), *flag],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0
        assert ("100.0%" in done.stderr) is shown, done.stderr
        assert ("agent0.log" in done.stderr) is shown


MEASURED = (
    "import resource, sys; from elastic_otel.cli import main; code = main(sys.argv[1:]); "
    "print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); "
    "sys.exit(code)"
)


def test_large_log_streams_with_flat_memory(tmp_path: Path) -> None:
    """A log of mostly training output is streamed: memory does not grow with its size."""
    events = [p for _, p in captured_events(NODE_FILES[0])]
    noise = "[default0]: step 000123 loss 0.123456 lr 0.0001 throughput 1234.5 samples/s\n" * 1000

    def make(path: Path, blocks: int) -> Path:
        with open(path, "w") as f:
            for i in range(blocks):
                f.write(noise)
                f.write(events[i % len(events)] + "\n")
        return path

    def run(path: Path) -> int:
        done = subprocess.run(
            [sys.executable, "-c", MEASURED, "replay", str(path), "--out", str(tmp_path / "o")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return int(done.stderr.split("MAXRSS ")[1])

    small = make(tmp_path / "small.log", 50)
    large = make(tmp_path / "large.log", 1500)  # ~120 MB
    small_rss = run(small)
    large_rss = run(large)
    assert large.stat().st_size > 100e6
    assert large_rss - small_rss < 40_000  # KiB: the file is not held in memory
    # (its speed is measured by the benchmarks, not asserted here)


def test_replay_exports_to_the_otlp_endpoint(tmp_path: Path, grpc_receiver: OtlpReceiver) -> None:
    log = write_log(tmp_path / "agent0.log", NODE_FILES[0])
    env = {**os.environ, **grpc_receiver.exporter_env()}
    done = subprocess.run(
        [*CLI, "replay", str(log), "--job-id", SALT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    spans, logs = live_model(NODE_FILES[0])
    grpc_receiver.wait_for_spans(len(spans))
    grpc_receiver.wait_for_logs(len(logs))
    same_spans([exported(s) for s in grpc_receiver.spans()], [modelled(r) for r in spans])
    assert f"{len(spans) + len(logs):,} records delivered" in done.stdout
    assert grpc_receiver.endpoint in done.stdout


def test_unreachable_or_malformed_endpoint_is_one_line(tmp_path: Path) -> None:
    log = write_log(tmp_path / "agent0.log", NODE_FILES[0])
    dead = f"http://127.0.0.1:{free_port()}"
    for endpoint, message in (
        (dead, f"export to {dead} (otlp_proto_grpc) failed"),
        ("http://host:notaport", "is not an endpoint URL"),
    ):
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
        env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1"
        start = time.monotonic()
        done = subprocess.run(
            [*CLI, "replay", str(log)], env=env, capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert time.monotonic() - start < 30


# --- a real job: its console log replayed vs. the live bridge ---------------------------------

AGENT_SPANS = (A.SPAN_AGENT_RENDEZVOUS, A.SPAN_AGENT_ASSIGN_RANKS, A.SPAN_WORKER, "agent.run")


def agent_story(spans: list[dict], agent_of: str) -> Counter:
    """Per agent, what its agent and worker spans say, without times or ids."""
    stories: dict[str, list] = {}
    for s in spans:
        if s["name"] not in AGENT_SPANS:
            continue
        a = s["attributes"]
        stories.setdefault(str(s["resource"][agent_of]), []).append(
            (
                s["name"],
                a.get(A.STATE),
                a.get(A.GLOBAL_RANK),
                a.get(A.AGENT_RESTARTS),
                s["status_code"],
                a.get(A.END_REASON),
            )
        )
    return Counter(tuple(sorted(story, key=repr)) for story in stories.values())


@pytest.mark.e2e
def test_replayed_console_job_tells_what_the_live_bridge_exported(
    tmp_path: Path, grpc_receiver: OtlpReceiver, http_receiver: OtlpReceiver
) -> None:
    from tests.support.jobs import LIGHT, job_env, start_agent

    runs = {}
    for handler, receiver in (("console", None), ("otel", grpc_receiver)):
        workdir = tmp_path / handler
        workdir.mkdir()
        env = job_env(
            receiver,
            workdir,
            TRAIN_FAIL_RANK="1",  # rank 0 waits until its agent stops it for the restart
            OTEL_METRICS_EXPORTER="none",
            # like with like: what torch's events alone give (the replayed logs have no more)
            ELASTIC_OTEL_AGENT_INSTRUMENTATION="false",
        )
        port, run_id = free_port(), f"replay-{handler}"
        runs[handler] = (
            run_id,
            [
                start_agent(
                    env,
                    port,
                    run_id,
                    handler=handler,
                    script=LIGHT,  # the agents' events are what is replayed
                    extra_args=("--max-restarts=1",),
                )
                for _ in range(2)
            ],
        )
    logs_in = []
    for handler, (_, agents) in runs.items():
        for i, agent in enumerate(agents):
            code, output = agent.wait(timeout=150)
            assert code == 0, output[-3000:]
            if handler == "console":
                logs_in.append(tmp_path / f"agent{i}.log")
                logs_in[-1].write_text(output)

    env = {**os.environ, **http_receiver.exporter_env()}
    done = subprocess.run(
        [*CLI, "replay", *map(str, logs_in), "--run-id", "replay-console"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr

    live_run = runs["otel"][0]

    def agents_done() -> bool:
        ended = [s for s in grpc_receiver.spans() if s["name"] == "agent.run"]
        return len(ended) == 2

    grpc_receiver.wait_until(agents_done, 20)
    live_spans = [s for s in grpc_receiver.spans() if s["attributes"].get(A.RUN_ID) == live_run]
    live_agent_logs = [
        r
        for r in grpc_receiver.logs()
        if r["attributes"].get(A.EVENT_SOURCE) in (A.SOURCE_AGENT, A.SOURCE_WORKER)
        and r["attributes"].get(A.RUN_ID) == live_run
    ]
    live_agent_spans = [s for s in live_spans if s["name"] in AGENT_SPANS]
    replayed_spans = http_receiver.wait_for_spans(len(live_agent_spans))
    replayed_logs = http_receiver.wait_for_logs(len(live_agent_logs))

    # The live bridge also has the rendezvous, which torch's console destination never prints:
    # each round has its join, member, agent steps and workers.
    rounds: dict[int, set] = {}
    members = {s["span_id"]: s for s in live_spans if s["name"] == A.SPAN_RDZV_MEMBER}
    for s in live_spans:
        parent = members.get(s["parent_span_id"])
        rnd = s["attributes"].get(A.ROUND) if parent is None else parent["attributes"][A.ROUND]
        if rnd is not None:
            rounds.setdefault(rnd, set()).add(s["name"])
    full = {A.SPAN_RDZV_JOIN, A.SPAN_RDZV_MEMBER, A.SPAN_AGENT_RENDEZVOUS, A.SPAN_WORKER}
    assert sorted(rounds) == [0, 1] and all(names >= full for names in rounds.values())

    # Same agents' and workers' story: states, ranks, restarts; same agent events as logs.
    assert agent_story(replayed_spans, "log.file.name") == agent_story(
        live_spans, "service.instance.id"
    )
    states = Counter(s["attributes"].get(A.STATE) for s in replayed_spans if s["name"] == "worker")
    assert states == {"REPLACED": 1, "RESTARTED": 1, "SUCCEEDED": 2}
    assert len(replayed_logs) == len(live_agent_logs)
    assert Counter(r["body"] for r in replayed_logs) == Counter(r["body"] for r in live_agent_logs)
