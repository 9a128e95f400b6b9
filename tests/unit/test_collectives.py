"""Collective progress from the process group's own record (issue 28): the worker's
collectives thread on a real gloo process group and torch's Flight Recorder, the file it
writes, and who waits for whom once the process groups are known."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

from elastic_otel.model.stalls import (
    describe_training_stall,
    rank_progress,
    silence_attributes,
    silent_nodes,
    training_stall,
)
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import (
    CollectiveProgress,
    GroupProgress,
    parse_collectives,
    read_collectives,
)
from elastic_otel.parsing.worker_progress import WorkerProgress
from elastic_otel.worker.collectives import record_backends

S = 1_000_000_000

ONE_RANK_GROUP = """
import json, os, sys, time, torch, torch.distributed as dist
from elastic_otel.worker.collectives import CollectivesWatch
directory = sys.argv[1]
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
watch = CollectivesWatch(directory, period_s=0.5, identify_after_s=0.0)
t = torch.ones(8)
for _ in range(3):
    dist.all_reduce(t)
sub = dist.new_group([0])
dist.broadcast(t, 0, group=sub)
path = os.path.join(directory, "elastic_otel_collectives.json")
for _ in range(400):  # gloo marks a collective completed a moment after its call returned
    watch.poll(time.time_ns())
    written = json.loads(open(path).read())  # what the agent reads, not the watch's memory
    if len(written["groups"]) == 2 and all(
        g["issued"] == g["completed"] for g in written["groups"]
    ):
        break
    time.sleep(0.05)
print("first", open(path).read())
watch.poll(time.time_ns(), dump=True)
print("dumped", open(os.path.join(directory, "elastic_otel_collectives.json")).read())
"""


def _run(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``script`` in a process of its own (``tmp_path`` its argument), which must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_worker_thread_reads_every_process_group(tmp_path: Path) -> None:
    """A real process group: the default group's three all-reduces and a sub-group's
    broadcast are counted, all completed (gloo's status at times says otherwise for good: the
    entries settle it); a requested dump is torch's own pickle format."""
    done = _run(ONE_RANK_GROUP, tmp_path)
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    first = parse_collectives(json.loads(lines["first"]))
    assert first is not None and first.dumps == 0
    default, sub = first.group("0"), first.group("1")
    assert default is not None and sub is not None
    assert (default.issued, default.members, default.completed) == (3, (0,), 3)
    assert first.open_group() is None and default.first_open == 0
    assert (sub.issued, sub.completed) == (1, 1)
    dumped = read_collectives(str(tmp_path))
    assert dumped is not None and dumped.dumps == 1
    record = pickle.loads((tmp_path / "elastic_otel_flight_recorder.pkl").read_bytes())
    ops = [(e["profiling_name"], e["collective_seq_id"]) for e in record["entries"]]
    assert ("gloo:all_reduce", 3) in ops and ("gloo:broadcast", 1) in ops


GLOO_STATUS_BEHIND = """
import json, pickle, time, torch, torch.distributed as dist
from elastic_otel.worker.records.gloo import GlooRecord
extension = torch._C._distributed_c10d
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
works = [dist.all_reduce(torch.ones(8), async_op=True) for _ in range(11)]
for work in works:
    work.wait()
time.sleep(0.2)
raw = json.loads(extension._dump_fr_trace_json(False, False))["pg_status"]["0"]
print("raw", raw["last_completed_collective"])  # often less than 11, for good
record = pickle.loads(extension._dump_fr_trace(True, False, False))
gloo = GlooRecord(extension)
print("whole", gloo.status_from(record)["0"]["last_completed_collective"])
# What gloo's threads left in CI: the collective one finished last written over the newest.
record["pg_status"]["0"]["last_completed_collective"] = 6
bare = {**record, "entries": []}  # as with TORCH_FR_BUFFER_SIZE=0: the status alone
print("again", gloo.status_from(bare)["0"]["last_completed_collective"])
print("bare", GlooRecord(extension).status_from(bare)["0"])
record["entries"][8]["retired"] = False  # #9 not finished yet, #10 and #11 are
print("open", GlooRecord(extension).status_from(record)["0"])
"""


