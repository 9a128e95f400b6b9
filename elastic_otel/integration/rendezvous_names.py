"""torch's rendezvous event names, read without ``inspect.stack()``.

``dynamic_rendezvous`` names each of its events after the method that records it with
``get_method_name``, which calls ``inspect.stack()`` twice: every frame of the stack, each with
its source line read. torch pays that only while its ``dynamic_rendezvous`` destination is not a
``NullHandler``, that is once the bridge routes it, so the registration puts in its place a
function that reads the same frame with ``sys._getframe`` (same name, same fallback) and puts
torch's back when it uninstalls. Design: ``docs/architecture.md`` (What the bridge costs).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable

NO_METHOD_NAME = "no_method_name"
"""torch's name when the stack is not that deep."""


def get_method_name(depth: int = 2) -> str:
    """torch's ``get_method_name``: the name of the function ``depth`` frames up (0: this one)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # the stack is not that deep
        return NO_METHOD_NAME


def install() -> Callable[[], None] | None:
    """Put :func:`get_method_name` in ``dynamic_rendezvous``; the function that puts torch's
    back, or ``None`` when nothing was replaced (torch's helper is missing, replaced already, or
    takes other parameters than the one this reads like)."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    except ImportError:
        return None
    original = getattr(dynamic_rendezvous, "get_method_name", None)
    if original is None or original is get_method_name:
        return None
    try:
        if list(inspect.signature(original).parameters) != ["depth"]:
            return None
    except (TypeError, ValueError):
        return None
    dynamic_rendezvous.get_method_name = get_method_name

    def undo() -> None:
        if dynamic_rendezvous.get_method_name is get_method_name:
            dynamic_rendezvous.get_method_name = original

    return undo
