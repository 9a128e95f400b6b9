"""NCCL timing by default (issue 41), without a GPU: the decision (``ELASTIC_OTEL_NCCL_TIMING``)
made by the worker's own reader on NCCL's record as an H100 returned it, turned on through
torch's real ``ProcessGroup._enable_collectives_timing`` of a gloo group in this process; what
the reports say on one node and in torch's watchdog window, from what an H200 recorded
(``tests/data/nccl-watchdog-h200/``, its README says how); who is the root cause when the
ranks die of the timeout.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic_otel.cli.otlp_json_reader import read_otlp_json
from elastic_otel.integration.training_watch import WatchedWorker, _with_watchdog
from elastic_otel.model.collective_timeouts import collective_attributes as timeout_attrs
from elastic_otel.model.collective_timeouts import collective_facts, describe
from elastic_otel.model.stalls import (
    describe_nccl_timing,
    describe_training_stall,
    rank_progress,
    stall_attributes,
    timing_attributes,
    training_stall,
)
from elastic_otel.names import attributes as A
from elastic_otel.parsing.collectives import (
    SCHEDULED,
    STARTED,
    CollectiveProgress,
    GroupProgress,
    NcclTiming,
    read_collectives,
)
from elastic_otel.parsing.nccl_errors import read_nccl_failure
from elastic_otel.parsing.worker_progress import WorkerProgress
from elastic_otel.worker import nccl_timing
from elastic_otel.worker.collectives import CollectivesWatch, _enable_timing
from elastic_otel.worker.records.nccl import NcclRecord
from tests.support.recorded_nccl import RecordedExtension, recorded

S = 1_000_000_000
H200 = Path(__file__).resolve().parents[1] / "data" / "nccl-watchdog-h200"


@pytest.fixture(scope="module")
def gloo_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real process group named ``0`` in this process (gloo, one rank), so that turning
    timing on goes through torch's own call."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _record(issued: int, completed: int, started: int = -1) -> dict[str, Any]:
    """The H100's record of its default group with the status moved on."""
    record = copy.deepcopy(recorded("nccl_completed.json"))
    record["pg_status"] = {
        "0": {
            "last_enqueued_collective": str(issued),
            "last_started_collective": str(started),
            "last_completed_collective": str(completed),
        }
    }
    return record


def _switch(**env: str) -> nccl_timing.TimingSwitch:
    environ = {k: v for k, v in os.environ.items() if "NCCL_TIMING" not in k}
    environ.pop("TORCH_NCCL_ENABLE_TIMING", None)
    environ.update(env)
    return nccl_timing.arm(environ)


def _watch(tmp_path: Path, switch: nccl_timing.TimingSwitch) -> tuple[Any, RecordedExtension]:
    extension = RecordedExtension(_record(1, 1))
    watch = CollectivesWatch(str(tmp_path), 1.0, 1.0, records=[NcclRecord(extension)])
    watch.timing = switch
    return watch, extension


def _decide(tmp_path: Path, rate: float, switch: nccl_timing.TimingSwitch) -> CollectiveProgress:
    """Feed the worker's watch a record whose default group issues ``rate`` collectives a
    second for six seconds after its first completed."""
    watch, extension = _watch(tmp_path, switch)
    for second in range(7):
        issued = 1 + round(rate * second)
        extension.record = _record(issued, issued)
        watch.poll((10 + second) * S)
    found = read_collectives(str(tmp_path))
    assert found is not None
    return found


def test_the_modes_and_what_the_job_set() -> None:
    environ: dict[str, str] = {"ELASTIC_OTEL_NCCL_TIMING": "true"}
    forced = nccl_timing.arm(environ)
    assert environ["TORCH_NCCL_ENABLE_TIMING"] == "1"  # before torch makes its groups
    assert forced.decision == NcclTiming(True, "forced")
    job = nccl_timing.arm({"ELASTIC_OTEL_NCCL_TIMING": "true", "TORCH_NCCL_ENABLE_TIMING": "0"})
    assert job.decision == NcclTiming(False, "set_by_job")  # the job's own setting wins
    # torch's own words for on: "t" is on, "on" is not (torch refuses it)
    for word, on in (("T", True), ("yes", True), ("on", False)):
        set_by_job = nccl_timing.arm({"TORCH_NCCL_ENABLE_TIMING": word})
        assert set_by_job.decision == NcclTiming(on, "set_by_job"), word
    assert nccl_timing.arm({"ELASTIC_OTEL_NCCL_TIMING": "off"}).decision == NcclTiming(
        False, "forced"
    )
    auto = nccl_timing.arm({})
    assert auto.mode == "auto" and auto.decision is None
    assert nccl_timing.timing_mode({"ELASTIC_OTEL_NCCL_TIMING": "sometimes"}) == "auto"


