"""Slurm's identity of the job as resource attributes (``emit/scheduler_resource.py``): read from
the environment Slurm gives a job step, under what the user set, never raising."""

from __future__ import annotations

import logging

import pytest

from elastic_otel.emit import scheduler_resource as S
from elastic_otel.emit.pipeline import build_resource
from elastic_otel.names import environment_variables as env

# What Slurm 22.05 set in a job step of a two-node job (tests/slurm/ runs the real thing).
STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOBID": "4242",
    "SLURM_JOB_NAME": "train.sbatch",
    "SLURM_JOB_PARTITION": "main",
    "SLURM_CLUSTER_NAME": "eotest",
    "SLURMD_NODENAME": "eo-n2",
    "SLURM_STEP_ID": "0",
}
ALL_SLURM = (
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
    "SLURM_RESTART_COUNT", "SLURM_JOB_PARTITION", "SLURM_CLUSTER_NAME", "SLURMD_NODENAME",
    "SLURM_STEP_ID", env.ELASTIC_OTEL_SLURM_RESOURCE, "OTEL_RESOURCE_ATTRIBUTES",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ALL_SLURM:
        monkeypatch.delenv(name, raising=False)
    S._warned.clear()


def _set(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]) -> None:
    for key, value in environ.items():
        monkeypatch.setenv(key, value)


def test_a_job_step_has_its_slurm_identity() -> None:
    assert S.scheduler_attributes(STEP) == {
        "slurm.job.id": "4242",
        "slurm.job.name": "train.sbatch",
        "slurm.job.partition": "main",
        "slurm.cluster.name": "eotest",
        "slurm.node.name": "eo-n2",
        "slurm.step.id": "0",
        "slurm.job.restart_count": 0,  # unset before the first requeue: the first attempt
    }


def test_an_array_task_and_a_requeue() -> None:
    environ = {**STEP, "SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "2",
               "SLURM_RESTART_COUNT": "3"}  # fmt: skip
    attrs = S.scheduler_attributes(environ)
    assert attrs["slurm.job.array.id"] == "4240"
    assert attrs["slurm.job.array.task_id"] == "2"
    assert attrs["slurm.job.restart_count"] == 3


def test_outside_slurm_nothing() -> None:
    assert S.scheduler_attributes({}) == {}
    # a stray variable without a job id is not a Slurm job
    assert S.scheduler_attributes({"SLURMD_NODENAME": "n1", "SLURM_RESTART_COUNT": "1"}) == {}
    assert S.scheduler_attributes({"SLURM_JOB_ID": "  "}) == {}


def test_the_older_spelling_of_the_job_id() -> None:
    assert S.scheduler_attributes({"SLURM_JOBID": "17"})["slurm.job.id"] == "17"


@pytest.mark.parametrize("value", ["two", "-1", "1.5", "0x2", "\x00"])
def test_a_malformed_restart_count_is_left_out_with_a_warning(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        attrs = S.scheduler_attributes({**STEP, "SLURM_RESTART_COUNT": value})
        S.scheduler_attributes({**STEP, "SLURM_RESTART_COUNT": value})
    assert "slurm.job.restart_count" not in attrs
    assert attrs["slurm.job.id"] == "4242"  # the rest is still there
    warnings = [r.getMessage() for r in caplog.records if "SLURM_RESTART_COUNT" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per process, not per resource built
    assert "not a count" in warnings[0]


def test_whitespace_is_ignored_and_a_long_value_cut_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        attrs = S.scheduler_attributes(
            {**STEP, "SLURM_RESTART_COUNT": " 2\n", "SLURM_JOB_NAME": "x" * 1000}
        )
    assert attrs["slurm.job.restart_count"] == 2
    assert attrs["slurm.job.name"] == "x" * S.MAX_VALUE_CHARS
    assert any("SLURM_JOB_NAME" in r.getMessage() for r in caplog.records)


def test_on_every_resource_the_bridge_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(monkeypatch, {**STEP, "SLURM_RESTART_COUNT": "1"})
    attrs = build_resource().attributes
    assert attrs["slurm.job.id"] == "4242"
    assert attrs["slurm.job.restart_count"] == 1
    assert attrs["slurm.node.name"] == "eo-n2"
    assert attrs["service.name"] == "torchelastic"
    # the workers' resource (worker/training.py passes its own attributes) too
    assert build_resource({"process.pid": 1}).attributes["slurm.job.id"] == "4242"


def test_otel_resource_attributes_win(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(monkeypatch, STEP)
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "slurm.job.id=mine,slurm.job.restart_count=7,team=a"
    )
    attrs = build_resource().attributes
    assert attrs["slurm.job.id"] == "mine"
    assert attrs["slurm.job.restart_count"] == "7"  # the user's, as the SDK read it
    assert attrs["slurm.node.name"] == "eo-n2"  # what the user did not set is still there
    assert attrs["team"] == "a"


@pytest.mark.parametrize("off", ["false", "0", "off"])
def test_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch, off: str) -> None:
    _set(monkeypatch, {**STEP, env.ELASTIC_OTEL_SLURM_RESOURCE: off})
    assert not [k for k in build_resource().attributes if k.startswith("slurm.")]


def test_a_typo_in_the_switch_leaves_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(monkeypatch, {**STEP, env.ELASTIC_OTEL_SLURM_RESOURCE: "nope"})
    assert build_resource().attributes["slurm.job.id"] == "4242"


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(monkeypatch, {"SLURM_JOB_ID": "99"})
    assert S.scheduler_attributes() == {"slurm.job.id": "99", "slurm.job.restart_count": 0}


def test_undecodable_bytes_are_replaced_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # os.environ holds bytes that are not UTF-8 as lone surrogates, which no OTLP exporter
    # could encode: the whole batch would be lost
    with caplog.at_level(logging.WARNING, logger="elastic_otel"):
        attrs = S.scheduler_attributes({**STEP, "SLURM_JOB_NAME": "caf\udce9"})
    assert attrs["slurm.job.name"] == "caf\ufffd"
    attrs["slurm.job.name"].encode("utf-8")
    assert any("SLURM_JOB_NAME is not UTF-8" in r.getMessage() for r in caplog.records)
