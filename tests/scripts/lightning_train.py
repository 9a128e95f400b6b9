"""A tiny Lightning run under torchrun (issue 43): ``Trainer`` on CPU, DDP over gloo across the
node's workers, ``STEPS`` optimizer steps and a ``ModelCheckpoint`` every ``CHECKPOINT_EVERY``
steps into ``CKPT_DIR``; the goodput marks come from ``GoodputCallback`` alone, no
``elastic_otel`` call in the loop.
"""

from __future__ import annotations

import os
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from elastic_otel.frameworks.lightning import GoodputCallback


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    steps = int(os.environ.get("STEPS", "20"))
    every = int(os.environ.get("CHECKPOINT_EVERY", "5"))
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy="ddp",
        max_steps=steps,
        callbacks=[
            GoodputCallback(),
            ModelCheckpoint(
                dirpath=os.environ["CKPT_DIR"], every_n_train_steps=every, save_top_k=-1
            ),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
    sys.stdout.flush()
    os._exit(0)  # gloo can abort in C++ destructors at interpreter exit


if __name__ == "__main__":
    main()
