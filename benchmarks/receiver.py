"""A counting OTLP receiver in its own process, built on ``tests/support/otlp_receiver.py``.

The test receiver decodes every record into dicts, which would dominate a million-event run;
:class:`CountingReceiver` keeps its gRPC/HTTP servers but only counts records, requests and
bytes. :class:`ReceiverProcess` runs it in a child process (pinned away from the measured
process) so that decoding never competes for the measured process's GIL or CPU.

Control protocol on the child's stdin/stdout, one JSON line per command:
``stats`` → counts, ``reset`` → zero them, ``quit`` → exit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks.common import ROOT, clean_env, helper_cpus, pin

_SIGNAL_FIELDS = {
    "logs": ("resource_logs", "scope_logs", "log_records"),
    "traces": ("resource_spans", "scope_spans", "spans"),
    "metrics": ("resource_metrics", "scope_metrics", "metrics"),
}


def _count(signal: str, request: Any) -> int:
    outer, middle, inner = _SIGNAL_FIELDS[signal]
    return sum(
        len(getattr(scope, inner))
        for resource in getattr(request, outer)
        for scope in getattr(resource, middle)
    )


def _receiver_class() -> type:
    if str(ROOT) not in sys.path:  # run as a script in its own process
        sys.path.insert(0, str(ROOT))
    from tests.support.otlp_receiver import OtlpReceiver

    class CountingReceiver(OtlpReceiver):
        """OtlpReceiver that counts instead of decoding and storing."""

        def clear(self) -> None:
            super().clear()
            self._counts_lock = getattr(self, "_counts_lock", threading.Lock())
            with self._counts_lock:
                self.records = dict.fromkeys(_SIGNAL_FIELDS, 0)
                self.requests_n = dict.fromkeys(_SIGNAL_FIELDS, 0)
                self.bytes = dict.fromkeys(_SIGNAL_FIELDS, 0)
                self.last_monotonic = 0.0

        def _handle(self, signal, request, headers, stop_event, alive):  # type: ignore[override]
            n = _count(signal, request)
            size = request.ByteSize()
            with self._counts_lock:
                self.records[signal] += n
                self.requests_n[signal] += 1
                self.bytes[signal] += size
                self.last_monotonic = time.monotonic()
            return None

        def snapshot(self) -> dict[str, Any]:
            with self._counts_lock:
                return {
                    "records": dict(self.records),
                    "requests": dict(self.requests_n),
                    "bytes": dict(self.bytes),
                    "last_monotonic": self.last_monotonic,
                }

    return CountingReceiver


def serve(protocol: str) -> None:
    """Child side: start, print the endpoint, answer commands until ``quit`` or EOF."""
    pin(helper_cpus())
    receiver = _receiver_class()(protocol)
    receiver.start()
    print(json.dumps({"endpoint": receiver.endpoint, "port": receiver.port}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "stats":
            print(json.dumps(receiver.snapshot()), flush=True)
        elif cmd == "reset":
            receiver.clear()
            print(json.dumps({"ok": True}), flush=True)
        elif cmd == "quit":
            break
    receiver.stop()


class ReceiverProcess:
    """Parent side: ``with ReceiverProcess() as rx: rx.endpoint, rx.stats()``."""

    def __init__(self, protocol: str = "grpc") -> None:
        self.protocol = protocol
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint = ""
        self.port = 0

    def start(self) -> ReceiverProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.receiver", self.protocol],
            cwd=ROOT,
            env=clean_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = json.loads(self._readline())
        self.endpoint, self.port = hello["endpoint"], hello["port"]
        return self

    def _readline(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("receiver process died")
        return line

    def _command(self, cmd: str) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return json.loads(self._readline())

    def stats(self) -> dict[str, Any]:
        """Records, requests and bytes per signal; ``last_monotonic``: last arrival."""
        return self._command("stats")

    def reset(self) -> None:
        self._command("reset")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def __enter__(self) -> ReceiverProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    serve(sys.argv[1] if len(sys.argv) > 1 else "grpc")
