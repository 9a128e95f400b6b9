"""Attribute keys, span names and enumerations the bridge emits.

All project-specific keys share one namespace, ``torchelastic.*``; host, process and
exception data use the OpenTelemetry semantic-convention names. ``docs/attributes.md`` lists
every key with its meaning (checked by ``tests/unit/test_docs.py``).
"""

from __future__ import annotations

from typing import Final

NS: Final = "torchelastic."

RUN_ID: Final = "torchelastic.run_id"
RANK: Final = "torchelastic.rank"
GLOBAL_RANK: Final = "torchelastic.global_rank"
GROUP_RANK: Final = "torchelastic.group_rank"
LOCAL_RANK: Final = "torchelastic.local_rank"
ROLE: Final = "torchelastic.role"
ROLE_RANK: Final = "torchelastic.role_rank"
WORKER_ID: Final = "torchelastic.worker_id"
WORKER_PID: Final = "torchelastic.worker_pid"
EXIT_CODE: Final = "torchelastic.exit_code"
STATE: Final = "torchelastic.state"
TORCH_STATE: Final = "torchelastic.torch_state"
"""On a record (and ``agent.run`` span) whose outcome the bridge restated from what happened:
the state torch's own event said (``SUCCEEDED``, recorded by torch's launcher whenever
``agent.run()`` returns, also when its workers failed); docs/outcomes.md."""
NODE_STATE: Final = "torchelastic.node_state"
ROUND: Final = "torchelastic.round"
WORLD_SIZE: Final = "torchelastic.world_size"
LINK_KIND: Final = "torchelastic.link.kind"
"""On the links between a round's trace and a node's own trace (large rounds): ``node`` on the
``rendezvous.join`` span's link to the node's ``rendezvous.member`` span, ``round`` on the
member's link back."""
LINK_NODE: Final = "node"
LINK_ROUND: Final = "round"
LOCAL_ID: Final = "torchelastic.local_id"
MASTER_ENDPOINT: Final = "torchelastic.master_endpoint"
RDZV_BACKEND: Final = "torchelastic.rdzv_backend"
AGENT_RESTARTS: Final = "torchelastic.agent_restarts"
DURATION_MS: Final = "torchelastic.duration_ms"
EVENT_NAME: Final = "torchelastic.event.name"
EVENT_SOURCE: Final = "torchelastic.event.source"
RDZV_ACTION: Final = "torchelastic.rendezvous.action"
ERROR_CATEGORY: Final = "torchelastic.error.category"
UNPARSED: Final = "torchelastic.unparsed"
INVALID_PREFIX: Final = "torchelastic.invalid."
"""``torchelastic.invalid.<field>``: the text of a field of a parsed event that had a value of
the wrong kind (a pid of ``"²"``); the field itself is left out, the rest of the event kept."""
PARSE_ERROR: Final = "torchelastic.parse_error"
RAW: Final = "torchelastic.raw"
END_REASON: Final = "torchelastic.end_reason"
KEEP_ALIVE_COUNT: Final = "torchelastic.keep_alive.count"
KEEP_ALIVE_FAILURES: Final = "torchelastic.keep_alive.failures"
KEEP_ALIVE_LAST_NS: Final = "torchelastic.keep_alive.last_time_unix_nano"
HEARTBEAT_UPDATE_COUNT: Final = "torchelastic.heartbeat_update.count"
SYNC_COUNT: Final = "torchelastic.sync.count"
DROPPED_EVENTS: Final = "torchelastic.dropped_events"
START_UNKNOWN: Final = "torchelastic.start_unknown"
MESSAGE: Final = "torchelastic.message"
ROLE_WORLD_SIZE: Final = "torchelastic.role_world_size"
GROUP_WORLD_SIZE: Final = "torchelastic.group_world_size"
ENTRY_POINT: Final = "torchelastic.entry_point"
OBSERVED_BY: Final = "torchelastic.observed_by"
"""``monitor_workers``: an outcome the bridge saw when torch's agent did (not torch's event)."""
STALLED_IN: Final = "torchelastic.stalled.in"
"""What a stalled node waits in: ``rendezvous.join``, ``exit_barrier``, ``stop_workers``."""
STALLED_SECONDS: Final = "torchelastic.stalled.seconds"
STALLED_RANKS: Final = "torchelastic.stalled.ranks"
"""On a training stall: the global ranks the others wait for, as the node sees them or, when
they are on other nodes, as those nodes said (``torchelastic.stalled.remote_host``; an int
array; absent when nobody named them)."""
STALLED_WAITING: Final = "torchelastic.stalled.waiting"
"""On a training stall: the node's global ranks waiting inside the collective (an int array)."""
STALLED_COLLECTIVE: Final = "torchelastic.stalled.collective"
"""On a training stall: the collective the waiting ranks are in (``all_reduce``, ``barrier``)."""
STALLED_COLLECTIVE_NUMBER: Final = "torchelastic.stalled.collective_number"
"""Which collective that is (1: the first): its sequence number in its process group where
torch's Flight Recorder says, else counted by each rank's Python collectives."""
STALLED_PROCESS_GROUP: Final = "torchelastic.stalled.process_group"
"""On a training stall: the process group of the collective (torch's group name, ``0``: the
default group), where torch's Flight Recorder says."""
STALLED_BACKEND: Final = "torchelastic.stalled.backend"
"""On a training stall: the backend whose Flight Recorder record says so (``gloo``, ``nccl``)."""
STALLED_NOT_REACHED: Final = "torchelastic.stalled.not_reached"
"""Of the ranks waited for, those that issued the collective and whose device has not started
it (``scheduled``: their own compute is slow or stuck), where the record tracks the device's
start (NCCL with ``TORCH_NCCL_ENABLE_TIMING``; an int array)."""
STALLED_LEFT: Final = "torchelastic.stalled.left"
"""Of the ranks waited for, those that left training: destroyed their default process group or
began to exit while the others wait in a collective they never issued (a rank that ran out of
data first: uneven inputs; an int array)."""
STALLED_STATE_KNOWN: Final = "torchelastic.stalled.state_known"
"""``true`` when the record tracks the device's start of the collective, so that the ranks
waiting are inside it on their device; ``false`` on NCCL without timing events."""
STALLED_PHASE: Final = "torchelastic.stalled.phase"
"""On a training stall before training began: ``startup`` (the ranks wait in
``init_process_group`` or the job's first collective for ranks that have not reached it);
absent once training began."""
STALLED_LOCAL_GROUP: Final = "torchelastic.stalled.local_group"
"""``true`` when every member of the stuck collective's process group is on this node: no rank
elsewhere is waited for, whatever the record can tell of the GPUs."""
STALLED_TIMED_OUT: Final = "torchelastic.stalled.timed_out"
"""On a training stall after torch's NCCL watchdog timed the collective out: the global ranks
whose watchdog said so (an int array); ``torchelastic.nccl.timeout_s`` says after how long."""
NCCL_TIMING: Final = "torchelastic.nccl.timing"
"""A worker's NCCL timing events, ``on`` or ``off`` (``ELASTIC_OTEL_NCCL_TIMING``), on its
decision record and on every NCCL training stall report."""
NCCL_TIMING_REASON: Final = "torchelastic.nccl.timing.reason"
"""Why: ``within_budget``, ``over_budget``, ``measuring``, ``forced``, ``set_by_job``,
``not_at_run_time``."""
NCCL_TIMING_RATE: Final = "torchelastic.nccl.timing.rate"
"""The NCCL collectives a second the worker measured for the decision (``auto``)."""
NCCL_TIMING_COST: Final = "torchelastic.nccl.timing.cost_percent"
"""What timing costs at that rate, in percent of wall time (rate x cost per collective)."""
NCCL_TIMING_BUDGET: Final = "torchelastic.nccl.timing.budget_percent"
"""The budget it was held to (``ELASTIC_OTEL_NCCL_TIMING_BUDGET``)."""
NCCL_TIMING_COST_US: Final = "torchelastic.nccl.timing.cost_us"
"""The cost per collective it was reckoned with, in µs (``ELASTIC_OTEL_NCCL_TIMING_COST_US``)."""
NCCL_TIMING_FROM: Final = "torchelastic.nccl.timing.from"
"""On a NCCL training stall whose collective was enqueued before ``auto`` turned timing on: the
group's first collective with timing events (the stuck one never gets a start event)."""
STALLED_REMOTE_HOST: Final = "torchelastic.stalled.remote_host"
"""On a training stall whose ranks waited for are on other nodes, as those nodes said through
the round's store: their hosts (comma separated); ``torchelastic.stalled.ranks`` names the
ranks and ``torchelastic.stack.frame`` the first one's frame."""
STALLED_REMOTE_PIDS: Final = "torchelastic.stalled.remote_pids"
"""Their nodes' agent process ids, in the same order (an int array): with the host, how
``elastic-otel timeline`` names a node."""
STRAGGLER_RANK: Final = "torchelastic.straggler.rank"
"""On a straggler report: the global rank that keeps its local peers waiting."""
STRAGGLER_SCORE: Final = "torchelastic.straggler.score"
"""Its score over the last window: 1 - lateness / interval, in [0, 1] (1: as fast as the fastest
local peer); also the gauge of that name, by ``torchelastic.global_rank``, for every rank."""
STRAGGLER_LATENESS: Final = "torchelastic.straggler.lateness"
"""Seconds per collective it issued after the earliest local peer (mean over the window); also
the gauge of that name, by ``torchelastic.global_rank``."""
STRAGGLER_INTERVAL: Final = "torchelastic.straggler.interval"
"""Seconds between consecutive collectives of its process group over the window (mean)."""
STRAGGLER_WAITED_SHARE: Final = "torchelastic.straggler.waited_share"
"""The share of that interval its local peers spent waiting for it (what it costs the job)."""
STRAGGLER_WAITING: Final = "torchelastic.straggler.waiting"
"""The local global ranks that wait for it (an int array)."""
STRAGGLER_WINDOWS: Final = "torchelastic.straggler.windows"
"""Consecutive windows it has been the node's straggler."""
STRAGGLER_PROCESS_GROUP: Final = "torchelastic.straggler.process_group"
"""The process group its lateness was measured in (torch's group name; ``0``: the default)."""
STRAGGLER_BASIS: Final = "torchelastic.straggler.basis"
"""On a straggler report: what it was scored from, ``issued`` (when each rank issued each
collective) or ``inside`` (the device's time inside each one: NCCL with timing events)."""
STRAGGLER_NODE: Final = "torchelastic.straggler.node"
"""On a slow-node report: the host name of the node whose every rank keeps the other nodes
waiting."""
STRAGGLER_NODE_RANK: Final = "torchelastic.straggler.node_rank"
"""On a slow-node report: that node's rank in the round (torchrun's group rank)."""
STRAGGLER_NODE_RANKS: Final = "torchelastic.straggler.node_ranks"
"""On a slow-node report: that node's global ranks."""
STRAGGLER_WAITING_NODES: Final = "torchelastic.straggler.waiting_nodes"
"""On a slow-node report: the node ranks of the nodes compared with it, which wait for it."""
SLOWDOWN_EVENT_NAME: Final = "torchelastic.slowdown"
"""The record of a lasting slowdown of a process group's collectives (WARN while it lasts, INFO
once it ended: ``docs/hangs.md``, Slow links and slowdowns)."""
SLOWDOWN_STATE: Final = "SLOWDOWN"
SLOWDOWN_ENDED_STATE: Final = "SLOWDOWN_ENDED"
SLOWDOWN_PROCESS_GROUP: Final = "torchelastic.slowdown.process_group"
"""The process group that slowed (torch's group name; ``0``: the default group)."""
SLOWDOWN_BEGAN: Final = "torchelastic.slowdown.began"
"""When the slowdown began (the change point), ISO 8601 in UTC."""
SLOWDOWN_SECONDS: Final = "torchelastic.slowdown.seconds"
"""How long it has lasted (on the end record: how long it lasted)."""
SLOWDOWN_INTERVAL_BEFORE: Final = "torchelastic.slowdown.interval.before"
"""Seconds between consecutive collectives of the group in the job's baseline (after warm-up)."""
SLOWDOWN_INTERVAL_NOW: Final = "torchelastic.slowdown.interval.now"
"""The same since the slowdown began (on the end record: over the slowdown)."""
SLOWDOWN_RATIO: Final = "torchelastic.slowdown.ratio"
"""interval.now / interval.before; also the gauge of that name, by process group, on every node
(1: as fast as the baseline)."""
SLOWDOWN_INSIDE_BEFORE: Final = "torchelastic.slowdown.inside.before"
"""Seconds each local rank spends inside each collective in the baseline (mean over the ranks)."""
SLOWDOWN_INSIDE_NOW: Final = "torchelastic.slowdown.inside.now"
"""The same since the slowdown began."""
SLOWDOWN_INSIDE_RATIO: Final = "torchelastic.slowdown.inside.ratio"
"""inside.now / inside.before."""
SLOWDOWN_PART: Final = "torchelastic.slowdown.part"
"""Which part of the interval grew: ``communication`` (the time inside the collectives, every
rank alike: a link, the fabric) or ``compute`` (the time between them: the ranks' own work)."""
SLOWDOWN_ALIKE: Final = "torchelastic.slowdown.alike"
"""``true`` when every local rank's time inside grew alike (no rank is the cause)."""
SLOWDOWN_BASIS: Final = "torchelastic.slowdown.basis"
"""How the time inside was measured: ``timed`` (the device's time inside each collective: NCCL
with timing events) or ``sampled`` (the share of time each rank had a collective open, sampled
by its collectives thread)."""
SLOWDOWN_LOST: Final = "torchelastic.slowdown.lost_s"
"""Seconds of training lost to the slowdown so far: its time, less what its collectives would
have taken at the baseline's interval (on the end record: in all)."""
SLOWDOWN_COLLECTIVES: Final = "torchelastic.slowdown.collectives"
"""Collectives of the group issued since the slowdown began."""
SLOWDOWN_REPORTS: Final = "torchelastic.slowdown.reports"
"""The how-manieth report of this slowdown this record is (1: the first)."""
METRIC_SLOWDOWN_RATIO: Final = SLOWDOWN_RATIO
LINK_EVENT_NAME: Final = "torchelastic.link"
"""The record naming the link, NIC or node a slowdown comes from (WARN, on the round, from node 0)
or, on every node, what its own connections and NICs show."""
LINK_STATE: Final = "SLOW_LINK"
LINK_SCOPE: Final = "torchelastic.link.scope"
"""What is named: ``link`` (one pair of nodes), ``node`` (every path of one node: its NIC, its
cable), ``fabric`` (every path: a switch, the network), ``nic`` (an RDMA port whose counters
say so) or ``local`` (a node's own evidence)."""
LINK_TRANSPORT: Final = "torchelastic.link.transport"
"""Where the evidence comes from: ``tcp`` (the kernel's per-connection statistics), ``netdev``
(the node's own network interface: its transmit queue held traffic back, its errors moved, its
rate is lower; what tells the slow end of a link its paths cannot), ``rdma`` (the NIC's port
counters in sysfs) or ``p2p`` (the point-to-point sends and receives NCCL's Flight Recorder
timed)."""
LINK_NODES: Final = "torchelastic.link.node"
"""The host name(s) named (a string array: one for a node, two for a link)."""
LINK_NODE_RANK: Final = "torchelastic.link.node_rank"
"""Their node ranks in the round (an int array, in the same order)."""
LINK_ADDRESS: Final = "torchelastic.link.address"
"""Their addresses as the peers' connections see them (a string array)."""
LINK_PEER: Final = "torchelastic.link.peer"
"""On a node's own evidence: the peer address its worst connection goes to."""
LINK_RTT: Final = "torchelastic.link.rtt_s"
"""The smoothed round-trip time of the named paths (seconds, mean over their connections)."""
LINK_RTT_OTHERS: Final = "torchelastic.link.rtt_s.others"
"""The same over the other paths of the job (seconds); absent where there are none."""
LINK_RATE: Final = "torchelastic.link.delivery_rate"
"""The kernel's delivery rate of the named paths (bytes a second, mean over their busy
connections)."""
LINK_RATE_OTHERS: Final = "torchelastic.link.delivery_rate.others"
LINK_RETRANSMITS: Final = "torchelastic.link.retransmits"
"""Segments retransmitted a second on the named paths over the last window."""
LINK_RETRANSMITS_OTHERS: Final = "torchelastic.link.retransmits.others"
LINK_DEVICE: Final = "torchelastic.link.rdma.device"
"""An RDMA NIC's device and port (``mlx5_0/1``): ``/sys/class/infiniband/<device>/ports/<n>``."""
LINK_RDMA_RATE: Final = "torchelastic.link.rdma.rate"
"""The port's rate as sysfs says it (``100 Gb/sec (4X EDR)``)."""
LINK_RDMA_STATE: Final = "torchelastic.link.rdma.state"
"""The port's ``state`` and ``phys_state`` (``4: ACTIVE / 5: LinkUp``)."""
LINK_RDMA_COUNTERS: Final = "torchelastic.link.rdma.counters"
"""The port's error counters that moved over the window, ``name=delta`` (a string array)."""
LINK_EVIDENCE: Final = "torchelastic.link.evidence"
"""Each path or port behind the finding, one line each (a string array)."""
METRIC_STRAGGLER_SCORE: Final = STRAGGLER_SCORE
METRIC_STRAGGLER_LATENESS: Final = STRAGGLER_LATENESS
STALLED_SILENT_NODES: Final = "torchelastic.stalled.silent_nodes"
"""On a training stall: the round's nodes (``host_pid_id``) whose rendezvous keep-alives
stopped, as this node sees them (comma separated); this node's own name when it reached no
rendezvous store."""
STALLED_SILENT_GROUP_RANKS: Final = "torchelastic.stalled.silent_group_ranks"
"""Their group ranks in the round (an int array)."""
STALLED_SILENT_SELF: Final = "torchelastic.stalled.silent_self"
"""``true`` when the silent node is this one: it reached no rendezvous store."""
STALLED_SILENT_SECONDS: Final = "torchelastic.stalled.silent_seconds"
"""Seconds since the last keep-alive of the silent node(s), the shortest; at least torch's
dead-node bound (``keep_alive_interval * keep_alive_max_attempt``) for a node torch dropped."""
FLIGHT_RECORDER_DUMP: Final = "torchelastic.flight_recorder.dump"
"""On a training stall and before workers are stopped: the directory of the workers' Flight
Recorder dumps, one file per global rank (``rank_<n>``), as ``torchfrtrace`` reads them."""
FLIGHT_RECORDER_UNANSWERED: Final = "torchelastic.flight_recorder.unanswered"
"""Global ranks that did not write their dump in time (a worker holding the GIL in C code)."""
STACK_FRAME: Final = "torchelastic.stack.frame"
"""On a worker stack record: the innermost frame of the worker's main thread
(``sleep at train.py:42``); on a training stall: that of the rank waited for."""
STACKS: Final = "torchelastic.stacks"
"""Carries a worker's stacks from the agent instrumentation to the model, which makes them the
record's body (never exported as an attribute)."""
STACKS_REASON: Final = "torchelastic.stacks.reason"
"""Why a worker's stacks were taken: ``training`` (a training stall), ``stall`` (another
stall report), ``before_stop`` (its agent was about to stop it)."""
RECOVERY_CAUSE: Final = "torchelastic.recovery.cause"
"""Why the agent restarted its workers: ``worker_failure`` or ``membership_change``."""
RECOVERY_DETECTION_MS: Final = "torchelastic.recovery.detection_ms"
"""From the worker failure (the worker start-up's time of death, else when its agent saw it) to
the agent beginning the restart."""
RECOVERY_PHASE: Final = "torchelastic.recovery.phase"
"""A phase of a recovery (metrics): ``stop_workers``, ``rendezvous``, ``assign_worker_ranks``,
``start_workers``; ``first_step`` from the training script (:mod:`elastic_otel.worker.training`)."""
RECOVERY_UNTIL: Final = "torchelastic.recovery.until"
"""Where a recovery's duration ends (metrics): ``workers_started`` (the agent) or ``first_step``."""
CAUSE_WORKER_FAILURE: Final = "worker_failure"
CAUSE_MEMBERSHIP_CHANGE: Final = "membership_change"
UNTIL_WORKERS_STARTED: Final = "workers_started"
UNTIL_FIRST_STEP: Final = "first_step"
FAILURE_KIND: Final = "torchelastic.failure.kind"
"""How a worker that did not succeed ended (agent instrumentation): ``root_cause`` (it failed on
its own: an exception, or a signal its agent did not send), ``peer_failure`` (its collective
failed because a peer died) or ``stopped`` (its agent stopped it after another worker failed).
Only a ``root_cause`` worker span is ERROR."""
LEFT_TRAINING: Final = "torchelastic.left_training"
"""On a root-cause worker: ``true`` when it left training (destroyed its process group, or
exited) while its peers were still training, which then failed without it; torch counted its
exit as a success. Its ``error.type`` is :data:`ERROR_TYPE_LEFT_TRAINING`."""
ERROR_TYPE_LEFT_TRAINING: Final = "left_training"
KIND_ROOT_CAUSE: Final = "root_cause"
KIND_PEER_FAILURE: Final = "peer_failure"
KIND_STOPPED: Final = "stopped"
STOPPED_AFTER: Final = "torchelastic.stopped_after"
"""On a ``stopped`` worker: the global rank whose failure made its agent stop it."""
OOM_KILL: Final = "torchelastic.oom_kill"
"""``true`` on a worker killed by SIGKILL while its cgroup's ``memory.events`` ``oom_kill``
count rose: the kernel's OOM killer. Absent where the kernel does not say."""
NCCL_TIMEOUT_S: Final = "torchelastic.nccl.timeout_s"
"""On a worker torch's NCCL watchdog ended, and on a training stall report in the minute torch
waits before it aborts the ranks: the timeout of the collective it timed out in (seconds); the
collective is ``torchelastic.stalled.collective`` / ``collective_number`` / ``process_group``."""
NCCL_ERROR: Final = "torchelastic.nccl.error"
"""On a failed worker whose last words name an NCCL error: ``ncclRemoteError``,
``ncclSystemError``, ... or ``communicator_aborted``."""
PHASE: Final = "torchelastic.phase"
"""``start`` or ``end`` of an agent step the bridge observes (``elastic_otel.agent.<step>``)."""

