"""Shared fixtures: the OTLP receiver, captured torch events, environment hygiene."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from otlp_receiver import OtlpReceiver

DATA = Path(__file__).parent / "data"

_OTEL_PREFIXES = ("OTEL_", "ELASTIC_OTEL_", "PET_")


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start from an environment with no OTel or elastic-otel settings."""
    for name in list(os.environ):
        if name.startswith(_OTEL_PREFIXES) or name in ("SLURM_JOB_ID", "LSB_JOBID"):
            monkeypatch.delenv(name, raising=False)


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
