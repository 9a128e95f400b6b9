"""The stall exchange: what a stalled node publishes in the round's store, what it reads back,
and how its report then names a rank of another node. The store is a real TCPStore; a frozen
store server (SIGSTOP) stands in for a cut link."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from elastic_otel.integration.stall_exchange import StallExchange
from elastic_otel.model.spans import SpanAttributes
from elastic_otel.model.stall_exchange import (
    MAX_ENTRIES,
    MAX_ENTRY_BYTES,
    Culprit,
    culprits_key,
    decode_culprits,
    decode_waiting,
    encode_culprit,
    waiting_key,
)
from elastic_otel.model.stalls import RankProgress, TrainingStall, describe_training_stall
from elastic_otel.names import attributes as A
from tests.support.otlp_receiver import free_port

S = 1_000_000_000
GROUP = "gloo:0"
FRAME = "stuck_data_loader at ddp_train.py:21"


def inside(rank: int, number: int = 1) -> RankProgress:
    """A rank waiting in collective ``number`` of the default group of four ranks."""
    return RankProgress(rank, "all_reduce", number, None, S, GROUP, ((GROUP, number),), None,
                        (0, 1, 2, 3))  # fmt: skip


def idle(rank: int, issued: int) -> RankProgress:
    """A rank in no collective that issued ``issued`` of the default group's."""
    return RankProgress(rank, None, issued, None, S, None, ((GROUP, issued),))


WAITING = TrainingStall(4.0, (2, 3), (), "all_reduce", 1, "0", "gloo")
"""Node 1's stall: both its ranks wait in all_reduce #1; the rank waited for is elsewhere."""
NAMING = TrainingStall(4.0, (0,), (1,), "all_reduce", 1, "0", "gloo")
"""Node 0's stall: rank 0 waits, rank 1 never issued it."""


def test_entries_are_bounded_and_garbage_reads_as_nothing() -> None:
    entry = encode_culprit(Culprit("host-a", 4700, (1,), "f at x.py:1" * 100))
    assert len(entry) <= MAX_ENTRY_BYTES
    [read] = decode_culprits(entry)
    assert (read.host, read.pid, read.ranks) == ("host-a", 4700, (1,))
    assert read.frame.startswith("f at x.py:1")
    good = encode_culprit(Culprit("host-a", 4700, (1,), FRAME))
    garbage = b"\xff\xfe not json\n" + b'{"h": 1}\n' + b'{"h":"x","p":1,"r":["1"]}\n'
    assert decode_culprits(garbage + good) == [Culprit("host-a", 4700, (1,), FRAME)]
    assert decode_culprits(good * (MAX_ENTRIES + 1) + b"x" * 10_000) == []  # too long
    assert decode_culprits("text") == [] and decode_culprits(None) == []
    for bad in (b"", b"[]", b'{"n": 0, "c": "x"}', b'{"n": true, "c": "x"}', b"x" * 300):
        assert decode_waiting(bad) is None
    assert decode_waiting(b'{"n": 3, "c": "all_reduce"}') is not None
    # the ranks that left training travel with the entry; one it does not name is dropped
    left = Culprit("host-a", 4700, (1, 3), FRAME, (), (3, 5))
    assert decode_culprits(encode_culprit(left)) == [
        Culprit("host-a", 4700, (1, 3), FRAME, (), (3,))
    ]


def _store() -> tuple[dist.TCPStore, dist.PrefixStore]:
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))
    return server, dist.PrefixStore("torch.rendezvous.job.0", server)


def _until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


