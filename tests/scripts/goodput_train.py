"""A training script that marks its steps and checkpoints (issue 22): ``STEPS`` steps of
``STEP_SECONDS`` each (an ``all_reduce`` per step), a checkpoint every ``CHECKPOINT_EVERY``
steps (rank 0 writes the step to ``CKPT_DIR``, every rank waits in a barrier: the save's
blocking time, measured with ``elastic_otel.saving_checkpoint``). Global rank ``FAIL_RANK``
raises right after it marked step ``FAIL_STEP`` in the first attempt; a restart resumes after
the checkpoint's step.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import elastic_otel


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = int(os.environ.get("STEPS", "20"))
    every = int(os.environ.get("CHECKPOINT_EVERY", "5"))
    step_s = float(os.environ.get("STEP_SECONDS", "0.08"))
    fail_rank, fail_step = int(os.environ.get("FAIL_RANK", "-1")), int(os.environ["FAIL_STEP"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    checkpoint = Path(os.environ["CKPT_DIR"]) / "checkpoint"
    start = int(checkpoint.read_text()) + 1 if checkpoint.exists() else 0
    tensor = torch.ones(4)
    for step in range(start, steps):
        time.sleep(step_s)
        dist.all_reduce(tensor)
        elastic_otel.mark_step(step)
        if step % every == every - 1:
            with elastic_otel.saving_checkpoint(step):
                if rank == 0:
                    temporary = checkpoint.with_suffix(".tmp")
                    temporary.write_text(str(step))
                    temporary.replace(checkpoint)
                dist.barrier()
        if rank == fail_rank and step == fail_step and attempt == 0:
            raise RuntimeError(f"injected failure at step {step}")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo can abort in C++ destructors at interpreter exit


if __name__ == "__main__":
    main()
