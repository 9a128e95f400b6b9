"""A training script whose rank ``HANG_RANK`` stops at step 3 (a sleep standing in for a
stuck data loader or a deadlock) while every other rank waits for it inside an
``all_reduce`` (gloo): the hang of issue 20. ``STEP_SECONDS`` makes every step slow instead
(a job that is slow, not stalled), and ``EXIT_SECONDS`` its end (work after the process group
is gone); ``MARK_STEP=1`` marks each step with ``elastic_otel.mark_step``. No ``@record`` and no
other code for the bridge.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def hang() -> None:
    time.sleep(600)  # HANG LINE


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hang_rank = int(os.environ.get("HANG_RANK", "-1"))
    step_seconds = float(os.environ.get("STEP_SECONDS", "0"))
    mark = os.environ.get("MARK_STEP") == "1"
    tensor = torch.ones(4)
    for step in range(int(os.environ.get("STEPS", "1000000"))):
        if mark:
            import elastic_otel

            elastic_otel.mark_step(step)
        if step == 3 and rank == hang_rank:
            hang()
        if step_seconds:
            time.sleep(step_seconds)
        dist.all_reduce(tensor)
    dist.destroy_process_group()
    time.sleep(float(os.environ.get("EXIT_SECONDS", "0")))


if __name__ == "__main__":
    main()
