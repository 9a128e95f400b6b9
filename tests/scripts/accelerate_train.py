"""A tiny accelerate run under torchrun (issue 43): an ``Accelerator`` on CPU (DDP over gloo
across the node's workers), ``STEPS`` optimizer steps with gradient accumulation over
``ACCUMULATE`` batches, ``save_state`` into ``CKPT_DIR`` every ``CHECKPOINT_EVERY`` steps; the
goodput marks come from ``mark_goodput`` alone, no ``elastic_otel`` call in the loop.
"""

from __future__ import annotations

import os
import sys

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from elastic_otel.frameworks.accelerate import mark_goodput


def main() -> None:
    steps = int(os.environ.get("STEPS", "20"))
    every = int(os.environ.get("CHECKPOINT_EVERY", "5"))
    accumulate = int(os.environ.get("ACCUMULATE", "2"))
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulate)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 8), torch.randn(1024, 1))
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4))
    marks = mark_goodput(accelerator, optimizer)
    done = 0
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            done += 1
            if done % every == 0:
                accelerator.save_state(os.path.join(os.environ["CKPT_DIR"], f"step-{done}"))
            if done == steps:
                break
    print(f"rank {accelerator.process_index}: {done} steps, marked {marks.step}", flush=True)
    accelerator.wait_for_everyone()
    sys.stdout.flush()
    os._exit(0)  # gloo can abort in C++ destructors at interpreter exit


if __name__ == "__main__":
    main()
