"""``elastic-otel demo``: a real two-node elastic job on this machine, observed by the bridge.

Two torchrun agents (``--nnodes=2``, c10d rendezvous on a free localhost port,
``--max-restarts=1``, ``--event-log-handler otel``) run a tiny gloo training script whose
rank 1 fails once, so the job goes through a failure, a restart and a second round that
succeeds. The agents write their spans, logs and metrics to a local OTLP JSON file (and also
to the OTLP endpoint when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set); the demo follows that file
to show progress, one line per event that matters (each worker's end once: the bridge reports
it when the agent's monitor sees it, torch again after the exit barrier, on the same span), and
prints the job's timeline at the end.

Every process the job starts is stopped when the demo ends, also on Ctrl-C (a second one
included), SIGTERM or a timeout: the agents run in their own process groups, their descendants
(torch starts each worker in a session of its own) are tracked while the job runs, and the
signals only ask the loop to stop (:class:`StopRequests`), never cut the stop short.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from elastic_otel.cli.otlp_json_reader import OtlpJsonError, decode_line, read_otlp_json
from elastic_otel.cli.timeline.analysis.build import build_timeline
from elastic_otel.cli.timeline.analysis.items import source_event_name
from elastic_otel.cli.timeline.render.goodput import goodput_headlines
from elastic_otel.cli.timeline.render.text import render_text, use_color
from elastic_otel.model.logs import rendezvous_event_name
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from elastic_otel.names.torch_names import STATUS_PREFIX, WorkerState
from elastic_otel.parsing.torch_events import RdzvAction

DEFAULT_OUT = "elastic-otel-demo.jsonl"
ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
)
_STOP_GRACE_S = 5.0


class DemoError(RuntimeError):
    """The demo could not run (its message is one line for the user)."""


@dataclass
class DemoConfig:
    out: Path = Path(DEFAULT_OUT)
    nproc_per_node: int = 1
    timeout_s: float = 120.0
    html: Path | None = None
    logs_dir: Path | None = None  # keep the agents' logs here
    steps: int = 10
    fail_rank: int | None = 1


def otlp_endpoint(environ: dict[str, str] | None = None) -> str:
    """The OTLP endpoint the environment names, or ``""``."""
    environ = dict(os.environ) if environ is None else environ
    for name in ENDPOINT_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return value
    return ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def training_script() -> str:
    spec = importlib.util.find_spec("elastic_otel.cli.demo_train")
    if spec is None or spec.origin is None:  # pragma: no cover - broken installation
        raise DemoError("the demo training script elastic_otel/cli/demo_train.py is missing")
    return spec.origin


# --- the job --------------------------------------------------------------------------------


@dataclass
class DemoAgent:
    index: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


def agent_command(cfg: DemoConfig, port: int, run_id: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        f"--nproc-per-node={cfg.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={run_id}",
        "--max-restarts=1",
        "--monitor-interval=0.5",
        "--event-log-handler",
        "otel",
        training_script(),
    ]


def agent_environment(cfg: DemoConfig, run_id: str, workdir: Path) -> dict[str, str]:
    environ = dict(os.environ)
    exporters = "elastic_otel_file,otlp" if otlp_endpoint(environ) else "elastic_otel_file"
    environ.update(
        {
            "OTEL_TRACES_EXPORTER": exporters,
            "OTEL_LOGS_EXPORTER": exporters,
            env.ELASTIC_OTEL_OTLP_JSON_FILE: str(cfg.out.resolve()),
            env.ELASTIC_OTEL_JOB_ID: run_id,
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # lets two agents on one host restart
            "TRAIN_STEPS": str(cfg.steps),
            "TRAIN_FAIL_ONCE_DIR": str(workdir),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    environ.setdefault("OTEL_SERVICE_NAME", "elastic-otel-demo")
    # torchelastic's and the bridge's metrics into the same file (and collector), unless the
    # user chose otherwise; the timeline reads past the metric lines.
    environ.setdefault("OTEL_METRICS_EXPORTER", exporters)
    # Export often, so that the demo's progress follows the job closely.
    environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")
    environ.setdefault("OTEL_BLRP_SCHEDULE_DELAY", "200")
    if cfg.fail_rank is not None:
        environ["TRAIN_FAIL_RANK"] = str(cfg.fail_rank)
        environ["TRAIN_FAIL_BEFORE_INIT"] = "1"
    else:
        environ.pop("TRAIN_FAIL_RANK", None)
    return environ


def start_agents(cfg: DemoConfig, workdir: Path, run_id: str, port: int) -> list[DemoAgent]:
    command = agent_command(cfg, port, run_id)
    environ = agent_environment(cfg, run_id, workdir)
    logs_dir = cfg.logs_dir or workdir
    agents = []
    try:
        for index in range(2):
            log_path = logs_dir / f"agent{index}.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    command,
                    env=environ,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group, away from our Ctrl-C
                )
            agents.append(DemoAgent(index, proc, log_path))
    except BaseException:
        stop_processes(agents, ProcessTracker())
        raise
    return agents


# --- process hygiene ------------------------------------------------------------------------


class ProcessTracker:
    """Remembers every descendant of the agents seen so far (Linux ``/proc``)."""

    def __init__(self) -> None:
        self.known: dict[int, str] = {}  # pid -> start time, to survive pid reuse

    def scan(self, roots: list[int]) -> None:
        table = _process_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = [r for r in roots if r in table]
        while todo:
            pid = todo.pop()
            if pid not in self.known:
                self.known[pid] = table[pid][1]
            todo.extend(children.get(pid, ()))

    def alive(self) -> list[int]:
        table = _process_table()
        return [pid for pid, start in self.known.items() if table.get(pid, (0, ""))[1] == start]


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) from ``/proc`` (empty where there is none)."""
    table: dict[int, tuple[int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 19:
            table[int(entry)] = (int(fields[1]), fields[19])
    return table


def stop_processes(agents: list[DemoAgent], tracker: ProcessTracker) -> None:
    """Stop the agents (SIGTERM, then SIGKILL) and then any descendant still alive."""
    tracker.scan([a.pid for a in agents])
    running = [a for a in agents if a.proc.poll() is None]
    for agent in running:
        _signal_group(agent.pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    for agent in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.proc.wait(max(0.0, deadline - time.monotonic()))
    for agent in agents:
        if agent.proc.poll() is None:
            _signal_group(agent.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.proc.wait(5)
    for pid in tracker.alive():
        _signal_group(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class StopRequests:
    """While the job runs and while it is stopped, Ctrl-C and SIGTERM only ask to stop.

    Python turns Ctrl-C into a ``KeyboardInterrupt`` raised wherever the demo happens to be;
    one raised while the job is being stopped (a second Ctrl-C, or the first one landing as the
    job ends) would cut the stop short and leave processes running. Here a signal sets
    :attr:`requested`, the demo's loop sees it within a poll, stops the job and then raises
    ``KeyboardInterrupt`` itself. A SIGINT the demo was started with ignored (a shell's
    background job) stays ignored."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[signal.Signals, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        self.requested = True

    def __enter__(self) -> StopRequests:
        for number in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(number)
            if number == signal.SIGINT and current is not signal.default_int_handler:
                continue  # ignored, or someone else's: theirs
            try:
                self._previous[number] = signal.signal(number, self._handler)
            except ValueError:  # not the main thread: leave signals alone
                break
        return self

    def __exit__(self, *exc: object) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()


# --- progress -------------------------------------------------------------------------------


_TOLD_BY_SPAN = frozenset(
    s.value
    for s in (
        WorkerState.REPLACED,
        WorkerState.RESTARTED,
        WorkerState.TERMINATED,
        WorkerState.STOPPED,
        WorkerState.PEER_FAILED,
    )
)
"""Worker ends told from the ``worker`` span, which says why (``torchelastic.end_reason``); the
others (SUCCEEDED, FAILED) from the first log record of the end, as soon as it is written."""


@dataclass
class ProgressFollower:
    """Tails the OTLP JSON file the agents write and tells what the job is doing."""

    path: Path
    agent_pids: dict[int, int]  # agent pid -> agent index
    offset: int = 0
    partial: bytes = b""
    instances: dict[str, int] = field(default_factory=dict)  # service.instance.id -> agent
    joined: set[str] = field(default_factory=set)  # agents that joined a rendezvous before
    ended: set[Any] = field(default_factory=set)  # the worker ends already told

    def poll(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        timed: list[tuple[int, list[str]]] = []
        for line in lines:
            try:
                spans, logs = decode_line(line.decode("utf-8", "replace"))
            except OtlpJsonError:
                continue
            timed += [(r["time_ns"], self._log_message(r)) for r in logs]
            timed += [(s["end_ns"], self._span_message(s)) for s in spans]
        timed.sort(key=lambda item: item[0])
        return [message for _, messages in timed for message in messages]

    def _agent(self, item: dict[str, Any]) -> str:
        attrs = item["attributes"]
        instance = str(item["resource"].get("service.instance.id", ""))
        pid = attrs.get(A.PROCESS_PID)
        if pid in self.agent_pids and instance:
            self.instances[instance] = self.agent_pids[pid]
        index = self.instances.get(instance)
        if index is None and pid in self.agent_pids:
            index = self.agent_pids[pid]
        return f"agent {index}" if index is not None else "an agent"

    def _log_message(self, record: dict[str, Any]) -> list[str]:
        attrs = record["attributes"]
        who = self._agent(record)
        name = source_event_name(record)
        if name == rendezvous_event_name(RdzvAction.JOINED):
            rnd = attrs.get(A.ROUND)
            return [
                f"{who}: joined rendezvous round {rnd} as rank {attrs.get(A.RANK)} "
                f"of {attrs.get(A.WORLD_SIZE)}"
            ]
        if name == rendezvous_event_name(RdzvAction.JOIN_ATTEMPT):
            if who in self.joined:
                return [f"{who}: its workers stopped; joining the rendezvous again"]
            self.joined.add(who)
            return [f"{who}: joining the rendezvous"]
        if name == STATUS_PREFIX + "START":
            return [f"{who}: started worker rank {attrs.get(A.GLOBAL_RANK)}"]
        if name.startswith(STATUS_PREFIX):
            state = name.rsplit(".", 1)[-1]
            if attrs.get(A.EVENT_SOURCE) == A.SOURCE_AGENT and state in ("SUCCEEDED", "FAILED"):
                return [f"{who}: job {state}"]
            if attrs.get(A.EVENT_SOURCE) == A.SOURCE_WORKER and state != "START":
                if state in _TOLD_BY_SPAN:
                    return []  # its span says why it ended
                # torch's late event and the bridge's early one are log records of one span
                key = record["span_id"] or (
                    who,
                    attrs.get(A.GLOBAL_RANK),
                    attrs.get(A.AGENT_RESTARTS),
                )
                error = ": ".join(
                    str(attrs[k]) for k in (A.EXCEPTION_TYPE, A.EXCEPTION_MESSAGE) if k in attrs
                )
                text = f"{who}: worker rank {attrs.get(A.GLOBAL_RANK)} {state}"
                return self._once(key, f"{text}: {error}" if error else text)
        if record["severity_number"] >= 17:
            return [f"{who}: ERROR {record['body']}"]
        return []

    def _span_message(self, span: dict[str, Any]) -> list[str]:
        attrs = span["attributes"]
        state = attrs.get(A.STATE)
        if span["name"] == A.SPAN_WORKER and state in _TOLD_BY_SPAN:
            reason = attrs.get(A.END_REASON, "")
            text = f"{self._agent(span)}: worker rank {attrs.get(A.GLOBAL_RANK)} {state}"
            return self._once(span["span_id"], f"{text}: {reason}" if reason else text)
        return []

    def _once(self, key: Any, message: str) -> list[str]:
        if key in self.ended:
            return []
        self.ended.add(key)
        return [message]


class StatusLine:
    """Progress output: event lines, plus a live elapsed-time line on a terminal."""

    _SPIN = "|/-\\"

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.live = bool(getattr(stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._tick = 0
        self._last_quiet_note = self.start

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def say(self, message: str) -> None:
        prefix = "\r\033[K" if self.live else ""
        self.stream.write(f"{prefix}[demo] {self.elapsed():5.1f}s {message}\n")
        self.stream.flush()
        self._last_quiet_note = time.monotonic()

    def tick(self) -> None:
        if self.live:
            self._tick += 1
            spin = self._SPIN[self._tick % len(self._SPIN)]
            self.stream.write(f"\r\033[K[demo] {self.elapsed():5.1f}s {spin} job running")
            self.stream.flush()
        elif time.monotonic() - self._last_quiet_note > 10:
            self.say("job still running")

    def clear(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()


# --- the demo -------------------------------------------------------------------------------


def run_demo(cfg: DemoConfig, stream: IO[str] | None = None) -> int:
    """Run the job, show its progress and timeline; 0 when the job succeeded."""
    stream = sys.stdout if stream is None else stream
    if importlib.util.find_spec("torch") is None:
        raise DemoError("the demo needs PyTorch: pip install 'elastic-otel[torch]'")
    if cfg.out.parent and not cfg.out.parent.exists():
        raise DemoError(f"{cfg.out.parent}: no such directory")
    cfg.out.write_bytes(b"")  # a new file for this run
    if cfg.logs_dir is not None:
        cfg.logs_dir.mkdir(parents=True, exist_ok=True)
    endpoint = otlp_endpoint()
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    port = free_port()
    status = StatusLine(stream)
    destinations = f"{cfg.out}" + (f" and OTLP endpoint {endpoint}" if endpoint else "")
    status.say(
        f"starting 2 torchrun agents x {cfg.nproc_per_node} worker(s), run id {run_id}, "
        f"rendezvous c10d on 127.0.0.1:{port}"
    )
    if cfg.fail_rank is not None:
        status.say(f"worker rank {cfg.fail_rank} will fail once; --max-restarts=1 restarts it")
    status.say(f"telemetry to {destinations}")

    workdir = Path(tempfile.mkdtemp(prefix="elastic-otel-demo-"))
    try:
        return _run_job(cfg, workdir, run_id, port, status, stream)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_job(
    cfg: DemoConfig, workdir: Path, run_id: str, port: int, status: StatusLine, stream: IO[str]
) -> int:
    tracker = ProcessTracker()
    agents: list[DemoAgent] = []
    follower = ProgressFollower(cfg.out, {})
    timed_out = False
    with StopRequests() as stop:
        try:
            agents = start_agents(cfg, workdir, run_id, port)
            follower.agent_pids = {a.pid: a.index for a in agents}
            deadline = time.monotonic() + cfg.timeout_s
            while not stop.requested and any(a.proc.poll() is None for a in agents):
                tracker.scan([a.pid for a in agents])
                for message in follower.poll():
                    status.say(message)
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                status.tick()
                time.sleep(0.2)
        finally:
            status.clear()
            stop_processes(agents, tracker)
    if stop.requested:
        raise KeyboardInterrupt
    for message in follower.poll():
        status.say(message)
    codes = [a.proc.returncode for a in agents]
    if timed_out:
        status.say(f"timed out after {cfg.timeout_s:g}s: stopped the job")
    else:
        status.say(f"agents exited with {codes[0]} and {codes[1]}")
    failed = timed_out or any(code != 0 for code in codes)
    if failed:
        _show_agent_logs(agents, stream, kept=cfg.logs_dir is not None)
    if otlp_endpoint():
        _report_export_problems(agents, status)
    _show_timeline(cfg, stream)
    if cfg.logs_dir is not None:
        status.say(f"agent logs in {cfg.logs_dir}")
    return 1 if failed else 0


def _show_agent_logs(agents: list[DemoAgent], stream: IO[str], kept: bool, lines: int = 15) -> None:
    for agent in agents:
        try:
            text = agent.log_path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        where = str(agent.log_path) if kept else "--logs-dir DIR keeps it"
        stream.write(f"--- last lines of agent {agent.index}'s log ({where}) ---\n")
        stream.write("\n".join(text[-lines:]) + "\n")


def _report_export_problems(agents: list[DemoAgent], status: StatusLine) -> None:
    for agent in agents:
        try:
            text = agent.log_path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if "telemetry export problem" in line or "Failed to export" in line:
                detail = line.split("telemetry export problem: ", 1)[-1]
                detail = detail.split("; the job is not affected", 1)[0].strip()
                status.say(f"agent {agent.index}: OTLP export problem: {detail[:240]}")
                break


def _show_timeline(cfg: DemoConfig, stream: IO[str]) -> None:
    try:
        spans, logs = read_otlp_json(cfg.out)
    except (OSError, OtlpJsonError) as e:
        stream.write(f"[demo] cannot read {cfg.out}: {e}\n")
        return
    timeline = build_timeline(spans, logs)
    stream.write(f"\n[demo] wrote {len(spans)} spans and {len(logs)} log records to {cfg.out}\n\n")
    stream.write(render_text(timeline, color=use_color(stream)))
    for run_id, line in goodput_headlines(timeline.goodput):
        stream.write(f"\n[demo] run {run_id}: {line}\n")
    if cfg.html is not None:
        from elastic_otel.cli.timeline.render.html import render_html

        cfg.html.write_text(render_html(timeline), encoding="utf-8")
        stream.write(f"\n[demo] timeline page: {cfg.html}\n")
    stream.write(f"\n[demo] again later: elastic-otel timeline {cfg.out} [--html timeline.html]\n")
