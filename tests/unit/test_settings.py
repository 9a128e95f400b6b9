"""Settings: every ``ELASTIC_OTEL_*`` setting read once, with the documented defaults."""

from __future__ import annotations

import dataclasses

import pytest

from elastic_otel.bridge.handler import OtelHandler
from elastic_otel.config import environment
from elastic_otel.config.settings import Settings
from elastic_otel.names import environment_variables as env
from tests.support.helpers import as_documented, documented_defaults


def _variable(field: str) -> str:
    """``exit_timeout_s`` → ``ELASTIC_OTEL_EXIT_TIMEOUT``; the semantic conventions' opt-in."""
    if field == "exception_signal":
        return env.OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN
    return getattr(env, "ELASTIC_OTEL_" + field.removesuffix("_s").upper())


def test_an_empty_environment_gives_the_field_defaults() -> None:
    assert Settings.from_environment() == Settings()


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Settings)])
def test_every_field_is_a_documented_variable_with_its_documented_default(field: str) -> None:
    variable = _variable(field)
    assert documented_defaults()[variable] == as_documented(getattr(Settings(), field))


def test_values_are_read_and_malformed_ones_are_their_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(environment, "_warned_flags", set())
    monkeypatch.setenv(env.ELASTIC_OTEL_EXIT_TIMEOUT, "0.5")
    monkeypatch.setenv(env.ELASTIC_OTEL_QUEUE_SIZE, "many")
    monkeypatch.setenv(env.ELASTIC_OTEL_TRACES, "off")
    monkeypatch.setenv(env.ELASTIC_OTEL_AGENT_INSTRUMENTATION, "true")
    monkeypatch.setenv(env.ELASTIC_OTEL_METRICS, "maybe")
    settings = Settings.from_environment()
    assert settings.exit_timeout_s == 0.5
    assert settings.queue_size == env.DEFAULT_QUEUE_SIZE
    assert settings.traces is False
    assert settings.agent_instrumentation is True
    assert settings.metrics is True


@pytest.mark.parametrize(
    ("value", "read"),
    [("logs", "logs"), (" LOGS/dup ", "logs/dup"), ("", None), ("span_events", None)],
)
def test_the_exception_opt_in_is_one_of_the_conventions_values_or_none(
    monkeypatch: pytest.MonkeyPatch, value: str, read: str | None
) -> None:
    monkeypatch.setattr(environment, "_warned_flags", set())
    monkeypatch.setenv(env.OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN, value)
    assert Settings.from_environment().exception_signal == read


def test_read_once_the_handler_keeps_what_it_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.ELASTIC_OTEL_EXIT_TIMEOUT, "3")
    handler = OtelHandler(pipeline_factory=lambda: None)
    monkeypatch.setenv(env.ELASTIC_OTEL_EXIT_TIMEOUT, "9")
    assert handler.settings.exit_timeout_s == 3.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        handler.settings.exit_timeout_s = 9.0  # type: ignore[misc]
    given = Settings(exit_timeout_s=0.25)
    assert OtelHandler(pipeline_factory=lambda: None, settings=given).settings is given