# Open-span snapshots, as the partial-span-processor package writes them
# (elastic_otel.model.snapshots).
PARTIAL_EVENT: Final = "partial.event"
PARTIAL_FREQUENCY: Final = "partial.frequency"
PARTIAL_BODY_TYPE: Final = "partial.body.type"
LOST: Final = "torchelastic.lost"
"""Set by ``elastic-otel timeline`` on a span known only from snapshots: its process was lost."""

# OpenTelemetry semantic conventions.
HOST_NAME: Final = "host.name"
PROCESS_PID: Final = "process.pid"
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"
EXCEPTION_STACKTRACE: Final = "exception.stacktrace"
LOG_IOSTREAM: Final = "log.iostream"
"""On a worker's output record: ``stdout`` or ``stderr`` (the OpenTelemetry semantic
conventions' attribute for the stream a log line was written to)."""
OUTPUT_TRUNCATED: Final = "torchelastic.output.truncated"
"""On a worker's output record: ``true`` when a line was longer than the line cap or the record
(a traceback) longer than its bound; the rest was not kept."""
OUTPUT_LENGTH: Final = "torchelastic.output.length"
"""With ``torchelastic.output.truncated``: the bytes the worker wrote for the record."""
OUTPUT_INVALID_UTF8: Final = "torchelastic.output.invalid_utf8"
"""On a worker's output record: ``true`` when bytes that were not UTF-8 became U+FFFD."""
OUTPUT_DROPPED: Final = "torchelastic.output.dropped"
"""On a worker's output record: lines of the worker the rate limit dropped just before it."""
LAST_WORDS: Final = "torchelastic.last_words"
"""On a root cause's record: the worker's last lines of stderr (at most 20, 4 KiB)."""
EXCEPTION_EVENT: Final = "exception"
"""The name of an exception's span event, and (``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN``
``logs`` or ``logs/dup``) the event name of the log record that carries it."""
ERROR_TYPE: Final = "error.type"
"""On a root-cause worker span: the exception's type (``RuntimeError``) or the signal's name
(``SIGKILL``), or ``exit_code_<n>`` when the worker exited non-zero without an exception."""
PROCESS_EXIT_CODE: Final = "process.exit.code"
"""A worker's exit code as torch reports it: negative for a signal (``-9``: SIGKILL)."""

