"""NCCL's own Flight Recorder record (issue 35): what an H100 returned, read through the same
reader the worker's collectives thread uses, and a real CPU job whose torch answers as a CUDA
build in a NCCL job does (the record only through NCCL's dump functions: the stand-in in
``tests/support/nccl_standin``).

The recorded dumps (``tests/data/nccl-flight-recorder/``, its README says how they were made)
are served by ``tests/support/recorded_nccl``, which answers the two NCCL dump functions with
the bytes torch returned there: the JSON as recorded, the pickle of the same record.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

from elastic_otel.model.stalls import describe_training_stall, rank_progress, training_stall
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import SCHEDULED, read_collectives
from elastic_otel.parsing.worker_progress import WorkerProgress
from tests.support.jobs import NCCL_STANDIN
from tests.support.recorded_nccl import FIXTURES, recorded, watch_of

S = 1_000_000_000


def progress() -> WorkerProgress:
    return WorkerProgress(1, 34, 0, 0, None, 0, None, None, S)


def test_completed_collectives_leave_no_group_open(tmp_path: Path) -> None:
    watch = watch_of(recorded("nccl_completed.json"), tmp_path)
    watch.poll(5 * S)
    read = read_collectives(str(tmp_path))
    assert read is not None and read.open_group() is None
    default, second = read.group("0", "nccl"), read.group("1", "nccl")
    assert default is not None and second is not None
    assert (default.issued, default.started, default.completed) == (9, 9, 9)
    assert (second.issued, second.completed, second.key) == (1, 1, "nccl:1")
    # pg_status of the pickle has ints, the JSON strings: both read the same
    pickled = pickle.loads((FIXTURES / "nccl_completed.pkl").read_bytes())
    assert {k: int(v) for k, v in pickled["pg_status"]["0"].items()} == {
        k: int(v) for k, v in recorded("nccl_completed.json")["pg_status"]["0"].items()
    }


def test_a_scheduled_collective_is_reported_as_not_reached_by_the_gpu(tmp_path: Path) -> None:
    """The all-reduce enqueued behind a busy GPU (timing events on): entry 10 ``scheduled``,
    ``last_started`` 9. The rank's own GPU has not reached it: the rank is named, not as
    waiting inside a collective."""
    watch = watch_of(recorded("nccl_scheduled.json"), tmp_path)
    watch.poll(5 * S)
    watch.poll(7 * S)  # open for the identification's half interval: the entry is read
    read = read_collectives(str(tmp_path))
    assert read is not None
    group = read.open_group()
    assert group is not None and group.backend == "nccl"
    assert (group.first_open, group.op, group.state, group.sizes) == (
        10,
        "all_reduce",
        SCHEDULED,
        ((1048576,),),
    )
    stall = training_stall([rank_progress(0, progress(), read)], 70 * S, 60 * S)
    assert stall is not None
    assert (stall.waiting, stall.waited_for, stall.not_reached) == ((), (0,), (0,))
    assert (stall.collective, stall.number, stall.group, stall.backend) == (
        "all_reduce",
        10,
        "0",
        "nccl",
    )
    assert stall.state_known
    body = describe_training_stall(
        {
            A.STALLED_SECONDS: stall.seconds,
            A.STALLED_WAITING: stall.waiting,
            A.STALLED_RANKS: stall.waited_for,
            A.STALLED_NOT_REACHED: stall.not_reached,
            A.STALLED_COLLECTIVE: stall.collective,
            A.STALLED_COLLECTIVE_NUMBER: stall.number,
            A.STALLED_PROCESS_GROUP: stall.group,
            A.STALLED_BACKEND: stall.backend,
            A.STALLED_STATE_KNOWN: stall.state_known,
        }
    )
    assert body == (
        "stalled 65 s in training; waiting for global rank 0, whose GPU has not reached "
        "all_reduce #10 of process group 0 (nccl) (scheduled: its own compute is slow or stuck)"
    )
    assert "no rank is in a collective" not in body


def test_without_timing_events_the_state_is_not_claimed(tmp_path: Path) -> None:
    """The same record as NCCL keeps it without ``TORCH_NCCL_ENABLE_TIMING`` (probe.txt: no
    start is tracked, ``last_started`` stays -1): the rank has the collective enqueued, not
    completed, and whose GPU started it is not said."""
    record = recorded("nccl_scheduled.json")
    for status in record["pg_status"].values():
        status["last_started_collective"] = "-1"
    watch = watch_of(record, tmp_path)
    watch.poll(5 * S)
    watch.poll(7 * S)
    read = read_collectives(str(tmp_path))
    assert read is not None
    group = read.open_group()
    assert group is not None and (group.op, group.state, group.started) == ("all_reduce", None, -1)
    ranks = [rank_progress(r, progress(), read) for r in (0, 1)]
    stall = training_stall(ranks, 70 * S, 60 * S)
    assert stall is not None and not stall.state_known and stall.not_reached == ()
    body = describe_training_stall(
        {
            A.STALLED_SECONDS: 69.0,
            A.STALLED_WAITING: stall.waiting,
            A.STALLED_COLLECTIVE: stall.collective,
            A.STALLED_COLLECTIVE_NUMBER: stall.number,
            A.STALLED_PROCESS_GROUP: stall.group,
            A.STALLED_BACKEND: stall.backend,
            A.STALLED_STATE_KNOWN: stall.state_known,
        }
    )
    assert body.startswith(
        "stalled 69 s in training: global ranks 0,1 have all_reduce #10 of process group 0 "
        "(nccl) enqueued, not completed; waiting for ranks on other nodes (or a local GPU"
    ), body


def test_a_dump_is_the_nccl_record_torchs_analyzer_reads(tmp_path: Path) -> None:
    watch = watch_of(recorded("nccl_completed.json"), tmp_path)
    watch.poll(5 * S, dump=True)
    dumped = pickle.loads((tmp_path / "elastic_otel_flight_recorder.pkl").read_bytes())
    assert dumped["pg_config"]["0"]["desc"] == "default_pg"
    assert len(dumped["entries"]) == 10 and dumped["comm_lib_version"] == "2.28.9"


STANDIN_JOB = """
import json, os, sys, time, torch, torch.distributed as dist
from elastic_otel.worker.collectives import CollectivesWatch
directory = sys.argv[1]
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
watch = CollectivesWatch(directory, period_s=0.5, identify_after_s=0.0)
t = torch.ones(8)
for _ in range(3):
    dist.all_reduce(t)
