"""torch's NCCL watchdog and NCCL's errors in a failure's story: the texts torch writes, who timed
out waiting, who never entered the collective, and what their records and spans say.

The texts are built as torch builds them; no GPU ran here. Formats, from torch's source:

- ``ProcessGroupNCCL.cpp``, ``operator<<(std::ostream&, const WorkNCCL&)`` (2.2 to 2.15):
  ``"WorkNCCL(" "SeqNum=" seq_ ", OpType=" opTypeToString(opType_) ", NumelIn=" numelIn_
  ", NumelOut=" numelOut_ ", Timeout(ms)=" opTimeout_.count() ")"``;
- ``WorkNCCL::checkTimeout`` (2.2 to 2.15): ``logPrefix() "Watchdog caught collective operation
  timeout: " *this " ran for " timeElapsed.count() " milliseconds before timing out."``, where
  the work's ``logPrefix()`` is ``"[Rank " rank_ "] "``;
- ``ProcessGroupNCCL::createLogPrefix`` (2.4 on): ``"[PG ID " local_id_ " PG GUID " pg_uid_
  "(" pg_desc_ ") Rank " rank_ "] "`` (2.3: ``"[PG " uid_ " (" desc ") Rank " rank_ "]"``);
- the watchdog's ``" failure detected by watchdog at work sequence id: " seq_ " PG status: last
  enqueued work: " ...`` (2.4 on; 2.3: ``"Exception (either an error or timeout) detected by
  watchdog at work: "``) and ``"Process group watchdog thread terminated with exception: "``;
- ``NCCLUtils.cpp``: ``getNcclErrorDetailStr`` (``"ncclRemoteError: A call failed possibly due
  to a network error or a remote process exiting prematurely."``) and ``NCCLComm::getNcclComm``
  (``"NCCL communicator was aborted on rank " rank_ ". " " Original reason for failure was: "``).

The fragments were checked against the strings of torch 2.14.1's ``libtorch_cuda.so``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from torch.distributed.elastic.events import Event, EventSource

from elastic_otel.integration.nccl_watchdog import gather_watchdog_dumps, story_from_files
from elastic_otel.model.collective_timeouts import (
    ERROR_TYPE_TIMEOUT,
    collective_attributes,
    collective_facts,
    describe,
)
from elastic_otel.model.failures import WorkerEnd, classify, root_cause
from elastic_otel.model.spans import STATUS_ERROR, SpanRecord
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.model.worker_outcomes import Ended
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from elastic_otel.parsing.collectives import CollectiveProgress, parse_collectives
from elastic_otel.parsing.nccl_errors import (
    COMMUNICATOR_ABORTED,
    NcclFailure,
    find_error,
    find_timeout,
    read_nccl_failure,
    read_tail,
)
from elastic_otel.parsing.records import AgentRecord, AttrValue
from elastic_otel.parsing.torch_events import parse_event
from elastic_otel.worker import startup


def work(seq: int, op: str = "ALLREDUCE", numel: int = 1, timeout_ms: int = 600000) -> str:
    """``WorkNCCL``'s ``operator<<``."""
    return (
        f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, "
        f"Timeout(ms)={timeout_ms})"
    )


def caught(rank: int, seq: int, ran_ms: int = 600081, **kwargs: object) -> str:
    """``WorkNCCL::checkTimeout``'s message."""
    return (
        f"[Rank {rank}] Watchdog caught collective operation timeout: {work(seq, **kwargs)}"  # type: ignore[arg-type]
        f" ran for {ran_ms} milliseconds before timing out."
    )


def pg(group: str, rank: int, desc: str | None = "default_pg", local_id: int = 0) -> str:
    """``ProcessGroupNCCL::createLogPrefix`` (2.4 on)."""
    guid = f"{group}({desc})" if desc else group
    return f"[PG ID {local_id} PG GUID {guid} Rank {rank}] "


