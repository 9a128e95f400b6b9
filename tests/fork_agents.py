"""Forked elastic agents that inherit dropped c10d stores: the shape of torch's own
``local_elastic_agent_test`` (``multiprocessing`` fork, ``LocalElasticAgent``), without it.

Each round the parent drops a few ``TCPStore`` servers in reference cycles (garbage it has not
collected yet, as a test process has after earlier tests), then forks agents that rendezvous
through a store the parent hosts. Each child collects the inherited garbage when it starts its
workers: on the main thread (``--collect main``), wherever the next collection happens to run,
often a bridge thread (``--collect anywhere``), or each in turn, round by round
(``alternate``). torch then joins a daemon thread that does not exist in the child. Prints
one JSON line per round: each agent's exit code, ``null`` for an agent still alive after
``--timeout`` seconds (a hang; it is then killed).

``--bridge`` registers elastic-otel in the parent first (its exporters read ``OTEL_*``).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time


def drop_stores(n: int) -> None:
    from torch.distributed import TCPStore

    for _ in range(n):
        # Port 0: the store binds a free port itself (a port picked first and bound later
        # can be taken meanwhile by the other tests running beside this one).
        store = TCPStore("127.0.0.1", 0, 1, True, use_libuv=True)
        cycle: list[object] = [store]
        cycle.append(cycle)  # only the garbage collector frees it


def happy() -> None:
    return None


def run_agent(
    endpoint: str, run_id: str, nodes: int, collect: str, dump_after: float | None
) -> None:
    if dump_after is not None:
        # A hung agent's Python stacks, every thread's, from a C watchdog that needs no GIL,
        # shortly before the round gives up on it (an agent that ends first prints none).
        faulthandler.dump_traceback_later(dump_after, file=sys.stderr)
    import torch.distributed.elastic.rendezvous.registry as registry
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    start_workers = LocalElasticAgent._start_workers

    def start_workers_after_collecting(self, worker_group):  # type: ignore[no-untyped-def]
        gc.enable()  # disabled since the parent dropped its stores
        if collect == "main":
            gc.collect()
        else:
            time.sleep(1.0)  # the next collection runs on whichever thread allocates
        return start_workers(self, worker_group)

    LocalElasticAgent._start_workers = start_workers_after_collecting  # type: ignore[method-assign]
    params = RendezvousParameters(
        backend="c10d",
        endpoint=endpoint,
        run_id=run_id,
        min_nodes=nodes,
        max_nodes=nodes,
        is_host=False,
    )
    spec = WorkerSpec(
        role="trainer",
        local_world_size=1,
        entrypoint=happy,
        rdzv_handler=registry.get_rendezvous_handler(params),
        max_restarts=0,
        monitor_interval=0.05,
    )
    agent = LocalElasticAgent(
        spec,
        start_method="spawn",
        exit_barrier_timeout=5,
        logs_specs=DefaultLogsSpecs(log_dir=tempfile.mkdtemp(prefix="fork_agents_")),
    )
    result = agent.run()
    sys.exit(1 if result.is_failed() else 0)


def _collect(mode: str, index: int) -> str:
    if mode == "alternate":
        return ("main", "anywhere")[index % 2]
    return mode


def one_round(index: int, args: argparse.Namespace) -> list[int | None]:
    from torch.distributed import TCPStore

    host = TCPStore("127.0.0.1", 0, args.agents + 1, True, use_libuv=True, wait_for_workers=False)
    port = host.port
    gc.disable()
    try:
        drop_stores(args.stores)
        fork = mp.get_context("fork")
        agents = [
            fork.Process(
                target=run_agent,
                args=(
                    f"127.0.0.1:{port}",
                    f"fork-{os.getpid()}-{index}",
                    args.agents,
                    _collect(args.collect, index),
                    max(1.0, args.timeout - 3.0) if args.dump_hung else None,
                ),
            )
            for _ in range(args.agents)
        ]
        for agent in agents:
            agent.start()
    finally:
        gc.enable()
    deadline = time.monotonic() + args.timeout
    for agent in agents:
        agent.join(max(0.0, deadline - time.monotonic()))
    codes = [agent.exitcode for agent in agents]
    if args.dump_hung and None in codes:
        # The parent too: it hosts the store the agents connect to.
        dump_native_stacks(os.getpid(), "parent")
    for agent in agents:
        if agent.exitcode is None:
            if args.dump_hung:
                dump_native_stacks(agent.pid, "hung agent")
            agent.kill()
            agent.join(10)
    del host
    return codes


def dump_native_stacks(pid: int | None, who: str) -> None:
    """Every thread's native stack (innermost frames) of process ``pid``, on stderr (where
    gdb is installed), each line cut short: what a hang is waiting on."""
    gdb = shutil.which("gdb")
    if gdb is None or pid is None:
        return
    done = subprocess.run(
        [gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Frames without a symbol (gRPC's stripped library) and the layers of a lock wait say
    # nothing; what is left fits every thread of a process with a few dozen of them.
    noise = ("cygrpc", "futex", "sem_wait", "sem_clockwait", "PyObject_Vectorcall", "Vectorcall")
    frames = [
        line[:160]
        for line in done.stdout.splitlines()
        if line.startswith(("Thread", "#")) and not any(n in line for n in noise)
    ]
    print(f"--- {who} {pid} ---", *frames, sep="\n", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bridge", action="store_true")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--stores", type=int, default=1)
    parser.add_argument("--collect", choices=("main", "anywhere", "alternate"), default="main")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--until-hang", action="store_true", help="stop after a round that hung")
    parser.add_argument("--dump-hung", action="store_true", help="gdb backtraces of hung agents")
    args = parser.parse_args()
    if args.bridge:
        import elastic_otel

        elastic_otel.register()
        from torch.distributed.elastic import events

        for i in range(50):  # the pipeline is busy exporting when the agents fork
            events.record(events.Event(f"fork_agents.{i}", events.EventSource.AGENT), "otel")
        time.sleep(0.5)
    for index in range(args.rounds):
        codes = one_round(index, args)
        print(json.dumps({"round": index, "exit_codes": codes}), flush=True)
        if args.until_hang and None in codes:
            break
    os._exit(0)  # the parent's own stores and exporters are not what is tested


if __name__ == "__main__":
    main()
