"""Goodput accounting (elastic_otel.model.goodput): pure, no torch; and the worker's calls."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elastic_otel.model import goodput as g
from elastic_otel.names import attributes as A
from elastic_otel.names import environment_variables as env
from elastic_otel.parsing import worker_progress as wp
from elastic_otel.parsing.worker_progress import WorkerProgress, read_progress
from elastic_otel.worker import progress

S = 1_000_000_000_000  # a start, in ns
SEC = 1_000_000_000


def reading(**fields: object) -> WorkerProgress:
    base: dict[str, object] = dict(
        pid=1,
        stack_signal=0,
        entered=0,
        completed=0,
        collective=None,
        since_ns=S,
        step=None,
        step_ns=None,
        progress_ns=S,
    )
    base.update(fields)
    return WorkerProgress(**base)  # type: ignore[arg-type]


def t(seconds: float) -> int:
    return S + int(seconds * SEC)


def steps_record(
    first_step: int, last_step: int, checkpoint_step: int | None, **times: float
) -> WorkerProgress:
    return reading(
        step=last_step,
        step_ns=t(times["last"]),
        progress_ns=t(times.get("progress", times["last"])),
        first_step=first_step,
        first_step_ns=t(times["first"]),
        checkpoint_step=checkpoint_step,
        checkpoint_ns=t(times["checkpoint"]) if checkpoint_step is not None else None,
        save_ns=int(times.get("saves", 0) * SEC),
        saves=1 if times.get("saves") else 0,
    )


def adds_up(b: g.Breakdown) -> None:
    assert b.productive_s + sum(b.badput_s.values()) == pytest.approx(b.wall_s, abs=1e-9)


def test_a_failed_attempt_loses_the_steps_after_its_checkpoint() -> None:
    # agent start 0; first step 2 s; checkpoint (step 9) saved at 6 s after a 0.5 s save;
    # step 12 at 8 s; death at 8.4 s; recovery from 9 s
    record = steps_record(0, 12, 9, first=2, last=8, checkpoint=6, saves=0.5)
    facts = g.AttemptFacts(0, S, t(9), g.combine([record]), restarted=True, failure_ns=t(8.4))
    b = g.account(facts)
    adds_up(b)
    assert b.wall_s == pytest.approx(9)
    assert b.badput_s[A.BADPUT_STARTUP] == pytest.approx(2)
    assert b.badput_s[A.BADPUT_CHECKPOINT] == pytest.approx(0.5)
    assert b.productive_s == pytest.approx(3.5)  # 2 → 6 less the save
    assert b.badput_s[A.BADPUT_LOST_PROGRESS] == pytest.approx(2.4)  # 6 → 8.4
    assert b.badput_s[A.BADPUT_RECOVERY] == pytest.approx(0.6)  # 8.4 → 9
    assert b.lost_steps == (10, 12)
    assert "steps 10-12 lost" in g.describe(b)


def test_the_attempt_that_ends_the_job_keeps_its_steps() -> None:
    record = steps_record(10, 19, 19, first=3, last=8, checkpoint=8.2, saves=0.2)
    facts = g.AttemptFacts(1, S, t(9), g.combine([record]), restarted=False)
    b = g.account(facts)
    adds_up(b)
    assert b.badput_s[A.BADPUT_RECOVERY] == pytest.approx(3)  # a later attempt's head
    assert b.productive_s == pytest.approx(5.0)  # 3 → 8.2 less the save
    assert b.badput_s[A.BADPUT_UNEXPLAINED] == pytest.approx(0.8)
    assert b.badput_s[A.BADPUT_LOST_PROGRESS] == 0 and b.lost_steps is None


def test_without_a_checkpoint_a_restart_loses_the_whole_attempt_after_its_first_step() -> None:
    record = steps_record(10, 14, None, first=1, last=4)
    b = g.account(g.AttemptFacts(1, S, t(5), g.combine([record]), True, t(4.5)))
    adds_up(b)
    assert b.productive_s == 0
    assert b.badput_s[A.BADPUT_LOST_PROGRESS] == pytest.approx(3.5)
    assert b.lost_steps == (10, 14)


def test_an_attempt_without_steps_is_start_up_then_recovery() -> None:
    b = g.account(g.AttemptFacts(0, S, t(5), g.combine([reading()]), True, t(3)))
    adds_up(b)
    assert b.badput_s[A.BADPUT_STARTUP] == pytest.approx(3)
    assert b.badput_s[A.BADPUT_RECOVERY] == pytest.approx(2)
    b = g.account(g.AttemptFacts(0, S, t(5), g.combine([]), False))
    assert b.badput_s[A.BADPUT_STARTUP] == pytest.approx(5) and b.productive_s == 0


def test_the_demo_s_first_attempt_is_start_up_on_the_node_of_rank_0() -> None:
    # rank 0 marked no step; its peer's worker failed, its own was stopped when its agent
    # began the restart at 6.7 s: its agent knows no failure time of its own
    ledger = g.GoodputLedger(S, stall_after_ns=0)
    ledger.begin([0])
    summary = ledger.end(t(6.7), [reading(entered=3, progress_ns=t(2))], restarted=True)
    assert summary.reporter and summary.facts.failure_ns is None
    b = summary.attempt
    adds_up(b)
    assert b.badput_s[A.BADPUT_STARTUP] == pytest.approx(6.7)
    assert b.badput_s[A.BADPUT_RECOVERY] == 0
    assert "startup 100.0 %" in g.describe(b) and "recovery" not in g.describe(b)
    attrs = summary.attributes()
    assert attrs[A.BADPUT_STARTUP_SECONDS] == pytest.approx(6.7)
    assert attrs[A.BADPUT_RECOVERY_SECONDS] == 0


def test_a_failure_on_the_node_without_rank_0_is_start_up_until_it_on_both_nodes() -> None:
    # two nodes, no step marked: rank 1's worker dies at 4 s, its agent restarts at 4.5 s; the
    # node of rank 0 learns of it when its agent restarts, at 5 s
    failing, reporting = g.GoodputLedger(S), g.GoodputLedger(S)
    failing.begin([1])
    reporting.begin([0])
    lost = failing.end(t(4.5), [reading()], restarted=True, failure_ns=t(4))
    seen = reporting.end(t(5), [reading()], restarted=True)
    assert not lost.reporter and seen.reporter
    adds_up(lost.attempt)
    adds_up(seen.attempt)
    assert lost.attempt.badput_s[A.BADPUT_STARTUP] == pytest.approx(4)
    assert lost.attempt.badput_s[A.BADPUT_RECOVERY] == pytest.approx(0.5)  # the detection
    assert seen.attempt.badput_s[A.BADPUT_STARTUP] == pytest.approx(5)
    assert seen.attempt.badput_s[A.BADPUT_RECOVERY] == 0
    assert failing.reported.wall_s == 0 and reporting.reported.wall_s == pytest.approx(5)


def test_a_failure_before_any_step_then_a_later_attempt_keeps_its_rules() -> None:
    ledger = g.GoodputLedger(S)
    ledger.begin([0, 1])
    first = ledger.end(t(3), [reading(), reading(pid=2)], restarted=True, failure_ns=t(2.2))
    assert first.attempt.badput_s[A.BADPUT_STARTUP] == pytest.approx(2.2)
    assert first.attempt.badput_s[A.BADPUT_RECOVERY] == pytest.approx(0.8)
    assert first.attempt.productive_s == 0 and first.attempt.lost_steps is None
    # the restarted attempt fails before a step too: recovery from its start
    ledger.begin([0, 1])
    second = ledger.end(t(7), [reading()], restarted=True, failure_ns=t(6))
    assert second.attempt.badput_s[A.BADPUT_STARTUP] == 0
    assert second.attempt.badput_s[A.BADPUT_RECOVERY] == pytest.approx(4)
    # the last one trains and ends the job
    ledger.begin([0, 1])
    last = ledger.end(t(12), [steps_record(0, 9, 9, first=8, last=11, checkpoint=11)], False)
    assert last.attempt.badput_s[A.BADPUT_RECOVERY] == pytest.approx(1)  # 7 → its first step
    assert last.attempt.productive_s == pytest.approx(3)
    for summary in (first, second, last):
        adds_up(summary.attempt)
        adds_up(summary.job)
    job = ledger.job()
    assert job.wall_s == pytest.approx(12)
    assert job.badput_s[A.BADPUT_STARTUP] == pytest.approx(2.2)
    assert job.badput_s[A.BADPUT_RECOVERY] == pytest.approx(0.8 + 4 + 1)
    assert job.productive_s == pytest.approx(3)


def test_stalls_are_taken_from_where_they_fall() -> None:
    record = steps_record(0, 12, 9, first=1, last=8, checkpoint=5, progress=8)
    stalls = ((t(2), t(3)), (t(8), t(20)))  # one while training, one until the failure
    facts = g.AttemptFacts(0, S, t(21), g.combine([record]), True, t(20), stalls)
    b = g.account(facts)
    adds_up(b)
    assert b.badput_s[A.BADPUT_STALL] == pytest.approx(13)
    assert b.productive_s == pytest.approx(3)  # 1 → 5 less 1 s stalled
    assert b.badput_s[A.BADPUT_LOST_PROGRESS] == pytest.approx(3)  # 5 → 8


def test_points_out_of_order_are_clamped_and_still_add_up() -> None:
    record = steps_record(5, 3, 4, first=9, last=2, checkpoint=30, saves=100)
    for restarted in (True, False):
        facts = g.AttemptFacts(0, t(1), t(10), g.combine([record]), restarted, t(0))
        b = g.account(facts)
        adds_up(b)
        assert b.wall_s == pytest.approx(9)
        assert all(v >= 0 for v in b.badput_s.values()) and b.productive_s >= 0
    backwards = g.account(g.AttemptFacts(0, t(5), t(1), g.combine([record]), False))
    assert backwards.wall_s == 0


def test_local_ranks_combine_into_the_job_s_steps() -> None:
    a = steps_record(0, 12, 9, first=2, last=8, checkpoint=6, saves=0.5)
    b = steps_record(0, 11, 9, first=2.1, last=7.5, checkpoint=6.1, saves=0.7)
    steps = g.combine([a, b])
    assert (steps.first_step, steps.first_step_ns) == (0, t(2))
    assert (steps.last_step, steps.last_step_ns) == (12, t(8))
    assert (steps.checkpoint_step, steps.checkpoint_ns) == (9, t(6))
    assert steps.save_ns == int(0.7 * SEC)


def test_stall_tracker_needs_after_without_progress() -> None:
    tracker = g.StallTracker(2 * SEC)
    tracker.observe(t(0), t(0), training=True)
    tracker.observe(t(1), t(0.5), training=True)
    tracker.observe(t(3), t(0.5), training=True)  # 2.5 s without progress: a stall
    tracker.observe(t(4), t(3.8), training=True)  # it ended
    tracker.observe(t(5), t(4.5), training=True)
    tracker.close(t(5.5))
    assert tracker.intervals == [(t(0.5), t(3.8))]
    off = g.StallTracker(0)
    off.observe(t(0), t(0), True)
    off.close(t(100))
    assert off.intervals == []


def test_ledger_reports_once_and_sums_the_job() -> None:
    ledger = g.GoodputLedger(S, stall_after_ns=0)
    ledger.begin([0, 1])
    first = ledger.end(t(9), [steps_record(0, 12, 9, first=2, last=8, checkpoint=6)], True, t(8.4))
    assert first.reporter and not first.final and first.facts.attempt == 0
    ledger.begin([2, 3])  # the other node runs global rank 0 now
    assert not ledger.reporter
    live = ledger.live(t(12), [steps_record(10, 11, None, first=11, last=11.5)])
    assert live.wall_s == pytest.approx(2.5) and live.productive_s == pytest.approx(0.5)
    last = ledger.end(t(14), [steps_record(10, 19, 19, first=11, last=13, checkpoint=13)], False)
    assert last.final and not last.reporter and last.facts.resumed_from == 9
    job = ledger.job()
    adds_up(job)
    assert job.wall_s == pytest.approx(14)
    assert last.job.wall_s == pytest.approx(14)
    assert ledger.reported.wall_s == pytest.approx(9)  # only what this node reported
    attrs = last.attributes()
    assert attrs[A.GOODPUT_ATTEMPT] == 1 and attrs[A.GOODPUT_FINAL] is True
    assert attrs[A.GOODPUT_JOB_WALL_SECONDS] == pytest.approx(14)
    assert A.GOODPUT_LOST_STEPS_FIRST not in attrs
    assert first.attributes()[A.GOODPUT_LOST_STEPS_FIRST] == 10
    keys = [A.badput_seconds_key(c) for c in g.CATEGORIES]
    assert keys[0] == A.BADPUT_STARTUP_SECONDS and keys[-1] == A.BADPUT_UNEXPLAINED_SECONDS
    assert sum(attrs[k] for k in keys) + attrs[A.GOODPUT_SECONDS] == pytest.approx(5)  # type: ignore[operator]


# --- the worker's calls and its record --------------------------------------------------------


@pytest.fixture
def armed(tmp_path: Path):  # type: ignore[no-untyped-def]
    progress.arm(str(tmp_path / env.WORKER_PROGRESS_FILE))
    yield tmp_path
    progress._disarm()


def test_marks_reach_the_record(armed: Path) -> None:
    assert (armed / env.WORKER_PROGRESS_FILE).stat().st_size == wp.FULL_SIZE
    progress.mark_checkpoint(0)  # before any step: marked, no save time counted
    with progress.saving_checkpoint(0):
        pass
    progress.mark_step(3)
    progress.mark_step(4)
    with progress.saving_checkpoint(4):
        pass
    with pytest.raises(OSError), progress.saving_checkpoint(5):
        raise OSError("disk full")  # a save that failed covers nothing
    progress.mark_checkpoint("not a step")  # type: ignore[arg-type]
    record = read_progress(str(armed))
    assert record is not None
    assert (record.first_step, record.step, record.checkpoint_step) == (3, 4, 4)
    assert record.first_step_ns is not None and record.checkpoint_ns is not None
    assert record.first_step_ns <= record.checkpoint_ns
    assert record.saves == 1 and record.save_ns > 0


def test_unarmed_calls_do_nothing() -> None:
    assert not progress.armed()
    progress.mark_checkpoint(3)
    with progress.saving_checkpoint(3) as context:
        assert context is progress._NOT_SAVING
    import elastic_otel

    assert elastic_otel.mark_checkpoint is progress.mark_checkpoint
    assert elastic_otel.saving_checkpoint is progress.saving_checkpoint


def test_a_record_without_the_extension_or_a_bad_one_still_reads(tmp_path: Path) -> None:
    path = tmp_path / env.WORKER_PROGRESS_FILE
    header = wp.HEADER.pack(wp.MAGIC, wp.VERSION, 7, 0)
    body = dict.fromkeys(wp.BODY_FIELDS, 0) | {"step": 5, "step_ns": 9, "seq": 2}
    record = header + wp.BODY.pack(*(body[k] for k in wp.BODY_FIELDS))
    path.write_bytes(record)
    old = read_progress(str(tmp_path))
    assert old is not None and old.step == 5 and old.first_step is None
    ext = dict.fromkeys(wp.EXTENSION_FIELDS, 0) | {"first_step": 1, "first_step_ns": 3}
    for magic, expected in ((wp.EXTENSION_MAGIC, 1), (b"XXXX", None)):
        data = wp.EXTENSION_HEADER.pack(magic, wp.EXTENSION_VERSION)
        data += wp.EXTENSION_BODY.pack(*(ext[k] for k in wp.EXTENSION_FIELDS))
        path.write_bytes(record + data)
        got = read_progress(str(tmp_path))
        assert got is not None and got.step == 5 and got.first_step == expected
    odd = dict(ext, ext_seq=3)  # a writer killed mid-update: the extension reads as absent
    path.write_bytes(
        record
        + wp.EXTENSION_HEADER.pack(wp.EXTENSION_MAGIC, wp.EXTENSION_VERSION)
        + wp.EXTENSION_BODY.pack(*(odd[k] for k in wp.EXTENSION_FIELDS))
    )
    got = read_progress(str(tmp_path))
    assert got is not None and got.first_step is None
    os.truncate(path, wp.FULL_SIZE - 8)
    assert read_progress(str(tmp_path)) is None


# --- the timeline, the dashboard ---------------------------------------------------------------


def _summary_record(summary: g.Summary, run_id: str = "run-1") -> dict:
    from elastic_otel.model.goodput import describe_summary

    attrs = {**summary.attributes(), A.RUN_ID: run_id}
    return {
        "event_name": A.GOODPUT_EVENT_NAME,
        "attributes": attrs,
        "body": describe_summary(attrs),
        "trace_id": "ab" * 16,
        "span_id": "cd" * 8,
        "time_ns": summary.facts.end_ns,
    }


def test_the_timeline_states_goodput_per_attempt_and_in_total() -> None:
    from elastic_otel.cli.timeline.analysis.goodput import goodput_records
    from elastic_otel.cli.timeline.render.goodput import goodput_html, goodput_lines

    ledger = g.GoodputLedger(S)
    ledger.begin([0])
    first = ledger.end(t(9), [steps_record(0, 12, 9, first=2, last=8, checkpoint=6)], True, t(8.4))
    ledger.begin([0])
    last = ledger.end(t(14), [steps_record(10, 19, 19, first=11, last=13, checkpoint=13)], False)
    records = [_summary_record(first), _summary_record(last), {"event_name": "other"}]
    items = goodput_records(records)
    assert [i.attempt for i in items] == [0, 1]
    assert items[0].breakdown.lost_ns == (t(6), t(8.4))
    text = "\n".join(goodput_lines(items))
    assert f"GOODPUT · run run-1 · goodput {100 * last.job.ratio:.1f} % of 14.0 s" in text
    assert "steps 10-12 lost" in text and "total" in text
    assert "LOST_PROGRESS" in text
    page = goodput_html(items)
    assert '<table class="goodput">' in page and "10-12" in page
    assert "steps 10-12 lost" in records[0]["body"] and "Job so far" in records[0]["body"]


def test_the_dashboard_shows_goodput_and_badput() -> None:
    import json

    root = Path(__file__).resolve().parents[2]
    path = root / "examples/compose/grafana/dashboards/torchelastic-rendezvous.json"
    panels = json.loads(path.read_text())["panels"]
    queries = " ".join(t.get("expr", "") for p in panels for t in p.get("targets", []))
    # the Prometheus names of the gauge (unit 1) and of the counter (unit s)
    assert "torchelastic_goodput_ratio" in queries
    assert "torchelastic_badput_duration_seconds_total" in queries
    assert "torchelastic_badput_category" in queries


@pytest.mark.parametrize("first", [2, None])
def test_a_job_that_failed_with_no_restart_left_tears_down_it_recovers_nothing(
    first: float | None,
) -> None:
    """Issue 36: the time from the failure (8.4 s) to the job's end (9 s) is its teardown."""
    if first is None:
        steps = g.Steps()  # no step marked
    else:
        steps = g.combine([steps_record(0, 12, 9, first=2, last=8, checkpoint=6, saves=0.5)])
    facts = g.AttemptFacts(0, S, t(9), steps, restarted=True, failure_ns=t(8.4), final=True)
    b = g.account(facts)
    adds_up(b)
    assert b.badput_s[A.BADPUT_RECOVERY] == 0
    assert b.badput_s[A.BADPUT_TEARDOWN] == pytest.approx(0.6)


def test_a_summary_from_before_teardown_still_reads() -> None:
    b = g.Breakdown(10.0, 6.0, {**dict.fromkeys(g.CATEGORIES, 0.0), A.BADPUT_STARTUP: 4.0})
    old = {A.GOODPUT_SECONDS: 6.0, A.GOODPUT_WALL_SECONDS: 10.0}
    old.update({A.badput_seconds_key(c): b.badput_s[c] for c in g.CATEGORIES})
    del old[A.BADPUT_TEARDOWN_SECONDS]
    read = g.from_attributes(old)
    assert read is not None and read.badput_s[A.BADPUT_TEARDOWN] == 0.0
