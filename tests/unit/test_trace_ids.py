"""trace_ids: the trace id every node of a round derives alone, and the salt that separates jobs.

(The attempt part of the salt is tested in tests/e2e/test_job_attempts.py.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from elastic_otel.model import trace_ids
from elastic_otel.model.trace_ids import SaltWarning, TraceIds, job_salt, trace_id_for
from elastic_otel.names import environment_variables as env

JOB_VARIABLES = (env.ELASTIC_OTEL_JOB_ID, *env.SCHEDULER_JOB_ID_VARIABLES)


def test_the_documented_precedence() -> None:
    assert JOB_VARIABLES == (
        "ELASTIC_OTEL_JOB_ID",
        "SLURM_JOB_ID",
        "LSB_JOBID",
        "PBS_JOBID",
        "FLUX_JOB_ID",
    )


@pytest.mark.parametrize(
    ("environ", "salt"),
    [
        ({}, ""),
        ({"ELASTIC_OTEL_JOB_ID": "  my-job \n"}, "my-job"),  # the user's id, as is
        ({"ELASTIC_OTEL_JOB_ID": "a b"}, "a b"),  # inner whitespace is part of the id
        (dict.fromkeys(JOB_VARIABLES, "7"), "7"),
        ({"ELASTIC_OTEL_JOB_ID": " \t", "SLURM_JOB_ID": "5"}, "SLURM_JOB_ID=5"),  # blank: unset
        (
            {"SLURM_JOB_ID": "5", "LSB_JOBID": "6", "PBS_JOBID": "7", "FLUX_JOB_ID": "8"},
            "SLURM_JOB_ID=5",
        ),
        ({"SLURM_JOB_ID": " ", "LSB_JOBID": "6", "PBS_JOBID": "7"}, "LSB_JOBID=6"),
        ({"LSB_JOBID": "", "PBS_JOBID": " 8.pbs ", "FLUX_JOB_ID": "f1"}, "PBS_JOBID=8.pbs"),
        ({"PBS_JOBID": "\n", "FLUX_JOB_ID": " ƒABC "}, "FLUX_JOB_ID=ƒABC"),
        ({"SLURM_JOB_ID": "  ", "FLUX_JOB_ID": "\t"}, ""),
        ({"SLURM_JOBID": "5", "LSF_JOBID": "6"}, ""),  # look-alikes are not read
    ],
)
def test_salt_precedence_and_whitespace(environ: dict[str, str], salt: str) -> None:
    assert job_salt(environ) == salt


def test_scheduler_ids_cannot_pass_for_one_another_or_for_the_users_id() -> None:
    salts = {job_salt({name: "42"}) for name in JOB_VARIABLES}
    assert len(salts) == len(JOB_VARIABLES)


def test_salt_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*JOB_VARIABLES, *env.SCHEDULER_ATTEMPT_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PBS_JOBID", " 99.server ")
    assert job_salt() == "PBS_JOBID=99.server"
    monkeypatch.setenv("ELASTIC_OTEL_JOB_ID", "mine")
    assert job_salt() == "mine"


def test_every_node_derives_the_same_id_and_rounds_and_jobs_differ() -> None:
    one = trace_id_for("job-a", "run", 3)
    trace_id_for.cache_clear()  # another process, another host: computed again, the same id
    assert one == trace_id_for("job-a", "run", 3)
    others = {
        trace_id_for("job-a", "run", 4),
        trace_id_for("job-b", "run", 3),
        trace_id_for("job-a", "run2", 3),
        trace_id_for("job-a", "run", "3"),  # a restart key is not a round number
        trace_id_for("", "run", 3),
    }
    assert one not in others and len(others) == 5
    ids = {trace_id_for("job", "run", r) for r in range(1000)}
    assert len(ids) == 1000 and all(0 < i < 2**128 for i in ids)


def test_separators_cannot_be_forged_by_the_parts() -> None:
    # "a\x00b" + "c" must not collide with "a" + "b\x00c", nor "a|b" + "c" with "a" + "b|c"
    assert trace_id_for("a\x00b", "c", 0) != trace_id_for("a", "b\x00c", 0)
    assert trace_id_for('a", "b', "c", 0) != trace_id_for("a", 'b", "c', 0)


def test_lone_surrogates_in_a_run_id_still_give_an_id() -> None:
    assert trace_id_for("", "run-\ud800", 0) > 0
    assert trace_id_for("", "run-\ud800", 0) != trace_id_for("", "run-\ud801", 0)


@pytest.fixture
def zero_digest(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """blake2b answering all zeros: the one digest OTel cannot use as a trace id."""

    class Zero:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def digest(self) -> bytes:
            return bytes(16)

    trace_id_for.cache_clear()  # ids computed before must not answer for the patched hash
    monkeypatch.setattr(trace_ids.hashlib, "blake2b", Zero)
    yield
    trace_id_for.cache_clear()  # nor the zero id for anyone after (monkeypatch undoes the rest)


def test_a_zero_digest_still_gives_a_valid_trace_id(zero_digest: None) -> None:
    assert trace_id_for("s", "r", 0) == 1  # 0 is OTel's invalid trace id


def test_missing_salt_with_run_id_none_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    ids = TraceIds("")
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        first = ids("none", 0)
        ids("none", 1)
        ids("", 2)
    warnings = [r for r in caplog.records if "no job id is set" in r.getMessage()]
    assert len(warnings) == 1
    assert (
        warnings[0].levelno == logging.WARNING
        and warnings[0].name == "elastic_otel.model.trace_ids"
    )
    assert (
        "'none'" in warnings[0].getMessage() and "ELASTIC_OTEL_JOB_ID" in warnings[0].getMessage()
    )
    assert first == trace_id_for("", "none", 0)  # the warning changes nothing about the id


def test_an_empty_run_id_warns_too(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        SaltWarning().check("", "")
    assert [r for r in caplog.records if "run_id is ''" in r.getMessage()]


def test_each_salt_warning_warns_once_on_its_own(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        one, two = SaltWarning(), SaltWarning()
        for _ in range(3):
            one.check("", "none")
            two.check("", "none")
    assert len([r for r in caplog.records if "no job id is set" in r.getMessage()]) == 2


@pytest.mark.parametrize(("salt", "run_id"), [("job", "none"), ("job", ""), ("", "my-run")])
def test_no_warning_when_jobs_are_told_apart(
    salt: str, run_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        TraceIds(salt)(run_id, 0)
    assert not [r for r in caplog.records if "no job id is set" in r.getMessage()]
