"""The batch scheduler's identity of the job as resource attributes: Slurm's, from its environment.

Under Slurm every record (span, log record, metric) carries the job id, its array job and task,
the requeue count, the partition, the cluster and the node Slurm runs the process on, so that a
backend filters one job, one attempt or one node without the script passing anything. Read only
from the variables Slurm sets in a job's environment (no ``scontrol``, nothing that needs Slurm
installed); :func:`elastic_otel.emit.pipeline.build_resource` adds them under what the user set
(``OTEL_RESOURCE_ATTRIBUTES`` wins). OpenTelemetry has no Slurm convention: the ``slurm.*``
names are this project's, shaped like the conventions' (``docs/slurm.md`` says why).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from elastic_otel.config.environment import env_flag
from elastic_otel.names import environment_variables as env

_logger = logging.getLogger("elastic_otel")

SLURM_JOB_ID = "slurm.job.id"
SLURM_JOB_NAME = "slurm.job.name"
SLURM_JOB_ARRAY_ID = "slurm.job.array.id"
SLURM_JOB_ARRAY_TASK_ID = "slurm.job.array.task_id"
SLURM_JOB_RESTART_COUNT = "slurm.job.restart_count"
SLURM_JOB_PARTITION = "slurm.job.partition"
SLURM_CLUSTER_NAME = "slurm.cluster.name"
SLURM_NODE_NAME = "slurm.node.name"
SLURM_STEP_ID = "slurm.step.id"

_TEXT = (
    (SLURM_JOB_ID, (env.SLURM_JOB_ID, env.SLURM_JOBID)),
    (SLURM_JOB_NAME, (env.SLURM_JOB_NAME,)),
    (SLURM_JOB_ARRAY_ID, (env.SLURM_ARRAY_JOB_ID,)),
    (SLURM_JOB_ARRAY_TASK_ID, (env.SLURM_ARRAY_TASK_ID,)),
    (SLURM_JOB_PARTITION, (env.SLURM_JOB_PARTITION,)),
    (SLURM_CLUSTER_NAME, (env.SLURM_CLUSTER_NAME,)),
    (SLURM_NODE_NAME, (env.SLURMD_NODENAME,)),
    (SLURM_STEP_ID, (env.SLURM_STEP_ID,)),
)
"""Attribute ← the Slurm variables it is read from, the first set winning (ids are strings,
as ``OTEL_RESOURCE_ATTRIBUTES`` would give them)."""

MAX_VALUE_CHARS = 256
"""Longer values are cut (with one warning): Slurm's own are far shorter."""

_warned: set[str] = set()


def scheduler_attributes(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The job's Slurm identity from ``environ`` (default ``os.environ``); empty outside Slurm
    or with :data:`~elastic_otel.names.environment_variables.ELASTIC_OTEL_SLURM_RESOURCE`
    ``false``. Never raises: a malformed value is left out (or cut) with one warning."""
    try:
        environ = os.environ if environ is None else environ
        if not env_flag(env.ELASTIC_OTEL_SLURM_RESOURCE, True):
            return {}
        return _slurm(environ)
    except Exception:  # pragma: no cover - nothing here may stop a job
        _logger.warning("elastic-otel: reading Slurm's environment failed", exc_info=True)
        return {}


def _slurm(environ: Mapping[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, names in _TEXT:
        value = _value(environ, names)
        if value is not None:
            found[key] = value
    if SLURM_JOB_ID not in found:  # not a Slurm job (or one whose environment was cleared)
        return {}
    # The requeue count: Slurm sets it from the first requeue on; unset is the first attempt.
    count = _count(environ, env.SLURM_RESTART_COUNT)
    if count is not None:
        found[SLURM_JOB_RESTART_COUNT] = count
    return found


def _value(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = str(environ.get(name, "")).strip()
        if not value:
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # undecodable bytes in the environment: OTLP takes UTF-8 only
            _warn_once(name, f"{name} is not UTF-8; undecodable bytes replaced")
            value = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        if len(value) > MAX_VALUE_CHARS:
            _warn_once(name, f"{name} is longer than {MAX_VALUE_CHARS} characters; cut")
            value = value[:MAX_VALUE_CHARS]
        return value
    return None


def _count(environ: Mapping[str, str], name: str) -> int | None:
    """A non-negative count, 0 when unset. A malformed one (``"two"``, ``"-1"``) is ``None``,
    left out with one warning: a wrong attempt number would be worse than none, and a string
    under the key would give it two types in a backend's index. (The trace-id salt still
    takes the raw value, so attempts keep their own traces: ``model/trace_ids.py``.)"""
    raw = str(environ.get(name, "")).strip()
    if not raw:
        return 0
    try:
        count = int(raw)
    except ValueError:
        count = -1
    if count < 0:
        _warn_once(name, f"{name}={raw[:40]!r} is not a count; {SLURM_JOB_RESTART_COUNT} left out")
        return None
    return count


def _warn_once(name: str, message: str) -> None:
    if name not in _warned:
        _warned.add(name)
        _logger.warning("elastic-otel: %s", message)
