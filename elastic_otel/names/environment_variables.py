"""Environment variables specific to elastic-otel and their defaults: names only.

Everything the OpenTelemetry specification already names (``OTEL_SDK_DISABLED``,
``OTEL_SERVICE_NAME``, ``OTEL_EXPORTER_OTLP_*``, ``OTEL_TRACES_EXPORTER``,
``OTEL_LOGS_EXPORTER``, ``OTEL_BSP_*``, ``OTEL_BLRP_*``, ...) is read by the
OpenTelemetry SDK itself. Only what OTel has no variable for lives here, and the one semantic
conventions' opt-in the SDK leaves to instrumentations (``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN``).

Every default lives beside its variable (lower layers that take a default as a parameter import
it from here). The runtime reads its settings once, with the tolerant readers of
:mod:`elastic_otel.config.environment`, into :class:`elastic_otel.config.settings.Settings`.
"""

ELASTIC_OTEL_ENABLED = "ELASTIC_OTEL_ENABLED"
"""Zero-code activation: ``true`` activates the bridge in every process that imports
torch's elastic rendezvous, ``false`` never; unset activates it when the torchrun
event log handler is ``otel`` (``--event-log-handler otel`` or ``PET_EVENT_LOG_HANDLER``)."""

ELASTIC_OTEL_RDZV_EVENTS = "ELASTIC_OTEL_RDZV_EVENTS"
"""``false`` leaves torch's ``dynamic_rendezvous`` destination alone (default ``true``)."""

ELASTIC_OTEL_TRACES = "ELASTIC_OTEL_TRACES"
"""``false`` turns the rendezvous/agent/worker span model off, logs only (default ``true``)."""

ELASTIC_OTEL_JOB_ID = "ELASTIC_OTEL_JOB_ID"
"""Job-unique salt shared by every node of one job, mixed into trace ids."""

ELASTIC_OTEL_JOB_ATTEMPT = "ELASTIC_OTEL_JOB_ATTEMPT"
"""Which attempt of the job this is, when the scheduler runs the same job id again (a requeue,
a JobSet restart); mixed into trace ids so that attempts get their own traces. Default: the
scheduler's own count (:data:`SCHEDULER_ATTEMPT_VARIABLES`), else none."""

ELASTIC_OTEL_EXIT_TIMEOUT = "ELASTIC_OTEL_EXIT_TIMEOUT"
"""Seconds the process may spend at exit flushing telemetry (default ``2``)."""
DEFAULT_EXIT_TIMEOUT_S = 2.0

ELASTIC_OTEL_QUEUE_SIZE = "ELASTIC_OTEL_QUEUE_SIZE"
"""Events buffered between torch's thread and the bridge's event thread (default ``65536``); also
the default size of the SDK's batch queues unless ``OTEL_BSP/BLRP_MAX_QUEUE_SIZE`` is set."""
DEFAULT_QUEUE_SIZE = 65536

ELASTIC_OTEL_RETRY_QUEUE_SIZE = "ELASTIC_OTEL_RETRY_QUEUE_SIZE"
"""Records per signal held while the collector is unreachable, re-sent when it is back
(default ``100000``); past it the oldest are dropped and counted."""
DEFAULT_RETRY_QUEUE_SIZE = 100_000

ELASTIC_OTEL_MAX_OPEN_SPANS = "ELASTIC_OTEL_MAX_OPEN_SPANS"
"""Nodes and agents tracked per process (each with its open spans) before the least recently
used is ended (default ``1024``)."""
DEFAULT_MAX_OPEN_SPANS = 1024  # a torchrun agent tracks one node and one agent per run

ELASTIC_OTEL_HEARTBEAT_LOGS = "ELASTIC_OTEL_HEARTBEAT_LOGS"
"""``false``: keep-alive heartbeats and syncs, about half of a job's events, get no log record
of their own; they stay counted on their rendezvous span (``torchelastic.keep_alive.count``…)
and in ``elastic_otel.stats()`` (``heartbeat_logs_skipped``). Default ``true``: every event
is a log record. Read by the live bridge and by ``elastic-otel replay``."""

ELASTIC_OTEL_AGENT_INSTRUMENTATION = "ELASTIC_OTEL_AGENT_INSTRUMENTATION"
"""``false``: leave torch's elastic agent unwrapped; worker outcomes then come from torch's own
events only. Unset: wrapped on the torch versions it is tested with (``TESTED_TORCH`` in
:mod:`elastic_otel.integration.agent_instrumentation`). ``true``: on any torch version whose
agent has the expected shape."""

