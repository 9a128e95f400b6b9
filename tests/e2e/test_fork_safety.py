"""Forked agents that inherit dropped c10d stores end as they do without the bridge (issue 23).

torch's ``TCPStore`` joins its daemon thread by id when destroyed; in a forked child that id
may name a thread the child started since (see :mod:`elastic_otel.bridge.fork_safety`). Without the
bridge such a child aborts at once; with the bridge exporting over gRPC it used to hang with
the GIL held, collector up or not. ``tests/fork_agents.py`` is the reproduction: the shape of
torch's ``local_elastic_agent_test`` (``multiprocessing`` fork, ``LocalElasticAgent``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).parent.parent / "fork_agents.py"
DEAD_COLLECTOR = "http://127.0.0.1:9"  # discard port: nothing listens


class Rounds(NamedTuple):
    codes: list[list[int | None]]  # each round's agent exit codes (None: alive at its timeout)
    hung_stacks: str  # hung agents' native stacks (``--dump-hung``, where gdb is installed)


def run_rounds(*args: str, endpoint: str | None = None, **env: str) -> Rounds:
    """Run the reproduction; a ``None`` exit code is an agent still alive at the round's
    timeout (a hang)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ELASTIC_"))}
    environ.update(OTEL_BLRP_SCHEDULE_DELAY="100", OTEL_BSP_SCHEDULE_DELAY="100", **env)
    if endpoint is not None:
        environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    rounds = [
        json.loads(line)["exit_codes"] for line in done.stdout.splitlines() if line[:1] == "{"
    ]
    assert rounds, f"no round ran:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    # A hung agent's Python stacks (faulthandler: "Timeout (...)!"), then the native ones.
    starts = [i for i in (done.stderr.find("Timeout ("), done.stderr.find("--- ")) if i >= 0]
    dumps = done.stderr[min(starts) :] if starts else ""
    return Rounds(rounds, dumps[:120000])


def outcome(code: int | None) -> str:
    if code is None:
        return "hang"
    return "crash" if code < 0 else f"exit {code}"


@pytest.fixture(scope="module")
def without_bridge() -> set[str]:
    """What the same agents do when no bridge runs: torch aborts them (``EINVAL`` in join)."""
    rounds = run_rounds("--rounds", "2", "--timeout", "60").codes
    outcomes = {outcome(code) for codes in rounds for code in codes}
    assert "hang" not in outcomes
    return outcomes


@pytest.mark.parametrize("collector", ["unreachable", "up"])
def test_forked_agents_end_as_without_the_bridge(collector: str, without_bridge: set[str]) -> None:
    """Ten rounds in a row; the inherited garbage is collected on the main thread in even
    rounds, wherever the next collection runs (often a bridge thread) in odd ones."""
    receiver = OtlpReceiver("grpc").start() if collector == "up" else None
    try:
        endpoint = receiver.endpoint if receiver is not None else DEAD_COLLECTOR
        rounds = run_rounds(
            "--bridge",
            "--rounds",
            "10",
            "--collect",
            "alternate",
            "--timeout",
            "30",
            "--dump-hung",
            endpoint=endpoint,
        )
    finally:
        if receiver is not None:
            receiver.close()
    assert len(rounds.codes) == 10
    for index, codes in enumerate(rounds.codes):
        assert {outcome(code) for code in codes} == without_bridge, (
            f"round {index}: {codes}\n{rounds.hung_stacks}"
        )
    if receiver is not None:
        assert receiver.logs, "the parent's bridge exported nothing"


def test_without_the_guard_the_reproduction_hangs() -> None:
    """The reproduction reproduces: with the guard off, some forked agent hangs."""
    rounds = run_rounds(
        "--bridge",
        "--rounds",
        "8",
        "--timeout",
        "10",
        "--until-hang",
        endpoint=DEAD_COLLECTOR,
        ELASTIC_OTEL_FORK_GUARD="false",
    )
    assert any(None in codes for codes in rounds.codes), rounds.codes


THREAD_IDS_AFTER_FORK = """
import ctypes, os, sys, threading, time
from elastic_otel.bridge.fork_safety import GUARD
if sys.argv[1] == "on":
    GUARD.watch()
    GUARD.bridge_running = True
stop = threading.Event()
parents = [threading.Thread(target=stop.wait, daemon=True) for _ in range(6)]
for t in parents:
    t.start()
inherited = {t.ident for t in parents}
# Joinable native threads that exited and were never joined (as a store's daemon whose loop was
# stopped): their stacks and ids stay in use, though /proc/self/task no longer lists them.
libc = ctypes.CDLL(None)
usleep = ctypes.c_void_p(ctypes.cast(libc.usleep, ctypes.c_void_p).value)
for _ in range(3):
    exited = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(exited), None, usleep, ctypes.c_void_p(1)) == 0
    inherited.add(exited.value)
time.sleep(0.2)
pid = os.fork()
if pid == 0:
    started = [threading.Thread(target=stop.wait, daemon=True) for _ in range(6)]
    for t in started:
        t.start()
    print(len(inherited & {t.ident for t in started}), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize(("guard", "expect_reused"), [("on", False), ("off", True)])
def test_threads_started_after_fork_get_new_ids(guard: str, expect_reused: bool) -> None:
    """The mechanism without torch: a child's new threads take the ids of the parent's threads,
    exited unjoined ones included (glibc's stack cache), unless the guard parked threads on
    those stacks first."""
    done = subprocess.run(
        [sys.executable, "-c", THREAD_IDS_AFTER_FORK, guard],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (int(done.stdout) > 0) is expect_reused, done.stdout
