"""Tolerant readers of environment variables: a malformed value is the default, with one
warning per variable, never an exception (a typo must not stop a training job, nor mean "on"
in one place and "off" in another). :class:`elastic_otel.config.settings.Settings` reads every
``ELASTIC_OTEL_*`` setting with them, once.
"""

from __future__ import annotations

import logging
import os

from elastic_otel.names.environment_variables import (
    DEFAULT_WORKER_OUTPUT,
    ELASTIC_OTEL_WORKER_OUTPUT,
    EXCEPTIONS_AS_LOGS,
    EXCEPTIONS_AS_LOGS_AND_SPAN_EVENTS,
    OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN,
    WORKER_OUTPUT_STREAMS,
)

_logger = logging.getLogger("elastic_otel")


def env_int(name: str, default: int) -> int:
    """``int(os.environ[name])``; ``default`` when unset, with a warning when malformed."""
    try:
        return int(os.environ.get(name, "").strip() or default)
    except ValueError:
        _logger.warning("elastic-otel: %s is not an integer, using %s", name, default)
        return default


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "").strip() or default)
    except ValueError:
        _logger.warning("elastic-otel: %s is not a number, using %s", name, default)
        return default


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_warned_flags: set[str] = set()


def env_switch(name: str) -> bool | None:
    """A boolean variable: ``True``, ``False``, or ``None`` when unset or unrecognised.

    ``true/1/yes/on`` and ``false/0/no/off`` (any case) are recognised; anything else is
    treated as unset, with one warning per variable, so that a typo never silently means
    "on" in one place and "off" in another.
    """
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return None
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    if name not in _warned_flags:
        _warned_flags.add(name)
        _logger.warning(
            "elastic-otel: %s=%r is neither true nor false; ignoring it", name, raw[:40]
        )
    return None


def env_flag(name: str, default: bool) -> bool:
    """:func:`env_switch`, with ``default`` when unset or unrecognised."""
    value = env_switch(name)
    return default if value is None else value


def env_exception_signal() -> str | None:
    """``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN`` as one of its values (``logs``, ``logs/dup``),
    else ``None`` (span events), with one warning for a value the conventions do not name."""
    name = OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN
    raw = os.environ.get(name, "").strip().lower()
    if raw in (EXCEPTIONS_AS_LOGS, EXCEPTIONS_AS_LOGS_AND_SPAN_EVENTS):
        return raw
    if raw and name not in _warned_flags:
        _warned_flags.add(name)
        _logger.warning(
            "elastic-otel: %s=%r is neither logs nor logs/dup; exceptions stay span events",
            name,
            raw[:40],
        )
    return None


def env_worker_output() -> str:
    """``ELASTIC_OTEL_WORKER_OUTPUT`` as one of :data:`WORKER_OUTPUT_STREAMS` (``false``:
    ``none``; ``stdout,stderr``: ``all``); the default, with one warning, for another value."""
    name = ELASTIC_OTEL_WORKER_OUTPUT
    raw = os.environ.get(name, "").strip().lower().replace(" ", "")
    if raw in _FALSE:
        return "none"
    if raw in ("stdout,stderr", "stderr,stdout"):
        return "all"
    if not raw or raw in WORKER_OUTPUT_STREAMS:
        return raw or DEFAULT_WORKER_OUTPUT
    if name not in _warned_flags:
        _warned_flags.add(name)
        _logger.warning(
            "elastic-otel: %s=%r is none of stderr, stdout, all, none; using %s",
            name,
            raw[:40],
            DEFAULT_WORKER_OUTPUT,
        )
    return DEFAULT_WORKER_OUTPUT
