"""A training script that prints known lines on stdout and stderr (issue 29): each rank five
lines on each stream, a Python logging warning on stdout and a handled traceback on stderr;
rank 2 invalid UTF-8 on stderr; then, after a barrier, rank 3 writes 10 MB on stdout without a
newline and rank 1, whose ``main`` has torch's ``@record`` (which points faulthandler at
stderr), dies of a SIGSEGV while the others sleep until their agents stop them.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

BLOB = 10 * 1024 * 1024


@record
def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    logging.basicConfig(stream=sys.stdout)  # Python logging's default format: LEVEL:name:msg
    for i in range(5):
        print(f"rank {rank} out {i}", flush=True)
        print(f"rank {rank} err {i}", file=sys.stderr, flush=True)
    logging.getLogger("train").warning("rank %d warned", rank)
    sys.stdout.flush()
    try:
        raise ValueError(f"rank {rank} handled")
    except ValueError:
        traceback.print_exc()
    if rank == 2:
        sys.stderr.buffer.write(b"rank 2 junk \xff\xfe\n")
        sys.stderr.flush()
    dist.barrier()
    if rank == 3:
        for _ in range(BLOB // 65536):
            sys.stdout.write("x" * 65536)
        sys.stdout.flush()
    if rank == 1:
        time.sleep(1.5)  # rank 3's blob is out
        os.kill(os.getpid(), signal.SIGSEGV)  # FAULT LINE
    time.sleep(4)  # rank 0 is stopped by its agent meanwhile
    sys.exit(3)  # ranks 2 and 3 fail their node too, silently: the job ends on both nodes


if __name__ == "__main__":
    main()
