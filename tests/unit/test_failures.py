"""Root cause or victim (elastic_otel.model.failures): the decision, from the facts an agent has."""

from __future__ import annotations

import json
import signal

import pytest
from torch.distributed.elastic.events import Event, EventSource

from elastic_otel.model.failures import (
    WorkerEnd,
    classify,
    describe,
    error_type,
    is_peer_failure,
    root_cause,
)
from elastic_otel.model.logs import to_log
from elastic_otel.model.spans import SPAN_TEXT_LIMIT, STATUS_ERROR, SpanRecord
from elastic_otel.model.trace_model import TraceModel
from elastic_otel.names import attributes as A
from elastic_otel.parsing.torch_events import parse_event

# What gloo's and NCCL's collectives raise on a rank whose peer died (torch 2.13, gloo over
# TCP; NCCL's text from ProcessGroupNCCL's ncclRemoteError).
GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:15771. This is typically caused by a remote worker crashing. Check the "
    "logs of the remote worker before reporting an error. GLHF! 🏖️"
)
GLOO_RESET = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error [127.0.0.1]:52836: "
    "Connection reset by peer"
)
NCCL_REMOTE = (
    "NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network "
    "error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error "
    "or a remote process exiting prematurely."
)


@pytest.mark.parametrize("message", [GLOO_CLOSED, GLOO_RESET, NCCL_REMOTE])
def test_a_collective_that_lost_its_peer_is_a_victim(message: str) -> None:
    end = WorkerEnd(2, 1, exception_type="RuntimeError", message=message)
    assert is_peer_failure("RuntimeError", message)
    assert classify(end) == A.KIND_PEER_FAILURE


@pytest.mark.parametrize(
    ("exception_type", "message"),
    [
        ("RuntimeError", "injected failure: the loss is NaN"),
        ("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB"),
        ("ValueError", "peer review pending"),  # "peer" alone says nothing
        # a peer of another kind: the dataset server, not a rank of the job
        ("ConnectionResetError", "[Errno 104] Connection reset by peer"),
        (None, None),  # exit 1 and nothing said: a suspect, never assumed a victim
    ],
)
def test_an_error_of_its_own_is_a_root_cause(
    exception_type: str | None, message: str | None
) -> None:
    assert classify(WorkerEnd(1, 1, exception_type=exception_type, message=message)) == (
        A.KIND_ROOT_CAUSE
    )


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGTERM])
def test_a_signal_its_agent_did_not_send_is_a_root_cause(sig: signal.Signals) -> None:
    assert classify(WorkerEnd(1, -sig)) == A.KIND_ROOT_CAUSE


@pytest.mark.parametrize("code", [-signal.SIGTERM, -signal.SIGKILL, 1])
def test_a_worker_that_ended_while_its_agent_stopped_the_group_was_stopped(code: int) -> None:
    end = WorkerEnd(0, code, stopped_by_agent=True, message=GLOO_CLOSED)
    assert classify(end) == A.KIND_STOPPED


def test_the_root_cause_is_the_earliest_failure_of_its_own() -> None:
    ends = [
        WorkerEnd(0, 1, exception_type="RuntimeError", message=GLOO_CLOSED, time_ns=100),
        WorkerEnd(3, -signal.SIGKILL, time_ns=300),
        WorkerEnd(1, -signal.SIGSEGV, time_ns=200),
        WorkerEnd(2, -signal.SIGTERM, stopped_by_agent=True, time_ns=50),
    ]
    root = root_cause(ends)
    assert root is not None and root.global_rank == 1
    # ties go to the lowest rank; nothing but victims: no root cause here
    assert root_cause([WorkerEnd(5, 1, time_ns=7), WorkerEnd(4, 1, time_ns=7)]).global_rank == 4  # type: ignore[union-attr]
    assert root_cause([ends[0], ends[3]]) is None


def test_error_type_and_the_status_message_name_what_killed_it() -> None:
    assert error_type(-9, None) == "SIGKILL"
    assert error_type(-11, "ignored: the signal is what killed it") == "SIGSEGV"
    assert error_type(1, "RuntimeError") == "RuntimeError"
    assert error_type(3, None) == "exit_code_3"
    assert error_type(None, None) == "_OTHER"
    assert error_type(-200, None) == "signal_200"
    assert describe(-9) == "killed by SIGKILL"
    assert describe(-9, oom_kill=True) == "killed by SIGKILL (the kernel's OOM killer)"
    assert describe(-11) == "segmentation fault (SIGSEGV)"
    assert describe(-6) == "aborted (SIGABRT)"
    assert describe(1, "RuntimeError: boom\nmore") == "RuntimeError: boom"
    assert describe(2) == "exit code 2"


