"""Section 13: the agent's own footprint (issue 42): its threads, memory and CPU, and whether
they stay flat over hundreds of restarts.

* **A healthy agent.** One torchrun agent (c10d on localhost,
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) with 8 light workers (no torch: each imports
  ``elastic_otel`` and marks a step every 100 ms until told to stop), pinned to the measured
  CPU, without the bridge (``--event-log-handler null``, ``ELASTIC_OTEL_ENABLED=false``) and
  with it (``--event-log-handler otel``, OTLP/gRPC to the counting receiver on the other CPUs),
  alternating. Once all 8 workers run and a settling pause has passed, the agent process is
  sampled over a steady window: its threads (``/proc/<pid>/task``), RSS, open file
  descriptors, and its CPU seconds (``utime + stime`` of ``/proc/<pid>/stat``, all its threads)
  per second of wall time, and each thread's (its ``schedstat``: nanoseconds on a CPU). The
  agent runs torchrun's own ``main()`` under a wrapper of a few
  lines (``python -m benchmarks.footprint agent ...``, both variants) that answers ``SIGUSR2``
  with the names of its Python threads, so that every thread is listed by name: Python's
  ``threading`` name, else the kernel's ``comm`` (gRPC's and torch's native threads).
* **A soak of restarts.** One agent with the bridge, ``--max-restarts=N``, 2 workers whose
  rank 0 fails 0.3 s after it starts in every attempt but the last (which succeeds); OTLP/gRPC
  to a receiver in this process. Every 10 restarts (2 in quick mode), right after an
  attempt's rank 0 started, the agent's RSS, open file descriptors and threads are sampled; at
  the end the ``worker`` spans received are counted against attempts x ranks. Then the same
  soak without the bridge: what torchrun's agent itself does over as many restarts.

``python -m benchmarks.footprint [--quick] [--restarts N]`` runs both and prints the report's
section; ``python -m benchmarks.run --sections footprint`` puts it in BENCHMARKS.md.

Renders section 13 of BENCHMARKS.md (:func:`render`, :func:`targets`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.format import Target
from benchmarks.format import number as _f
from benchmarks.format import table as _table
from benchmarks.format import times as _x

MODULE = "benchmarks.footprint"
MB = 1024 * 1024
DEFAULT_RESTARTS = 200
THREADS_FILE_ENV = "FOOTPRINT_THREADS_FILE"
"""Where the agent wrapper writes its Python threads' names on SIGUSR2."""

_STEADY_WORKER = """
import os, time
import elastic_otel
stop = os.environ["FOOTPRINT_STOP"]
deadline = time.monotonic() + 300
step = 0
while not os.path.exists(stop) and time.monotonic() < deadline:
    time.sleep(0.1)
    elastic_otel.mark_step(step)
    step += 1
"""

_SOAK_WORKER = """
import os, sys, time
import elastic_otel
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])
if rank == 0:
    with open(os.environ["SOAK_STARTS"], "a") as f:
        f.write(f"{restart}\\n")
for step in range(6):  # 0.3 s of steps
    time.sleep(0.05)
    elastic_otel.mark_step(step)
if restart == int(os.environ["SOAK_RESTARTS"]):
    sys.exit(0)  # the last attempt succeeds: the job ends as a healthy one
if rank == 0:
    sys.exit(1)
time.sleep(300)  # the others wait for their agent to stop them, as a peer's collective would
"""


# --- the agent process, from outside ------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _threads(pid: int) -> dict[int, str]:
    """Thread id → ``comm`` of every thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/comm") as f:
            out[int(tid)] = f.read().strip()
    return out


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def sample(pid: int) -> dict[str, float]:
    """The process's threads, RSS (MB) and open file descriptors now."""
    return {"threads": len(_threads(pid)), "rss_mb": _rss_mb(pid), "fds": _fds(pid)}


