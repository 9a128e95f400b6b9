"""rotel (an OTLP collector shipped as a PyPI wheel) as the collector in front of the receiver.

The configuration is built with rotel's own Python API (``rotel.Config`` →
``build_agent_environment()``); the agent binary shipped in the wheel is then run in the
foreground with that environment, pinned to the helper CPUs, instead of ``Rotel.start()``'s
``--daemon`` mode, so that the benchmark owns its process id, can read its CPU time and can
stop it reliably.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class RotelCollector:
    """``with RotelCollector(forward_to=rx.endpoint) as col: col.endpoint``."""

    def __init__(self, forward_to: str, batch_timeout: str = "200ms") -> None:
        self.forward_to = forward_to
        self.batch_timeout = batch_timeout
        self.grpc_port = _free_port()
        self.http_port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="eo-rotel-")
        self.version = ""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def _environment(self) -> dict[str, str]:
        from rotel import Config

        tmp = Path(self._tmp.name)
        config = Config(
            {
                "enabled": True,
                "pid_file": str(tmp / "rotel.pid"),
                "log_file": str(tmp / "rotel.log"),
                "otlp_grpc_endpoint": f"127.0.0.1:{self.grpc_port}",
                "otlp_http_endpoint": f"127.0.0.1:{self.http_port}",
                "batch_timeout": self.batch_timeout,
                "exporter": Config.otlp_exporter(endpoint=self.forward_to, protocol="grpc"),
            }
        )
        if not config.is_active():
            raise RuntimeError("rotel configuration rejected")
        return config.build_agent_environment()

    def start(self, timeout: float = 15.0) -> RotelCollector:
        import rotel.agent

        binary = str(rotel.agent.agent.agent_path)
        env = {
            k: v
            for k, v in self._environment().items()
            if not k.startswith(("OTEL_", "ELASTIC_OTEL_"))
        }
        self.version = subprocess.run(
            [binary, "version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        helpers = common.helper_cpus()
        self.proc = subprocess.Popen(
            [binary, "start"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=(lambda: os.sched_setaffinity(0, helpers)) if helpers else None,
        )
        deadline = time.monotonic() + timeout
        while not _listening(self.grpc_port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = Path(self._tmp.name, "rotel.log")
                detail = log.read_text()[-2000:] if log.exists() else ""
                self.stop()
                raise RuntimeError(f"rotel did not start listening: {detail}")
            time.sleep(0.05)
        return self

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return common.proc_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None
        self._tmp.cleanup()

    def __enter__(self) -> RotelCollector:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
