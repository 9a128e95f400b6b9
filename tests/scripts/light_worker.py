"""A worker that trains nothing, for jobs whose tests read only what the agents export
(rendezvous rounds, their traces, the worker spans the agents make, exit codes): it imports
neither torch nor elastic_otel, so that a job costs what its agents do (a worker of
examples/train.py costs ~2.5 CPU-seconds: torch's import, a gloo process group, the SDK).
``TRAIN_WAIT_FOR_WORLD``: idle (up to ``TRAIN_WAIT_SECONDS``, default 120) while torchrun's
``WORLD_SIZE`` is smaller, so that an elastic scale-up restarts it, as examples/train.py does.
``TRAIN_IDLE_SECONDS``: then idle this long (default 0), so that the agents' monitor finds the
group running (torch asks the rendezvous for waiting nodes only then).
"""

from __future__ import annotations

import os
import time


def main() -> None:
    wait_for = int(os.environ.get("TRAIN_WAIT_FOR_WORLD", "0"))
    deadline = time.monotonic() + float(os.environ.get("TRAIN_WAIT_SECONDS", "120"))
    world = int(os.environ["WORLD_SIZE"])
    while world < wait_for and time.monotonic() < deadline:
        time.sleep(0.2)  # torchrun restarts this worker when more nodes join
    time.sleep(float(os.environ.get("TRAIN_IDLE_SECONDS", "0")))
    print(f"rank {os.environ['RANK']} of {world} done", flush=True)


if __name__ == "__main__":
    main()
