"""A training script whose rank ``FAIL_RANK`` fails at step 3 while every other rank waits for
it in an ``all_reduce`` (gloo): the shape of a real failure, where each peer then fails in its
own collective. ``FAIL_HOW``: ``kill`` (SIGKILL, as the kernel's OOM killer sends), ``segv``,
``abort`` (SIGABRT, as a collective watchdog does) or ``raise``. It fails once (a marker file
in ``FAIL_ONCE_DIR``), so that a job with a restart then succeeds. Not decorated with torch's
``@record``: what the bridge reports needs no change to the training script.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import signal
import time

import torch
import torch.distributed as dist


def fail(how: str) -> None:
    marker = pathlib.Path(os.environ["FAIL_ONCE_DIR"]) / "failed"
    if marker.exists():
        return
    marker.write_text(how)
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
    tensor = torch.ones(4)
    for step in range(200):
        if step == 3 and rank == int(os.environ["FAIL_RANK"]):
            time.sleep(1.0)  # its peers are in the all_reduce by now
            fail(os.environ["FAIL_HOW"])
        dist.all_reduce(tensor)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
