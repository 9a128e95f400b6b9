"""The pipeline's Resource: what every exported record is attributed to."""

from __future__ import annotations

import socket

import pytest
from opentelemetry.sdk.resources import Resource

from elastic_otel.emit.pipeline import build_resource


def test_service_and_host_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    attrs = build_resource().attributes
    assert attrs["service.name"] == "torchelastic"
    assert attrs["host.name"] == socket.gethostname()


def test_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "llm-pretrain")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "host.name=node-7,k8s.pod.name=trainer-0")
    attrs = build_resource().attributes
    assert (attrs["service.name"], attrs["host.name"]) == ("llm-pretrain", "node-7")
    assert attrs["k8s.pod.name"] == "trainer-0"


def test_groups_like_a_plain_resource() -> None:
    """The encoders group records by resource: the cached hash is the SDK's own."""
    resource = build_resource()
    plain = Resource(resource.attributes, resource.schema_url)
    assert hash(resource) == hash(plain) and resource == plain
    assert len({resource: 1, plain: 2}) == 1
    assert hash(resource.merge(Resource({"extra": 1}))) != hash(resource)
