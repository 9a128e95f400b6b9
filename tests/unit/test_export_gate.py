"""The export gate: a fork waits for the bridge's export under way, within its bound."""

from __future__ import annotations

import subprocess
import sys

import pytest

from elastic_otel.emit.export_gate import FORK_WAIT_S

FORK_DURING_AN_EXPORT = """
import os, sys, threading, time
from elastic_otel.emit.export_gate import ExportGate
gate = ExportGate()
os.register_at_fork(before=gate.before_fork, after_in_parent=gate.after_fork_in_parent,
                    after_in_child=gate.after_fork_in_child)
order = []
entered = threading.Event()
def export():
    with gate.exporting():
        entered.set()
        time.sleep(float(sys.argv[1]))
        order.append("export returned")
thread = threading.Thread(target=export)
thread.start()
entered.wait()
pid = os.fork()
if pid == 0:
    with gate.exporting():  # open in the child, whose exporting thread does not exist
        os._exit(0)
order.append("forked")
assert os.waitpid(pid, 0)[1] == 0
thread.join()
print(" then ".join(order), gate.forks_waited_out, sep="|")
"""


@pytest.mark.parametrize(
    ("export_s", "expected"),
    [
        (FORK_WAIT_S / 5, "export returned then forked|0"),
        (FORK_WAIT_S * 6, "forked then export returned|1"),  # past the bound: fork goes ahead
    ],
)
def test_a_fork_waits_for_the_export_under_way_within_its_bound(
    export_s: float, expected: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORK_DURING_AN_EXPORT, str(export_s)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


def test_an_otlp_grpc_exporters_rpcs_pass_the_gate_also_after_it_reconnects() -> None:
    """An export that starts while a fork is under way waits for the gate; the stub the
    exporter makes when it reconnects (after UNAVAILABLE) is gated too."""
    import threading

    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

    from elastic_otel.emit.export_gate import ExportGate, gate_grpc_calls
    from tests.support.otlp_receiver import OtlpReceiver, free_port

    gate = ExportGate()
    dead = gate_grpc_calls(
        OTLPLogExporter(endpoint=f"http://127.0.0.1:{free_port()}", timeout=1), gate
    )
    dead.export([])  # refused: UNAVAILABLE, a new channel and stub
    assert type(dead._client).__name__ == "_GatedStub"

    with OtlpReceiver("grpc") as receiver:
        exporter = gate_grpc_calls(OTLPLogExporter(endpoint=receiver.endpoint, insecure=True), gate)
        exported = threading.Event()
        gate.before_fork()  # nothing under way: closes at once
        try:
            thread = threading.Thread(target=lambda: (exporter.export([]), exported.set()))
            thread.start()
            assert not exported.wait(FORK_WAIT_S), "an RPC started while the gate was closed"
        finally:
            gate.after_fork_in_parent()
        assert exported.wait(30)
        thread.join()
        exporter.shutdown()
