"""A small DDP model instrumented by ``torchtel`` under torchrun (issue 43): torchtel's own
set-up (its OTLP/HTTP exporters to ``OTEL_EXPORTER_OTLP_ENDPOINT``) and its instrumentor, no
``elastic_otel`` call and no ``context=``: its ``train``, ``Tiny.forward``,
``autograd.backward``, ``SGD.step`` and ``dataloader.next`` spans land in the rank's ``worker``
span through the worker start-up alone.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torchtel import PyTorchInstrumentor, setup_opentelemetry


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def main() -> None:
    tracer_provider, meter_provider = setup_opentelemetry(service_name="torchtel-train")
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Tiny()
    instrumentor = PyTorchInstrumentor().instrument(model=model)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(12, 8), torch.randn(12, 1))
    for x, y in DataLoader(data, batch_size=4):
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    instrumentor.uninstrument()  # ends its train span
    dist.barrier()
    dist.destroy_process_group()
    tracer_provider.shutdown()
    meter_provider.shutdown()
    sys.stdout.flush()
    os._exit(0)  # gloo can abort in C++ destructors at interpreter exit


if __name__ == "__main__":
    main()