# Values of torchelastic.event.source.
SOURCE_AGENT: Final = "AGENT"
SOURCE_WORKER: Final = "WORKER"
SOURCE_RENDEZVOUS: Final = "RENDEZVOUS"
SOURCE_UNKNOWN: Final = "UNKNOWN"

# Span names: low cardinality, the round and rank live in attributes.
SPAN_RDZV_JOIN: Final = "rendezvous.join"
SPAN_RDZV_MEMBER: Final = "rendezvous.member"
SPAN_AGENT_RENDEZVOUS: Final = "agent.rendezvous"
SPAN_AGENT_ASSIGN_RANKS: Final = "agent.assign_worker_ranks"
SPAN_WORKER: Final = "worker"
SPAN_AGENT_RUN: Final = "agent.run"
SPAN_AGENT_EXIT_BARRIER: Final = "agent.exit_barrier"
SPAN_AGENT_STOP_WORKERS: Final = "agent.stop_workers"
SPAN_AGENT_START_WORKERS: Final = "agent.start_workers"
SPAN_AGENT_RECOVERY: Final = "agent.recovery"
"""From the agent noticing a failure or a waiting node to its workers running again; in the
new round's trace, with the phases as children."""
SPAN_WORKER_FAILURE: Final = "worker.failure"
"""In a round with a trace per node: a root-cause failure, also in the round's trace (under its
node's ``rendezvous.join``, linked to the ``worker`` span), so that the round shows it."""
SPAN_WORKER_FIRST_STEP: Final = "worker.first_step"
"""Emitted by the training script (:func:`elastic_otel.mark_first_step`): worker start to its
first training step, a child of the rank's ``worker`` span."""