def aborted_stderr(rank: int, seq: int, group: str = "0") -> str:
    """A worker's stderr after its watchdog timed out (torch's glog prefix, then
    ``std::terminate`` with the watchdog's exception, torch's C++ frames, faulthandler)."""
    glog = f"[rank{rank}]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:632] "
    frames = "".join(
        f"frame #{i}: <unknown function> + 0x{i:x}0 (0x7f in /torch/lib/libtorch_cuda.so)\n"
        for i in range(20)
    )
    return (
        "step 41 loss 0.12\n"
        f"{glog}{caught(rank, seq)}\n"
        f"{glog}{pg(group, rank)} failure detected by watchdog at work sequence id: {seq} PG "
        f"status: last enqueued work: {seq}, last completed work: {seq - 1}\n"
        f"{glog}[Rank {rank}] Some NCCL operations have failed or timed out. Due to the "
        "asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
        "corrupted/incomplete data.\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"  what():  {pg(group, rank)}Process group watchdog thread terminated with exception: "
        f"{caught(rank, seq)}\n"
        "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:760 (most recent call first):\n"
        f"{frames}"
        "Fatal Python error: Aborted\n\nThread 0x00007f (most recent call first):\n"
        '  File "/job/train.py", line 42 in step\n'
    )


NCCL_REMOTE_STDERR = (
    "[rank9]:[E ProcessGroupNCCL.cpp:1414] [PG 0 Rank 9] Process group watchdog thread "
    "terminated with exception: NCCL error: remote process exited or there was a network error, "
    "NCCL version 2.20.5\nncclRemoteError: A call failed possibly due to a network error or a "
    "remote process exiting prematurely.\nLast error:\nNET/IB : Got completion from peer "
    "10.5.0.34<33956> with error 5\n"
)


# --- the texts -----------------------------------------------------------------------------------


def test_a_watchdog_timeout_names_its_collective_and_its_process_group() -> None:
    found = find_timeout(aborted_stderr(1, 11, group="0"))
    assert found is not None
    assert (found.op, found.op_type, found.number) == ("all_reduce", "ALLREDUCE", 11)
    assert (found.timeout_ms, found.ran_for_ms, found.rank) == (600000, 600081, 1)
    assert (found.numel_in, found.numel_out) == (1, 1)
    assert (found.group, found.group_desc) == ("0", "default_pg")


def test_the_group_comes_from_the_watchdog_line_about_the_same_work() -> None:
    # torch 2.4 on, a subgroup without a description: "[PG ID 1 PG GUID 1 Rank 1]"
    text = (
        f"{caught(1, 57, op='ALLGATHER')}\n"
        f"{pg('1', 1, desc=None, local_id=1)} failure detected by watchdog at work sequence id:"
        " 57 PG status: last enqueued work: 57, last completed work: 56\n"
    )
    found = find_timeout(text)
    assert found is not None and (found.op, found.group, found.group_desc) == (
        "all_gather",
        "1",
        None,
    )
    # torch 2.3: "[PG 0 (default_pg) Rank 1] Exception (either an error or timeout) ..."
    text = (
        f"{caught(1, 6463)}\n[PG 0 (default_pg) Rank 1] Exception (either an error or timeout) "
        "detected by watchdog at work: 6463, last enqueued NCCL work: 6463, last completed NCCL "
        "work: 6462.\n"
    )
    found = find_timeout(text)
    assert found is not None and (found.group, found.group_desc) == ("0", "default_pg")
    # another work's line says nothing of this one
    text = f"{caught(1, 12)}\n{pg('3', 1)} failure detected by watchdog at work sequence id: 4"
    found = find_timeout(text)
    assert found is not None and found.group is None


def test_an_older_torch_without_a_group_prefix_still_names_the_collective() -> None:
    # torch 2.2: "[Rank 2] NCCL watchdog thread terminated with exception: [Rank 2] Watchdog ..."
    text = (
        f"[Rank 2] NCCL watchdog thread terminated with exception: {caught(2, 4, op='BROADCAST')}"
    )
    found = find_timeout(text)
    assert found is not None
    assert (found.op, found.number, found.group) == ("broadcast", 4, None)


