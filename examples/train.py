"""A tiny CPU data-parallel training script for torchrun (gloo backend).

It does not import elastic_otel: the bridge is activated by ``--event-log-handler otel``.

Environment:
  TRAIN_STEPS        optimisation steps (default 20)
  TRAIN_FAIL_RANK    global rank that raises on its first attempt (default: none)
  TRAIN_FAIL_ONCE_DIR  directory for the marker file that makes the failure happen once
  TRAIN_WAIT_FOR_WORLD  idle (up to 120 s) while the world is smaller than this, so that an
                     elastic scale-up restarts the workers with more nodes
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    fail_rank = os.environ.get("TRAIN_FAIL_RANK", "")
    if fail_rank and int(fail_rank) == rank:
        marker_dir = pathlib.Path(os.environ.get("TRAIN_FAIL_ONCE_DIR", "."))
        marker = marker_dir / f"failed-rank{rank}"
        if not marker.exists():
            marker.write_text(str(restart))
            raise RuntimeError(f"injected failure on rank {rank} (restart {restart})")

    wait_for = int(os.environ.get("TRAIN_WAIT_FOR_WORLD", "0"))
    deadline = time.monotonic() + 120
    while world < wait_for and time.monotonic() < deadline:
        time.sleep(0.2)  # torchrun restarts this worker when more nodes join

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
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