INSTRUMENTATION_SCOPE: Final = "elastic_otel"

# torchelastic 0.2 events, rendezvous wrappers and elastic metrics.
EVENT_TYPE: Final = "torchelastic.event.type"
"""The ``type`` of a torchelastic 0.2 event: the destination it was recorded to."""
RDZV_OUTCOME: Final = "torchelastic.rendezvous.outcome"
"""How a ``next_rendezvous`` call ended: ``ok``, ``closed``, ``timeout`` or ``error``."""
METRIC_GROUP: Final = "torchelastic.metric_group"
"""The torchelastic metric group a data point was put in (``torchelastic`` for torch's own)."""

# Metric names the bridge records itself (beside torchelastic's own, see
# elastic_otel.integration.torch_metrics).
METRIC_RDZV_DURATION: Final = "torchelastic.rendezvous.duration"
METRIC_RDZV_NODES_WAITING: Final = "torchelastic.rendezvous.nodes_waiting"
METRIC_RECOVERY_DURATION: Final = "torchelastic.recovery.duration"
"""Histogram (s) by ``torchelastic.recovery.cause`` and ``torchelastic.recovery.until``."""
METRIC_RECOVERY_PHASE_DURATION: Final = "torchelastic.recovery.phase.duration"
"""Histogram (s) by ``torchelastic.recovery.phase`` and ``torchelastic.recovery.cause``."""
METRIC_WORKER_FAILURES: Final = "torchelastic.worker.failures"
"""Counter: root-cause worker failures (never the workers that died of them), by ``error.type``."""
METRIC_STALLED_SECONDS: Final = "torchelastic.stalled.seconds"
"""Gauge: the longest current wait per ``torchelastic.stalled.in`` past the stall threshold."""

