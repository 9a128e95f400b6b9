"""The launcher tests' job (tests/launchers/): a small ``DistributedDataParallel`` model on gloo,
the same script under every launcher. Global rank ``FAIL_RANK`` fails at step 3 while its peers
wait for it in DDP's gradient all-reduce (issued by DDP's C++ reducer, not Python): ``FAIL_HOW``
``raise`` (an exception, exit code 1), ``kill`` (SIGKILL, as the OOM killer sends) or ``hang``
(it sleeps for good, as a rank stuck outside collectives does). Plain
torch, no ``elastic_otel`` call, no ``@record`` and no launcher's API: what the bridge reports
must not depend on the launcher that started the job.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist


def fail(how: str) -> None:
    if how == "hang":  # bounded: a job the test could not end leaves nothing behind for long
        time.sleep(float(os.environ.get("HANG_S", "120")))
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("injected failure: the loss is NaN")


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    fail_rank = int(os.environ.get("FAIL_RANK", "-1"))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(int(os.environ.get("STEPS", "20"))):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        if step == 3 and rank == fail_rank:
            time.sleep(1.0)  # its peers are in DDP's all-reduce by now
            fail(os.environ.get("FAIL_HOW", "raise"))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
