"""Goodput marks from Lightning's own hooks: ``Trainer(callbacks=[GoodputCallback()])`` marks
each optimizer step the trainer completes (:func:`elastic_otel.mark_step`) and each checkpoint
it saves, with the save's blocking time (:func:`elastic_otel.saving_checkpoint`), on every rank;
no other change to the script. Needs ``lightning`` (``pip install 'elastic-otel[frameworks]'``).
Design: ``docs/goodput.md`` (From the frameworks' own hooks).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from elastic_otel.frameworks.saves import unwrap_save, wrap_save
from elastic_otel.worker.progress import mark_step

_SAVE = "save_checkpoint"


class GoodputCallback(Callback):
    """A Lightning ``Callback`` for the goodput accounting.

    Steps are the trainer's optimizer steps, numbered from 0 (``trainer.global_step - 1`` once
    one completed, so that a run resumed from a checkpoint goes on numbering where it left): the
    end of a batch that completed one marks it (under gradient accumulation, the batch that
    stepped). A checkpoint is every ``trainer.save_checkpoint`` (``ModelCheckpoint``'s saves and
    the script's own), marked when it returns, as covering the last completed step; Lightning
    has no hook after a save, so :meth:`setup` wraps that method on the trainer and
    :meth:`teardown` puts it back. Outside a worker the agent started, the marks do nothing.
    """

    def __init__(self) -> None:
        self._marked = 0  # trainer.global_step when a step was last marked

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if _SAVE in vars(trainer):
            return  # wrapped already (a second fit, or another instance of this callback)
        wrap_save(trainer, _SAVE, lambda: trainer.global_step - 1)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        unwrap_save(trainer, _SAVE)

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        stepped = trainer.global_step
        if stepped > self._marked:  # this batch completed an optimizer step
            self._marked = stepped
            mark_step(stepped - 1)