# Goodput (elastic_otel.model.goodput; docs/goodput.md).
METRIC_GOODPUT: Final = "torchelastic.goodput"
"""Gauge (``1``): the job's productive step time over its wall time so far."""
METRIC_BADPUT_DURATION: Final = "torchelastic.badput.duration"
"""Counter (``s``) by ``torchelastic.badput.category``: wall time that did not train."""
BADPUT_CATEGORY: Final = "torchelastic.badput.category"
"""Where badput went: ``startup``, ``recovery``, ``lost_progress``, ``checkpoint``, ``stall``,
``teardown``, ``unexplained``."""
BADPUT_STARTUP: Final = "startup"
BADPUT_RECOVERY: Final = "recovery"
BADPUT_LOST_PROGRESS: Final = "lost_progress"
BADPUT_CHECKPOINT: Final = "checkpoint"
BADPUT_STALL: Final = "stall"
BADPUT_TEARDOWN: Final = "teardown"
"""A job that failed with no restart left: from the failure to the job's end."""
BADPUT_UNEXPLAINED: Final = "unexplained"
BADPUT_CATEGORIES: Final = (
    BADPUT_STARTUP,
    BADPUT_RECOVERY,
    BADPUT_LOST_PROGRESS,
    BADPUT_CHECKPOINT,
    BADPUT_STALL,
    BADPUT_TEARDOWN,
    BADPUT_UNEXPLAINED,
)
GOODPUT_EVENT_NAME: Final = "torchelastic.goodput"
"""``event_name`` of the summary log record at the end of each attempt."""
GOODPUT_STATE: Final = "GOODPUT"
GOODPUT_ATTEMPT: Final = "torchelastic.goodput.attempt"
"""Which attempt (worker group run) of the job the summary is about, from 0."""
GOODPUT_FINAL: Final = "torchelastic.goodput.final"
"""``true`` on the summary of the job's last attempt (the job ended)."""
GOODPUT_RATIO: Final = "torchelastic.goodput.ratio"
GOODPUT_SECONDS: Final = "torchelastic.goodput.seconds"
GOODPUT_WALL_SECONDS: Final = "torchelastic.goodput.wall_seconds"
GOODPUT_JOB_RATIO: Final = "torchelastic.goodput.job.ratio"
GOODPUT_JOB_SECONDS: Final = "torchelastic.goodput.job.seconds"
GOODPUT_JOB_WALL_SECONDS: Final = "torchelastic.goodput.job.wall_seconds"
BADPUT_STARTUP_SECONDS: Final = "torchelastic.badput.startup.seconds"
BADPUT_RECOVERY_SECONDS: Final = "torchelastic.badput.recovery.seconds"
BADPUT_LOST_PROGRESS_SECONDS: Final = "torchelastic.badput.lost_progress.seconds"
BADPUT_CHECKPOINT_SECONDS: Final = "torchelastic.badput.checkpoint.seconds"
BADPUT_STALL_SECONDS: Final = "torchelastic.badput.stall.seconds"
BADPUT_TEARDOWN_SECONDS: Final = "torchelastic.badput.teardown.seconds"
BADPUT_UNEXPLAINED_SECONDS: Final = "torchelastic.badput.unexplained.seconds"
BADPUT_JOB_PREFIX: Final = "torchelastic.badput.job."
"""``torchelastic.badput.job.<category>.seconds``: the job's badput so far, per category."""
GOODPUT_FIRST_STEP: Final = "torchelastic.goodput.first_step"
GOODPUT_LAST_STEP: Final = "torchelastic.goodput.last_step"
GOODPUT_CHECKPOINT_STEP: Final = "torchelastic.goodput.checkpoint_step"
GOODPUT_LOST_STEPS_FIRST: Final = "torchelastic.goodput.lost_steps.first"
GOODPUT_LOST_STEPS_LAST: Final = "torchelastic.goodput.lost_steps.last"
GOODPUT_SAVES: Final = "torchelastic.goodput.saves"
GOODPUT_LOST_START: Final = "torchelastic.goodput.lost_progress.start_time_unix_nano"
"""When the progress a restart redoes began (the last checkpoint, else the first step)."""
GOODPUT_LOST_END: Final = "torchelastic.goodput.lost_progress.end_time_unix_nano"
"""When it ended (the failure)."""


def badput_seconds_key(category: str, job: bool = False) -> str:
    """The summary record's attribute for ``category``'s seconds (the attempt's or the job's)."""
    return f"{BADPUT_JOB_PREFIX if job else NS + 'badput.'}{category}.seconds"
