"""The straggler score (elastic_otel.model.stragglers): a rank that is late at every collective
is named after consecutive windows; equal ranks, and uneven arrivals that shift from rank to
rank, name nobody. Arrivals as the workers' collectives files carry them; device times from
the NCCL record an H100 wrote (tests/data/nccl-flight-recorder); slow nodes
(elastic_otel.model.slow_nodes) through a real TCPStore."""

from __future__ import annotations

import json
import random
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from elastic_otel.integration.straggler_exchange import StragglerExchange
from elastic_otel.model.slow_nodes import (
    NodeGroup,
    NodeInside,
    SlowNode,
    SlowNodeWatch,
    decode,
    describe_slow_node,
    encode,
    node_inside,
    slow_node_attributes,
)
from elastic_otel.model.stragglers import (
    INSIDE,
    ISSUED,
    REPORT_EVERY,
    WINDOWS,
    StragglerWatch,
    describe_straggler,
    straggler_attributes,
)
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import device_ns, parse_collectives, read_collectives
from tests.support.recorded_nccl import recorded, watch_of

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "nccl-flight-recorder"

MS = 1_000_000
STEP = 300 * MS
PER_WINDOW = 10


def _window(
    watch: StragglerWatch, w: int, late: dict[int, float], ranks: tuple[int, ...] = (0, 1)
) -> None:
    """Window ``w``'s collectives: rank r issues each ``late[r]`` seconds after the step's
    start (a callable per collective where given)."""
    for rank in ranks:
        pairs = []
        for i in range(PER_WINDOW):
            seq = w * PER_WINDOW + i + 1
            delay = late.get(rank, 0.0)
            offset = delay(seq) if callable(delay) else delay
            pairs.append((seq, 10**18 + seq * STEP + int(offset * 1e9)))
        watch.observe(rank, [("0", pairs)], {"0": ranks})


def test_a_slow_rank_is_named_after_consecutive_windows() -> None:
    watch = StragglerWatch(0.75)
    found = []
    for w in range(WINDOWS + REPORT_EVERY):
        _window(watch, w, {1: 0.25})
        found.append(watch.close_window((0, 1)))
    assert found[: WINDOWS - 1] == [None] * (WINDOWS - 1)
    straggler = found[WINDOWS - 1]
    assert straggler is not None
    assert straggler.rank.global_rank == 1 and straggler.waiting == (0,)
    assert straggler.windows == WINDOWS
    assert abs(straggler.rank.lateness_s - 0.25) < 1e-6
    assert abs(straggler.rank.interval_s - 0.3) < 1e-6
    assert abs(straggler.rank.score - (1 - 0.25 / 0.3)) < 1e-6
    assert abs(straggler.rank.waited_share - 0.25 / 0.3) < 1e-6
    # reported again every REPORT_EVERY windows while it lasts, not every window
    assert found[WINDOWS : WINDOWS + REPORT_EVERY - 1] == [None] * (REPORT_EVERY - 1)
    assert found[-1] is not None and found[-1].windows == WINDOWS + REPORT_EVERY
    assert watch.scores[0].score == 1.0 and watch.scores[0].lateness_s == 0.0
    assert watch.scores[1].score < 0.75

    attrs = straggler_attributes(straggler)
    assert attrs[A.STRAGGLER_RANK] == 1 and attrs[A.STRAGGLER_WAITING] == (0,)
    body = describe_straggler(attrs)
    assert body.startswith("global rank 1 is a straggler: score 0.17 over 3 windows"), body
    assert "global ranks 0 spend 83 % of that time waiting for it" in body


def test_equal_ranks_name_nobody() -> None:
    watch = StragglerWatch(0.75)
    for w in range(4 * WINDOWS):
        _window(watch, w, {1: lambda seq: 0.001 * (seq % 2)})
        assert watch.close_window((0, 1)) is None
    assert all(s.score > 0.99 for s in watch.scores.values())


def test_uneven_but_shifting_arrivals_name_nobody() -> None:
    rng = random.Random(7)
    jitter = {r: (lambda seq, r=r: rng.uniform(0, 0.25)) for r in range(4)}
    watch = StragglerWatch(0.75)
    for w in range(6 * WINDOWS):
        _window(watch, w, jitter, ranks=(0, 1, 2, 3))  # late ranks change every collective
        assert watch.close_window((0, 1, 2, 3)) is None
    # a slow rank that changes from window to window: never the same one for long enough
    watch = StragglerWatch(0.75)
    for w in range(6 * WINDOWS):
        _window(watch, w, {w % 2: 0.25})
        assert watch.close_window((0, 1)) is None
    assert watch.scores[(6 * WINDOWS - 1) % 2].score < 0.75  # the score still says it


