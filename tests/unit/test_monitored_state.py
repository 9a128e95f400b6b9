"""What a monitor's result reports (``integration/agent_observer.py``), on torch's own
``RunResult`` and ``ProcessFailure``: ``ft_launcher``'s agent says ``UNHEALTHY`` while some
workers failed and the others still run, and looks again once it stopped them; each worker's
end is reported once, the first look's as the attempt's failure."""

from __future__ import annotations

from pathlib import Path

from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from elastic_otel.integration.agent_observer import AgentState, monitored_state
from elastic_otel.model.failures import WorkerEnd
from elastic_otel.model.worker_outcomes import Ended


def failure(tmp_path: Path, local_rank: int, exitcode: int) -> ProcessFailure:
    return ProcessFailure(local_rank, 4000 + local_rank, exitcode, str(tmp_path / "none.json"))


def test_unhealthy_with_failures_is_a_failure(tmp_path: Path) -> None:
    some_failed = RunResult(state=WorkerState.UNHEALTHY, failures={1: failure(tmp_path, 1, 1)})
    assert monitored_state(some_failed) == "FAILED"
    assert monitored_state(RunResult(state=WorkerState.UNHEALTHY)) == "UNHEALTHY"
    assert monitored_state(RunResult(state=WorkerState.HEALTHY)) == "HEALTHY"
    assert monitored_state(RunResult(state=WorkerState.FAILED)) == "FAILED"
    assert monitored_state(None) == ""


def test_each_end_is_reported_once() -> None:
    state = AgentState()
    first_look: Ended = {1: (WorkerEnd(global_rank=1, exit_code=1), None)}
    new, first = state.unreported(first_look)
    assert (list(new), first) == ([1], True)
    second_look: Ended = {**first_look, 0: (WorkerEnd(global_rank=0, exit_code=-15), None)}
    new, first = state.unreported(second_look)
    assert (list(new), first) == ([0], False)
    assert state.unreported(second_look)[0] == {}
