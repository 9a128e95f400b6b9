"""A worker that trains nothing, for jobs whose tests read only what the agents export
(rendezvous rounds, their traces, the worker spans the agents make, exit codes): it imports
neither torch nor elastic_otel, so that a job costs what its agents do (a worker of
examples/train.py costs ~2.5 CPU-seconds: torch's import, a gloo process group, the SDK).
``TRAIN_WAIT_FOR_WORLD``: idle (up to ``TRAIN_WAIT_SECONDS``, default 120) while torchrun's
``WORLD_SIZE`` is smaller, so that an elastic scale-up restarts it, as examples/train.py does.
``TRAIN_IDLE_SECONDS``: then idle this long (default 0), so that the agents' monitor finds the
group running (torch asks the rendezvous for waiting nodes only then).
``TRAIN_FAIL_RANK``: that rank raises once (its marker in ``TRAIN_FAIL_ONCE_DIR``), once every
other rank has started; those then do what a peer waiting for it does, by
``TRAIN_PEER_FAILURE``: ``wait`` (default; idle until their agent stops them for the restart,
as in ``init_process_group``) or ``exit`` (exit 1, as a collective that lost its peer does).
"""

from __future__ import annotations

import os
import pathlib
import sys
import time


def _fail_once(rank: int, world: int, deadline: float) -> None:
    fail_rank = os.environ.get("TRAIN_FAIL_RANK", "")
    if not fail_rank:
        return
    folder = pathlib.Path(os.environ.get("TRAIN_FAIL_ONCE_DIR", "."))
    marker = folder / f"failed-rank{fail_rank}"
    if marker.exists():
        return  # a later attempt: it failed before
    if rank != int(fail_rank):
        (folder / f"started-rank{rank}").touch()
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if os.environ.get("TRAIN_PEER_FAILURE", "wait") == "exit":
            sys.exit(1)
        while time.monotonic() < deadline:
            time.sleep(0.1)  # the agent stops this worker for the restart
        return
    others = [folder / f"started-rank{r}" for r in range(world) if r != rank]
    while not all(f.exists() for f in others) and time.monotonic() < deadline:
        time.sleep(0.1)
    marker.touch()
    raise RuntimeError(f"injected failure on rank {rank}")


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    wait_for = int(os.environ.get("TRAIN_WAIT_FOR_WORLD", "0"))
    deadline = time.monotonic() + float(os.environ.get("TRAIN_WAIT_SECONDS", "120"))
    _fail_once(rank, world, deadline)
    while world < wait_for and time.monotonic() < deadline:
        time.sleep(0.2)  # torchrun restarts this worker when more nodes join
    time.sleep(float(os.environ.get("TRAIN_IDLE_SECONDS", "0")))
    print(f"rank {rank} of {world} done", flush=True)


if __name__ == "__main__":
    main()
