"""Goodput marks from accelerate's and torch's own hooks: ``mark_goodput(accelerator, optimizer)``
marks each step the prepared optimizer takes (:func:`elastic_otel.mark_step`, through torch's
optimizer step hook) and each ``Accelerator.save_state`` as a checkpoint, with the save's
blocking time (:func:`elastic_otel.saving_checkpoint`); the training loop is unchanged. Needs
``accelerate``. Design: ``docs/goodput.md`` (From the frameworks' own hooks).
"""

from __future__ import annotations

from typing import Any

from accelerate import Accelerator

from elastic_otel.frameworks.saves import unwrap_save, wrap_save
from elastic_otel.worker.progress import mark_step

_SAVE = "save_state"


class GoodputMarks:
    """The hooks :func:`mark_goodput` installed; :meth:`remove` takes them out.

    ``step`` is the number the next optimizer step is marked with. The optimizer's post-step
    hook runs only for a step it really took: accelerate skips the inner step while it
    accumulates gradients, and the grad scaler skips one with infinite gradients. A
    ``save_state`` is marked when it returns, as covering the last step marked.
    """

    def __init__(self, accelerator: Accelerator, optimizer: Any, start_step: int) -> None:
        self.accelerator = accelerator
        self.step = start_step
        # An AcceleratedOptimizer wraps torch's: the inner one steps only when it really does.
        inner = getattr(optimizer, "optimizer", optimizer)
        self._hook = inner.register_step_post_hook(self._stepped)
        wrap_save(self.accelerator, _SAVE, lambda: self.step - 1)

    def _stepped(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        mark_step(self.step)
        self.step += 1

    def remove(self) -> None:
        """Put the optimizer and ``save_state`` back as they were."""
        self._hook.remove()
        unwrap_save(self.accelerator, _SAVE)


def mark_goodput(accelerator: Accelerator, optimizer: Any, start_step: int = 0) -> GoodputMarks:
    """Mark ``optimizer``'s steps (the one ``accelerator.prepare`` returned, or torch's own) and
    ``accelerator``'s ``save_state`` calls for the goodput accounting, on every rank. When the
    run resumes from a checkpoint, ``start_step`` is the number of the first step it takes (the
    steps the checkpoint covers), so that the numbering goes on. Outside a worker the agent
    started, the marks do nothing."""
    return GoodputMarks(accelerator, optimizer, start_step)
