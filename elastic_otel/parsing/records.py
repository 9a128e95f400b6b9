"""Typed values the events carry: attribute values, errors, and the agent instrumentation's records.

:class:`ErrorInfo` is what an event says went wrong (the ``exception.*`` attributes), read from
torch's texts (an error file's message, an agent traceback, a rendezvous failure) by
:func:`error_from_message`, one rule for what names an exception type.

:class:`AgentRecord` is what the agent instrumentation hands the bridge handler for what torch's
agent observed: the agent's own ``Event`` (``_construct_event``: run id, ranks, host, state) and
the facts the instrumentation adds, typed, so that nothing is written as text for
:mod:`elastic_otel.parsing.torch_events` to read back. Why a record and not torch's ``Event``
alone: docs/architecture.md, "The agent instrumentation's records". No torch, no SDK here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from elastic_otel.names import attributes as A

AttrValue = str | bool | int | float | tuple[int, ...]
"""An attribute value; the tuples are lists of global ranks (exported as int arrays)."""
Attributes = dict[str, AttrValue]

EXCEPTION_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt", "Timeout", "Failure")
"""Endings of a class name that make "Name: text" an exception without a stack trace."""


@dataclass(slots=True)
class ErrorInfo:
    """What went wrong, as the ``exception.*`` attributes say it (empty parts left out)."""

    type: str
    message: str
    stacktrace: str = ""


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """One observation of the instrumented agent, as the bridge handler receives it."""

    event: object
    """What the agent's ``_construct_event`` made, named and dated by the instrumentation; read
    as any torch ``Event`` (its ``raw_error``, when set, is torch's own error file)."""
    attributes: Mapping[str, AttrValue | None] = field(default_factory=dict)
    """Added to the event's, by full key (:mod:`elastic_otel.names.attributes`), after torch's
    metadata; a ``None`` or an empty rank list is left out."""
    error: ErrorInfo | None = None
    """The error the instrumentation knows (the worker start-up's report, a fatal signal's
    stack, a step's exception); ``None``: the event's ``raw_error``, if any."""


def error_from_message(message: str, stacktrace: str) -> ErrorInfo:
    """ErrorInfo from "Type: message": a dotted identifier before ": " is the exception type
    when it looks like one (…Error, …Exception, …) or when a stack trace confirms it was raised."""
    head, sep, _ = message[:256].partition(": ")
    if sep and all(part.isidentifier() for part in head.split(".")):
        short = head.rsplit(".", 1)[-1]
        if stacktrace or any(suffix in short for suffix in EXCEPTION_SUFFIXES):
            return ErrorInfo(type=head, message=message[len(head) + 2 :], stacktrace=stacktrace)
    return ErrorInfo(type="", message=message, stacktrace=stacktrace)


def error_attributes(error: ErrorInfo) -> dict[str, str]:
    """The semantic-convention ``exception.*`` attributes of ``error`` (empty parts left out)."""
    attrs: dict[str, str] = {}
    if error.type:
        attrs[A.EXCEPTION_TYPE] = error.type
    if error.message:
        attrs[A.EXCEPTION_MESSAGE] = error.message
    if error.stacktrace:
        attrs[A.EXCEPTION_STACKTRACE] = error.stacktrace
    return attrs