def test_a_rate_within_the_budget_turns_timing_on_through_torch(
    tmp_path: Path, gloo_group: Any
) -> None:
    """100 collectives/s x 9 µs = 0.09 %: on, for the group torch knows as ``0``, from its
    next collective; the group torch does not know (``1``) is left alone."""
    found = _decide(tmp_path, 100.0, _switch())
    timing = found.nccl_timing
    assert timing is not None and timing.on and timing.reason == "within_budget"
    assert timing.rate == pytest.approx(100.0, rel=0.05) and timing.cost_us == 9.0
    assert timing.share_percent == pytest.approx(0.09, rel=0.05)
    group = found.group("0", "nccl")
    # Decided at the fifth second, when the group had issued 501: timed from the next one.
    assert group is not None and group.timed_from == 502
    # A collective enqueued before the switch never gets a start event: no state claimed.
    hung = dataclasses.replace(group, issued=502, completed=500, started=-1)
    assert (hung.state_of(501), hung.state_of(502)) == (None, SCHEDULED)
    assert dataclasses.replace(hung, started=502).state_of(502) == STARTED


def test_a_rate_over_the_budget_leaves_timing_off(tmp_path: Path, gloo_group: Any) -> None:
    """800 collectives/s (DDP's 8 all-reduces per 10 ms step): 0.72 % > 0.5 %."""
    found = _decide(tmp_path, 800.0, _switch())
    timing = found.nccl_timing
    assert timing is not None and not timing.on and timing.reason == "over_budget"
    group = found.group("0", "nccl")
    assert group is not None and group.timed_from == 0
    text = describe_nccl_timing(timing_attributes(timing))
    assert text == "off: 800 collectives/s x 9.0 µs = 0.72 % of wall time, over the 0.5 % budget"
    # A larger budget takes it.
    assert _decide(tmp_path, 800.0, _switch(ELASTIC_OTEL_NCCL_TIMING_BUDGET="1")).nccl_timing
    again = read_collectives(str(tmp_path))
    assert again is not None and again.nccl_timing is not None and again.nccl_timing.on


def test_measuring_then_a_torch_that_cannot_at_run_time(tmp_path: Path) -> None:
    """Until the rate is measured the worker says so; where torch has no process group to
    turn timing on for (none in this process here), it stays off and says why."""
    watch, extension = _watch(tmp_path, _switch())
    watch.enable_timing = _enable_timing if not _initialized() else (lambda name: False)
    watch.poll(10 * S)
    first = read_collectives(str(tmp_path))
    assert first is not None and first.nccl_timing == NcclTiming(False, "measuring")
    for second in range(1, 7):
        extension.record = _record(1 + 10 * second, 1 + 10 * second)
        watch.poll((10 + second) * S)
    found = read_collectives(str(tmp_path))
    assert found is not None and found.nccl_timing is not None
    assert (found.nccl_timing.on, found.nccl_timing.reason) == (False, "not_at_run_time")


def _initialized() -> bool:
    import sys

    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    return c10d is not None and c10d.is_initialized()


def test_gloo_alone_makes_no_decision(tmp_path: Path) -> None:
    """A job with no NCCL group says nothing of NCCL timing."""
    switch = _switch()
    groups = [{"name": "0", "backend": "gloo", "issued": 5, "completed": 5, "timed_from": 0}]
    assert not switch.observe(10 * S, groups, lambda name: True)
    assert switch.decision is None


# --- the reports -------------------------------------------------------------------------------


def _h200_records(name: str) -> list[dict[str, Any]]:
    return read_otlp_json(H200 / name)[1]


def _h200_rank0(timing: NcclTiming | None, state: str | None = None) -> CollectiveProgress:
    """Global rank 0 of the H200 job as its collectives file had it in the hang: the
    watchdog's line says "last enqueued work: 168, last completed work: 160"; one rank, so
    the default group's only member."""
    group = GroupProgress(
        "0", (0,), 168, 160, 1, "all_reduce", ((16781312,),), "nccl", -1, state, 0
    )
    return CollectiveProgress(100, 1 * S, (group,), 0, nccl_timing=timing)


def _progress() -> WorkerProgress:
    return WorkerProgress(100, 20, 0, 0, None, 0, None, None, S)