def test_nccl_errors_are_named() -> None:
    assert find_error(NCCL_REMOTE_STDERR) == "ncclRemoteError"
    # ncclGetErrorString's text alone (torch's "NCCL error in: <file>:<line>, ...")
    text = "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.21.5"
    assert find_error(text) == "ncclSystemError"
    aborted = (
        "DistBackendError: NCCL communicator was aborted on rank 3.  Original reason for failure "
        "was: CUDA error: an illegal memory access was encountered"
    )
    failure = read_nccl_failure(aborted)
    assert failure == NcclFailure(
        None, COMMUNICATOR_ABORTED, "CUDA error: an illegal memory access was encountered"
    )
    # torch 2.14.1's other abort text
    assert find_error("NCCL communicator was aborted after a previous error") == (
        COMMUNICATOR_ABORTED
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=abc, OpType=ALLREDUCE",
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=, Timeout(ms)=1)",
        "WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)",
        "[PG ID x PG GUID Rank] failure detected by watchdog at work sequence id: ",
        "\x00\udcff" * 1000,
        "peer review: internal error",  # not NCCL's
    ],
)
def test_a_malformed_text_is_just_not_matched(text: str) -> None:
    assert read_nccl_failure(text, None) is None


def test_the_stderr_tail_is_read_bounded(tmp_path: Path) -> None:
    path = tmp_path / "stderr.log"
    path.write_bytes(b"x" * 100_000 + aborted_stderr(0, 3).encode())
    tail = read_tail(str(path), 4096)
    assert len(tail.encode()) <= 4096 and tail.endswith("line 42 in step\n")
    assert read_tail(str(tmp_path / "missing")) == "" and read_tail(None) == ""
    os.mkfifo(tmp_path / "fifo")
    assert read_tail(str(tmp_path / "fifo")) == ""  # never blocks on a FIFO


# --- who waited, who never came ------------------------------------------------------------------


def reading(
    pid: int, issued: int, completed: int, group: str = "0", members: tuple[int, ...] = (0, 1, 2, 3)
) -> CollectiveProgress:
    """A worker's collectives file, in the shape its collectives thread writes."""
    data = {
        "pid": pid,
        "progress_ns": 1,
        "groups": [
            {"name": group, "members": list(members), "issued": issued, "completed": completed}
        ],
    }
    progress = parse_collectives(json.loads(json.dumps(data)))
    assert progress is not None
    return progress


def timed_out(rank: int, seq: int, group: str | None = "0") -> NcclFailure:
    failure = read_nccl_failure(aborted_stderr(rank, seq, group or "0"))
    assert failure is not None and failure.timeout is not None
    if group is None:  # a text that does not name the group
        failure = read_nccl_failure(caught(rank, seq))
        assert failure is not None
    return failure


def test_the_ranks_that_timed_out_are_victims_of_the_one_that_never_entered() -> None:
    found = {r: timed_out(r, 11) for r in (0, 1, 2)}
    readings = {r: reading(100 + r, 11, 10) for r in (0, 1, 2)} | {3: reading(103, 10, 10)}
    facts = collective_facts(found, readings, range(4))
    assert facts[3].kind == A.KIND_ROOT_CAUSE and facts[3].waiting == (0, 1, 2)
    assert facts[3].timeout_s is None  # it never entered: no timeout of its own
    for rank in (0, 1, 2):
        assert facts[rank].kind == A.KIND_PEER_FAILURE
        assert facts[rank].waited_for == (3,) and facts[rank].timeout_s == 600.0
    # even stopped by its agent after the others died, it is the root cause
    ends = [WorkerEnd(r, -6, time_ns=1000 + r, kind=facts[r].kind) for r in (0, 1, 2)]
    ends.append(WorkerEnd(3, -15, stopped_by_agent=True, time_ns=5000, kind=facts[3].kind))
    assert [classify(e) for e in ends] == ["peer_failure"] * 3 + ["root_cause"]
    culprit = root_cause(ends)
    assert culprit is not None and culprit.global_rank == 3


def test_with_nobody_to_blame_the_timeout_is_a_root_cause_of_its_own() -> None:
    # every member entered #11 (an NCCL or network hang): nobody else to blame
    found = {r: timed_out(r, 11) for r in (0, 1)}
    readings = {r: reading(100 + r, 11, 10, members=(0, 1)) for r in (0, 1)}
    facts = collective_facts(found, readings, (0, 1))
    assert {facts[r].kind for r in (0, 1)} == {A.KIND_ROOT_CAUSE}
    # no readings at all (Flight Recorder off): nothing blames another rank either
    facts = collective_facts({0: timed_out(0, 11)}, {}, (0, 1))
    assert facts[0].kind == A.KIND_ROOT_CAUSE and facts[0].op == "all_reduce"