def test_arrivals_that_come_in_other_windows_still_score() -> None:
    """The workers' windows are not the agent's: a rank's arrivals may come a window later."""
    watch = StragglerWatch(0.75)
    found = []
    prev: list[tuple[int, int]] = []
    for w in range(WINDOWS + 1):
        pairs = {
            r: [
                (seq, 10**18 + seq * STEP + (250 * MS if r == 1 else 0))
                for seq in range(w * 10 + 1, w * 10 + 11)
            ]
            for r in (0, 1)
        }
        watch.observe(0, [("0", pairs[0])])
        if w:  # rank 1's come one window late
            watch.observe(1, [("0", prev)])
        prev = pairs[1]
        watch.observe(0, [("0", pairs[0])])  # a file read twice adds nothing
        found.append(watch.close_window((0, 1)))
    assert found[0] is None and found[-1] is not None and found[-1].rank.global_rank == 1


def test_ranks_outside_the_group_or_on_other_nodes_are_not_compared() -> None:
    watch = StragglerWatch(0.75)
    for w in range(WINDOWS):
        # group "1" has one local member (rank 0) and one elsewhere (rank 2): nothing to compare
        for rank in (0, 1):
            pairs = [
                (s, 10**18 + s * STEP + (250 * MS if rank == 1 else 0))
                for s in range(w * 10 + 1, w * 10 + 11)
            ]
            watch.observe(rank, [("1", pairs)] if rank == 0 else [], {"1": (0, 2)})
        assert watch.close_window((0, 1)) is None
    assert watch.scores == {}


def test_the_collectives_file_carries_arrivals() -> None:
    data = {
        "pid": 7,
        "progress_ns": 1,
        "groups": [],
        "arrivals": {"0": [[1, 100], [2, 200]]},
        "window_ns": 5,
    }
    parsed = parse_collectives(data)
    assert parsed is not None
    assert parsed.arrivals == (("0", ((1, 100), (2, 200))),) and parsed.window_ns == 5
    assert parse_collectives({**data, "arrivals": [1]}) is None


def test_older_files_without_durations_still_read() -> None:
    data = {"pid": 7, "progress_ns": 1, "groups": [], "arrivals": {"0": [[1, 100]]}}
    parsed = parse_collectives(data)
    assert parsed is not None and parsed.durations == ()
    parsed = parse_collectives({**data, "durations": {"nccl:0": [[1, 133376]]}})
    assert parsed is not None and parsed.durations == (("nccl:0", ((1, 133376),)),)
    assert parse_collectives({**data, "durations": "x"}) is None


def test_the_worker_leaves_the_h100_records_device_times(tmp_path: Path) -> None:
    """The collectives thread over the H100's record (its real entries, through NCCL's dump
    functions): each completed collective's ``duration_ms`` as ns, per group, beside its
    arrival; none for an entry not completed (the scheduled record's last one)."""
    record = recorded("nccl_completed.json")
    watch = watch_of(record, tmp_path)
    watch.window_ns = 1
    watch.poll(time.time_ns())
    read = read_collectives(str(tmp_path))
    assert read is not None
    durations = dict(read.durations)
    expected = [
        (e["collective_seq_id"], round(e["duration_ms"] * 1e6))
        for e in record["entries"]
        if e["process_group"][0] == "0"
    ]
    assert durations["nccl:0"] == tuple(expected)
    assert durations["nccl:1"] == ((1, 33664),)  # 0.033663999 ms: the second group's all-reduce
    scheduled = recorded("nccl_scheduled.json")
    (last,) = [e for e in scheduled["entries"] if e["state"] == "scheduled"]
    assert device_ns(last) is None
    assert device_ns({"state": "completed", "duration_ms": None}) is None  # gloo's
    assert device_ns({"state": "completed", "duration_ms": float("nan")}) is None


H100_STEP_S = 0.010378
"""A DDP step of 8 x Linear(4096), batch 512, on the H100 the fixtures come from (timing off,
first run: tests/data/nccl-flight-recorder/README.md)."""