path = os.path.join(directory, "elastic_otel_collectives.json")
for _ in range(400):
    watch.poll(time.time_ns())
    written = json.loads(open(path).read()) if os.path.exists(path) else {"groups": []}
    nccl = [g for g in written["groups"] if g["backend"] == "nccl"]
    if nccl and all(g["issued"] == g["completed"] == 3 for g in nccl):
        break
    time.sleep(0.05)
print([r.backend for r in watch.records])
dist.destroy_process_group()  # gloo's threads joined: none left joinable at exit (abort)
"""


def test_a_job_whose_record_only_nccls_functions_hold_is_read(tmp_path: Path) -> None:
    """A real process group under the stand-in: gloo's functions return an empty record, as
    in a NCCL job; the groups are read from NCCL's, and named as NCCL's."""
    env = {**os.environ, "PYTHONPATH": NCCL_STANDIN}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", STANDIN_JOB, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - started < 120
    read = read_collectives(str(tmp_path))
    assert read is not None
    # The default group is placed in its backend's record (issued nothing) until torch's
    # status lists it: here gloo's (the stand-in's group is gloo's), empty, never does; the
    # groups come in the records' order, NCCL's first. torch at times leaves gloo's last
    # all_reduce open in its record for good (see test_collectives.py): 2 of 3 completed.
    assert [(g.name, g.backend, g.issued) for g in read.groups] == [
        ("0", "nccl", 3),
        ("0", "gloo", 0),
    ]
    assert read.groups[0].completed in (2, 3) and read.groups[1].completed == 0