def test_a_group_with_members_on_other_nodes_may_be_held_up_there() -> None:
    found = {r: timed_out(r, 11) for r in (0, 1)}
    readings = {r: reading(100 + r, 11, 10) for r in (0, 1)}  # members 0..3, ranks 2, 3 elsewhere
    facts = collective_facts(found, readings, (0, 1))
    assert {facts[r].kind for r in (0, 1)} == {A.KIND_PEER_FAILURE}
    assert facts[0].elsewhere and facts[0].waited_for == ()


def test_the_group_a_text_does_not_name_is_the_one_the_reading_has_open() -> None:
    found = {0: timed_out(0, 7, group=None)}
    readings = {
        0: reading(100, 7, 6, group="5", members=(0, 1)),
        1: reading(101, 6, 6, "5", (0, 1)),
    }
    facts = collective_facts(found, readings, (0, 1))
    assert facts[0].group == "5" and facts[0].waited_for == (1,)
    assert facts[1].kind == A.KIND_ROOT_CAUSE


def test_nccl_errors_after_a_peer_died_are_victims() -> None:
    remote = read_nccl_failure(NCCL_REMOTE_STDERR)
    aborted = read_nccl_failure("NCCL communicator was aborted on rank 2. ")
    cuda = read_nccl_failure(
        "NCCL communicator was aborted on rank 2.  Original reason for failure was: CUDA error: "
        "an illegal memory access was encountered"
    )
    system = read_nccl_failure("NCCL error: unhandled system error")
    assert remote and aborted and cuda and system
    facts = collective_facts({0: remote, 1: aborted, 2: cuda, 3: system}, {}, range(4))
    assert facts[0].kind == facts[1].kind == A.KIND_PEER_FAILURE
    assert facts[2].kind is None and facts[3].kind is None  # errors of their own
    assert collective_attributes(facts[0]) == {A.NCCL_ERROR: "ncclRemoteError"}


def test_the_story_says_which_collective_how_long_and_who() -> None:
    found = {r: timed_out(r, 11) for r in (0, 1)}
    readings = {0: reading(100, 11, 10), 1: reading(101, 11, 10), 2: reading(102, 10, 10)}
    readings[3] = reading(103, 11, 10)
    facts = collective_facts(found, readings, range(4))
    victim = collective_attributes(facts[0])
    assert victim == {
        A.STALLED_COLLECTIVE: "all_reduce",
        A.STALLED_COLLECTIVE_NUMBER: 11,
        A.STALLED_PROCESS_GROUP: "0",
        A.NCCL_TIMEOUT_S: 600.0,
        A.STALLED_RANKS: (2,),
    }
    assert describe(victim) == (
        "timed out after 600 s in all_reduce #11 of process group 0 (NCCL watchdog), "
        "waiting for global rank 2"
    )
    assert describe(collective_attributes(facts[2])) == (
        "never entered all_reduce #11 of process group 0, in which global ranks 0, 1 timed out "
        "(NCCL watchdog)"
    )
    assert 3 not in facts  # it entered: not part of this story
    assert describe({A.NCCL_ERROR: "ncclRemoteError"}) == "NCCL error ncclRemoteError"
    assert describe({}) is None


# --- on the spans and records --------------------------------------------------------------------


def _outcome(
    state: str, rank: int, t_ms: int, code: int, attributes: dict[str, AttrValue]
) -> AgentRecord:
    """A worker outcome as the agent instrumentation sends it: the agent's own torch ``Event``
    (``_construct_event``'s shape) with the instrumentation's attributes beside it."""
    per_worker = {"local_rank": [rank], "exit_code": [code], "worker_pid": [4000 + rank]}
    md = {
        "run_id": "job-35",
        "global_rank": rank,
        "group_rank": 0,
        "state": state,
        "role": "default",
        "agent_restarts": 0,
        "hostname": "node-a",
        "metadata": json.dumps(per_worker),
    }
    event = Event(f"torchelastic.worker.status.{state}", EventSource.WORKER, t_ms, md)  # type: ignore[arg-type]
    return AgentRecord(event, {A.OBSERVED_BY: "monitor_workers", **attributes})