ELASTIC_OTEL_OPEN_SPAN_INTERVAL = "ELASTIC_OTEL_OPEN_SPAN_INTERVAL"
"""Seconds between snapshots of spans still open (``partial.event`` = ``heartbeat`` log
records), so that a lost process's spans reach the backend (default ``30``; ``0``: none)."""
DEFAULT_OPEN_SPAN_INTERVAL_S = 30.0

ELASTIC_OTEL_STALL_AFTER = "ELASTIC_OTEL_STALL_AFTER"
"""Seconds a node may wait in a join, in torch's exit barrier or for its workers to stop before
a WARN stall report says so, repeated at that interval while it lasts (default ``60``; ``0``
turns reports off)."""
DEFAULT_STALL_AFTER_S = 60.0

ELASTIC_OTEL_STALL_EXCHANGE = "ELASTIC_OTEL_STALL_EXCHANGE"
"""``false``: a stalled node tells other nodes nothing through the round's store and reads
nothing there; only the node that has the late rank names it (docs/hangs.md, "Every node
names the rank"; default ``true``)."""

ELASTIC_OTEL_GOODPUT = "ELASTIC_OTEL_GOODPUT"
"""``false``: no goodput accounting in the agent (no summary records, no goodput metrics); the
training script's ``mark_step`` / ``mark_checkpoint`` still cost what they cost."""

ELASTIC_OTEL_ROUND_TRACE_MAX_NODES = "ELASTIC_OTEL_ROUND_TRACE_MAX_NODES"
"""Nodes a rendezvous round may have and still be one trace (default ``128``; ``0``: no limit).
In a larger round each node's spans form a trace of their own, linked both ways with its
``rendezvous.join`` span in the round's trace (docs/trace-model.md, "Large jobs")."""
DEFAULT_ROUND_TRACE_MAX_NODES = 128

ELASTIC_OTEL_FORK_GUARD = "ELASTIC_OTEL_FORK_GUARD"
"""``false``: no fork guard (:mod:`elastic_otel.bridge.fork_safety`); a forked child of a bridged
process may then hang where it would crash without the bridge (default ``true``)."""

ELASTIC_OTEL_GC_FREEZE = "ELASTIC_OTEL_GC_FREEZE"
"""``false``: leave the process's cyclic garbage collector as it is when the bridge starts
(:meth:`elastic_otel.bridge.process.BridgeProcess.freeze_heap`; default ``true``)."""

ELASTIC_OTEL_RAW_LIMIT = "ELASTIC_OTEL_RAW_LIMIT"
"""Characters of unparseable input kept on the flagged log record (default ``4096``)."""
DEFAULT_RAW_LIMIT = 4096

PET_EVENT_LOG_HANDLER = "PET_EVENT_LOG_HANDLER"
"""torchrun's own variable for ``--event-log-handler``."""

# Slurm's variables: trace-id salt and attempt (below), resource attributes
# (elastic_otel.emit.scheduler_resource).
SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_JOBID = "SLURM_JOBID"
"""The older spelling Slurm still sets beside ``SLURM_JOB_ID``."""
SLURM_JOB_NAME = "SLURM_JOB_NAME"
SLURM_ARRAY_JOB_ID = "SLURM_ARRAY_JOB_ID"
SLURM_ARRAY_TASK_ID = "SLURM_ARRAY_TASK_ID"
SLURM_RESTART_COUNT = "SLURM_RESTART_COUNT"
"""How often Slurm requeued the job; set from the first requeue on (also an attempt counter in
:data:`SCHEDULER_ATTEMPT_VARIABLES`)."""
SLURM_JOB_PARTITION = "SLURM_JOB_PARTITION"
SLURM_CLUSTER_NAME = "SLURM_CLUSTER_NAME"
SLURMD_NODENAME = "SLURMD_NODENAME"
"""The node's name in slurm.conf, set in job steps and the batch script."""
SLURM_STEP_ID = "SLURM_STEP_ID"

# Scheduler job ids used as trace-id salt when ELASTIC_OTEL_JOB_ID is unset, in this order.
# Kubernetes sets no job id in the environment: map the Job's uid through the downward API
# (see docs/trace-model.md).
SCHEDULER_JOB_ID_VARIABLES = (
    SLURM_JOB_ID,
    "LSB_JOBID",  # IBM LSF
    "PBS_JOBID",  # PBS / Torque
    "FLUX_JOB_ID",
)