def test_gloo_completion_comes_from_the_entries_and_never_goes_back(tmp_path: Path) -> None:
    """gloo's status can say a group's sixth collective is its last completed when all eleven
    are (each gloo thread writes the one it finished: CI, torch 2.14.1, a DDP hang named in
    all_reduce #7 instead of #11). The record's reading gives what the entries' ``retired``
    flags say, and never less than it gave before."""
    lines = dict(
        line.split(" ", 1) for line in _run(GLOO_STATUS_BEHIND, tmp_path).stdout.splitlines()
    )
    assert lines["whole"] == "11" and lines["again"] == "11", lines
    assert "'last_completed_collective': 6" in lines["bare"], lines["bare"]
    assert "'last_completed_collective': 8" in lines["open"], lines["open"]
    assert "'last_enqueued_collective': 11" in lines["open"], lines["open"]


EXITING_WORKER = """
import atexit, sys, time, torch, torch.distributed as dist
from elastic_otel.worker import collectives
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
thread = collectives.start(sys.argv[1])
for _ in range(3):
    dist.all_reduce(torch.ones(8))
time.sleep(0.5)
def report():  # atexit's, after the hooks that run when the main thread returns
    thread.join(5)
    print("ended" if not thread.is_alive() else "alive", flush=True)
atexit.register(report)
"""


def test_the_worker_thread_stops_before_the_interpreter_finalizes(tmp_path: Path) -> None:
    """A worker's main thread returns: the collectives thread leaves torch's functions and ends
    before the atexit handlers run, so that none of its reads outlives torch's statics."""
    done = _run(EXITING_WORKER, tmp_path)
    assert done.stdout.split() == ["ended"]


def test_the_default_group_is_placed_in_its_own_backends_records_only() -> None:
    """A gloo job on a CUDA build (2.14.1's wheel) has NCCL's record too: the default group,
    placed before its first collective, must not sit there as a NCCL group that never issued
    one (its peers would read this rank as not started; caught by CI on 2.14.1)."""
    assert record_backends("cpu:gloo,cuda:gloo") == {"gloo"}
    assert record_backends("cpu:gloo,cuda:nccl") == {"gloo", "nccl"}
    assert record_backends("nccl") == {"nccl"}
    assert record_backends("cpu:mpi") == {"gloo"}
    assert record_backends("") == set()


def test_malformed_files_read_as_nothing(tmp_path: Path) -> None:
    assert read_collectives(str(tmp_path)) is None
    (tmp_path / "elastic_otel_collectives.json").write_bytes(b"\xff{not json")
    assert read_collectives(str(tmp_path)) is None
    assert parse_collectives({"pid": 1, "progress_ns": 2, "groups": [{"name": "0"}]}) is None
    assert parse_collectives([1, 2]) is None


def group(
    name: str,
    issued: int,
    completed: int,
    op: str | None = None,
    members: tuple[int, ...] = (0, 1, 2, 3),
    **more: object,
) -> GroupProgress:
    opened = 5 * S if issued > completed else 0
    return GroupProgress(name, members, issued, completed, opened, op, (), **more)  # type: ignore[arg-type]


def progress(at: int, collective: str | None = None, entered: int = 0) -> WorkerProgress:
    return WorkerProgress(1, 34, entered, entered, collective, 0, None, None, at)


def flight(at: int, *groups: GroupProgress) -> CollectiveProgress:
    return CollectiveProgress(1, at, groups, 0)


def test_ddp_hang_the_late_rank_is_the_one_that_never_issued_it() -> None:
    """DDP's reducer: no Python collective on any rank; the Flight Recorder shows ranks 0 and
    2 inside all-reduce #11 of the default group, rank 1 still at #10."""
    ranks = [
        rank_progress(0, progress(S), flight(5 * S, group("0", 11, 10, "all_reduce"))),
        rank_progress(1, progress(S), flight(4 * S, group("0", 10, 10))),
        rank_progress(2, progress(S), flight(5 * S, group("0", 11, 10, "all_reduce"))),
    ]
    stall = training_stall(ranks, 70 * S, 60 * S)
    assert stall is not None
    assert (stall.waiting, stall.waited_for) == ((0, 2), (1,))
    assert (stall.collective, stall.number, stall.group, stall.seconds) == (
        "all_reduce",
        11,
        "0",
        65.0,
    )