def test_every_node_names_the_rank_through_the_store() -> None:
    """Node 1 (all waiting) learns rank 1 from node 0's entry, with its host, pid and frame;
    its report says so. A node in no collective learns from the waiting key that its rank is
    the one waited for."""
    server, store = _store()
    woken = threading.Event()
    node1 = StallExchange(store, woken.set)
    node0 = StallExchange(store, lambda: None)
    local = [inside(2), inside(3)]
    assert node1.exchanged(WAITING, local) == WAITING  # nothing there yet: read later
    node0.publish(NAMING, FRAME)
    node0.publish(NAMING, FRAME)  # once per collective
    _until(lambda: store.check([culprits_key(GROUP, 1)]))
    _until(lambda: node1.exchanged(WAITING, local).remote)
    assert woken.is_set()  # the watch is told at once, not at its next poll
    named = node1.exchanged(WAITING, local)
    assert (named.remote, named.remote_frame, named.remote_pids) == ((1,), FRAME, (os.getpid(),))
    assert store.get(culprits_key(GROUP, 1)).count(b"\n") == 1
    attrs: SpanAttributes = {
        A.STALLED_SECONDS: 4.0, A.STALLED_WAITING: (2, 3), A.STALLED_RANKS: named.remote,
        A.STALLED_COLLECTIVE: "all_reduce", A.STALLED_COLLECTIVE_NUMBER: 1,
        A.STALLED_PROCESS_GROUP: "0", A.STALLED_REMOTE_HOST: "host-a",
        A.STALLED_REMOTE_PIDS: (4700,), A.STACK_FRAME: FRAME,
    }  # fmt: skip
    assert describe_training_stall(attrs) == (
        "stalled 4 s in training: global ranks 2,3 wait in all_reduce #1 of process group 0; "
        f"waiting for global rank 1 on host-a pid 4700 (in {FRAME}), which never entered it"
    )

    # One rank per node, the late one in no collective: it learns it is waited for.
    _until(lambda: store.check([waiting_key(GROUP)]))
    lone = StallExchange(store, lambda: None)
    alone = TrainingStall(4.0, (), (), None, 0)
    mine = [idle(1, 0)]
    _until(lambda: lone.exchanged(alone, mine).waited_for)
    told = lone.exchanged(alone, mine)
    said = (told.waited_for, told.collective, told.number, told.group)
    assert said == ((1,), "all_reduce", 1, "0")
    assert lone.exchanged(alone, [idle(1, 1)]) == alone  # it issued it: not late
    attrs = {
        A.STALLED_SECONDS: 4.0, A.STALLED_RANKS: (1,), A.STALLED_COLLECTIVE: "all_reduce",
        A.STALLED_COLLECTIVE_NUMBER: 1, A.STALLED_PROCESS_GROUP: "0", A.STACK_FRAME: FRAME,
    }  # fmt: skip
    assert describe_training_stall(attrs) == (
        "stalled 4 s in training: ranks on other nodes wait in all_reduce #1 of process group 0; "
        f"waiting for global rank 1 (in {FRAME}), which never entered it"
    )
    for exchange in (node0, node1, lone):
        exchange.close()
    del server


def test_own_entries_and_many_nodes() -> None:
    """A node ignores an entry naming its own ranks; past MAX_ENTRIES nodes append nothing."""
    server, store = _store()
    for n in range(MAX_ENTRIES + 4):
        entry = Culprit(f"host-{n}", n, (100 + n,))
        if store.add(culprits_key(GROUP, 1) + "/count", 1) <= MAX_ENTRIES:
            store.append(culprits_key(GROUP, 1), encode_culprit(entry))  # type: ignore[attr-defined]
    read = decode_culprits(store.get(culprits_key(GROUP, 1)))
    assert len(read) == MAX_ENTRIES
    exchange = StallExchange(store, lambda: None)
    _until(lambda: exchange.exchanged(WAITING, [inside(2), inside(3)]).remote)
    named = exchange.exchanged(WAITING, [inside(2), inside(3)])
    assert named.remote == tuple(range(100, 100 + MAX_ENTRIES))
    assert exchange.exchanged(WAITING, [inside(100), inside(3)]).remote == tuple(
        range(101, 100 + MAX_ENTRIES)
    )
    exchange.close()
    del server


SERVER = """
import sys, time, torch.distributed as dist
from datetime import timedelta
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 1, True, timeout=timedelta(seconds=30))
print("up", flush=True)
time.sleep(120)
"""


def test_a_cut_link_never_blocks_the_watch() -> None:
    """The store's host frozen (as a cut link looks): the exchange's calls return at once; its
    own thread waits, within its timeout."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline() == b"up\n"
        client = dist.TCPStore("127.0.0.1", port, 1, False, timeout=timedelta(seconds=10))
        store = dist.PrefixStore("torch.rendezvous.job.0", client)
        exchange = StallExchange(store, lambda: None, timeout_s=1.0)
        os.kill(server.pid, signal.SIGSTOP)
        started = time.monotonic()
        for _ in range(20):
            assert exchange.exchanged(WAITING, [inside(2), inside(3)]) == WAITING
            exchange.publish(NAMING, FRAME)
        assert time.monotonic() - started < 0.5
        exchange.close()
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()


def test_a_stall_named_locally_is_left_alone() -> None:
    server, store = _store()
    exchange = StallExchange(store, lambda: None)
    assert exchange.exchanged(NAMING, [inside(0), idle(1, 0)]) == NAMING
    no_group = dataclasses.replace(WAITING, group=None)
    assert exchange.exchanged(no_group, [inside(2), inside(3)]) == no_group
    exchange.close()
    del server


@pytest.mark.parametrize("hosts", [("host-a", "host-b")])
def test_two_culprit_nodes(hosts: tuple[str, str]) -> None:
    attrs: SpanAttributes = {
        A.STALLED_SECONDS: 4.0, A.STALLED_WAITING: (4,), A.STALLED_RANKS: (1, 2),
        A.STALLED_COLLECTIVE: "all_reduce", A.STALLED_COLLECTIVE_NUMBER: 1,
        A.STALLED_PROCESS_GROUP: "0", A.STALLED_REMOTE_HOST: ", ".join(hosts),
        A.STALLED_REMOTE_PIDS: (1, 2),
    }  # fmt: skip
    assert "waiting for global rank 1,2 on host-a pid 1, host-b pid 2, which never" in (
        describe_training_stall(attrs)
    )
