"""Real training for the hang tests: a small ``DistributedDataParallel`` model (gloo), whose
gradient all-reduces DDP's C++ reducer issues, not Python. Global rank ``HANG_RANK`` stops
before its ``backward()`` at step ``HANG_STEP`` (default 5; a sleep standing in for a stuck
data loader) while the other ranks wait inside theirs, in DDP's all-reduce. ``FUNCTIONAL=1``
averages the gradients with ``torch.distributed._functional_collectives`` instead of DDP (as
FSDP2 and tensor parallelism do), and so issues no collective before the first ``backward()``.
For the straggler tests, global rank ``SLOW_RANK`` sleeps ``SLOW_SECONDS`` more than its peers
before each ``backward()``, and every rank ``STEP_SECONDS`` (a data loader's time). Global rank
``GPU_HOLD_RANK`` holds its GPU busy (``torch.cuda._sleep``, as the GPU tests' script does)
before its ``backward()`` once ``GPU_HOLD_AFTER_S`` seconds passed since its first step ended
(the workers decide on NCCL timing 5 s after their first collective, however long a loaded
machine took to start them): on the CPU only under the NCCL stand-in
(``tests/support/nccl_standin``), which holds the rank and records its next all-reduce as NCCL
does behind a busy GPU. In start-up, the global ranks in
``STARTUP_HANG_RANKS`` (comma separated, from ``RANK``) stop before ``init_process_group``
(``STARTUP_HANG_AT=init``: a checkpoint load on a hung mount) or after it, before the first
collective (``first``), until the file ``STARTUP_HANG_UNTIL`` exists if set (the load ends and
training begins). Global rank ``RAISE_RANK`` prints a line on stderr and raises at its next step
once the file ``RAISE_WHEN`` exists (a bad batch). No ``elastic_otel`` call and no ``@record``.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import torch
import torch.distributed as dist


def stuck_data_loader() -> None:
    time.sleep(600)  # HANG LINE


def stuck_loading_checkpoint() -> None:
    """A read that blocks, as on a hung mount, until ``STARTUP_HANG_UNTIL`` exists (600 s at
    most). One blocking call: the stack signal finds the rank on this line, never on a loop's
    other line."""
    until = os.environ.get("STARTUP_HANG_UNTIL")
    read_end, write_end = os.pipe()

    def mount_comes_back() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not (until and os.path.exists(until)):
            time.sleep(0.2)
        os.write(write_end, b"x")

    threading.Thread(target=mount_comes_back, daemon=True).start()
    os.read(read_end, 1)  # STARTUP HANG LINE


def main() -> None:
    late = os.environ.get("STARTUP_HANG_RANKS", "")
    late_here = os.environ.get("RANK") in late.split(",")
    if late_here and os.environ.get("STARTUP_HANG_AT") == "init":
        stuck_loading_checkpoint()
    dist.init_process_group("gloo")
    if late_here and os.environ.get("STARTUP_HANG_AT") == "first":
        stuck_loading_checkpoint()
    rank = dist.get_rank()
    hang_rank = int(os.environ.get("HANG_RANK", "-1"))
    hang_step = int(os.environ.get("HANG_STEP", "5"))
    functional = os.environ.get("FUNCTIONAL") == "1"
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_SECONDS", "0"))
    step_s = float(os.environ.get("STEP_SECONDS", "0"))
    hold_rank = int(os.environ.get("GPU_HOLD_RANK", "-1"))
    hold_after_s = float(os.environ.get("GPU_HOLD_AFTER_S", "0"))
    raise_rank = int(os.environ.get("RAISE_RANK", "-1"))
    raise_when = os.environ.get("RAISE_WHEN", "")
    began = float("inf")  # the end of the first step
    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    )
    if not functional:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(int(os.environ.get("STEPS", "1000000"))):
        inputs, targets = torch.randn(16, 32), torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        if step == hang_step and rank == hang_rank:
            stuck_data_loader()
        if rank == raise_rank and os.path.exists(raise_when):
            print(f"rank {rank}: a bad batch at step {step}", file=sys.stderr, flush=True)
            raise RuntimeError(f"rank {rank}: the loss is NaN at step {step}")  # RAISE LINE
        if rank == hold_rank and time.monotonic() - began >= hold_after_s:  # nan: not yet
            torch.cuda._sleep(1 << 62)  # GPU HOLD LINE
        if step_s or rank == slow_rank:
            time.sleep(step_s + (slow_s if rank == slow_rank else 0.0))
        loss.backward()
        if functional:
            import torch.distributed._functional_collectives as funcol

            for p in model.parameters():
                assert p.grad is not None
                p.grad = funcol.all_reduce(p.grad, "avg", dist.group.WORLD).wait()
        optimizer.step()
        optimizer.zero_grad()
        began = min(began, time.monotonic())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