def test_a_rank_outside_the_group_is_not_waited_for() -> None:
    """Ranks 0 and 1 wait in a sub-group's all-gather; rank 2 is not a member of it and idle:
    nobody waits for it."""
    sub = group("1", 7, 6, "all_gather", members=(0, 1))
    ranks = [
        rank_progress(0, progress(S), flight(2 * S, group("0", 4, 4), sub)),
        rank_progress(1, progress(S), flight(2 * S, group("0", 4, 4), sub)),
        rank_progress(2, progress(S), flight(2 * S, group("0", 4, 4))),
    ]
    stall = training_stall(ranks, 70 * S, 60 * S)
    assert stall is not None
    assert (stall.waiting, stall.waited_for, stall.group, stall.number) == ((0, 1), (), "1", 7)


def test_progress_is_the_newest_of_both_sources() -> None:
    """A rank whose Flight Recorder moved recently made progress, whatever its record says;
    a Python collective the Flight Recorder does not count (a send) is still seen."""
    moved = rank_progress(0, progress(S), flight(69 * S, group("0", 3, 3)))
    assert moved.progress_ns == 69 * S and moved.collective is None and moved.entered == 3
    assert training_stall([moved], 70 * S, 60 * S) is None
    sending = rank_progress(1, progress(S, "send", 2), flight(S, group("0", 3, 3)))
    assert (sending.collective, sending.group) == ("send", None)
    no_record = rank_progress(2, progress(S, "all_reduce", 9), None)
    assert (no_record.collective, no_record.entered, no_record.group) == ("all_reduce", 9, None)


def test_every_rank_in_the_same_collective_waits_for_other_nodes() -> None:
    ranks = [
        rank_progress(r, progress(S), flight(2 * S, group("0", 80, 79, "all_reduce")))
        for r in (2, 3)
    ]
    stall = training_stall(ranks, 70 * S, 60 * S)
    assert stall is not None
    assert (stall.waiting, stall.waited_for, stall.number) == ((2, 3), (), 80)


def test_silent_nodes_from_the_rendezvous_keep_alives() -> None:
    """A member whose keep-alive is older than torch's bound, or that torch dropped as dead,
    is silent; this node, when it reached no store, names only itself (its view is stale)."""
    members = {"a_1_0": 0, "b_2_0": 1, "c_3_0": 2}
    beats = {"a_1_0": 100.0, "b_2_0": 90.0}  # c dropped as dead
    nodes = silent_nodes(members, beats, "a_1_0", 1.0, 100.0, 4.0)
    assert [(n.node, n.group_rank, n.seconds, n.dropped) for n in nodes] == [
        ("b_2_0", 1, 10.0, False),
        ("c_3_0", 2, 4.0, True),
    ]
    attrs = silence_attributes(nodes)
    assert attrs[A.STALLED_SILENT_NODES] == "b_2_0, c_3_0"
    assert attrs[A.STALLED_SILENT_GROUP_RANKS] == (1, 2)
    assert (attrs[A.STALLED_SILENT_SELF], attrs[A.STALLED_SILENT_SECONDS]) == (False, 4.0)
    text = describe_training_stall(
        {
            A.STALLED_SECONDS: 7.0,
            A.STALLED_WAITING: (0, 1),
            A.STALLED_COLLECTIVE: "all_reduce",
            A.STALLED_COLLECTIVE_NUMBER: 80,
            A.STALLED_PROCESS_GROUP: "0",
            **attrs,
        }
    )
    assert text == (
        "stalled 7 s in training: global ranks 0,1 wait in all_reduce #80 of process group 0; "
        "waiting for ranks on other nodes; node b_2_0, c_3_0 (group rank 1,2) sent no "
        "rendezvous keep-alive for 4 s or more: its host or link may be down"
    )
    cut = silent_nodes(members, beats, "a_1_0", 30.0, 100.0, 4.0)
    assert [(n.node, n.this_node) for n in cut] == [("a_1_0", True)]
    assert "this node reached no rendezvous store for 30 s or more" in describe_training_stall(
        {A.STALLED_SECONDS: 31.0, **silence_attributes(cut)}
    )
    assert silent_nodes(members, {"b_2_0": 99.0, "c_3_0": 99.5}, "a_1_0", 0.5, 100.0, 4.0) == []
