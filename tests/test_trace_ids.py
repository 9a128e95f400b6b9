"""trace_ids: the trace id every node of a round derives alone, and the salt that separates jobs.

(The attempt part of the salt is tested in tests/test_job_attempts.py.)
"""

from __future__ import annotations

import logging

import pytest

from elastic_otel.trace_ids import TraceIds, job_salt, trace_id_for


@pytest.mark.parametrize(
    ("environ", "salt"),
    [
        ({}, ""),
        ({"ELASTIC_OTEL_JOB_ID": "  my-job "}, "my-job"),
        ({"ELASTIC_OTEL_JOB_ID": "x", "SLURM_JOB_ID": "5"}, "x"),
        ({"ELASTIC_OTEL_JOB_ID": "  ", "SLURM_JOB_ID": "5"}, "SLURM_JOB_ID=5"),
        ({"LSB_JOBID": "7", "PBS_JOBID": "8.pbs"}, "LSB_JOBID=7"),
        ({"PBS_JOBID": "8.pbs", "FLUX_JOB_ID": "f1"}, "PBS_JOBID=8.pbs"),
        ({"FLUX_JOB_ID": "f1"}, "FLUX_JOB_ID=f1"),
    ],
)
def test_salt_precedence(environ: dict[str, str], salt: str) -> None:
    assert job_salt(environ) == salt


def test_every_node_derives_the_same_id_and_rounds_and_jobs_differ() -> None:
    one = trace_id_for("job-a", "run", 3)
    assert one == trace_id_for("job-a", "run", 3)  # another process, another host: same id
    others = {
        trace_id_for("job-a", "run", 4),
        trace_id_for("job-b", "run", 3),
        trace_id_for("job-a", "run2", 3),
        trace_id_for("job-a", "run", "restart-3"),
    }
    assert one not in others and len(others) == 4
    assert 0 < one < 2**128


def test_separators_cannot_be_forged_by_the_parts() -> None:
    # "a\x00b" + "c" must not collide with "a" + "b\x00c"
    assert trace_id_for("a\x00b", "c", 0) != trace_id_for("a", "b\x00c", 0)


def test_lone_surrogates_in_a_run_id_still_give_an_id() -> None:
    assert trace_id_for("", "run-\ud800", 0) > 0


def test_missing_salt_with_run_id_none_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    ids = TraceIds("")
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        first = ids("none", 0)
        ids("none", 1)
        ids("none", 2)
    warnings = [r for r in caplog.records if "no job id is set" in r.getMessage()]
    assert len(warnings) == 1 and "ELASTIC_OTEL_JOB_ID" in warnings[0].getMessage()
    assert first == trace_id_for("", "none", 0)


@pytest.mark.parametrize(("salt", "run_id"), [("job", "none"), ("", "my-run")])
def test_no_warning_when_jobs_are_told_apart(
    salt: str, run_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        TraceIds(salt)(run_id, 0)
    assert not [r for r in caplog.records if "no job id is set" in r.getMessage()]
