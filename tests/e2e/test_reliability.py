"""Reliability: collector outages, signals, forks, concurrency (security: test_security.py).

In-process tests use a real ``OtelHandler`` on a real ``logging.Logger`` (the way torch's
``events.record`` reaches it) exporting to a real OTLP receiver; job-level tests run torchrun.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from torch.distributed.elastic.events import Event, EventSource, NodeState, RdzvEvent

from elastic_otel.names import attributes as A
from tests.support.jobs import (
    LIGHT,
    TRAIN,
    job_env,
    seqs,
    start_agent,
    use_dead_collector,
    use_receiver,
)
from tests.support.otlp_receiver import OtlpReceiver, free_port


def agent_event(i: int, run_id: str = "r") -> str:
    return Event(f"user.event.{i}", EventSource.AGENT, 0, {"run_id": run_id, "seq": i}).serialize()


# --- 1. collector outages ---------------------------------------------------------------


def test_events_during_an_outage_arrive_after_the_collector_returns(
    monkeypatch, grpc_receiver: OtlpReceiver, make_logger
) -> None:
    use_receiver(monkeypatch, grpc_receiver)
    logger, handler = make_logger()
    for i in range(50):
        logger.info(agent_event(i))
    grpc_receiver.wait_until(lambda: len(seqs(grpc_receiver)) == 50)
    # the exporter must have its answer too: a batch the collector took but whose response
    # the stop cut off is sent again later (OTLP retries are at-least-once)
    assert handler.flush(5)
    grpc_receiver.stop()
    for i in range(50, 150):
        logger.info(agent_event(i))
    grpc_receiver.wait_until(lambda: handler.all_stats()["export_failed_attempts"] > 0, 20)
    assert handler.all_stats()["pending_export"] > 0
    grpc_receiver.restart()
    for i in range(150, 160):
        logger.info(agent_event(i))
    assert handler.flush(10)
    counts = seqs(grpc_receiver)
    assert sorted(counts) == list(range(160)), "every event arrives"
    assert set(counts.values()) == {1}, "exactly once"
    stats = handler.all_stats()
    assert stats["dropped_collector_outage"] == 0 and stats["pending_export"] == 0


def test_outage_beyond_the_bound_is_counted_and_reported_once(
    monkeypatch, caplog, make_logger
) -> None:
    use_dead_collector(
        monkeypatch,
        ELASTIC_OTEL_RETRY_QUEUE_SIZE="40",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",  # the exporter's own retries give up
    )
    logger, handler = make_logger()
    deadline = time.monotonic() + 30
    i = 0
    while handler.all_stats()["dropped_collector_outage"] == 0 and time.monotonic() < deadline:
        for _ in range(50):
            logger.info(agent_event(i))
            i += 1
        time.sleep(0.2)  # let batches go out (and fail) along the way
    stats = handler.all_stats()
    assert stats["dropped_collector_outage"] > 0
    assert stats["pending_export"] <= 40
    for i in range(100):  # more overflow: still reported once
        logger.info(agent_event(i))
    handler.flush(1)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("ELASTIC_OTEL_RETRY_QUEUE_SIZE" in m for m in messages) == 1
    assert not any(r.exc_info for r in caplog.records)


def test_flush_is_false_while_records_wait_for_the_collector(monkeypatch, make_logger) -> None:
    """``flush`` answers whether everything got out, not whether its calls returned."""
    use_dead_collector(monkeypatch, OTEL_EXPORTER_OTLP_TIMEOUT="1")  # fails within the flush
    logger, handler = make_logger()
    for i in range(10):
        logger.info(agent_event(i))
    assert not handler.flush(15)
    assert handler.all_stats()["pending_export"] >= 10


def test_retry_bound_never_cuts_a_batch_the_collector_accepts(
    monkeypatch, grpc_receiver: OtlpReceiver, make_logger
) -> None:
    """The retry queue bounds what waits for a collector that is down, not the batch size."""
    use_receiver(monkeypatch, grpc_receiver, ELASTIC_OTEL_RETRY_QUEUE_SIZE="10")
    logger, handler = make_logger()
    for i in range(300):
        logger.info(agent_event(i))
    assert handler.flush(20)
    assert handler.all_stats()["dropped_collector_outage"] == 0
    assert seqs(grpc_receiver) == Counter(range(300))


def test_exit_with_collector_down_counts_every_record_as_lost_at_exit(
    monkeypatch, caplog, make_logger
) -> None:
    """Records still queued or in flight when the exit closes the exporter are lost because
    the collector is down, not because the exporter rejected them: counted once, as such."""
    use_dead_collector(monkeypatch, OTEL_BLRP_MAX_EXPORT_BATCH_SIZE="64")  # several SDK batches
    logger, handler = make_logger()
    for i in range(2000):
        logger.info(agent_event(i, run_id="down"))
    deadline = time.monotonic() + 20
    while handler.all_stats()["export_failed_attempts"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    handler.shutdown()
    stats = handler.all_stats()
    assert stats["processed"] == 2000 and stats["exported"] == 0
    assert stats["dropped_invalid"] == 0 and stats["dropped_sdk_queue"] == 0
    assert stats["lost_at_exit"] == 2000  # every log record accounted for, once
    messages = [r.getMessage() for r in caplog.records if "elastic-otel" in r.getMessage()]
    assert not any("rejected" in m for m in messages), messages
    assert len(messages) <= 2, messages  # the export problem, and the loss at exit


def test_slow_collector_never_delays_the_caller(monkeypatch, make_logger) -> None:
    with OtlpReceiver("grpc", delay_s=3.0) as slow:
        use_receiver(monkeypatch, slow)
        logger, handler = make_logger()
        for i in range(500):
            logger.info(agent_event(i))
        # every record() returned while the collector had not answered a single export
        assert slow.logs() == []
        assert handler.flush(15)
        assert len(seqs(slow)) == 500


def test_unreachable_collector_job_same_exit_code_one_warning(tmp_path: Path) -> None:
    """With the collector down, jobs end as they do without the bridge: a one-node job that
    succeeds (0, torchrun's success), a two-node job whose rank 1 fails (each agent's exit
    code, as the same job's without the bridge); one warning."""
    dead = f"http://127.0.0.1:{free_port()}"
    agents = {}
    for handler, fail in (("otel", ""), ("otel", "1"), ("null", "1")):  # side by side
        env = job_env(
            None,
            tmp_path / f"{handler}{fail}",
            OTEL_EXPORTER_OTLP_ENDPOINT=dead,
            TRAIN_FAIL_RANK=fail,
            TRAIN_PEER_FAILURE="exit",
        )
        (tmp_path / f"{handler}{fail}").mkdir()
        port, run_id = free_port(), f"dead-{uuid.uuid4().hex[:4]}"
        nodes = 2 if fail else 1
        # the failing jobs compare exit codes only: their workers need not import torch
        script = LIGHT if fail else TRAIN
        for node in range(nodes):
            agents[(handler, fail, node)] = start_agent(
                env, port, run_id, nnodes=str(nodes), handler=handler, script=script
            )
    outcomes = {key: agent.wait() for key, agent in agents.items()}
    assert outcomes[("otel", "", 0)][0] == 0
    for node in range(2):
        assert outcomes[("otel", "1", node)][0] == outcomes[("null", "1", node)][0] != 0
    out = outcomes[("otel", "", 0)][1]
    assert "Traceback" not in out
    bridge_lines = [line for line in out.splitlines() if "elastic-otel" in line]
    assert len(bridge_lines) <= 1, bridge_lines


# --- 2. signals and forks ----------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_agent_delivers_final_events(sig, grpc_receiver: OtlpReceiver, tmp_path) -> None:
    env = job_env(grpc_receiver, tmp_path, TRAIN_WAIT_FOR_WORLD="2")
    agent = start_agent(
        env,
        free_port(),
        f"sig-{uuid.uuid4().hex[:4]}",
        nnodes="1:2",
        extra_args=("--rdzv-conf=last_call_timeout=1",),
        script=LIGHT,  # waits for a second node that never comes: the agent is signalled
    )
    grpc_receiver.wait_for_logs(1, timeout=60, where=lambda r: r["body"].endswith(".START"))
    time.sleep(0.5)  # START is recorded just before torchrun installs its signal handlers
    agent.proc.send_signal(sig)
    rc, _out = agent.wait(60)
    assert rc != 0
    failed = grpc_receiver.wait_for_logs(
        1,
        where=lambda r: (
            r["body"] == "torchelastic.worker.status.FAILED"
            and r["attributes"].get(A.EVENT_SOURCE) == "AGENT"
        ),
    )
    assert "SignalException" in failed[0]["attributes"][A.EXCEPTION_TYPE]
    assert failed[0]["severity_text"] == "ERROR"
    spans = grpc_receiver.wait_for_spans(
        1,
        where=lambda s: (
            s["name"] in (A.SPAN_WORKER, A.SPAN_RDZV_MEMBER)
            and "terminated" in str(s["attributes"].get(A.END_REASON, ""))
        ),
    )
    for span in spans:
        # the agent's round is an error; its workers were running: victims, not errors
        expected = "ERROR" if span["name"] == A.SPAN_RDZV_MEMBER else "UNSET"
        assert span["status_code"] == expected, span["name"]
        assert str(signal.Signals(sig).value) in span["attributes"][A.END_REASON]
    names = {s["name"] for s in spans}
    assert names >= {A.SPAN_WORKER, A.SPAN_RDZV_MEMBER}
    # the attempt the signal ended is accounted: a scheduler's time limit or requeue ends so
    (goodput,) = grpc_receiver.wait_for_logs(
        1, where=lambda r: r["event_name"] == A.GOODPUT_EVENT_NAME
    )
    assert goodput["attributes"][A.GOODPUT_ATTEMPT] == 0
    assert goodput["attributes"][A.GOODPUT_FINAL] is True


def test_sigterm_to_a_plain_script_flushes(grpc_receiver: OtlpReceiver, tmp_path) -> None:
    script = tmp_path / "waits.py"
    script.write_text(
        "import sys, time, elastic_otel\n"
        "from torch.distributed.elastic import events\n"
        "elastic_otel.register()\n"
        "for i in range(20):\n"
        "    events.record(events.Event('e', events.EventSource.AGENT, 0, {'seq': i}), 'otel')\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env=job_env(grpc_receiver, tmp_path),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == -signal.SIGTERM
    assert sorted(seqs(grpc_receiver)) == list(range(20))


CHILDREN = 12


def test_forked_children_do_not_deadlock(grpc_receiver: OtlpReceiver, tmp_path) -> None:
    """Children forked while the parent exports steadily export their own records: no export
    of the parent is inside gRPC at a fork (``emit/export_gate.py``; without the gate about one
    child in 40 hung in its first export until the deadline)."""
    script = tmp_path / "forks.py"
    script.write_text(
        "import os, threading, time, elastic_otel\n"
        "from torch.distributed.elastic import events\n"
        "elastic_otel.register()\n"
        "def rec(tag, n):\n"
        "    for i in range(n):\n"
        "        events.record(events.Event('e', events.EventSource.WORKER, 0,\n"
        "                                   {'seq': f'{tag}-{i}'}), 'otel')\n"
        "busy = threading.Thread(target=rec, args=('parent-bg', 20000))\n"
        "busy.start()\n"
        "pids = []\n"
        f"for c in range({CHILDREN}):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        rec(f'child{c}', 10)\n"
        "        os._exit(0 if elastic_otel.flush(30) else 3)\n"  # a bound: two cores, 3 jobs
        "    pids.append(pid)\n"
        "    time.sleep(0.02)\n"
        "for pid in pids:\n"
        "    assert os.waitpid(pid, 0)[1] == 0, 'a child did not get its records out'\n"
        "busy.join()\n"
        "rec('parent', 10)\n"
        # not the exit's bounded flush: on a loaded machine 20,000 records take longer
        "assert elastic_otel.flush(60), 'the parent did not get its records out'\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        env=job_env(grpc_receiver, tmp_path),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = grpc_receiver.wait_until(
        lambda: (c := seqs(grpc_receiver)) and len(c) >= 20010 + 10 * CHILDREN and c, 60
    )
    for c in range(CHILDREN):
        assert {counts[f"child{c}-{i}"] for i in range(10)} == {1}
    assert {counts[f"parent-{i}"] for i in range(10)} == {1}


# --- 4. concurrency ----------------------------------------------------------------------


def test_sixteen_threads_every_event_once_every_span_once(
    monkeypatch, grpc_receiver: OtlpReceiver, make_logger
) -> None:
    use_receiver(
        monkeypatch,
        grpc_receiver,
        ELASTIC_OTEL_QUEUE_SIZE="400000",
        OTEL_BLRP_MAX_QUEUE_SIZE="400000",
        OTEL_BLRP_MAX_EXPORT_BATCH_SIZE="4096",
        OTEL_BSP_MAX_QUEUE_SIZE="100000",
    )
    logger, handler = make_logger()
    threads_n, per_thread = 16, 1_000  # 16,000 events: the threads interleave many times
    stop = threading.Event()
    timer_count = [0]

    def rdzv(pid: int, message: str, state: NodeState = NodeState.RUNNING) -> str:
        return RdzvEvent(
            "dynamic_rendezvous.py:x", "conc", message, "h", pid, state, local_id=0
        ).serialize()

    def node(pid: int) -> None:
        desc = f"'h_{pid}_0'"
        logger.info(
            rdzv(pid, f"The node {desc} attempts to join the next round of the rendezvous 'conc'.")
        )
        logger.info(
            rdzv(
                pid,
                f"The node {desc} has joined round 0 of the rendezvous 'conc' "
                "as rank 0 in a world of size 16.",
            )
        )
        for i in range(per_thread - 3):
            logger.info(
                Event(
                    "e", EventSource.WORKER, 0, {"run_id": f"other-{pid}", "seq": f"{pid}-{i}"}
                ).serialize()
            )
        logger.info(
            rdzv(pid, f"The node {desc} has closed the rendezvous 'conc'.", NodeState.SUCCEEDED)
        )

    def keep_alive_timer() -> None:  # torch's keep-alive timer thread, for every node
        while not stop.is_set():
            for pid in range(threads_n):
                logger.info(
                    rdzv(
                        pid,
                        f"The node 'h_{pid}_0' has sent a keep-alive heartbeat "
                        "to the rendezvous 'conc'.",
                    )
                )
                timer_count[0] += 1
            time.sleep(0.01)

    timer = threading.Thread(target=keep_alive_timer)
    timer.start()
    workers = [threading.Thread(target=node, args=(pid,)) for pid in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    timer.join()
    assert handler.flush(60)
    expected = threads_n * per_thread + timer_count[0]
    logs = grpc_receiver.wait_for_logs(expected, timeout=60)
    assert len(logs) == expected
    counts = seqs(grpc_receiver)
    assert len(counts) == threads_n * (per_thread - 3) and set(counts.values()) == {1}
    assert handler.all_stats()["dropped_queue_full"] == 0
    spans = grpc_receiver.spans()
    assert Counter(s["span_id"] for s in spans).most_common(1)[0][1] == 1, "each span once"
    members = [s for s in spans if s["name"] == A.SPAN_RDZV_MEMBER]
    assert len(members) == threads_n
    assert len([s for s in spans if s["name"] == A.SPAN_RDZV_JOIN]) == threads_n
    # keep-alives that arrived while a node was a member were counted on its span
    assert sum(s["attributes"].get(A.KEEP_ALIVE_COUNT, 0) for s in members) > 0
