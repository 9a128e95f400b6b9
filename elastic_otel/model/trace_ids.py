"""Trace identity shared by every node of a rendezvous, without context propagation.

The nodes of a job are separate processes on separate hosts: the only facts they share are
the rendezvous ``run_id``, the round number, and the environment the scheduler gives the job.
Each process therefore derives the same 128-bit trace id from ``(salt, run_id, round)``:

* one trace per rendezvous **round**, not per run: a job that restarts 200 times over three
  days gives 200 small traces Jaeger can open, linked round to round with span links;
* ``salt`` separates jobs that reuse a run_id: torchrun's default ``--rdzv-id`` is the string
  ``none``. It is ``ELASTIC_OTEL_JOB_ID`` or a scheduler's job id (Slurm, LSF, PBS, Flux).

Because the id is a hash, trace-id load balancing in a collector tier (the ``loadbalancing``
exporter with ``routing_key: traceID``) sends all spans of one round to the same backend.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Mapping

from elastic_otel.names import environment_variables as env

_logger = logging.getLogger(__name__)


def job_salt(environ: Mapping[str, str] | None = None) -> str:
    """The salt of this attempt of the job.

    The job: ``ELASTIC_OTEL_JOB_ID``, else the first scheduler job id set. The attempt:
    ``ELASTIC_OTEL_JOB_ATTEMPT``, else the scheduler's count (Slurm's ``SLURM_RESTART_COUNT``);
    the first attempt (none, or ``0``) adds nothing, so its trace ids do not depend on whether
    the scheduler counts attempts at all.
    """
    environ = os.environ if environ is None else environ
    salt = environ.get(env.ELASTIC_OTEL_JOB_ID, "").strip()
    if not salt:
        for name in env.SCHEDULER_JOB_ID_VARIABLES:
            value = environ.get(name, "").strip()
            if value:
                salt = f"{name}={value}"
                break
    attempt = environ.get(env.ELASTIC_OTEL_JOB_ATTEMPT, "").strip()
    for name in env.SCHEDULER_ATTEMPT_VARIABLES:
        attempt = attempt or environ.get(name, "").strip()
    if attempt and attempt != "0":
        salt = f"{salt}#attempt={attempt}"
    return salt


@functools.lru_cache(maxsize=4096)  # every event of a round asks for the same id
def trace_id_for(salt: str, run_id: str, round_key: int | str) -> int:
    """The trace id of one rendezvous round (never 0, which OTel reserves as invalid)."""
    # JSON keeps the parts apart whatever they contain (a separator could be forged).
    key = json.dumps([salt, run_id, round_key], ensure_ascii=True)
    digest = hashlib.blake2b(key.encode("ascii"), digest_size=16).digest()
    return int.from_bytes(digest, "big") or 1


class SaltWarning:
    """Warns once per process when run_id ``none`` meets an empty salt."""

    def __init__(self) -> None:
        self._warned = False

    def check(self, salt: str, run_id: str) -> None:
        if self._warned or salt or run_id not in ("none", ""):
            return
        self._warned = True
        _logger.warning(
            "elastic-otel: rendezvous run_id is %r and no job id is set, so unrelated jobs "
            "would share trace ids; set %s (or --rdzv-id) to a value unique to this job",
            run_id,
            env.ELASTIC_OTEL_JOB_ID,
        )


class TraceIds:
    """``trace_id_for`` with this process's salt, warning once when the salt is missing."""

    def __init__(self, salt: str = "") -> None:
        self.salt = salt
        self._warning = SaltWarning()

    def __call__(self, run_id: str, round_key: int | str) -> int:
        self._warning.check(self.salt, run_id)
        return trace_id_for(self.salt, run_id, round_key)
