"""Job attempts get their own traces: a requeued job (same job id, same ``--rdzv-id``) must not
merge its rounds into the first attempt's traces, and the first attempt's trace ids must not
depend on whether the scheduler counts attempts at all."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from elastic_otel.model.trace_ids import job_salt, trace_id_for
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from tests.support.jobs import LIGHT, job_env, span_attr, start_agent
from tests.support.otlp_receiver import OtlpReceiver, free_port

SCHEDULER_VARIABLES = (*env.SCHEDULER_JOB_ID_VARIABLES, *env.SCHEDULER_ATTEMPT_VARIABLES)


def round0_trace(environ: dict[str, str], run_id: str = "run") -> int:
    """The trace id the bridge gives round 0 of ``run_id`` in this environment."""
    return trace_id_for(job_salt(environ), run_id, 0)


SLURM = {"SLURM_JOB_ID": "4242"}


def test_first_attempt_is_no_attempt() -> None:
    assert round0_trace({**SLURM, "SLURM_RESTART_COUNT": "0"}) == round0_trace(SLURM)
    assert round0_trace({**SLURM, env.ELASTIC_OTEL_JOB_ATTEMPT: "0"}) == round0_trace(SLURM)


def test_each_attempt_has_its_own_traces() -> None:
    traces = {round0_trace({**SLURM, "SLURM_RESTART_COUNT": str(n)}) for n in range(4)}
    assert len(traces) == 4
    job = {env.ELASTIC_OTEL_JOB_ID: "my-job"}
    assert round0_trace({**job, env.ELASTIC_OTEL_JOB_ATTEMPT: "1"}) != round0_trace(job)
    # the attempt separates attempts of one job, never two jobs
    other = {"SLURM_JOB_ID": "4243", "SLURM_RESTART_COUNT": "1"}
    assert round0_trace(other) != round0_trace({**SLURM, "SLURM_RESTART_COUNT": "1"})


def test_elastic_otel_job_attempt_wins_over_the_schedulers_count() -> None:
    explicit = {**SLURM, env.ELASTIC_OTEL_JOB_ATTEMPT: "3", "SLURM_RESTART_COUNT": "1"}
    assert round0_trace(explicit) == round0_trace({**SLURM, "SLURM_RESTART_COUNT": "3"})
    # an explicit first attempt too: the scheduler's count is then not used
    first = {**SLURM, env.ELASTIC_OTEL_JOB_ATTEMPT: "0", "SLURM_RESTART_COUNT": "2"}
    assert round0_trace(first) == round0_trace(SLURM)


@pytest.mark.parametrize(
    ("value", "same_as"),
    [(" 2 ", "2"), ("2\n", "2"), (" 0 ", ""), ("", ""), ("   ", "")],
)
def test_whitespace_around_the_attempt_is_ignored(value: str, same_as: str) -> None:
    expected = {**SLURM, "SLURM_RESTART_COUNT": same_as} if same_as else SLURM
    assert round0_trace({**SLURM, "SLURM_RESTART_COUNT": value}) == round0_trace(expected)
    assert round0_trace({**SLURM, env.ELASTIC_OTEL_JOB_ATTEMPT: value}) == round0_trace(expected)


def test_blank_elastic_otel_job_attempt_falls_back_to_the_scheduler() -> None:
    blank = {**SLURM, env.ELASTIC_OTEL_JOB_ATTEMPT: "  ", "SLURM_RESTART_COUNT": "2"}
    assert round0_trace(blank) == round0_trace({**SLURM, "SLURM_RESTART_COUNT": "2"})
    assert round0_trace(blank) != round0_trace(SLURM)


# --- a real requeue: the same Slurm job, run twice ---------------------------------------------


@pytest.mark.e2e
def test_a_requeued_job_gets_new_traces(grpc_receiver: OtlpReceiver, tmp_path: Path) -> None:
    job_id = f"77{uuid.uuid4().int % 10**6}"
    run_id = f"attempts-{uuid.uuid4().hex[:6]}"
    round0: dict[str, set[str]] = {}
    for attempt in ("0", "1"):
        environ = job_env(grpc_receiver, tmp_path)
        for name in (env.ELASTIC_OTEL_JOB_ID, env.ELASTIC_OTEL_JOB_ATTEMPT, *SCHEDULER_VARIABLES):
            environ.pop(name, None)
        environ.update(SLURM_JOB_ID=job_id, SLURM_RESTART_COUNT=attempt)
        grpc_receiver.clear()
        rc, out = start_agent(environ, free_port(), run_id, nnodes="1", script=LIGHT).wait(120)
        assert rc == 0, out[-3000:]
        spans = grpc_receiver.wait_for_spans(
            3,
            timeout=20,
            where=lambda s: s["name"] in (A.SPAN_RDZV_JOIN, A.SPAN_RDZV_MEMBER, A.SPAN_WORKER),
        )
        assert {span_attr(s, A.ROUND) for s in spans if s["name"] != A.SPAN_WORKER} == {0}
        round0[attempt] = {s["trace_id"] for s in spans}
    assert len(round0["0"]) == len(round0["1"]) == 1, round0  # one trace per attempt's round
    assert round0["0"] != round0["1"]
    without_count = round0_trace({"SLURM_JOB_ID": job_id}, run_id)
    assert round0["0"] == {f"{without_count:032x}"}
