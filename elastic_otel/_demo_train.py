"""The training script of ``elastic-otel demo``: tiny CPU data-parallel training (gloo).

The same job as ``examples/train.py``, shipped inside the package so that the demo works
after a plain ``pip install``. It does not import elastic_otel: torchrun's
``--event-log-handler otel`` activates the bridge in the agents.

Environment:
  TRAIN_STEPS          optimisation steps (default 20)
  TRAIN_FAIL_RANK      global rank that raises on its first attempt (default: none; not 0,
                       whose worker hosts the job's store)
  TRAIN_FAIL_ONCE_DIR  directory for the marker file that makes the failure happen once
"""

from __future__ import annotations

import os
import pathlib
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def _fail_once(rank: int, restart: int) -> None:
    fail_rank = os.environ.get("TRAIN_FAIL_RANK", "")
    if not fail_rank or int(fail_rank) != rank:
        return
    marker = pathlib.Path(os.environ.get("TRAIN_FAIL_ONCE_DIR", ".")) / f"failed-rank{rank}"
    if not marker.exists():
        marker.write_text(str(restart))
        raise RuntimeError(f"injected failure on rank {rank} (restart {restart})")


@record
def main() -> None:
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # Fail before the process group exists: the other ranks then wait in init instead of
    # crashing on a closed connection, so every run fails and restarts the same way.
    _fail_once(int(os.environ["RANK"]), restart)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.zeros(())
    for _ in range(int(os.environ.get("TRAIN_STEPS", "20"))):
        x = torch.randn(16, 8)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
    if rank == 0:
        print(f"trained on {world} workers, final loss {loss.item():.4f}, restart {restart}")
    dist.barrier()  # leave together: a peer tearing gloo down early can abort the others
    dist.destroy_process_group()
    # torch 2.13's gloo can abort in C++ destructors at interpreter exit ("terminate called
    # without an active exception": 4 of ~80 restarted jobs here); the agent then counts a
    # finished worker as failed. Training is done and the output flushed: skip them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