def _thread_cpu(pid: int) -> dict[int, float]:
    """Thread id → CPU seconds it used so far: its ``schedstat``'s time on a CPU (ns), else
    ``utime + stime`` of its ``stat`` (ticks of 10 ms)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        task = f"/proc/{pid}/task/{tid}"
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"{task}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
            continue
        with contextlib.suppress(OSError), open(f"{task}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def thread_names(pid: int, names_file: Path, timeout_s: float = 3.0) -> dict[int, str] | None:
    """Thread id → name of every thread of the agent: Python's name where it is a Python thread
    (asked of the wrapper with SIGUSR2), else ``comm (native)``; ``None`` when the wrapper did
    not answer."""
    with contextlib.suppress(FileNotFoundError):
        names_file.unlink()
    os.kill(pid, signal.SIGUSR2)
    if not common.wait_until(names_file.exists, timeout_s, 0.02):
        return None
    rows = json.loads(names_file.read_text())
    python = {int(tid): name for name, tid in rows if tid is not None}  # None: not running yet
    return {tid: python.get(tid) or f"{comm} (native)" for tid, comm in _threads(pid).items()}


def _count(names: dict[int, str] | None) -> dict[str, int]:
    return dict(sorted(Counter((names or {}).values()).items()))


# --- a healthy agent ------------------------------------------------------------------------------


def _agent_cmd(nproc: int, handler: str, script: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        MODULE,
        "agent",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
        "--event-log-handler",
        handler,
        *extra,
        str(script),
    ]


def _stop(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """Wait for the agent; kill its session (its workers too) past ``timeout_s``."""
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        return None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def steady_run(with_bridge: bool, config: dict[str, Any], endpoint: str, work: Path) -> dict:
    """One agent with ``config['workers']`` light workers; the steady window's samples."""
    work.mkdir(parents=True)
    script = work / "worker.py"
    script.write_text(_STEADY_WORKER)
    stop, names_file, log = work / "stop", work / "threads.json", work / "agent.log"
    env = common.clean_env(
        {
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "ELASTIC_OTEL_JOB_ID": "benchmark-footprint",
            "FOOTPRINT_STOP": str(stop),
            THREADS_FILE_ENV: str(names_file),
            "LOGLEVEL": "WARNING",
        }
    )
    if not with_bridge:
        env["ELASTIC_OTEL_ENABLED"] = "false"
    n = config["workers"]
    cmd = _agent_cmd(n, "otel" if with_bridge else "null", script)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=common.child_cwd(), env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    cpu = common.measured_cpu()
    if cpu is not None:  # at once: the threads and workers it makes later inherit it
        with contextlib.suppress(OSError):
            os.sched_setaffinity(proc.pid, {cpu})
    pid = proc.pid
    try:
        if not common.wait_until(lambda: len(_children(pid)) >= n, 120.0, 0.1):
            raise RuntimeError(f"the agent did not start {n} workers:\n{_tail(log)}")
        time.sleep(config["settle_s"])
        samples, names = [], None
        threads0 = _thread_cpu(pid)
        t0, cpu0 = time.monotonic(), common.proc_cpu_seconds(pid)
        end = t0 + config["window_s"]
        while time.monotonic() < end:
            samples.append(sample(pid))
            if names is None and time.monotonic() >= t0 + config["window_s"] / 2:
                names = thread_names(pid, names_file)
            time.sleep(0.5)
        t1, cpu1 = time.monotonic(), common.proc_cpu_seconds(pid)
        threads1 = _thread_cpu(pid)
        workers_alive = len(_children(pid))
    finally:
        stop.touch()
        code = _stop(proc, 120.0)
    if code != 0:
        raise RuntimeError(f"the agent exited {code}:\n{_tail(log)}")
    by_name: dict[str, float] = {}  # CPU seconds per second of each thread, by name
    for tid, used in threads1.items():
        name = (names or {}).get(tid, "(ended or unnamed)")
        by_name[name] = by_name.get(name, 0.0) + (used - threads0.get(tid, 0.0)) / (t1 - t0)
    return {
        "threads": max(s["threads"] for s in samples),
        "threads_min": min(s["threads"] for s in samples),
        "rss_mb": statistics.median(s["rss_mb"] for s in samples),
        "fds": max(s["fds"] for s in samples),
        "cpu_s_per_s": (cpu1 - cpu0) / (t1 - t0),
        "window_s": t1 - t0,
        "workers": workers_alive,
        "names": _count(names),
        "cpu_s_per_s_by_thread": dict(sorted(by_name.items())),
    }


