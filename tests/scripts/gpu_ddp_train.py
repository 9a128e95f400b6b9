"""Real GPU training for the GPU tests (tests/gpu/): a ``DistributedDataParallel`` model on the
rank's GPU over NCCL, whose gradient all-reduces DDP's C++ reducer enqueues on the GPU's stream.
``GPU_HANG_STEP``: at that step the rank holds its GPU busy (``torch.cuda._sleep``, a kernel on
the compute stream) before ``backward()``, so that DDP's all-reduce stays enqueued behind it and
the training thread waits at the loss's ``.item()``: the GPU, not a peer, is what the job waits
for; ``GPU_HANG_AFTER_S``: the same at the first step that many seconds into training (after
the workers' NCCL timing decision, say). ``GPU_OOM_STEP``: at that step it allocates more than
the GPU has (a CUDA out-of-memory error). ``PG_TIMEOUT_S``: the process group's timeout (torch's
NCCL watchdog). ``STEPS``, ``WIDTH``, ``BATCH``: the run's size; it prints its median step
time.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist


def hold_the_gpu() -> None:
    torch.cuda._sleep(1 << 62)  # GPU HOLD LINE


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    timeout = os.environ.get("PG_TIMEOUT_S")
    dist.init_process_group(
        "nccl",
        device_id=torch.device("cuda", local_rank),
        timeout=datetime.timedelta(seconds=float(timeout)) if timeout else None,
    )
    width, batch = int(os.environ.get("WIDTH", "1024")), int(os.environ.get("BATCH", "64"))
    hang_step = int(os.environ.get("GPU_HANG_STEP", "-1"))
    oom_step = int(os.environ.get("GPU_OOM_STEP", "-1"))
    hang_after_s = float(os.environ.get("GPU_HANG_AFTER_S", "-1"))
    layers = [torch.nn.Linear(width, width) for _ in range(8)]
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*layers).cuda(), device_ids=[local_rank]
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    inputs = torch.randn(batch, width, device="cuda")
    times = []
    began = time.monotonic()
    for step in range(int(os.environ.get("STEPS", "300"))):
        torch.cuda.synchronize()
        started = time.perf_counter()
        loss = model(inputs).square().mean()
        if step == oom_step:
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
        if step == hang_step or 0 <= hang_after_s <= time.monotonic() - began:
            hold_the_gpu()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()
        times.append(time.perf_counter() - started)
    print(f"median step ms {statistics.median(times[20:]) * 1e3:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
