"""A tiny CPU data-parallel training script for torchrun (gloo): the job of ``elastic-otel demo``.

Shipped inside the package so that the demo works after a plain ``pip install``;
``examples/train.py`` is this file. It does what any training script can: its own spans under
its rank's ``worker`` span, its first step, the steps that count and its checkpoints. Its
``TRAIN_*`` variables (steps, an injected failure, checkpoints): ``docs/cli.md``.
"""

from __future__ import annotations

import io
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
from opentelemetry import trace
from torch.distributed.elastic.multiprocessing.errors import record

import elastic_otel


def _note(event: str, rank: int, restart: int) -> None:
    path = os.environ.get("TRAIN_EVENTS_FILE")
    if path:
        with open(path, "a") as f:  # one short write: whole lines even with several writers
            f.write(f"{event} {rank} {restart} {time.time():.6f}\n")


def _fail_once(rank: int, restart: int) -> None:
    fail_rank = os.environ.get("TRAIN_FAIL_RANK", "")
    if not fail_rank or int(fail_rank) != rank:
        return
    marker = pathlib.Path(os.environ.get("TRAIN_FAIL_ONCE_DIR", ".")) / f"failed-rank{rank}"
    if not marker.exists():
        marker.write_text(str(restart))
        _note("fail", rank, restart)
        raise RuntimeError(f"injected failure on rank {rank} (restart {restart})")


def _save(path: pathlib.Path | None, model: torch.nn.Module, step: int) -> None:
    """Save the state (rank 0) to ``path`` atomically, or to memory when there is none."""
    state = {"model": model.state_dict(), "step": step}
    if path is None:
        torch.save(state, io.BytesIO())
        return
    temporary = path.with_suffix(".tmp")
    torch.save(state, temporary)
    temporary.replace(path)


@record
def main() -> None:
    traced = bool(os.environ.get("TRACEPARENT")) and os.environ.get("TRAIN_OTEL") != "0"
    telemetry = elastic_otel.start_worker_telemetry() if traced else None
    tracer = trace.get_tracer("elastic_otel.demo_train")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    _note("start", int(os.environ["RANK"]), restart)
    before_init = os.environ.get("TRAIN_FAIL_BEFORE_INIT") == "1"
    if before_init:
        _fail_once(int(os.environ["RANK"]), restart)
    with tracer.start_as_current_span("init_process_group", context=elastic_otel.worker_context()):
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if not before_init:
        _fail_once(rank, restart)
    wait_for = int(os.environ.get("TRAIN_WAIT_FOR_WORLD", "0"))
    deadline = time.monotonic() + float(os.environ.get("TRAIN_WAIT_SECONDS", "120"))
    while world < wait_for and time.monotonic() < deadline:
        time.sleep(0.2)  # torchrun restarts this worker when more nodes join

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.zeros(())
    every = int(os.environ.get("TRAIN_CHECKPOINT_EVERY", "5"))
    directory = os.environ.get("TRAIN_CHECKPOINT_DIR")
    checkpoint = pathlib.Path(directory) / "checkpoint.pt" if directory else None
    start = 0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        start = state["step"] + 1
    for step in range(start, int(os.environ.get("TRAIN_STEPS", "20"))):
        x = torch.randn(16, 8)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        elastic_otel.mark_step(step)  # this step counts (until a restart redoes it)
        if step == start and telemetry is not None:
            elastic_otel.mark_first_step()  # training runs again: a recovery ends here
        if every > 0 and step % every == every - 1:
            with elastic_otel.saving_checkpoint(step):  # the steps up to here are kept
                if rank == 0:
                    _save(checkpoint, model, step)
    if rank == 0:
        print(f"trained on {world} workers, final loss {loss.item():.4f}, restart {restart}")
    dist.barrier()  # leave together: a peer tearing gloo down early can abort the others
    dist.destroy_process_group()
    # torch 2.13's gloo can abort in C++ destructors at interpreter exit ("terminate called
    # without an active exception": 4 of ~80 restarted jobs here); the agent then counts a
    # finished worker as failed. Training is done and the output flushed: skip them.
    if telemetry is not None:
        telemetry.shutdown()  # os._exit skips exit handlers
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
