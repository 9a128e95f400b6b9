"""A training script whose rank ``FAIL_RANK`` fails at step 3 while every other rank waits for
it in an ``all_reduce`` (gloo): the shape of a real failure, where each peer then fails in its
own collective. ``FAIL_HOW``: how each attempt fails, comma-separated, the first attempt first:
``kill`` (SIGKILL, as the kernel's OOM killer sends), ``segv``, ``abort`` (SIGABRT, as a
collective watchdog does), ``raise`` or ``exit`` (it runs out of data: leaves its loop, destroys
its process group and exits with code 0, which torch counts as a success); the attempts after
the list succeed. Not decorated with torch's ``@record``: what the bridge reports needs no change
to the training script.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

import torch
import torch.distributed as dist


def fail(how: str) -> None:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "segv":
        ctypes.string_at(0)  # FAULT LINE
    elif how == "abort":
        os.abort()
    raise RuntimeError("injected failure: the loss is NaN")


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hows = os.environ["FAIL_HOW"].split(",")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    tensor = torch.ones(4)
    for step in range(200):
        if step == 3 and rank == int(os.environ["FAIL_RANK"]) and attempt < len(hows):
            time.sleep(1.0)  # its peers are in the all_reduce by now
            if hows[attempt] == "exit":
                break  # fewer batches than its peers
            fail(hows[attempt])
        dist.all_reduce(tensor)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