def _h100_windows(slow: int, late_s: float, ranks: tuple[int, ...], windows: int) -> list:
    """The H100 record's default-group collectives as one window each time, for ``ranks``
    on one node: every rank issues them when the record says (the window shifted by its own
    span) and its GPU spends the recorded ``duration_ms`` inside, rotated by rank so that each
    rank's own device times differ; rank ``slow`` issues each ``late_s`` later, so each peer's
    device spends ``late_s`` more inside, waiting for it (the wait NCCL's kernel measures)."""
    entries = [
        e for e in recorded("nccl_completed.json")["entries"] if e["process_group"][0] == "0"
    ]
    span = entries[-1]["time_created_ns"] - entries[0]["time_created_ns"]
    out = []
    for w in range(windows):
        files = {}
        for rank in ranks:
            arrivals, durations = [], []
            for i, entry in enumerate(entries):
                seq = w * len(entries) + entry["collective_seq_id"]
                own = device_ns(entries[(i + rank) % len(entries)])
                assert own is not None
                wait = 0 if rank == slow else int(late_s * 1e9)
                late = int(late_s * 1e9) if rank == slow else 0
                created = entry["time_created_ns"] + w * (span + span // len(entries))
                arrivals.append((seq, created + late))
                durations.append((seq, own + wait))
            files[rank] = (arrivals, durations)
        out.append(files)
    return out


def test_on_the_h100_record_the_rank_its_peers_wait_inside_for_is_named() -> None:
    """Device time decides: rank 2's arrivals say nothing here (it issues on time, its GPU is
    a step behind: only the peers' time inside shows it)."""
    watch = StragglerWatch(0.75)
    found = []
    for files in _h100_windows(2, H100_STEP_S, (0, 1, 2, 3), WINDOWS):
        for rank, (arrivals, durations) in files.items():
            on_time = [
                (seq, t - int(H100_STEP_S * 1e9)) if rank == 2 else (seq, t) for seq, t in arrivals
            ]
            watch.observe(
                rank, [("nccl:0", on_time)], {"nccl:0": (0, 1, 2, 3)}, [("nccl:0", durations)]
            )
        found.append(watch.close_window((0, 1, 2, 3)))
    straggler = found[-1]
    assert found[:-1] == [None] * (WINDOWS - 1) and straggler is not None
    assert straggler.rank.global_rank == 2 and straggler.waiting == (0, 1, 3)
    assert straggler.rank.basis == INSIDE
    # its lateness is the peers' extra time inside, less the spread of the GPUs' own times
    assert abs(straggler.rank.lateness_s - H100_STEP_S) < 0.0002, straggler.rank
    assert straggler.rank.score < 0.75
    assert all(watch.scores[r].score > 0.99 for r in (0, 1, 3))
    attrs = straggler_attributes(straggler)
    assert attrs[A.STRAGGLER_BASIS] == INSIDE and attrs[A.STRAGGLER_PROCESS_GROUP] == "0"
    body = describe_straggler(attrs)
    assert "its device spends 0.010 s less inside each collective of process group 0" in body
    assert "global ranks 0,1,3 spend" in body


def test_without_device_times_the_arrivals_score() -> None:
    watch = StragglerWatch(0.75)
    for files in _h100_windows(1, H100_STEP_S, (0, 1), WINDOWS):
        for rank, (arrivals, _) in files.items():
            watch.observe(rank, [("nccl:0", arrivals)], {"nccl:0": (0, 1)})
        straggler = watch.close_window((0, 1))
    assert straggler is not None and straggler.rank.global_rank == 1
    assert straggler.rank.basis == ISSUED


def test_equal_device_times_name_nobody() -> None:
    watch = StragglerWatch(0.75)
    for files in _h100_windows(-1, H100_STEP_S, (0, 1), 4 * WINDOWS):
        for rank, (arrivals, durations) in files.items():
            watch.observe(rank, [("nccl:0", arrivals)], {"nccl:0": (0, 1)}, [("nccl:0", durations)])
        assert watch.close_window((0, 1)) is None
    # every rank's device waits the same step: nobody is late
    assert all(s.basis == INSIDE and s.score > 0.99 for s in watch.scores.values())


def _node(
    node_rank: int, ranks: tuple[int, ...], mean_ms: float, window: int, spread_ms: float = 0.0
) -> NodeInside:
    group = NodeGroup(
        "nccl:0", 9, mean_ms * 1e6, (mean_ms - spread_ms) * 1e6, (mean_ms + spread_ms) * 1e6, 29e6
    )
    return NodeInside(node_rank, f"host-{node_rank}", ranks, window, (group,))


def test_a_node_whose_every_rank_waits_less_inside_is_named() -> None:
    watch = SlowNodeWatch(0.75)
    found = []
    for w in range(WINDOWS):
        nodes = [
            _node(0, (0, 1), 10.4, w),
            _node(1, (2, 3), 0.04, w, 0.01),
            _node(2, (4, 5), 10.5, w),
        ]
        found.append(watch.close_window(nodes))
    slow = found[-1]
    assert found[:-1] == [None] * (WINDOWS - 1) and isinstance(slow, SlowNode)
    assert slow.node.node_rank == 1 and slow.node.ranks == (2, 3) and slow.waiting == (0, 2)
    assert slow.node.score < 0.75 and abs(slow.node.lateness_s - 0.01046) < 1e-6
    attrs = slow_node_attributes(slow)
    assert attrs[A.STRAGGLER_NODE] == "host-1" and attrs[A.STRAGGLER_NODE_RANKS] == (2, 3)
    assert A.STRAGGLER_RANK not in attrs
    body = describe_slow_node(attrs)
    assert body.startswith("node host-1 (node rank 1, global ranks 2,3) is a slow node: score"), (
        body
    )
    assert "nodes 0,2 spend" in body


def test_a_node_with_one_slow_rank_or_equal_nodes_is_not_named() -> None:
    watch = SlowNodeWatch(0.75)
    for w in range(3 * WINDOWS):
        # node 1's mean is low, but one of its ranks waits as long as the others: not every rank
        assert (
            watch.close_window([_node(0, (0, 1), 10.4, w), _node(1, (2, 3), 5.0, w, 5.4)]) is None
        )
        assert watch.close_window([_node(0, (0, 1), 10.4, w), _node(1, (2, 3), 10.3, w)]) is None
        assert watch.close_window([_node(0, (0, 1), 10.4, w)]) is None  # one node: no evidence


def test_published_values_round_trip_and_bad_ones_are_none() -> None:
    value = node_inside(1, "host-1", (3, 2), 4, StragglerWatch(0.75).inside)
    assert value is None  # nothing timed: nothing published
    node = _node(1, (2, 3), 0.04, 4)
    assert decode(encode(node)) == node
    for bad in (b"", b"{", b"[]", json.dumps({"n": 1}).encode(), "text", None, b"x" * 70000):
        assert decode(bad) is None
    broken = json.loads(encode(node))
    broken["g"][0][2] = -1.0
    assert decode(json.dumps(broken).encode()) is None


def _store() -> tuple[Any, Any]:
    """A TCPStore server and a client of it under a round's prefix, as the agents have."""
    import torch.distributed as dist

    server = dist.TCPStore(
        "127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    client = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=timedelta(seconds=10))
    return server, dist.PrefixStore("torch.rendezvous.job.0", client)


def _until(condition: Any) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_node_zero_names_the_slow_node_through_the_rendezvous_store() -> None:
    """Two agents' exchanges on one real TCPStore: each publishes per window, node 0 reads
    both keys once per window and reports node 1."""
    _server, store = _store()
    reported: list[SlowNode] = []
    zero = StragglerExchange(store, 0, 0, 2, 0.75, reported.append)
    one = StragglerExchange(store, 0, 1, 2, 0.75, reported.append)
    assert one.watch is None and zero.watch is not None
    key = "elastic_otel/slow_nodes/0/1"
    for w in range(WINDOWS):
        one.publish(_node(1, (2, 3), 0.04, w))
        _until(
            lambda w=w: store.check([key]) and getattr(decode(store.get(key)), "window", -1) == w
        )
        zero.publish(_node(0, (0, 1), 10.4, w))
        _until(lambda w=w: zero._seen.get(0) == w)
    _until(lambda: reported)
    (slow,) = reported
    assert slow.node.node_rank == 1 and slow.node.host == "host-1" and slow.windows == WINDOWS
    zero.close()
    one.close()


def test_a_cut_link_never_blocks_the_publisher() -> None:
    server, store = _store()
    exchange = StragglerExchange(store, 0, 0, 2, 0.75, lambda slow: None)
    del server  # the store's server is gone: its client's operations fail or time out
    started = time.monotonic()
    for w in range(5):
        exchange.publish(_node(0, (0, 1), 10.4, w))
        time.sleep(0.01)
    assert time.monotonic() - started < 0.5
    exchange.close()