VARIANTS = ("without", "with")
"""Without: ``--event-log-handler null``, ``ELASTIC_OTEL_ENABLED=false``; with:
``--event-log-handler otel``."""
MEASURES = ("threads", "rss_mb", "fds", "cpu_s_per_s")


def steady(quick: bool) -> dict[str, Any]:
    from benchmarks.receiver import ReceiverProcess

    config: dict[str, Any] = (
        {"workers": 8, "reps": 1, "settle_s": 1.0, "window_s": 4.0}
        if quick
        else {"workers": 8, "reps": 4, "settle_s": 3.0, "window_s": 14.0}
    )
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with ReceiverProcess("grpc") as rx, tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        for rep in range(config["reps"]):
            order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]  # alternating: A B B A ...
            for variant in order:
                work = Path(tmp) / f"{rep}-{variant}"
                runs[variant].append(steady_run(variant == "with", config, rx.endpoint, work))
        received = rx.stats()["records"]
    medians = {v: {k: statistics.median(r[k] for r in runs[v]) for k in MEASURES} for v in VARIANTS}
    pairs = list(zip(runs["with"], runs["without"], strict=True))
    paired = {k: statistics.median(w[k] - o[k] for w, o in pairs) for k in MEASURES}
    return {
        "config": config,
        "runs": runs,
        "median": medians,
        "difference": {k: medians["with"][k] - medians["without"][k] for k in MEASURES},
        "paired_difference": paired,
        "ratio": {k: common.ratio(medians["with"][k], medians["without"][k]) for k in MEASURES},
        "names": {v: runs[v][-1]["names"] for v in VARIANTS},
        "cpu_by_thread": {v: _median_by_thread(runs[v]) for v in VARIANTS},
        "received": received,
    }


