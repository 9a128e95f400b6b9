"""The runtime's settings: every ``ELASTIC_OTEL_*`` variable it reads, read once.

:meth:`Settings.from_environment` reads them all with the tolerant readers (a malformed value
is its default, with one warning); the process's handler reads them when it is made and passes
them down, so no two parts of a process can disagree about a setting. What is left out on
purpose: ``docs/architecture.md`` (Life cycle); the variables: ``docs/configuration.md``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from elastic_otel.config.environment import (
    env_exception_signal,
    env_flag,
    env_float,
    env_int,
    env_switch,
    env_worker_output,
)
from elastic_otel.names.environment_variables import (
    DEFAULT_EXIT_TIMEOUT_S,
    DEFAULT_MAX_OPEN_SPANS,
    DEFAULT_OPEN_SPAN_INTERVAL_S,
    DEFAULT_QUEUE_SIZE,
    DEFAULT_RAW_LIMIT,
    DEFAULT_RDMA_SYSFS,
    DEFAULT_RETRY_QUEUE_SIZE,
    DEFAULT_ROUND_TRACE_MAX_NODES,
    DEFAULT_SLOWDOWN_RATIO,
    DEFAULT_STALL_AFTER_S,
    DEFAULT_STRAGGLER_SCORE,
    DEFAULT_STRAGGLER_WINDOW_S,
    DEFAULT_WORKER_OUTPUT,
    DEFAULT_WORKER_OUTPUT_LINE_MAX,
    DEFAULT_WORKER_OUTPUT_RATE,
    ELASTIC_OTEL_AGENT_INSTRUMENTATION,
    ELASTIC_OTEL_ENABLED,
    ELASTIC_OTEL_EXIT_TIMEOUT,
    ELASTIC_OTEL_FORK_GUARD,
    ELASTIC_OTEL_GC_FREEZE,
    ELASTIC_OTEL_GOODPUT,
    ELASTIC_OTEL_HEARTBEAT_LOGS,
    ELASTIC_OTEL_LINK_STATS,
    ELASTIC_OTEL_MAX_OPEN_SPANS,
    ELASTIC_OTEL_METRICS,
    ELASTIC_OTEL_OPEN_SPAN_INTERVAL,
    ELASTIC_OTEL_QUEUE_SIZE,
    ELASTIC_OTEL_RAW_LIMIT,
    ELASTIC_OTEL_RDMA_SYSFS,
    ELASTIC_OTEL_RDZV_EVENTS,
    ELASTIC_OTEL_RETRY_QUEUE_SIZE,
    ELASTIC_OTEL_ROUND_TRACE_MAX_NODES,
    ELASTIC_OTEL_SLOWDOWN,
    ELASTIC_OTEL_STALL_AFTER,
    ELASTIC_OTEL_STALL_EXCHANGE,
    ELASTIC_OTEL_STRAGGLER_SCORE,
    ELASTIC_OTEL_STRAGGLER_WINDOW,
    ELASTIC_OTEL_TRACES,
    ELASTIC_OTEL_WORKER_OUTPUT_LINE_MAX,
    ELASTIC_OTEL_WORKER_OUTPUT_RATE,
    ELASTIC_OTEL_WORKER_STARTUP,
    WORKER_OUTPUT_STREAMS,
)


@dataclass(frozen=True)
class Settings:
    """One field per ``ELASTIC_OTEL_*`` setting (and the exception opt-in of the semantic
    conventions); the field defaults are the documented ones (``Settings()`` is what an empty
    environment gives)."""

    enabled: bool | None = None
    """``ELASTIC_OTEL_ENABLED``: ``None`` (unset) decides from context."""
    rdzv_events: bool = True
    """``ELASTIC_OTEL_RDZV_EVENTS``: route torch's ``dynamic_rendezvous`` to the bridge."""
    traces: bool = True
    """``ELASTIC_OTEL_TRACES``: the span model (``False``: log records only)."""
    metrics: bool = True
    """``ELASTIC_OTEL_METRICS``: torchelastic's metrics and the bridge's counters as metrics."""
    agent_instrumentation: bool | None = None
    """``ELASTIC_OTEL_AGENT_INSTRUMENTATION``: ``None``: on the tested torch versions."""
    exit_timeout_s: float = DEFAULT_EXIT_TIMEOUT_S
    """``ELASTIC_OTEL_EXIT_TIMEOUT``: the one bound of the exit path."""
    queue_size: int = DEFAULT_QUEUE_SIZE
    """``ELASTIC_OTEL_QUEUE_SIZE``: the bridge's event queue (and the SDK's batch queues)."""
    retry_queue_size: int = DEFAULT_RETRY_QUEUE_SIZE
    """``ELASTIC_OTEL_RETRY_QUEUE_SIZE``: records per signal held through an outage."""
    max_open_spans: int = DEFAULT_MAX_OPEN_SPANS
    """``ELASTIC_OTEL_MAX_OPEN_SPANS``: nodes and agents tracked before the LRU one ends."""
    heartbeat_logs: bool = True
    """``ELASTIC_OTEL_HEARTBEAT_LOGS``: a log record per keep-alive."""
    open_span_interval_s: float = DEFAULT_OPEN_SPAN_INTERVAL_S
    """``ELASTIC_OTEL_OPEN_SPAN_INTERVAL``: seconds between open-span snapshots (0: none)."""
    stall_after_s: float = DEFAULT_STALL_AFTER_S
    """``ELASTIC_OTEL_STALL_AFTER``: seconds of waiting before a stall report (0: none)."""
    straggler_window_s: float = DEFAULT_STRAGGLER_WINDOW_S
    """``ELASTIC_OTEL_STRAGGLER_WINDOW``: seconds per straggler window (0: no scores)."""
    straggler_score: float = DEFAULT_STRAGGLER_SCORE
    """``ELASTIC_OTEL_STRAGGLER_SCORE``: a straggler's score stays below this."""
    slowdown: float = DEFAULT_SLOWDOWN_RATIO
    """``ELASTIC_OTEL_SLOWDOWN``: a lasting slowdown is this much slower (0: no reports)."""
    link_stats: bool = True
    """``ELASTIC_OTEL_LINK_STATS``: read TCP connection statistics and RDMA counters."""
    rdma_sysfs: str = DEFAULT_RDMA_SYSFS
    """``ELASTIC_OTEL_RDMA_SYSFS``: where the RDMA ports are read from."""
    round_trace_max_nodes: int = DEFAULT_ROUND_TRACE_MAX_NODES
    """``ELASTIC_OTEL_ROUND_TRACE_MAX_NODES``: larger rounds get a trace per node (0: never)."""
    fork_guard: bool = True
    """``ELASTIC_OTEL_FORK_GUARD``."""
    gc_freeze: bool = True
    """``ELASTIC_OTEL_GC_FREEZE``: the heap alive when the bridge starts leaves the GC's scans."""
    raw_limit: int = DEFAULT_RAW_LIMIT
    """``ELASTIC_OTEL_RAW_LIMIT``: characters of unparseable input kept."""
    worker_startup: bool = True
    """``ELASTIC_OTEL_WORKER_STARTUP``: the worker-side start-up the instrumented agent arranges."""
    goodput: bool = True
    """``ELASTIC_OTEL_GOODPUT``: the agent's goodput accounting (summary records, metrics)."""
    stall_exchange: bool = True
    """``ELASTIC_OTEL_STALL_EXCHANGE``: stalled nodes share who is late through the round's
    store."""
    worker_output: str = DEFAULT_WORKER_OUTPUT
    """``ELASTIC_OTEL_WORKER_OUTPUT``: the workers' streams that become log records
    (``stderr``, ``stdout``, ``all``, ``none``; :attr:`worker_output_streams`)."""
    worker_output_rate: float = DEFAULT_WORKER_OUTPUT_RATE
    """``ELASTIC_OTEL_WORKER_OUTPUT_RATE``: records per second and worker (0: no limit)."""
    worker_output_line_max: int = DEFAULT_WORKER_OUTPUT_LINE_MAX
    """``ELASTIC_OTEL_WORKER_OUTPUT_LINE_MAX``: bytes of a line kept."""
    exception_signal: str | None = None
    """``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN``: ``logs``, ``logs/dup``, or ``None``: exceptions
    as span events."""

    @property
    def worker_output_streams(self) -> tuple[str, ...]:
        """The streams ``worker_output`` names (``stdout``, ``stderr``)."""
        return WORKER_OUTPUT_STREAMS.get(self.worker_output, ())

    @classmethod
    def from_environment(cls) -> Settings:
        """Read every setting now (each reader warns once about a malformed value)."""
        return cls(
            enabled=env_switch(ELASTIC_OTEL_ENABLED),
            rdzv_events=env_flag(ELASTIC_OTEL_RDZV_EVENTS, True),
            traces=env_flag(ELASTIC_OTEL_TRACES, True),
            metrics=env_flag(ELASTIC_OTEL_METRICS, True),
            agent_instrumentation=env_switch(ELASTIC_OTEL_AGENT_INSTRUMENTATION),
            exit_timeout_s=env_float(ELASTIC_OTEL_EXIT_TIMEOUT, DEFAULT_EXIT_TIMEOUT_S),
            queue_size=env_int(ELASTIC_OTEL_QUEUE_SIZE, DEFAULT_QUEUE_SIZE),
            retry_queue_size=env_int(ELASTIC_OTEL_RETRY_QUEUE_SIZE, DEFAULT_RETRY_QUEUE_SIZE),
            max_open_spans=env_int(ELASTIC_OTEL_MAX_OPEN_SPANS, DEFAULT_MAX_OPEN_SPANS),
            heartbeat_logs=env_flag(ELASTIC_OTEL_HEARTBEAT_LOGS, True),
            open_span_interval_s=env_float(
                ELASTIC_OTEL_OPEN_SPAN_INTERVAL, DEFAULT_OPEN_SPAN_INTERVAL_S
            ),
            stall_after_s=env_float(ELASTIC_OTEL_STALL_AFTER, DEFAULT_STALL_AFTER_S),
            straggler_window_s=env_float(ELASTIC_OTEL_STRAGGLER_WINDOW, DEFAULT_STRAGGLER_WINDOW_S),
            straggler_score=env_float(ELASTIC_OTEL_STRAGGLER_SCORE, DEFAULT_STRAGGLER_SCORE),
            slowdown=env_float(ELASTIC_OTEL_SLOWDOWN, DEFAULT_SLOWDOWN_RATIO),
            link_stats=env_flag(ELASTIC_OTEL_LINK_STATS, True),
            rdma_sysfs=os.environ.get(ELASTIC_OTEL_RDMA_SYSFS) or DEFAULT_RDMA_SYSFS,
            round_trace_max_nodes=env_int(
                ELASTIC_OTEL_ROUND_TRACE_MAX_NODES, DEFAULT_ROUND_TRACE_MAX_NODES
            ),
            fork_guard=env_flag(ELASTIC_OTEL_FORK_GUARD, True),
            gc_freeze=env_flag(ELASTIC_OTEL_GC_FREEZE, True),
            raw_limit=env_int(ELASTIC_OTEL_RAW_LIMIT, DEFAULT_RAW_LIMIT),
            worker_startup=env_flag(ELASTIC_OTEL_WORKER_STARTUP, True),
            goodput=env_flag(ELASTIC_OTEL_GOODPUT, True),
            stall_exchange=env_flag(ELASTIC_OTEL_STALL_EXCHANGE, True),
            worker_output=env_worker_output(),
            worker_output_rate=env_float(
                ELASTIC_OTEL_WORKER_OUTPUT_RATE, DEFAULT_WORKER_OUTPUT_RATE
            ),
            worker_output_line_max=env_int(
                ELASTIC_OTEL_WORKER_OUTPUT_LINE_MAX, DEFAULT_WORKER_OUTPUT_LINE_MAX
            ),
            exception_signal=env_exception_signal(),
        )