def test_the_culprit_is_the_error_and_the_ranks_that_timed_out_say_whom_they_waited_for() -> None:
    found = {r: timed_out(r, 11) for r in (0, 1, 2)}
    readings = {r: reading(100 + r, 11, 10) for r in (0, 1, 2)} | {3: reading(103, 10, 10)}
    facts = collective_facts(found, readings, range(4))
    model = TraceModel(salt="s")
    spans: list[SpanRecord] = []
    records = [_outcome("START", r, 1000 + r, 0, {}) for r in range(4)]
    records.append(  # the root cause first, as the instrumentation sends them
        _outcome(
            "FAILED",
            3,
            700_000,
            -15,
            {A.FAILURE_KIND: "root_cause", **collective_attributes(facts[3])},
        )
    )
    records += [
        _outcome(
            "PEER_FAILED",
            r,
            600_100 + r,
            -6,
            {A.FAILURE_KIND: "peer_failure", **collective_attributes(facts[r])},
        )
        for r in (0, 1, 2)
    ]
    for record in records:
        spans += model.process(parse_event(record, 0)).spans
    workers = {s.attributes[A.GLOBAL_RANK]: s for s in spans if s.name == A.SPAN_WORKER}

    culprit = workers[3]
    assert culprit.status == STATUS_ERROR
    assert culprit.attributes[A.ERROR_TYPE] == ERROR_TYPE_TIMEOUT  # not its SIGTERM
    assert culprit.status_message == (
        "never entered all_reduce #11 of process group 0, in which global ranks 0, 1, 2 timed "
        "out (NCCL watchdog)"
    )
    assert culprit.attributes[A.STALLED_COLLECTIVE_NUMBER] == 11
    for rank in (0, 1, 2):
        victim = workers[rank]
        assert victim.status != STATUS_ERROR and A.ERROR_TYPE not in victim.attributes
        assert victim.attributes[A.END_REASON] == (
            "its collective timed out waiting for a peer: timed out after 600 s in all_reduce "
            "#11 of process group 0 (NCCL watchdog), waiting for global rank 3"
        )
        assert victim.attributes[A.STALLED_COLLECTIVE] == "all_reduce"
        assert victim.attributes[A.STALLED_PROCESS_GROUP] == "0"
        assert [link.span_id for link in victim.links] == [culprit.span_id]


def test_a_timeout_with_nobody_to_blame_says_so_on_its_error() -> None:
    facts = collective_facts({0: timed_out(0, 11)}, {}, (0,))
    model = TraceModel(salt="s")
    spans: list[SpanRecord] = []
    attributes = {A.FAILURE_KIND: "root_cause", **collective_attributes(facts[0])}
    for record in (_outcome("START", 0, 1000, 0, {}), _outcome("FAILED", 0, 9000, -6, attributes)):
        spans += model.process(parse_event(record, 0)).spans
    (worker,) = [s for s in spans if s.name == A.SPAN_WORKER]
    assert worker.attributes[A.ERROR_TYPE] == ERROR_TYPE_TIMEOUT
    assert worker.status_message == (
        "timed out after 600 s in all_reduce #11 of process group 0 (NCCL watchdog)"
    )


# --- the agent's side: the workers' files ---------------------------------------------------------


def _attempt(tmp_path: Path, ranks: range) -> tuple[dict[int, str], dict[int, str | None]]:
    """An attempt directory as torch's ``DefaultLogsSpecs`` lays it out: ``<rank>/`` each."""
    attempt = tmp_path / "run" / "attempt_0"
    directories: dict[int, str] = {}
    stderrs: dict[int, str | None] = {}
    for rank in ranks:
        directory = attempt / str(rank)
        directory.mkdir(parents=True)
        directories[rank] = str(directory)
        stderrs[rank] = str(directory / "stderr.log")
    return directories, stderrs


def _write_reading(directory: str, pid: int, issued: int) -> None:
    data = {
        "pid": pid,
        "progress_ns": 1,
        "groups": [{"name": "0", "members": [0, 1, 2], "issued": issued, "completed": 10}],
    }
    Path(directory, env.WORKER_COLLECTIVES_FILE).write_text(json.dumps(data))


