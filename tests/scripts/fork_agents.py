"""Forked elastic agents that inherit dropped c10d stores: the shape of torch's own
``local_elastic_agent_test`` (``multiprocessing`` fork, ``LocalElasticAgent``), without it.

Each round the parent drops a few ``TCPStore`` servers in reference cycles (garbage it has not
collected yet, as a test process has after earlier tests), then forks agents that rendezvous
through a store the parent hosts (``--backend c10d``) or an etcd server (``--backend etcd
--etcd HOST:PORT``; ``--heterogeneous``: torch's heterogeneous rank assignment, roles of
different sizes). Each child collects the inherited garbage: when it starts its workers, on
the main thread (``--collect main``) or wherever the next collection happens to run, often a
bridge thread (``anywhere``); each in turn, round by round (``alternate``); or at once after
the fork, while the bridge's threads start there (``fork``). torch then joins a daemon
thread by an id the child may have handed to a thread of its own. Prints one JSON line per
round: each agent's exit code, ``null`` for an agent still alive after ``--timeout`` seconds
(a hang; it is then killed), and whether the ranks the agents reported are consistent.

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


HETEROGENEOUS = [("master", 2), ("trainer", 1), ("trainer", 2), ("ps", 1)]
"""Roles and local world sizes of ``--heterogeneous`` (torch's test has 7 agents, 26 workers)."""


def role_info() -> dict[str, int]:
    """What torch's heterogeneous test checks: the ranks the agent gave this worker."""
    names = ("RANK", "ROLE_RANK", "GROUP_RANK", "ROLE_WORLD_SIZE", "WORLD_SIZE")
    return {name: int(os.environ[name]) for name in names}


def consistent(results: list[tuple[str, dict[int, dict[str, int]]]], roles: list) -> bool:
    """Every global and role rank given once, role world sizes as configured."""
    expected = {}
    for role, size in roles:
        expected[role] = expected.get(role, 0) + size
    infos = [(role, info) for role, values in results for info in values.values()]
    world = sum(expected.values())
    by_role = {role: sorted(i["ROLE_RANK"] for r, i in infos if r == role) for role in expected}
    return (
        len(results) == len(roles)
        and sorted(i["RANK"] for _, i in infos) == list(range(world))
        and all(by_role[role] == list(range(n)) for role, n in expected.items())
        and all(i["ROLE_WORLD_SIZE"] == expected[r] and i["WORLD_SIZE"] == world for r, i in infos)
    )


def run_agent(
    rdzv: dict[str, object],
    role: str,
    local_world_size: int,
    collect: str,
    dump_after: float | None,
    results: mp.Queue,
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
        elif collect == "anywhere":
            time.sleep(1.0)  # the next collection runs on whichever thread allocates
        return start_workers(self, worker_group)

    if collect == "fork":
        gc.set_threshold(700, 10, 10)  # the fork hook's threshold of 1 has done its work
    LocalElasticAgent._start_workers = start_workers_after_collecting  # type: ignore[method-assign]
    spec = WorkerSpec(
        role=role,
        local_world_size=local_world_size,
        entrypoint=role_info,
        rdzv_handler=registry.get_rendezvous_handler(RendezvousParameters(**rdzv)),
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
    spec.rdzv_handler.shutdown()
    results.put((role, result.return_values))
    sys.exit(1 if result.is_failed() else 0)


def _collect(mode: str, index: int) -> str:
    if mode == "alternate":
        return ("main", "anywhere")[index % 2]
    return mode


def collect_at_fork() -> None:
    """In a forked child, collect at the next allocation: where the bridge's fork hooks, run
    before this one, are starting its threads (the SDK's processors, the metric reader)."""
    gc.enable()
    gc.set_threshold(1)


def one_round(index: int, args: argparse.Namespace) -> dict[str, object]:
    from torch.distributed import TCPStore

    roles = HETEROGENEOUS if args.heterogeneous else [("trainer", 1)] * args.agents
    run_id = f"fork-{os.getpid()}-{index}"
    host = None
    if args.backend == "c10d":
        host = TCPStore(
            "127.0.0.1", 0, len(roles) + 1, True, use_libuv=True, wait_for_workers=False
        )
        rdzv: dict[str, object] = {"backend": "c10d", "endpoint": f"127.0.0.1:{host.port}"}
    else:
        rdzv = {"backend": "etcd", "endpoint": args.etcd, "last_call_timeout": 1}
    rdzv.update(run_id=run_id, min_nodes=len(roles), max_nodes=len(roles), is_host=False)
    fork = mp.get_context("fork")
    results = fork.Queue()
    gc.disable()
    try:
        drop_stores(args.stores)
        agents = [
            fork.Process(
                target=run_agent,
                args=(
                    rdzv,
                    role,
                    size,
                    _collect(args.collect, index),
                    max(1.0, args.timeout - 3.0) if args.dump_hung else None,
                    results,
                ),
            )
            for role, size in roles
        ]
        for agent in agents:
            agent.start()
    finally:
        gc.enable()
    deadline = time.monotonic() + args.timeout
    reported = []
    while len(reported) < len(agents) and time.monotonic() < deadline:
        try:
            reported.append(results.get(timeout=0.2))
        except Exception:  # queue.Empty
            if all(agent.exitcode is not None for agent in agents):
                break
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
    return {"exit_codes": codes, "ranks_consistent": consistent(reported, roles)}


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
    parser.add_argument("--backend", choices=("c10d", "etcd"), default="c10d")
    parser.add_argument("--etcd", help="HOST:PORT of an etcd server with the v2 API")
    parser.add_argument("--heterogeneous", action="store_true", help="roles of different sizes")
    parser.add_argument(
        "--collect", choices=("main", "anywhere", "alternate", "fork"), default="main"
    )
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
    if args.collect == "fork":
        os.register_at_fork(after_in_child=collect_at_fork)  # after the bridge's own hooks
    for index in range(args.rounds):
        outcome = one_round(index, args)
        print(json.dumps({"round": index, **outcome}), flush=True)
        if args.until_hang and None in outcome["exit_codes"]:
            break
    os._exit(0)  # the parent's own stores and exporters are not what is tested


if __name__ == "__main__":
    main()
