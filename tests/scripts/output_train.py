"""A training script that prints known lines on stdout and stderr (issue 29): each rank five
lines on each stream, a Python logging warning on stdout and a handled traceback on stderr, and
an INFO line on stderr in each logging format a level is read from (issue 36); rank 2 invalid
UTF-8 on stderr; then, after a barrier, rank 3 writes 10 MB on stdout without a
newline and rank 1, whose ``main`` has torch's ``@record`` (which points faulthandler at
stderr), dies of a SIGSEGV while the others sleep until their agents stop them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from datetime import datetime, timezone

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

BLOB = 10 * 1024 * 1024
PYTHON_FORMATS = {  # name: (format, datefmt), as the libraries configure Python's logging
    "hf-explicit": ("[%(levelname)s|%(filename)s:%(lineno)s] %(asctime)s >> %(message)s", None),
    "hf-examples": ("%(asctime)s - %(levelname)s - %(name)s - %(message)s", "%m/%d/%Y %H:%M:%S"),
    "lightning": ("%(levelname)s: %(message)s", None),
}


def info_in_each_format() -> None:
    """One INFO line on stderr per format; each says ``format <name>`` (and no rank: the
    timestamps differ from run to run, and the console comparison skips lines without one)."""
    log = logging.getLogger("formats")
    log.propagate = False
    log.setLevel(logging.INFO)
    for name, (fmt, datefmt) in PYTHON_FORMATS.items():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(fmt, datefmt))
        log.addHandler(handler)
        log.info("format %s", name)
        log.removeHandler(handler)
    now = datetime.now(timezone.utc)
    # loguru's default: {time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <8} | {name}:{function}:{line}
    stamp = f"{now:%Y-%m-%d %H:%M:%S}.{now.microsecond // 1000:03d}"
    print(f"{stamp} | {'INFO':<8} | __main__:main:30 - format loguru", file=sys.stderr)
    print(f'time={now:%Y-%m-%dT%H:%M:%SZ} level=info msg="format logfmt"', file=sys.stderr)
    record = {"time": now.isoformat(), "level": "info", "msg": "format json"}
    print(json.dumps(record), file=sys.stderr, flush=True)


@record
def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    logging.basicConfig(stream=sys.stdout)  # Python logging's default format: LEVEL:name:msg
    info_in_each_format()  # first: rank 1's last words are its lines below
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
