"""The tests' shared fixtures (a ``pytest_plugins`` module): OTLP receivers, a bridge handler on
a torch-like event logger, a real etcd server, environment hygiene; and the recorded events of
real jobs (``tests/data``)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.otlp_receiver import OtlpReceiver, free_port

if TYPE_CHECKING:
    from elastic_otel.bridge.handler import OtelHandler

DATA = Path(__file__).resolve().parents[1] / "data"

_OTEL_PREFIXES = ("OTEL_", "ELASTIC_OTEL_", "PET_")


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start from an environment with no OTel or elastic-otel settings."""
    for name in list(os.environ):
        if name.startswith(_OTEL_PREFIXES) or name in ("SLURM_JOB_ID", "LSB_JOBID"):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def error_file(tmp_path: Path) -> Path:
    """torch's per-attempt, per-rank error file (torch creates its directory, not the file)."""
    directory = tmp_path / "attempt_0" / "0"
    directory.mkdir(parents=True)
    return directory / "error.json"


@pytest.fixture
def grpc_receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver("grpc") as receiver:
        yield receiver


@pytest.fixture
def http_receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver("http") as receiver:
        yield receiver


def captured_events(name: str) -> list[tuple[float, str]]:
    """(created, JSON) pairs recorded from a real torchrun job (see tests/data/README.md)."""
    rows = []
    for line in (DATA / name).read_text().splitlines():
        created, _, payload = line.partition("\t")
        rows.append((float(created), payload))
    return rows


@pytest.fixture
def make_logger() -> Iterator:
    """A torch-like event logger with a fresh bridge handler; shut down after the test."""
    made: list[OtelHandler] = []

    def make() -> tuple[logging.Logger, OtelHandler]:
        from elastic_otel.bridge.handler import OtelHandler

        handler = OtelHandler()
        made.append(handler)
        logger = logging.getLogger(f"torchelastic-events-test-{uuid.uuid4().hex[:6]}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        return logger, handler

    yield make
    for handler in made:
        handler.shutdown()


def _etcd_version(binary: str) -> tuple[int, int]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"etcd Version: (\d+)\.(\d+)", out)
    assert m, out
    return int(m[1]), int(m[2])


@pytest.fixture(scope="module")
def etcd_endpoint() -> Iterator[str]:
    """A real etcd server on free loopback ports, v2 API on (torch's etcd backends use it)."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("etcd binary not found: run .ci/install-etcd.sh (Debian's etcd-server)")
    version = _etcd_version(binary)
    if version >= (3, 6):
        pytest.skip(f"etcd {version} has no v2 API, which torch's etcd backends need")
    client, peer = free_port(), free_port()
    data = tempfile.mkdtemp(prefix="etcd-")
    proc = subprocess.Popen(
        [
            binary,
            "--name=test",
            f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=test=http://127.0.0.1:{peer}",
            "--enable-v2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1) as r:
                    if b"true" in r.read():
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"etcd did not start: {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
            time.sleep(0.1)
        yield f"127.0.0.1:{client}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(data, ignore_errors=True)