def test_the_h200_hang_on_one_node_never_points_at_other_nodes() -> None:
    """What the bridge said on the H200 (hang.jsonl, timing off): "waiting for ranks on other
    nodes" of a job of one node. The same reading now says the group is all here."""
    said = [r for r in _h200_records("hang.jsonl") if r["event_name"] == "torchelastic.stalled"]
    assert any("waiting for ranks on other nodes" in r["body"] for r in said)
    timing = NcclTiming(False, "over_budget", 816.0, 0.7344, 0.5, 9.0)
    reading = _h200_rank0(timing)
    stall = training_stall([rank_progress(0, _progress(), reading)], 13 * S, 10 * S, [0])
    assert stall is not None and stall.local_group and not stall.state_known
    body = describe_training_stall(stall_attributes(stall))
    assert body == (
        "stalled 12 s in training: global ranks 0 have all_reduce #161 of process group 0"
        " (nccl) enqueued, not completed; every member of the group is on this node and none of"
        " their GPUs has finished it: without NCCL timing the record cannot tell which GPU"
        " stopped (NCCL timing off: 816 collectives/s x 9.0 µs = 0.73 % of wall time, over"
        " the 0.5 % budget)"
    ), body


def test_the_h200_busy_gpu_with_timing_is_named() -> None:
    """hangtime.jsonl: with timing the record had #161 ``scheduled``: the rank is named."""
    said = [r for r in _h200_records("hangtime.jsonl") if r["event_name"] == "torchelastic.stalled"]
    assert any("whose GPU has not reached all_reduce #161" in r["body"] for r in said)
    reading = _h200_rank0(NcclTiming(True, "within_budget", 200.0, 0.18, 0.5, 9.0), SCHEDULED)
    reading = CollectiveProgress(
        reading.pid,
        reading.progress_ns,
        (GroupProgress("0", (0,), 168, 160, 1, "all_reduce", (), "nccl", 160, SCHEDULED, 1),),
        0,
        nccl_timing=reading.nccl_timing,
    )
    stall = training_stall([rank_progress(0, _progress(), reading)], 13 * S, 10 * S, [0])
    assert stall is not None and stall.not_reached == (0,) and stall.waited_for == (0,)
    body = describe_training_stall(stall_attributes(stall))
    assert "waiting for global rank 0, whose GPU has not reached all_reduce #161" in body, body
    assert "other nodes" not in body and "NCCL timing" not in body, body


def test_a_report_in_the_watchdogs_window_says_torch_timed_it_out(tmp_path: Path) -> None:
    """timeout.jsonl: torch's watchdog timed #161 out after 10 s and took the rank down 60 s
    later; the bridge's report at 65 s still said "enqueued, not completed" alone. The
    worker's stderr, as the H200's was, now puts the watchdog in the report."""
    lines = [
        r["body"]
        for r in _h200_records("timeout.jsonl")
        if isinstance(r.get("body"), str) and r["body"].startswith("[rank0]:")
    ]
    assert any("Watchdog caught collective operation timeout" in line for line in lines)
    stderr = tmp_path / "stderr.log"
    stderr.write_text("\n".join(lines[:3]) + "\n")
    reading = _h200_rank0(NcclTiming(False, "over_budget", 816.0, 0.7344, 0.5, 9.0))
    stall = training_stall([rank_progress(0, _progress(), reading)], 66 * S, 60 * S, [0])
    assert stall is not None
    watched = WatchedWorker(0, 0, 100, str(tmp_path), None, stderr=str(stderr))
    stall = _with_watchdog(stall, [watched])
    assert stall.timed_out == (0,) and stall.timeout_s == 10.0
    body = describe_training_stall(stall_attributes(stall))
    assert (
        "; torch's NCCL watchdog timed it out after 10 s on global rank 0 and is dumping its"
        " Flight Recorder before it aborts the rank"
    ) in body, body


def _timed_out_reading(rank: int, state: str) -> CollectiveProgress:
    started = 11 if state == STARTED else 10
    group = GroupProgress("0", (0, 1, 2, 3), 11, 10, 1, "all_reduce", (), "nccl", started, state, 1)
    return CollectiveProgress(100 + rank, S, (group,), 0)


