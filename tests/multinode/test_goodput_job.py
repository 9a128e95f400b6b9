"""Goodput (issue 22) on a real two-node torchrun job (c10d, gloo, two workers per node): 20
marked steps with a checkpoint every 5 (after steps 4, 9, 14, 19); global rank 1 fails right
after step 12 in the first attempt, and the restart resumes from the checkpoint of step 9. The
summary records and the metrics say steps 10-12 were lost, the categories add up to the wall
time, and ``elastic-otel timeline`` prints the breakdown (tests/scripts/goodput_train.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from elastic_otel.model.goodput import CATEGORIES
from elastic_otel.names import attributes as A
from tests.support.jobs import SCRIPTS, run_exported_job
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.e2e

SCRIPT = SCRIPTS / "goodput_train.py"


@dataclass
class Job:
    summaries: list[dict]
    metrics: list[dict]
    timeline: str


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    tmp_path = tmp_path_factory.mktemp("goodput")
    (tmp_path / "ckpt").mkdir()
    summaries: list[dict] = []

    def wait(receiver: OtlpReceiver) -> None:
        summaries.extend(
            receiver.wait_for_logs(
                2, timeout=30, where=lambda r: r["event_name"] == A.GOODPUT_EVENT_NAME
            )
        )
        receiver.wait_until(
            lambda: [m for m in receiver.metrics() if m["name"] == A.METRIC_GOODPUT], 10
        )

    done = run_exported_job(
        tmp_path,
        SCRIPT,
        ("--max-restarts=1",),
        wait,
        FAIL_RANK="1",
        FAIL_STEP="12",
        STEPS="20",
        CHECKPOINT_EVERY="5",
        STEP_SECONDS="0.08",
        CKPT_DIR=str(tmp_path / "ckpt"),
        ELASTIC_OTEL_STALL_AFTER="5",
    )
    return Job(
        sorted(summaries, key=lambda r: r["attributes"][A.GOODPUT_ATTEMPT]),
        done.metrics,
        done.timeline,
    )


def _categories(attrs: dict, job: bool = False) -> dict[str, float]:
    return {c: attrs[A.badput_seconds_key(c, job)] for c in CATEGORIES}


def test_one_summary_per_attempt_counted_once(job: Job) -> None:
    # only the node that ran global rank 0 reports: one record per attempt for the job
    assert [s["attributes"][A.GOODPUT_ATTEMPT] for s in job.summaries] == [0, 1]
    assert [s["attributes"][A.GOODPUT_FINAL] for s in job.summaries] == [False, True]
    assert all(s["trace_id"] and s["span_id"] for s in job.summaries)  # on the node's round


def test_the_steps_after_the_checkpoint_were_lost(job: Job) -> None:
    failed, resumed = (s["attributes"] for s in job.summaries)
    assert failed[A.GOODPUT_CHECKPOINT_STEP] == 9
    assert failed[A.GOODPUT_LAST_STEP] == 12
    assert (failed[A.GOODPUT_LOST_STEPS_FIRST], failed[A.GOODPUT_LOST_STEPS_LAST]) == (10, 12)
    lost = failed[A.BADPUT_LOST_PROGRESS_SECONDS]
    assert 3 * 0.08 <= lost < 5.0, failed  # three steps of 0.08 s and the failure's detection
    assert failed[A.BADPUT_STARTUP_SECONDS] > 0 and failed[A.BADPUT_RECOVERY_SECONDS] > 0
    assert failed[A.BADPUT_CHECKPOINT_SECONDS] > 0 and failed[A.GOODPUT_SAVES] == 2
    assert resumed[A.GOODPUT_FIRST_STEP] == 10 and resumed[A.GOODPUT_LAST_STEP] == 19
    assert A.GOODPUT_LOST_STEPS_FIRST not in resumed
    assert resumed[A.BADPUT_RECOVERY_SECONDS] > 0  # the restart's head: until step 10
    assert "steps 10-12 lost" in job.summaries[0]["body"], job.summaries[0]["body"]


def test_the_categories_add_up_to_the_wall_time(job: Job) -> None:
    for summary in job.summaries:
        attrs = summary["attributes"]
        for is_job, wall, good in (
            (False, A.GOODPUT_WALL_SECONDS, A.GOODPUT_SECONDS),
            (True, A.GOODPUT_JOB_WALL_SECONDS, A.GOODPUT_JOB_SECONDS),
        ):
            parts = attrs[good] + sum(_categories(attrs, is_job).values())
            assert parts == pytest.approx(attrs[wall], rel=0.01), attrs
    failed, resumed = (s["attributes"] for s in job.summaries)
    walls = failed[A.GOODPUT_WALL_SECONDS] + resumed[A.GOODPUT_WALL_SECONDS]
    assert resumed[A.GOODPUT_JOB_WALL_SECONDS] == pytest.approx(walls, rel=0.01)
    ratio = resumed[A.GOODPUT_JOB_RATIO]
    assert 0 < ratio < 1
    assert ratio == pytest.approx(
        resumed[A.GOODPUT_JOB_SECONDS] / resumed[A.GOODPUT_JOB_WALL_SECONDS], rel=0.01
    )


def test_metrics_count_the_job_once(job: Job) -> None:
    ratios = [m for m in job.metrics if m["name"] == A.METRIC_GOODPUT]
    assert ratios and all(m["unit"] == "1" and 0 <= m["value"] <= 1 for m in ratios)
    badput = [m for m in job.metrics if m["name"] == A.METRIC_BADPUT_DURATION]
    assert badput and all(m["unit"] == "s" and m["is_monotonic"] for m in badput)
    # the last value of each process (a cumulative sum), added over the job's processes
    last: dict[tuple, dict] = {}
    for point in sorted(badput, key=lambda m: m["time_ns"]):
        process = tuple(sorted(point["resource"].items()))
        last[(process, point["attributes"][A.BADPUT_CATEGORY])] = point
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for (_, category), point in last.items():
        totals[category] += point["value"]
    job_attrs = job.summaries[-1]["attributes"]
    for category, seconds in _categories(job_attrs, job=True).items():
        assert totals[category] == pytest.approx(seconds, rel=0.01, abs=1e-3), category


def test_the_timeline_prints_the_goodput(job: Job) -> None:
    text = job.timeline
    assert "GOODPUT" in text, text
    assert "steps 10-12 lost" in text, text
    ratio = job.summaries[-1]["attributes"][A.GOODPUT_JOB_RATIO]
    assert f"goodput {100 * ratio:.1f} %" in text, text
