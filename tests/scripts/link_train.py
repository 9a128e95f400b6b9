"""Real training for the slow-link tests (``tests/links/``): a ``DistributedDataParallel`` model
on gloo whose gradients (two ``Linear(1024, 1024)`` layers: 8.4 MB a step, two buckets of DDP's
C++ reducer) are big enough that a rate-limited link between the hosts makes every all-reduce
much longer, while its compute (a batch of 8) stays cheap on two shared cores. No
``elastic_otel`` call and no ``@record``: the bridge reads the collectives from torch's Flight
Recorder, as in any job.

Every rank sleeps ``STEP_SECONDS`` before each ``backward()`` (a data loader's time: it keeps
the cores free for the other host's ranks and the agents), and ``SLOW_ALL_SECONDS`` more while
the file ``SLOW_ALL_WHEN`` exists (a sleep standing in for slower compute on every rank: the
test starts and ends a compute slowdown by creating and removing the file). ``STEPS`` steps.
With ``PRINT_EVERY`` = n, global rank 0 prints ``link_train: step <step> at <unix time> mean
<seconds>`` after every n steps (the mean step time of those n) on stdout, which the tests read
to time the job's phases; nothing goes to stderr.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

WIDTH = 1024
BATCH = 8


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = int(os.environ.get("STEPS", "1000000"))
    step_s = float(os.environ.get("STEP_SECONDS", "0"))
    slow_when = os.environ.get("SLOW_ALL_WHEN", "")
    slow_s = float(os.environ.get("SLOW_ALL_SECONDS", "0"))
    print_every = int(os.environ.get("PRINT_EVERY", "0")) if rank == 0 else 0
    torch.set_num_threads(1)  # four ranks on two cores: no thread pool fighting the others
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH)
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    since = time.monotonic()
    for step in range(1, steps + 1):
        inputs, targets = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        pause = step_s + (slow_s if slow_when and os.path.exists(slow_when) else 0.0)
        if pause:
            time.sleep(pause)
        loss.backward()  # DDP's all-reduces of the gradients
        optimizer.step()
        optimizer.zero_grad()
        if print_every and step % print_every == 0:
            now = time.monotonic()
            mean = (now - since) / print_every
            print(f"link_train: step {step} at {time.time():.3f} mean {mean:.4f}", flush=True)
            since = now
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