# Scheduler attempt counters used when ELASTIC_OTEL_JOB_ATTEMPT is unset. Slurm counts requeues
# of one job id; LSF, PBS and Flux expose no count (a resubmission there is a new job id).
# Kubernetes: map JobSet's restart attempt through the downward API (see docs/trace-model.md).
SCHEDULER_ATTEMPT_VARIABLES = (SLURM_RESTART_COUNT,)

ELASTIC_OTEL_METRICS = "ELASTIC_OTEL_METRICS"
"""``false`` leaves torchelastic's metrics alone when the bridge is activated, and reports no
bridge counters as metrics either (default ``true``). Where they go is ``OTEL_METRICS_EXPORTER``
(default ``otlp``) and ``OTEL_METRIC_EXPORT_*``."""

OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN = "OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN"
"""The semantic conventions' switch from exception span events to exception log records (the
SDK does not read it; instrumentations do): :data:`EXCEPTIONS_AS_LOGS` (``logs``): the log
record only, event name ``exception``; :data:`EXCEPTIONS_AS_LOGS_AND_SPAN_EVENTS`
(``logs/dup``): both; unset or any other value: ``exception`` span events, as before the
conventions moved (docs/trace-model.md, "Exceptions: span events or log records", says why
that is the default)."""
EXCEPTIONS_AS_LOGS = "logs"
EXCEPTIONS_AS_LOGS_AND_SPAN_EVENTS = "logs/dup"

# --- set by the agent in each worker's environment (elastic_otel.worker.training) ----------

TRACEPARENT = "TRACEPARENT"
"""W3C trace context of the worker's own ``worker`` span, as OpenTelemetry's convention for
environment-variable carriers names it (``TRACESTATE`` beside it when there is one)."""
TRACESTATE = "TRACESTATE"
ELASTIC_OTEL_WORKER_START_UNIX_NANO = "ELASTIC_OTEL_WORKER_START_UNIX_NANO"
"""When the agent started the worker processes (ns since the epoch)."""
ELASTIC_OTEL_RECOVERY_CAUSE = "ELASTIC_OTEL_RECOVERY_CAUSE"
"""Set when the workers were started by a recovery: ``worker_failure`` or ``membership_change``."""
ELASTIC_OTEL_RECOVERY_START_UNIX_NANO = "ELASTIC_OTEL_RECOVERY_START_UNIX_NANO"
"""When that recovery began (the agent noticed the failure or the waiting node)."""

