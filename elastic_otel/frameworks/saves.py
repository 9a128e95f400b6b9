"""A framework's checkpoint save, marked for the goodput accounting: the frameworks have no hook
after a save, so the save method of one trainer or accelerator is wrapped on that instance (and
put back), each call measured as :func:`elastic_otel.saving_checkpoint` of the last completed
step. Design: ``docs/goodput.md`` (From the frameworks' own hooks).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from elastic_otel.worker.progress import saving_checkpoint

_MARK = "_elastic_otel_goodput"


def wrap_save(owner: Any, name: str, last_step: Callable[[], int]) -> None:
    """Mark each call of ``owner.<name>`` as a checkpoint of ``last_step()`` (none before the
    first step: no progress to keep); the wrapper lives on ``owner`` alone."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def save(*args: Any, **kwargs: Any) -> Any:
        step = last_step()
        if step < 0:
            return original(*args, **kwargs)
        with saving_checkpoint(step):
            return original(*args, **kwargs)

    setattr(save, _MARK, True)
    setattr(owner, name, save)


def is_wrapped(owner: Any, name: str) -> bool:
    """Whether ``owner.<name>`` is the wrapper :func:`wrap_save` put there."""
    return getattr(vars(owner).get(name), _MARK, False)


def unwrap_save(owner: Any, name: str) -> None:
    """Put ``owner``'s own save method back (nothing if it was not wrapped here)."""
    if is_wrapped(owner, name):
        delattr(owner, name)