def test_ranks_that_died_of_the_timeout_blame_the_gpu_that_never_started_it() -> None:
    """Four ranks of one node time out in all_reduce #11 (the H200's watchdog line, its
    sequence number moved): rank 2's GPU never started it (timing on), so rank 2 is the root
    cause and the three that waited inside it are its victims, not four root causes."""
    line = next(
        r["body"]
        for r in _h200_records("timeout.jsonl")
        if "Watchdog caught collective operation timeout" in str(r.get("body"))
    ).replace("SeqNum=161", "SeqNum=11")
    failure = read_nccl_failure(line)
    assert failure is not None and failure.timeout is not None
    found = dict.fromkeys(range(4), failure)
    readings = {r: _timed_out_reading(r, SCHEDULED if r == 2 else STARTED) for r in range(4)}
    facts = collective_facts(found, readings, range(4))
    assert facts[2].kind == A.KIND_ROOT_CAUSE and facts[2].not_reached == (2,)
    assert {facts[r].kind for r in (0, 1, 3)} == {A.KIND_PEER_FAILURE}
    assert all(facts[r].waited_for == (2,) for r in (0, 1, 3))
    assert describe(timeout_attrs(facts[2])) == (
        "timed out after 10 s in all_reduce #11 of process group 0 (NCCL watchdog): its GPU"
        " never started it (scheduled: its own compute is slow or stuck)"
    )
    assert describe(timeout_attrs(facts[0])) == (
        "timed out after 10 s in all_reduce #11 of process group 0 (NCCL watchdog), waiting"
        " for global rank 2, whose GPU never started it"
    )
    # Without timing nothing tells them apart: each is a root cause of its own, as before.
    untimed = {
        r: CollectiveProgress(100 + r, S, (replace_state(readings[r]),), 0) for r in range(4)
    }
    assert {f.kind for f in collective_facts(found, untimed, range(4)).values()} == {
        A.KIND_ROOT_CAUSE
    }


def replace_state(reading: CollectiveProgress) -> GroupProgress:
    return dataclasses.replace(reading.groups[0], started=-1, state=None, timed_from=0)


def test_a_collective_the_gpu_starts_is_no_progress(tmp_path: Path) -> None:
    """A peer's GPU starting the all-reduce it then waits in (``last_started_collective``
    moving on) must not restart the stall's clock: the rank still waits."""
    record = recorded("nccl_scheduled.json")  # #10 enqueued behind a busy GPU, not started
    extension = RecordedExtension(record)
    watch = CollectivesWatch(str(tmp_path), 1.0, 1.0, records=[NcclRecord(extension)])
    watch.poll(5 * S)
    first = read_collectives(str(tmp_path))
    assert first is not None and first.progress_ns == 5 * S
    started = copy.deepcopy(record)
    started["pg_status"]["0"]["last_started_collective"] = "10"
    extension.record = started
    watch.poll(9 * S)
    then = read_collectives(str(tmp_path))
    assert then is not None and then.group("0", "nccl") is not None
    assert then.group("0", "nccl").started == 10  # type: ignore[union-attr]
    assert then.progress_ns == 5 * S  # still waiting since the first reading


# --- a job stuck in its first steps (issue 46) -------------------------------------------------


def _stuck(tmp_path: Path, switch: nccl_timing.TimingSwitch, worked_s: int) -> CollectiveProgress:
    """The worker's watch on a default group that completes 10 collectives a second for
    ``worked_s`` seconds after its first, then waits in the next one (#``10 * worked_s + 2``,
    enqueued, never completed) for the rest of 12 seconds."""
    watch, extension = _watch(tmp_path, switch)
    for second in range(13):
        done = 1 + 10 * min(second, worked_s)
        extension.record = _record(done + 1 if second >= worked_s else done, done)
        watch.poll((10 + second) * S)
    found = read_collectives(str(tmp_path))
    assert found is not None
    return found