ELASTIC_OTEL_WORKER_STARTUP = "ELASTIC_OTEL_WORKER_STARTUP"
"""``false``: the instrumented agent starts its workers as torch does, without the worker-side
start-up (:mod:`elastic_otel.worker.startup`) that reports a crashed worker's Python stack and
an uncaught exception's type (default ``true``)."""
ELASTIC_OTEL_WORKER_CONTEXT = "ELASTIC_OTEL_WORKER_CONTEXT"
"""``false``: the worker start-up leaves OpenTelemetry's current context alone; by default it
makes the rank's ``worker`` span (``TRACEPARENT``) the main thread's current context once the
worker imports OpenTelemetry's tracing API, so that spans started without a parent are its
children (docs/trace-model.md, "The worker span as the current context")."""
ELASTIC_OTEL_STACK_SIGNAL = "ELASTIC_OTEL_STACK_SIGNAL"
"""The signal on which a worker appends its main thread's Python stack to its stacks file,
for its agent to ask while the job hangs: ``SIGUSR1``, ``SIGUSR2`` or a real-time signal, by
name (``SIGRTMIN+3``) or number (default ``SIGRTMIN+3``, which nothing else uses); ``none``
(or anything else) arms none. A signal the worker already handles is left alone."""
ELASTIC_OTEL_WORKER_REPORTS = "ELASTIC_OTEL_WORKER_REPORTS"
"""Set by the agent for the worker start-up, removed by it from the worker's own environment
(its children do not inherit it): ``1`` asks it to write its reports beside the worker's
``TORCHELASTIC_ERROR_FILE``."""
ELASTIC_OTEL_WORKER_PYTHONPATH = "ELASTIC_OTEL_WORKER_PYTHONPATH"
"""Set by the agent beside the ``PYTHONPATH`` it prepends the start-up's directory to: the
worker's ``PYTHONPATH`` without it (empty: unset), which the start-up puts back for the
worker's children."""
PYTHONPATH = "PYTHONPATH"
TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
"""torch's: where a worker's ``@record`` writes its error; the worker reports go beside it."""
WORKER_FAULT_FILE = "elastic_otel_fault.log"
"""The worker start-up's ``faulthandler`` output (a fatal signal's Python stacks), beside the
worker's error file."""
WORKER_ERROR_FILE = "elastic_otel_error.json"
"""The worker start-up's record of an uncaught exception (type, message, traceback, time),
beside the worker's error file."""
WORKER_PROGRESS_FILE = "elastic_otel_progress.bin"
WORKER_STACKS_FILE = "elastic_otel_stacks.log"
WORKER_COLLECTIVES_FILE = "elastic_otel_collectives.json"
"""The worker's process groups as torch's Flight Recorder records have them (last collective
issued, started and completed in each, the open one's op and state), written by
:mod:`elastic_otel.worker.collectives`."""
WORKER_REQUESTS_FIFO = "elastic_otel_requests"
"""A FIFO the worker's collectives thread reads: a byte from the agent asks for a dump."""
WORKER_FLIGHT_RECORDER_FILE = "elastic_otel_flight_recorder.pkl"
"""The worker's whole Flight Recorder record, in torch's pickle format, on the agent's request."""
TORCH_NCCL_DEBUG_INFO_TEMP_FILE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
"""torch's: the prefix of the file its NCCL watchdog dumps the Flight Recorder to on a timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT``), the global rank appended; the worker start-up points it into
the worker's directory when the user has not chosen (docs/hangs.md, torch's NCCL watchdog)."""
TORCH_DUMP_FILE_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", TORCH_NCCL_DEBUG_INFO_TEMP_FILE)
"""torch's variables for that prefix, the first set winning (``TORCH_FR_DUMP_TEMP_FILE`` in
recent releases: 2.13's and 2.14.1's libraries read both): the user's choice, left alone."""
WORKER_NCCL_DUMP_PREFIX = "nccl_trace_rank_"
"""The prefix the worker start-up gives torch, in the worker's directory (torch's own default
file name, which is ``/tmp/nccl_trace_rank_`` or ``~/.cache/torch/comm_lib_trace_rank_``)."""
ELASTIC_OTEL_FLIGHT_RECORDER = "ELASTIC_OTEL_FLIGHT_RECORDER"
"""``false``: workers do not read torch's Flight Recorder (collective progress then comes only
from the Python collectives the progress record wraps), and no dump is taken."""
ELASTIC_OTEL_NCCL_TIMING = "ELASTIC_OTEL_NCCL_TIMING"
"""NCCL's timing events, which make NCCL's record say which ranks' GPUs started a collective
and how long each took on the device: ``auto`` (default) turns them on at run time in each
worker whose measured collective rate times their cost per collective is within
``ELASTIC_OTEL_NCCL_TIMING_BUDGET``; ``true`` sets ``TORCH_NCCL_ENABLE_TIMING=1`` at start-up
(unless the job set it); ``false`` leaves them off (docs/hangs.md, NCCL timing by default)."""
NCCL_TIMING_MODES = ("auto", "true", "false")
DEFAULT_NCCL_TIMING = "auto"
ELASTIC_OTEL_NCCL_TIMING_BUDGET = "ELASTIC_OTEL_NCCL_TIMING_BUDGET"
"""Percent of wall time NCCL's timing events may cost a worker for ``auto`` to turn them on
(default ``0.5``)."""
DEFAULT_NCCL_TIMING_BUDGET_PERCENT = 0.5
ELASTIC_OTEL_NCCL_TIMING_COST_US = "ELASTIC_OTEL_NCCL_TIMING_COST_US"
"""What NCCL's timing events cost one collective, in microseconds of the training step, for
``auto``'s decision (default ``9``: an H100's DDP step of 8 all-reduces, +0.07 ms with timing;
``python -m benchmarks.nccl_timing`` measures it at several rates, BENCHMARKS.md)."""
DEFAULT_NCCL_TIMING_COST_US = 9.0
NCCL_TIMING_MEASURE_S = 5.0
"""Seconds of a worker's collective rate ``auto`` measures, from its first completed NCCL
collective (communicator set-up and the first step excluded), before it decides."""
TORCH_NCCL_ENABLE_TIMING = "TORCH_NCCL_ENABLE_TIMING"
ELASTIC_OTEL_STRAGGLER_WINDOW = "ELASTIC_OTEL_STRAGGLER_WINDOW"
"""Seconds per straggler window: each worker's collectives thread reads its whole Flight
Recorder once per window and leaves the arrivals of the collectives issued since, which the
agent scores per local rank (default ``30``; ``0``: no straggler scores)."""
DEFAULT_STRAGGLER_WINDOW_S = 30.0
ELASTIC_OTEL_STRAGGLER_SCORE = "ELASTIC_OTEL_STRAGGLER_SCORE"
"""A rank whose straggler score (1: as fast as its fastest local peer) stays below this, the
worst of its node, for consecutive windows is reported as a straggler (default ``0.75``)."""
DEFAULT_STRAGGLER_SCORE = 0.75
ELASTIC_OTEL_SLOWDOWN = "ELASTIC_OTEL_SLOWDOWN"
"""A process group whose collectives come this many times slower than the job's own baseline,
lastingly (a change point, not one slow window), is reported as slowed down, split into its
part (communication or compute), once per straggler window while it lasts, and its end with
what it cost (default ``1.3``; ``0``: no slowdown reports, and no link reads)."""
DEFAULT_SLOWDOWN_RATIO = 1.3
ELASTIC_OTEL_LINK_STATS = "ELASTIC_OTEL_LINK_STATS"
"""``false``: the agent reads neither its node's TCP connection statistics (sock_diag) nor its
RDMA ports' counters, and no link is named (default ``true``)."""
ELASTIC_OTEL_RDMA_SYSFS = "ELASTIC_OTEL_RDMA_SYSFS"
"""The directory the agent reads RDMA ports from (default ``/sys/class/infiniband``)."""
DEFAULT_RDMA_SYSFS = "/sys/class/infiniband"
ELASTIC_OTEL_WORKER_OUTPUT = "ELASTIC_OTEL_WORKER_OUTPUT"
"""Which streams of its workers the instrumented agent turns into log records on their
``worker`` spans: ``stderr`` (default), ``stdout``, ``all`` (both) or ``none``."""
DEFAULT_WORKER_OUTPUT = "stderr"
WORKER_OUTPUT_STREAMS = {
    "stderr": ("stderr",),
    "stdout": ("stdout",),
    "all": ("stdout", "stderr"),
    "none": (),
}
"""The values of ``ELASTIC_OTEL_WORKER_OUTPUT`` → the streams they capture."""
ELASTIC_OTEL_WORKER_OUTPUT_RATE = "ELASTIC_OTEL_WORKER_OUTPUT_RATE"
"""Records per second and worker at most (a burst of as many); lines past it are counted in
``elastic_otel.stats()`` (``worker_output_dropped``), not exported (default ``1000``; ``0``:
no limit)."""
DEFAULT_WORKER_OUTPUT_RATE = 1000.0
ELASTIC_OTEL_WORKER_OUTPUT_LINE_MAX = "ELASTIC_OTEL_WORKER_OUTPUT_LINE_MAX"
"""Bytes of one output line kept (default ``16384``); the record of a longer line is flagged."""
DEFAULT_WORKER_OUTPUT_LINE_MAX = 16384

# --- OTLP JSON file exporters (elastic_otel.emit.otlp_json) ---------------------------------------

ELASTIC_OTEL_OTLP_JSON_FILE = "ELASTIC_OTEL_OTLP_JSON_FILE"
"""Output file of the ``elastic_otel_file`` exporters (``OTEL_TRACES_EXPORTER`` /
``OTEL_LOGS_EXPORTER`` / ``OTEL_METRICS_EXPORTER``), required by them: one OTLP/JSON export
request per line, appended, as OpenTelemetry's ``otlp_json_file`` and the Collector's ``file``
exporters write. Several processes may share one file."""

# --- Slurm's identity of the job as resource attributes (elastic_otel.emit.scheduler_resource) ---

ELASTIC_OTEL_SLURM_RESOURCE = "ELASTIC_OTEL_SLURM_RESOURCE"
"""``false``: no ``slurm.*`` resource attributes from Slurm's environment (default ``true``;
docs/slurm.md)."""