def test_the_agent_reads_the_story_from_the_workers_files(tmp_path: Path) -> None:
    directories, stderrs = _attempt(tmp_path, range(3))
    for rank in (0, 1):
        Path(stderrs[rank] or "").write_text(aborted_stderr(rank, 11))
        _write_reading(directories[rank], 100 + rank, 11)
    _write_reading(directories[2], 102, 10)  # stuck before #11; its agent stopped it
    for rank in range(3):  # torch's dump on the timeout, every rank told to dump
        Path(directories[rank], f"{env.WORKER_NCCL_DUMP_PREFIX}{rank}").write_bytes(b"\x80\x04")
    ended: Ended = {
        0: (WorkerEnd(0, -6, time_ns=10), None),
        1: (WorkerEnd(1, -6, time_ns=11), None),
        2: (WorkerEnd(2, -15, stopped_by_agent=True, time_ns=20), None),
    }
    pids = {0: 100, 1: 101, 2: 102}
    updated, attributes = story_from_files(directories, stderrs, ended, pids)
    assert [classify(updated[r][0]) for r in range(3)] == [
        "peer_failure",
        "peer_failure",
        "root_cause",
    ]
    assert attributes[2][A.STALLED_WAITING] == (0, 1)
    assert attributes[0][A.STALLED_RANKS] == (2,)
    dumps = attributes[0][A.FLIGHT_RECORDER_DUMP]
    assert isinstance(dumps, str) and dumps == attributes[2][A.FLIGHT_RECORDER_DUMP]
    assert Path(dumps).parent.name == "flight_recorder"
    assert Path(dumps).name.startswith("watchdog-")
    assert sorted(os.listdir(dumps)) == ["rank_0", "rank_1", "rank_2"]
    # a reading of another process (a worker of before) is not this worker's
    updated, _ = story_from_files(directories, stderrs, ended, {0: 100, 1: 101, 2: 999})
    assert classify(updated[2][0]) == "stopped"


def test_a_failure_without_nccl_in_it_is_left_as_it_was(tmp_path: Path) -> None:
    directories, stderrs = _attempt(tmp_path, range(2))
    Path(stderrs[0] or "").write_text("Traceback ...\nRuntimeError: the loss is NaN\n")
    ended: Ended = {
        0: (WorkerEnd(0, 1, exception_type="RuntimeError", message="the loss is NaN"), None)
    }
    assert story_from_files(directories, stderrs, ended, {}) == (ended, {})
    assert gather_watchdog_dumps(directories) is None
    assert not (tmp_path / "run" / "attempt_0" / "flight_recorder").exists()


def test_the_exception_a_worker_raised_is_read_too(tmp_path: Path) -> None:
    # Python saw the watchdog's error (a wait on the work): DistBackendError with its text
    directories, stderrs = _attempt(tmp_path, range(1))
    end = WorkerEnd(0, 1, exception_type="torch.distributed.DistBackendError", message=caught(0, 5))
    ended: Ended = {0: (end, None)}
    updated, attributes = story_from_files(directories, stderrs, ended, {})
    assert attributes[0][A.STALLED_COLLECTIVE_NUMBER] == 5
    assert classify(updated[0][0]) == "root_cause"  # nobody to blame on record


# --- the worker start-up: where torch writes its dump -------------------------------------------


def test_the_worker_start_up_points_torchs_dump_into_the_workers_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in env.TORCH_DUMP_FILE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    startup._keep_nccl_dumps(str(tmp_path))
    prefix = os.environ[env.TORCH_NCCL_DEBUG_INFO_TEMP_FILE]
    assert prefix == os.path.join(str(tmp_path), env.WORKER_NCCL_DUMP_PREFIX)
    assert startup._keep_nccl_dumps in startup.FEATURES


@pytest.mark.parametrize("variable", env.TORCH_DUMP_FILE_VARIABLES)
def test_the_users_own_dump_location_is_left_alone(
    variable: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in env.TORCH_DUMP_FILE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "/scratch/fr_trace_")
    startup._keep_nccl_dumps(str(tmp_path))
    assert os.environ[variable] == "/scratch/fr_trace_"
    others = [n for n in env.TORCH_DUMP_FILE_VARIABLES if n != variable]
    assert all(name not in os.environ for name in others)