def test_a_stall_in_a_collective_enqueued_before_timing_came_on_says_so(
    tmp_path: Path, gloo_group: Any
) -> None:
    """The job worked for 3 s, then hung in all_reduce #32 before ``auto`` decided (5 s after
    its first collective): timing came on from #33, so #32 never gets a start event. The report
    says ``on`` and why the record still cannot tell whose GPU started #32, never "without NCCL
    timing" (what a stand-in job stuck at step 5 said in 8 reports of 8)."""
    reading = _stuck(tmp_path, _switch(), worked_s=3)
    timing, group = reading.nccl_timing, reading.group("0", "nccl")
    assert timing is not None and timing.on and timing.reason == "within_budget"
    assert group is not None and (group.issued, group.completed, group.timed_from) == (32, 31, 33)
    stall = training_stall([rank_progress(0, _progress(), reading)], 22 * S, 3 * S, [0, 1])
    assert stall is not None and not stall.state_known and stall.number == 32
    attrs = stall_attributes(stall)
    assert (attrs[A.NCCL_TIMING], attrs[A.NCCL_TIMING_FROM]) == ("on", 33)
    body = describe_training_stall(attrs)
    assert body == (
        "stalled 9 s in training: global ranks 0 have collective #32 of process group 0 (nccl)"
        " enqueued, not completed; every member of the group is on this node and none of their"
        " GPUs has finished it: NCCL timing came on from collective #33, after this one (#32) was"
        " enqueued, so the record cannot tell which GPU stopped (ELASTIC_OTEL_NCCL_TIMING=true"
        " times from the first)"
    ), body
    # A group with members on other nodes: the same, in that report's words.
    spread = dataclasses.replace(stall, local_group=False)
    assert describe_training_stall(stall_attributes(spread)).endswith(
        "; waiting for ranks on other nodes (or a local GPU: NCCL timing came on from collective"
        " #33, after this one (#32) was enqueued, so the record cannot say whose GPU started it;"
        " ELASTIC_OTEL_NCCL_TIMING=true times from the first)"
    )
    # A collective enqueued after the switch is timed: the report names no missing timing.
    timed = dataclasses.replace(stall, number=33, state_known=True)
    assert A.NCCL_TIMING_FROM not in stall_attributes(timed)


def test_timing_on_from_the_start_leaves_nothing_to_explain(tmp_path: Path) -> None:
    """``ELASTIC_OTEL_NCCL_TIMING=true``: every collective is timed (``timed_from`` 1)."""
    reading = _stuck(tmp_path, _switch(ELASTIC_OTEL_NCCL_TIMING="true"), worked_s=3)
    group = reading.group("0", "nccl")
    assert group is not None and group.timed_from == 1
    stall = training_stall([rank_progress(0, _progress(), reading)], 22 * S, 3 * S, [0, 1])
    assert stall is not None and A.NCCL_TIMING_FROM not in stall_attributes(stall)


def test_a_window_in_which_no_collective_completed_decides_nothing(
    tmp_path: Path, gloo_group: Any
) -> None:
    """Stuck in its second collective from the start: 0 collectives a second is no rate.
    The worker keeps measuring and says why; it decides once collectives complete again."""
    switch = _switch()
    reading = _stuck(tmp_path, switch, worked_s=0)
    timing = reading.nccl_timing
    assert timing == NcclTiming(False, "measuring", 0.0, None, 0.5, 9.0), timing
    group = reading.group("0", "nccl")
    assert group is not None and group.timed_from == 0
    text = describe_nccl_timing(timing_attributes(timing))
    assert text == "off: still measuring the collective rate (none completed while it measured)"
    stall = training_stall([rank_progress(0, _progress(), reading)], 22 * S, 3 * S, [0, 1])
    assert stall is not None
    assert describe_training_stall(stall_attributes(stall)).endswith(
        " (NCCL timing off: still measuring the collective rate (none completed while it measured))"
    )
    # It works again from the 23rd second: a window later, decided on what it measured.
    groups = [{"name": "0", "backend": "nccl", "issued": 2, "completed": 1, "timed_from": 0}]
    for second in range(23, 29):
        groups[0].update(issued=2 + 20 * (second - 22), completed=1 + 20 * (second - 22))
        switch.observe(second * S, groups, lambda name: True)
    decided = switch.decision
    assert decided is not None and decided.reason == "within_budget"
    assert decided.rate == pytest.approx(20.0, rel=0.3)


def test_the_decision_says_the_cost_per_collective_it_was_reckoned_with() -> None:
    """The configured cost, not one derived from a rounded share (which read "0.0 µs" at a
    rate of 0, and "8.9 µs" for 9); a slow job's rate is not rounded to 0."""
    timing = NcclTiming(True, "within_budget", 0.4, 0.0004, 0.5, 9.0)
    assert describe_nccl_timing(timing_attributes(timing)) == (
        "on: 0.4 collectives/s x 9.0 µs = 0.0004 % of wall time, within the 0.5 % budget"
    )
    assert timing_attributes(timing)[A.NCCL_TIMING_COST_US] == 9.0
    cheap = NcclTiming(True, "within_budget", 3.6, 0.0032, 0.5, 9.0)
    assert describe_nccl_timing(timing_attributes(cheap)).startswith(
        "on: 3.6 collectives/s x 9.0 µs = 0.003 % of wall time"
    )
    # A record from before the cost was carried: derived from the share, as before.
    older = {k: v for k, v in timing_attributes(cheap).items() if k != A.NCCL_TIMING_COST_US}
    assert " x 8.9 µs = " in describe_nccl_timing(older)