# --- the trace model: what a root cause and its victims look like as spans and records ----------


def _worker_event(
    state: str, rank: int, t_ms: int, exit_code: int | None = None, **metadata: object
) -> Event:
    """A worker event shaped as the agent instrumentation builds it (torch's
    ``_construct_event`` plus its own keys)."""
    per_worker = {"local_rank": [rank % 2], "exit_code": [exit_code], "worker_pid": [4000 + rank]}
    md: dict[str, object] = {
        "run_id": "job-18",
        "global_rank": rank,
        "group_rank": rank // 2,
        "state": state,
        "role": "default",
        "agent_restarts": 0,
        "hostname": "node-a",
        "metadata": json.dumps(per_worker),
        **metadata,
    }
    return Event(f"torchelastic.worker.status.{state}", EventSource.WORKER, t_ms, md)  # type: ignore[arg-type]


def _raw(message: str, stack: str) -> str:
    return json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": stack}}})


def _fault_stack(depth: int) -> str:
    frames = [f'  File "/job/model.py", line {100 + i} in layer_{i}' for i in range(depth)]
    return (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call "
        'first):\n  File "/job/train.py", line 42 in fail\n' + "\n".join(frames) + "\n"
    )


def test_only_the_root_cause_is_an_error_and_the_victims_link_to_it() -> None:
    model = TraceModel(salt="s")
    spans: list[SpanRecord] = []
    logs = []
    stack = _fault_stack(200)  # far past what a span attribute keeps
    events = [
        *(_worker_event("START", rank, 1000 + rank) for rank in (0, 1, 2)),
        _worker_event(
            "FAILED",
            1,
            5000,
            -11,
            raw_error=_raw("Fatal Python error: Segmentation fault", stack),
            **{"failure.kind": "root_cause", "observed_by": "monitor_workers"},
        ),
        _worker_event(
            "PEER_FAILED",
            2,
            5100,
            1,
            raw_error=_raw(f"RuntimeError: {GLOO_CLOSED}", "Traceback ...\nRuntimeError: x"),
            **{"failure.kind": "peer_failure"},
        ),
        _worker_event("STOPPED", 0, 5200, -15, stopped_after=1, **{"failure.kind": "stopped"}),
    ]
    for event in events:
        out = model.process(parse_event(event, event.timestamp * 1_000_000))
        spans += out.spans
        logs += out.logs
    workers = {s.attributes[A.GLOBAL_RANK]: s for s in spans if s.name == A.SPAN_WORKER}

    culprit = workers[1]
    assert culprit.status == STATUS_ERROR
    assert culprit.status_message == "segmentation fault (SIGSEGV)"
    assert culprit.attributes[A.ERROR_TYPE] == "SIGSEGV"
    assert culprit.attributes[A.PROCESS_EXIT_CODE] == -11
    (exc,) = [e for e in culprit.events if e.name == "exception"]
    kept = str(exc.attributes[A.EXCEPTION_STACKTRACE])
    assert len(kept.encode()) <= SPAN_TEXT_LIMIT
    assert 'train.py", line 42 in fail' in kept  # the innermost frame survives
    assert "layer_199" not in kept  # the outermost are the ones left out

    peer, stopped = workers[2], workers[0]
    assert peer.status != STATUS_ERROR and A.ERROR_TYPE not in peer.attributes
    assert peer.attributes[A.STATE] == "PEER_FAILED"
    assert peer.attributes[A.END_REASON].startswith("its collective failed after a peer died: ")
    assert "Connection closed by peer" in peer.attributes[A.END_REASON]
    assert stopped.status != STATUS_ERROR and stopped.attributes[A.STATE] == "STOPPED"
    for victim in (peer, stopped):
        assert [link.span_id for link in victim.links] == [culprit.span_id]

    records = {
        log.event.global_rank: to_log(log.event) for log in logs if log.event.state != "START"
    }
    assert records[1].body == stack  # the whole stack, on the log record
    assert records[1].severity_text == "ERROR"
    assert records[2].severity_text == "WARN"
    assert records[0].severity_text == "INFO"
