"""An agent's outcome from what happened, not from the word torch's launcher records.

torch's launcher records its agent ``SUCCEEDED`` whenever ``agent.run()`` returns, whatever its
workers did, then raises ``ChildFailedError`` for a failed run: torchrun exits 1. An agent whose
final attempt had a worker fail is restated ``FAILED`` (torch's word kept in
``torchelastic.torch_state``), with the root cause, the exception leaving the launcher and
torchrun's exit code; a job ended by a signal during a training stall names the stalled ranks.
The table of every outcome word and what is exported for it: ``docs/outcomes.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from elastic_otel.model.spans import SpanAttributes, SpanRecord
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import STATUS_PREFIX, WorkerState
from elastic_otel.parsing.torch_events import ElasticEvent

CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
"""What torch's launcher raises for a run whose workers failed (``error.type`` of the run)."""
EXIT_FAILED = 1
"""torchrun's exit code when an exception leaves its ``main`` (``ChildFailedError``, a
``SignalException``, a rendezvous error): Python's for an uncaught exception."""
SIGNAL_EXCEPTION = "SignalException"
"""torch's exception for a signal to the agent (``torch.distributed.elastic.multiprocessing``)."""
_BARE_EXCEPTION = re.compile(r"[A-Za-z_][\w.]{0,200}(Error|Exception):?")
"""A traceback's last line naming an exception without a message: Python writes the bare
name (``raise RendezvousTimeoutError``), a hand-written line may end with a colon."""
_CARRIED_STALL = (A.STALLED_RANKS, A.STACK_FRAME, A.STALLED_SECONDS)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """The agent's final event as exported, what ``agent.run`` adds, and why it failed."""

    event: ElasticEvent
    attributes: SpanAttributes = field(default_factory=dict)
    description: str = ""  # the root cause, for a failed run's status
    signal: str = ""  # the signal that ended the agent, as torch said it ("" : none)
    root: SpanRecord | None = None  # the worker whose failure ended the run


def run_outcome(ev: ElasticEvent, failed: SpanRecord | None, stall: SpanAttributes) -> RunOutcome:
    """The outcome of the agent whose final event is ``ev``: ``failed`` is the worker of its
    last attempt whose failure ended it (the root cause, else the first that ended failed;
    ``None``: none failed), ``stall`` its latest training stall report's facts."""
    if ev.state == WorkerState.SUCCEEDED and failed is not None:
        return _restated(ev, failed)
    if ev.state == WorkerState.SUCCEEDED:
        return RunOutcome(ev, {A.PROCESS_EXIT_CODE: 0})
    if ev.state != WorkerState.FAILED:
        return RunOutcome(ev)
    err = ev.error
    attributes: SpanAttributes = {A.PROCESS_EXIT_CODE: EXIT_FAILED}
    message = (err.message.strip().splitlines() or [""])[0][:200] if err is not None else ""
    if err is not None and not err.type and _BARE_EXCEPTION.fullmatch(message):
        err = replace(err, type=message.rstrip(":"), message="")  # "…RendezvousTimeoutError"
        message = ""
    if err is not None and err.type:
        attributes[A.ERROR_TYPE] = err.type
    # torchrun's SIGTERM, SIGINT
    is_signal = err is not None and err.type.endswith(SIGNAL_EXCEPTION)
    signal = (message[:80] or "a signal") if is_signal else ""
    description = f"{err.type.rsplit('.', 1)[-1]}: {message}" if err and err.type else message
    if signal and stall.get(A.STALLED_RANKS):
        description = f"{stall_text(stall)}; then {signal}"
        attributes.update((k, stall[k]) for k in _CARRIED_STALL if k in stall)
        ev = replace(ev, attributes={**ev.attributes, **attributes})
    return RunOutcome(ev, attributes, description, signal)


def _restated(ev: ElasticEvent, failed: SpanRecord) -> RunOutcome:
    """torch's ``SUCCEEDED`` after a failed run, as the ``FAILED`` it was."""
    rank = failed.attributes.get(A.GLOBAL_RANK)
    state = failed.attributes.get(A.STATE, WorkerState.FAILED.value)
    why = failed.status_message or str(failed.attributes.get(A.END_REASON, ""))
    description = f"worker global rank {rank} {state}" + (f": {why}" if why else "")
    attributes: SpanAttributes = {
        A.STATE: WorkerState.FAILED.value,
        A.TORCH_STATE: ev.state,
        A.ERROR_TYPE: CHILD_FAILED,
        A.PROCESS_EXIT_CODE: EXIT_FAILED,
    }
    event = replace(
        ev,
        state=WorkerState.FAILED.value,
        name=STATUS_PREFIX + WorkerState.FAILED.value,
        body=description,
        attributes={**ev.attributes, **attributes},  # torchelastic.event.name: torch's
    )
    return RunOutcome(event, attributes, description, root=failed)


def stall_text(stall: SpanAttributes) -> str:
    """``stalled: global rank 1 at File "train.py", line 9 in step for 34 s``."""
    ranks = stall.get(A.STALLED_RANKS)
    names = ", ".join(str(r) for r in ranks) if isinstance(ranks, tuple | list) else str(ranks)
    text = f"stalled: global rank {names}"
    frame = stall.get(A.STACK_FRAME)
    if frame:
        text += f" at {frame}"
    seconds = stall.get(A.STALLED_SECONDS)
    if isinstance(seconds, int | float):
        text += f" for {seconds:.0f} s, every other rank waiting for it"
    return text