def _median_by_thread(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each thread name's median CPU seconds per second over ``runs`` (0 where absent)."""
    every = {name for r in runs for name in r["cpu_s_per_s_by_thread"]}
    return {
        name: statistics.median(r["cpu_s_per_s_by_thread"].get(name, 0.0) for r in runs)
        for name in sorted(every)
    }


# --- the soak -------------------------------------------------------------------------------------


def soak(restarts: int, sample_every: int, with_bridge: bool = True, ranks: int = 2) -> dict:
    """One agent through ``restarts`` restarts (see the module docstring); without the bridge,
    the same agent's own growth, for comparison (no spans then)."""
    from tests.support.otlp_receiver import OtlpReceiver

    with OtlpReceiver("grpc") as rx, tempfile.TemporaryDirectory(prefix="footprint-soak-") as tmp:
        work = Path(tmp)
        script, starts = work / "worker.py", work / "starts.txt"
        script.write_text(_SOAK_WORKER)
        starts.touch()
        names_file, log = work / "threads.json", work / "agent.log"
        env = common.clean_env(
            {
                **rx.exporter_env(),
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "ELASTIC_OTEL_JOB_ID": "benchmark-footprint-soak",
                "SOAK_STARTS": str(starts),
                "SOAK_RESTARTS": str(restarts),
                THREADS_FILE_ENV: str(names_file),
                "LOGLEVEL": "WARNING",
            }
        )
        if not with_bridge:
            env["ELASTIC_OTEL_ENABLED"] = "false"
        handler = "otel" if with_bridge else "null"
        cmd = _agent_cmd(ranks, handler, script, f"--max-restarts={restarts}")
        t0 = time.monotonic()
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=common.child_cwd(), env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        samples: list[dict[str, Any]] = []
        names: dict[str, dict[str, int]] = {}
        deadline = t0 + 60.0 + 10.0 * (restarts + 1)
        sampled, next_due = -1, 0
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                attempts = len(starts.read_text().split())
                due = attempts - 1  # the restart count of the attempt now running
                if due >= next_due or (due == restarts and due != sampled):
                    sampled, next_due = due, (due // sample_every + 1) * sample_every
                    with contextlib.suppress(OSError):  # the agent ended meanwhile
                        samples.append({"restart": due, **sample(proc.pid)})
                        found = thread_names(proc.pid, names_file, 1.0)
                        if found is not None:
                            names.setdefault("first", _count(found))
                            names["last"] = _count(found)
                time.sleep(0.05)
        finally:
            code = _stop(proc, max(1.0, deadline - time.monotonic()))
        elapsed = time.monotonic() - t0
        attempts = len(starts.read_text().split())
        expected = attempts * ranks if with_bridge else 0

        def worker_spans() -> list[dict[str, Any]]:
            return [s for s in rx.spans() if s["name"] == "worker"]

        if with_bridge:
            common.wait_until(lambda: len(worker_spans()) >= expected, 30.0, 0.2)
            time.sleep(1.0)  # anything more (a duplicate) would arrive now
        spans = worker_spans()
        failure = "" if code == 0 else _tail(log)
    by_state = Counter(str(s["attributes"].get("torchelastic.state")) for s in spans)
    return {
        "with_bridge": with_bridge,
        "restarts": restarts,
        "ranks": ranks,
        "attempts": attempts,
        "exit_code": code,
        "failure": failure,
        "elapsed_s": elapsed,
        "s_per_attempt": elapsed / attempts if attempts else None,
        "worker_spans": len(spans),
        "distinct_worker_spans": len({s["span_id"] for s in spans}),
        "expected_worker_spans": expected,
        "worker_span_states": dict(sorted(by_state.items())),
        "samples": samples,
        "summary": {
            k: {
                "first": samples[0][k],
                "last": samples[-1][k],
                "max": max(s[k] for s in samples),
            }
            for k in ("rss_mb", "fds", "threads")
        }
        if samples
        else {},
        "names": names,
    }


def run(quick: bool, restarts: int | None = None) -> dict[str, Any]:
    n = restarts if restarts is not None else (10 if quick else DEFAULT_RESTARTS)
    every = 2 if quick else 10
    return {
        "steady": steady(quick),
        "soak": soak(n, every),
        "soak_without": soak(n, every, with_bridge=False),
    }


# --- the agent wrapper (runs in the agent process) --------------------------------------------


def agent(argv: list[str]) -> None:
    """torchrun's ``main()`` as the ``torchrun`` command runs it; ``SIGUSR2`` writes the Python
    threads' (name, native id) to ``$FOOTPRINT_THREADS_FILE``. Nothing else is added: no
    thread, no import of ``elastic_otel``."""
    path = os.environ[THREADS_FILE_ENV]

    def dump(_signum: int, _frame: object) -> None:
        rows = [(t.name, t.native_id) for t in threading.enumerate()]
        with open(path + ".tmp", "w") as f:
            json.dump(rows, f)
        os.replace(path + ".tmp", path)

    signal.signal(signal.SIGUSR2, dump)
    from torch.distributed.run import main

    sys.argv = ["torchrun", *argv]
    main()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["agent"]:
        agent(args[1:])
        return 0
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1 run each, 10 restarts")
    parser.add_argument(
        "--restarts", type=int, default=None, help=f"the soak's (default {DEFAULT_RESTARTS})"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    parsed = parser.parse_args(args)
    results = run(parsed.quick, parsed.restarts)
    if parsed.json:
        parsed.json.write_text(json.dumps(results, indent=1))
    print("\n".join(render(results)))
    return 0


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


TITLE = "## 13. Agent footprint"


_FOOTPRINT_ROWS = (
    ("threads", "threads of the agent process", 0, 1),
    ("rss_mb", "RSS, MB", 1, 1),
    ("fds", "open file descriptors", 0, 1),
    ("cpu_s_per_s", "CPU, ms per second of wall time", 2, 1e3),
)


def render(fp: dict[str, Any]) -> list[str]:
    """Section 13: a healthy agent with and without the bridge, and the soak of restarts."""
    st, soak = fp["steady"], fp["soak"]
    c = st["config"]
    reps = c["reps"]
    lines = [
        TITLE,
        "",
        f"One torchrun agent (c10d on localhost) with {c['workers']} light workers (no torch: "
        "each imports `elastic_otel` and marks a step every 100 ms), agent and workers pinned "
        "to one CPU; without the bridge (`--event-log-handler null`, "
        "`ELASTIC_OTEL_ENABLED=false`) and with it (`--event-log-handler otel`, OTLP/gRPC to "
        f"the counting receiver on the other CPUs), alternating, {reps} "
        f"run{'s' if reps > 1 else ''} each. Once every worker ran and {_f(c['settle_s'])} s "
        f"more had passed, the agent process was sampled for {_f(c['window_s'])} s: its "
        "threads (the most seen), RSS (the median), open file descriptors (the most) and CPU "
        "seconds of all its threads (`utime + stime`, `/proc/<pid>/stat`) per second of wall "
        "time. Medians of the runs; *paired* is the median of each run's difference with the "
        "run beside it (`benchmarks/footprint.py`; why each thread is there: "
        "[docs/architecture.md](docs/architecture.md#threads)).",
        "",
    ]
    med, diff, paired = st["median"], st["difference"], st["paired_difference"]
    rows = []
    for key, label, digits, scale in _FOOTPRINT_ROWS:
        rows.append(
            (
                label,
                _f(med["without"][key] * scale, digits),
                _f(med["with"][key] * scale, digits),
                f"{diff[key] * scale:+,.{digits}f} (paired {paired[key] * scale:+,.{digits}f})",
                _x(st["ratio"][key]),
            )
        )
    lines += _table(["agent process", "without", "with", "with - without", "with ÷ without"], rows)
    names = st["names"]
    # The baseline's threads first, then the bridge's.
    every = sorted(
        set(names["without"]) | set(names["with"]), key=lambda n: (n not in names["without"], n)
    )
    cpu = st.get("cpu_by_thread") or {v: {} for v in names}

    def cell(variant: str, name: str) -> str:
        if name not in names[variant]:
            return "-"
        used = cpu[variant].get(name)
        return f"{names[variant][name]} ({'-' if used is None else _f(used * 1e3, 2)})"

    lines += [
        "Its threads by name in the last run of each (Python's `threading` name; *native*: "
        "a thread Python did not start, by its kernel name, `comm`), and in parentheses the CPU "
        "they used, ms per second of wall time (each thread's time on a CPU, "
        "`/proc/<pid>/task/<tid>/schedstat`; median of the runs):",
        "",
        *_table(
            ["thread", "without", "with"],
            ((f"`{n}`", cell("without", n), cell("with", n)) for n in every),
        ),
    ]
    lines += [
        f"### {soak['restarts']:,} restarts",
        "",
        f"One agent with the bridge, `--max-restarts={soak['restarts']}`, {soak['ranks']} "
        "workers whose rank 0 fails 0.3 s after it starts in every attempt but the last; "
        "OTLP/gRPC to a receiver; then the same agent without the bridge. Right after an "
        f"attempt's rank 0 started, every {10 if soak['restarts'] > 20 else 2} restarts and at "
        "the last, the agent's RSS, open file descriptors and threads were sampled. With the "
        f"bridge: {soak['attempts']:,} attempts in {_f(soak['elapsed_s'], 0)} s "
        f"({_f(soak['s_per_attempt'], 2)} s each), agent exit code {soak['exit_code']}; "
        f"`worker` spans received: {soak['worker_spans']:,} ({soak['distinct_worker_spans']:,} "
        f"distinct) of {soak['attempts']:,} attempts x {soak['ranks']} ranks = "
        f"{soak['expected_worker_spans']:,}; their states: "
        + ", ".join(f"{k} {v:,}" for k, v in soak["worker_span_states"].items())
        + ".",
        "",
    ]
    soaks = [("with", soak)]
    if fp.get("soak_without"):
        soaks.insert(0, ("without", fp["soak_without"]))
    for name, one in soaks:
        if one.get("failure"):
            lines += [f"The agent {name} the bridge exited {one['exit_code']}:", "", "```",
                      one["failure"], "```", ""]  # fmt: skip
    rows = []
    for key, label, digits, _ in _FOOTPRINT_ROWS:
        for name, one in soaks:
            v = one["summary"].get(key)
            if v is None:
                continue
            rows.append(
                (
                    f"{label}, {name} the bridge",
                    _f(v["first"], digits),
                    _f(v["last"], digits),
                    _f(v["max"], digits),
                    f"{v['last'] - v['first']:+,.{digits}f}",
                )
            )
    if rows:
        first, last = soak["samples"][0]["restart"], soak["samples"][-1]["restart"]
        lines += _table(
            ["agent process", f"first (restart {first})", f"last (restart {last})", "max",
             "last - first"],
            rows,
        )  # fmt: skip
    sn = soak.get("names") or {}
    if sn.get("first") is not None and sn.get("last") is not None:
        if sn["first"] == sn["last"]:
            lines += [
                "With the bridge, the same threads by name at the first and the last sample.",
                "",
            ]
        else:
            changed = sorted(set(sn["first"]) | set(sn["last"]))
            lines += [
                "With the bridge, threads by name that differ between the first and the last "
                "sample: "
                + ", ".join(
                    f"`{n}` {sn['first'].get(n, 0)} → {sn['last'].get(n, 0)}"
                    for n in changed
                    if sn["first"].get(n) != sn["last"].get(n)
                )
                + ".",
                "",
            ]
    return lines


THREADS_ADDED = 8
"""Issue 48: threads the bridge may add to an agent of 8 workers (the SDK's and gRPC's too)."""
CPU_ADDED_MS_PER_S = 5.0
"""Issue 48: CPU the bridge may add to a healthy agent of 8 workers, ms per second."""


def targets(fp: dict[str, Any]) -> list[Target]:
    """The healthy agent's added threads and CPU; the soak of restarts: every worker span of
    every attempt exported, once."""
    rows: list[Target] = []
    steady = fp.get("steady")
    if steady:
        diff, workers = steady["difference"], steady["config"]["workers"]
        cpu_ms = diff["cpu_s_per_s"] * 1e3
        rows += [
            (
                f"13. threads the bridge adds to a healthy agent ({workers} workers)",
                f"+{diff['threads']:.0f}",
                f"≤ +{THREADS_ADDED}",
                diff["threads"] <= THREADS_ADDED,
            ),
            (
                f"13. CPU the bridge adds to a healthy agent ({workers} workers)",
                f"{cpu_ms:+.2f} ms/s",
                f"≤ +{CPU_ADDED_MS_PER_S:.0f} ms/s",
                cpu_ms <= CPU_ADDED_MS_PER_S,
            ),
        ]
    soak = fp.get("soak")
    if not soak:
        return rows
    change = ", ".join(
        f"{label} {_f(v['first'], 1 if key == 'rss_mb' else 0)} → "
        f"{_f(v['last'], 1 if key == 'rss_mb' else 0)}"
        for key, label in (("rss_mb", "RSS MB"), ("fds", "fds"), ("threads", "threads"))
        if (v := soak["summary"].get(key))
    )
    return [
        *rows,
        (
            f"13. {soak['restarts']:,} restarts of one agent ({soak['ranks']} workers): worker "
            "spans exported",
            f"{soak['worker_spans']:,} of {soak['attempts']:,} attempts x {soak['ranks']} "
            f"({soak['distinct_worker_spans']:,} distinct); {change}",
            "= attempts x ranks",
            soak["worker_spans"] == soak["distinct_worker_spans"] == soak["expected_worker_spans"]
            and soak["exit_code"] == 0,
        ),
    ]


if __name__ == "__main__":
    sys.exit(main())
