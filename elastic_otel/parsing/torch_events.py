"""Parse what torch hands a logging handler into :class:`ElasticEvent`.

torch's serialized events, its ``Event`` / ``RdzvEvent`` objects and the agent
instrumentation's :class:`~elastic_otel.parsing.records.AgentRecord` all become one
:class:`ElasticEvent` with typed fields and a ready-to-emit attribute dict, built once for the
log record and the span model. Bad input never raises: a bad field loses only itself, and what
is no event becomes an ``UNPARSED`` one. No torch, no OpenTelemetry SDK.
Design, the rules for bad fields: ``docs/attributes.md`` (How torch's events are read).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeGuard

from elastic_otel.names import attributes as A
from elastic_otel.names.environment_variables import DEFAULT_RAW_LIMIT
from elastic_otel.names.torch_names import AGENT_STEP_PREFIX, STATUS_PREFIX, NodeState
from elastic_otel.parsing.records import (
    AgentRecord,
    Attributes,
    AttrValue,
    ErrorInfo,
    error_attributes,
    error_from_message,
)

_MAX_INPUT_CHARS = 8 * 1024 * 1024
"""Larger messages are not JSON-decoded at all (they are flagged and truncated)."""


class EventKind(str, Enum):
    AGENT = "AGENT"  # torchelastic.worker.status.* from the agent about itself
    WORKER = "WORKER"  # torchelastic.worker.status.* about one worker
    RENDEZVOUS = "RENDEZVOUS"  # RdzvEvent
    GENERIC = "GENERIC"  # any other Event (user code, watchdog)
    UNPARSED = "UNPARSED"


class RdzvAction(str, Enum):
    """What a rendezvous event reports, classified from torch's message text."""

    JOIN_ATTEMPT = "join_attempt"
    JOINED = "joined"
    ADDED_TO_PARTICIPANTS = "added_to_participants"
    ADDED_TO_WAIT_LIST = "added_to_wait_list"
    ADDED_TO_REDUNDANCY_LIST = "added_to_redundancy_list"
    REMOVED_FROM_PARTICIPANTS = "removed_from_participants"
    REMOVED_FROM_WAIT_LIST = "removed_from_wait_list"
    REMOVED_FROM_REDUNDANCY_LIST = "removed_from_redundancy_list"
    MARKED_COMPLETE = "marked_complete"
    MARKED_CLOSED = "marked_closed"
    SYNCED = "synced"
    STALE_STATE = "stale_state"
    HEARTBEAT_UPDATED = "heartbeat_updated"
    KEEP_ALIVE = "keep_alive"
    KEEP_ALIVE_FAILED = "keep_alive_failed"
    DEAD_NODES_REMOVED = "dead_nodes_removed"
    CLOSED = "closed"
    SHUTDOWN_FAILED = "shutdown_failed"
    FAILED = "failed"
    OTHER = "other"


@dataclass(slots=True)
class ElasticEvent:
    """One torch elastic event, normalised."""

    kind: EventKind
    name: str
    body: str
    time_ns: int
    attributes: Attributes
    run_id: str = ""
    # Rendezvous events.
    node_state: str = ""  # torch's NodeState name (names.torch_names.NodeState); text as it came
    action: RdzvAction | None = None
    round: int | None = None
    rank: int | None = None
    world_size: int | None = None
    hostname: str = ""
    pid: int | None = None
    local_id: int | None = None
    # Agent and worker events.
    state: str = ""  # a WorkerState (names.torch_names) or an agent step's name; text as it came
    global_rank: int | None = None
    group_rank: int | None = None
    role: str = ""
    agent_restarts: int | None = None
    duration_ms: float | None = None
    error: ErrorInfo | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# --- entry point ----------------------------------------------------------------------------


def parse_event(
    payload: object, created_ns: int, raw_limit: int = DEFAULT_RAW_LIMIT
) -> ElasticEvent:
    """Normalise ``payload`` (JSON text, dict, ``Event``/``RdzvEvent`` or anything) into an event.

    ``created_ns`` is used when the event carries no timestamp of its own (torch's agent
    events always have ``timestamp == 0``). An :class:`AgentRecord` is its ``event`` with the
    record's attributes and error added. Never raises.
    """
    record = payload if isinstance(payload, AgentRecord) else None
    if record is not None:
        payload = record.event
    try:
        data = _as_mapping(payload)
    except _Unparsed as e:
        return _unparsed(e.text, e.reason, created_ns, raw_limit)
    except Exception as e:  # a hostile __repr__/__str__, recursion, ...
        return _unparsed(safe_text(payload), f"{type(e).__name__}: {e}", created_ns, raw_limit)
    try:
        if "node_state" in data and "run_id" in data and "message" in data:
            return _rdzv_event(data, created_ns)
        if "name" in data and "source" in data:
            return _event(data, created_ns, record)
    except _Unparsed as e:
        return _unparsed(_raw_text(payload, data), e.reason, created_ns, raw_limit)
    except Exception as e:  # defensive: a field of a type no torch version produces
        return _unparsed(
            _raw_text(payload, data), f"{type(e).__name__}: {e}", created_ns, raw_limit
        )
    return _unparsed(_raw_text(payload, data), "not a torch elastic event", created_ns, raw_limit)


class _Unparsed(Exception):
    def __init__(self, reason: str, text: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.text = text


def _as_mapping(payload: object) -> dict[str, Any]:
    if isinstance(payload, str):
        return _loads(payload)
    if isinstance(payload, bytes | bytearray):
        return _loads(bytes(payload).decode("utf-8", errors="replace"))
    if isinstance(payload, dict):
        return payload
    if payload is None:
        raise _Unparsed("empty message (None)", "None")
    # torch's Event / RdzvEvent dataclasses, or anything shaped like them.
    fields = getattr(type(payload), "__dataclass_fields__", None)
    if fields is not None and ("source" in fields or "node_state" in fields):
        return {name: getattr(payload, name, None) for name in fields}
    serialize = getattr(payload, "serialize", None)
    if callable(serialize):
        text = serialize()
        if isinstance(text, str):
            return _loads(text)
    raise _Unparsed(f"unsupported message type {type(payload).__name__}", safe_text(payload))


def _loads(text: str) -> dict[str, Any]:
    if len(text) > _MAX_INPUT_CHARS:
        raise _Unparsed(f"message too long ({len(text)} characters)", text)
    try:
        data = json.loads(text, parse_int=_json_int)
    except RecursionError:
        raise _Unparsed("JSON nested too deeply", text) from None
    except ValueError as e:
        raise _Unparsed(f"invalid JSON: {e}", text) from None
    if not isinstance(data, dict):
        raise _Unparsed(f"JSON {type(data).__name__} is not an event object", text)
    return data


def _json_int(digits: str) -> int | str:
    """A JSON integer; one past Python's digit limit (4300 by default) stays text, so that a
    5000-digit pid is a bad field, not invalid JSON for the whole event."""
    try:
        return int(digits)
    except ValueError:
        return digits


# --- rendezvous events ----------------------------------------------------------------------

# Only anchored, linear-time patterns: messages can be megabytes long, and a backtracking
# regex would hold the GIL (and so torch's threads) for minutes.
# [0-9], not \d: \d also matches "٣" (and int() would take it), which torch never writes.
_INT = re.compile(r"-?[0-9]{1,18}")
_ROUND = re.compile(r"round ([0-9]{1,18})")

# Ordered: first match wins. Keyword tests are cheaper than one regex per action.
_ACTIONS: tuple[tuple[str, RdzvAction], ...] = (
    ("attempts to join the next round", RdzvAction.JOIN_ATTEMPT),
    ("has sent a keep-alive heartbeat", RdzvAction.KEEP_ALIVE),
    ("updated its keep-alive heartbeat", RdzvAction.HEARTBEAT_UPDATED),
    ("has joined round", RdzvAction.JOINED),
    ("has joined the rendezvous", RdzvAction.JOINED),  # NVRx 0.5's barrier: no round named
    ("added itself to the participants", RdzvAction.ADDED_TO_PARTICIPANTS),
    ("added itself to the wait list", RdzvAction.ADDED_TO_WAIT_LIST),
    ("added itself to the redundancy list", RdzvAction.ADDED_TO_REDUNDANCY_LIST),
    ("removed itself from the participants", RdzvAction.REMOVED_FROM_PARTICIPANTS),
    ("removed itself from the wait list", RdzvAction.REMOVED_FROM_WAIT_LIST),
    ("removed itself from the redundant list", RdzvAction.REMOVED_FROM_REDUNDANCY_LIST),
    ("as complete", RdzvAction.MARKED_COMPLETE),
    ("marked the rendezvous", RdzvAction.MARKED_CLOSED),
    ("has successfully synced", RdzvAction.SYNCED),
    ("has a stale state", RdzvAction.STALE_STATE),
    ("failed to send a keep-alive heartbeat", RdzvAction.KEEP_ALIVE_FAILED),
    ("since they had no heartbeat", RdzvAction.DEAD_NODES_REMOVED),
    ("has closed the rendezvous", RdzvAction.CLOSED),
    ("has permanently closed the rendezvous", RdzvAction.CLOSED),  # NVRx 0.5's barrier
    ("has failed to shutdown the rendezvous", RdzvAction.SHUTDOWN_FAILED),
)


def _int_after(text: str, marker: str, start: int = 0, last: bool = False) -> int | None:
    i = text.rfind(marker, start) if last else text.find(marker, start)
    if i < 0:
        return None
    m = _INT.match(text, i + len(marker))
    return int(m.group()) if m else None


def _joined_numbers(message: str) -> tuple[int | None, int | None, int | None]:
    """(round, rank, world size) from "has joined round N of the rendezvous 'R' as rank K in a
    world of size W." (the run id may contain anything, so rank and size are found from the end)."""
    return (
        _int_after(message, "has joined round "),
        _int_after(message, " as rank ", last=True),
        _int_after(message, " in a world of size ", last=True),
    )


def classify_rdzv_message(message: str, node_state: str) -> RdzvAction:
    """Which :class:`RdzvAction` torch's message text describes."""
    for needle, action in _ACTIONS:
        if needle in message:
            return action
    return RdzvAction.FAILED if node_state == NodeState.FAILED else RdzvAction.OTHER


def _rdzv_event(d: dict[str, Any], created_ns: int) -> ElasticEvent:
    message = _text(d.get("message"))
    node_state = _enum_name(d.get("node_state"))
    run_id = _text(d.get("run_id"))
    hostname = _text(d.get("hostname"))
    pid = _opt_int(d.get("pid"))
    local_id = _opt_int(d.get("local_id"))
    rank = rank_field = _opt_int(d.get("rank"))
    name = _text(d.get("name"))
    action = classify_rdzv_message(message, node_state)

    round_: int | None = None
    world_size: int | None = None
    if action is RdzvAction.JOINED:
        round_, msg_rank, world_size = _joined_numbers(message)
        if rank is None:
            rank = msg_rank
    elif action in _ROUND_IN_MESSAGE:
        m = _ROUND.search(message)
        if m:
            round_ = int(m[1])  # the wait and redundancy lists name the round waited for

    attrs: Attributes = {
        A.EVENT_SOURCE: A.SOURCE_RENDEZVOUS,
        A.EVENT_NAME: name,
        A.RUN_ID: run_id,
        A.NODE_STATE: node_state,
        A.RDZV_ACTION: action.value,
    }
    if hostname:
        attrs[A.HOST_NAME] = hostname
    if pid is not None:
        attrs[A.PROCESS_PID] = pid
    if local_id is not None:
        attrs[A.LOCAL_ID] = local_id
    if rank is not None:
        attrs[A.RANK] = rank
    if round_ is not None:
        attrs[A.ROUND] = round_
    if world_size is not None:
        attrs[A.WORLD_SIZE] = world_size
    master = _text(d.get("master_endpoint"))
    if master:
        attrs[A.MASTER_ENDPOINT] = master
    for key, value in (("pid", pid), ("local_id", local_id), ("rank", rank_field)):
        if value is None:
            _flag_invalid(attrs, key, d.get(key))

    error: ErrorInfo | None = None
    if node_state == NodeState.FAILED:
        error = error_from_message(message, _text(d.get("error_trace")))
        attrs.update(error_attributes(error))
    extra = {k: v for k, v in d.items() if k not in _RDZV_FIELDS}
    _put_extra(attrs, extra)

    return ElasticEvent(
        kind=EventKind.RENDEZVOUS,
        name=name,
        body=message,
        time_ns=created_ns,
        attributes=attrs,
        run_id=run_id,
        node_state=node_state,
        action=action,
        round=round_,
        rank=rank,
        world_size=world_size,
        hostname=hostname,
        pid=pid,
        local_id=local_id,
        error=error,
        extra=extra,
    )


_ROUND_IN_MESSAGE = frozenset(
    {
        RdzvAction.ADDED_TO_PARTICIPANTS,
        RdzvAction.ADDED_TO_WAIT_LIST,
        RdzvAction.ADDED_TO_REDUNDANCY_LIST,
        RdzvAction.REMOVED_FROM_PARTICIPANTS,
        RdzvAction.REMOVED_FROM_WAIT_LIST,
        RdzvAction.REMOVED_FROM_REDUNDANCY_LIST,
        RdzvAction.MARKED_COMPLETE,
    }
)
_RDZV_FIELDS = frozenset(
    {
        "name",
        "run_id",
        "message",
        "hostname",
        "pid",
        "node_state",
        "master_endpoint",
        "rank",
        "local_id",
        "error_trace",
    }
)


# --- agent, worker and other Events ---------------------------------------------------------

# Keys of Event.metadata that become typed fields rather than plain torchelastic.<key>.
_AGENT_SPECIAL = frozenset({"hostname", "raw_error", "metadata"})


def _event(d: dict[str, Any], created_ns: int, record: AgentRecord | None = None) -> ElasticEvent:
    name = _text(d.get("name"))
    source = _enum_name(d.get("source"))
    ts = d.get("timestamp")
    time_ns = created_ns
    ts_ok = False
    if _is_number(ts) and 0 < ts < _MAX_TIMESTAMP_MS:  # NaN fails both comparisons
        ts_ok = True
        time_ns = int(ts * 1_000_000)
    md = d.get("metadata")
    if md is None:
        md = {}
    elif not isinstance(md, dict):
        raise _Unparsed(f"metadata is {type(md).__name__}, not an object")

    attrs: Attributes = {A.EVENT_NAME: name, A.EVENT_SOURCE: source or A.SOURCE_UNKNOWN}
    if not ts_ok and not (_is_number(ts) and ts == 0):
        # not milliseconds since the epoch (ns? µs? text?): the record time is used instead
        _flag_invalid(attrs, "timestamp", ts)
    nested: dict[str, Any] = {}
    raw_nested = md.get("metadata")
    if isinstance(raw_nested, str) and raw_nested.startswith("{"):
        try:
            parsed = json.loads(raw_nested, parse_int=_json_int)
            if isinstance(parsed, dict):
                nested = parsed
        except (ValueError, RecursionError):
            attrs[A.NS + "metadata"] = raw_nested
    elif isinstance(raw_nested, dict):
        nested = raw_nested
    elif raw_nested is not None:
        attrs[A.NS + "metadata"] = _attr_value(raw_nested)

    typed: dict[str, int | float] = {}
    for key, value in md.items():
        if key in _AGENT_SPECIAL or value is None:
            continue
        _put_field(attrs, typed, _text(key), value)
    if record is not None:
        _put_record_attributes(attrs, record)
    for key, value in nested.items():
        # torch wraps each per-worker value in a one-element list (tuples in JSON).
        if isinstance(value, list | tuple) and len(value) == 1:
            value = value[0]
        if value is None or A.NS + _text(key) in attrs:
            continue
        _put_field(attrs, typed, _text(key), value)

    hostname = _text(md.get("hostname"))
    if hostname:
        attrs[A.HOST_NAME] = hostname
    state = _text(md.get("state")) if md.get("state") is not None else ""
    if not state and name.startswith(STATUS_PREFIX):
        state = name[len(STATUS_PREFIX) :]
    group_rank = typed.get("group_rank")
    if group_rank is not None:
        attrs[A.RANK] = group_rank  # the node's rendezvous rank

    error = record.error if record is not None else None
    if error is None:
        error = _error_from_raw(md.get("raw_error"), attrs)
    if error is not None:
        attrs.update(error_attributes(error))

    if name.startswith(STATUS_PREFIX):
        kind = EventKind.WORKER if source == A.SOURCE_WORKER else EventKind.AGENT
    elif name.startswith(AGENT_STEP_PREFIX) and source == A.SOURCE_AGENT:
        kind = EventKind.AGENT  # a step the bridge observed itself (agent_instrumentation)
    else:
        kind = EventKind.GENERIC

    extra = {k: v for k, v in d.items() if k not in ("name", "source", "timestamp", "metadata")}
    _put_extra(attrs, extra)
    return ElasticEvent(
        kind=kind,
        name=name,
        body=name,
        time_ns=time_ns,
        attributes=attrs,
        run_id=_text(md.get("run_id")) if md.get("run_id") is not None else "",
        hostname=hostname,
        state=state,
        global_rank=_as_int(typed.get("global_rank")),
        group_rank=_as_int(group_rank),
        role=_text(md.get("role")) if md.get("role") is not None else "",
        agent_restarts=_as_int(typed.get("agent_restarts")),
        duration_ms=_as_float(typed.get("duration_ms")),
        error=error,
        pid=_as_int(typed.get("worker_pid")),
        extra=extra,
    )


def _put_field(attrs: Attributes, typed: dict[str, int | float], key: str, value: object) -> None:
    """``torchelastic.<key>``: typed when parse_event reads the key, else as it came."""
    if key in _RANK_LIST_METADATA:
        ranks = _rank_list(value)
        if ranks is None:
            _flag_invalid(attrs, key, value)
        elif ranks:  # none: the attribute is left out
            attrs[A.NS + key] = ranks
        return
    coerce = _TYPED_METADATA.get(key)
    if coerce is None:
        attrs[A.NS + key] = _attr_value(value)
        return
    number = coerce(value)
    if number is None:
        _flag_invalid(attrs, key, value)
    else:
        typed[key] = attrs[A.NS + key] = number


def _put_record_attributes(attrs: Attributes, record: AgentRecord) -> None:
    """The instrumentation's typed facts, where a serialized event's metadata would have them
    (after torch's keys): ``None`` and empty rank lists left out, as in metadata."""
    for key, value in record.attributes.items():
        if value is None or value == ():
            continue
        attrs[key] = value if isinstance(value, tuple) else _attr_value(value)


def _as_int(value: int | float | None) -> int | None:
    return value if isinstance(value, int) else None


def _as_float(value: int | float | None) -> float | None:
    return float(value) if value is not None else None


def _error_from_raw(raw: object, attrs: Attributes) -> ErrorInfo | None:
    """``raw_error`` is a worker's JSON error file, an agent traceback, or ``None``."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        return ErrorInfo(type="", message=_text(raw))
    text = raw.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text, parse_int=_json_int)
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict):
            traits = data.get("errorTraits")
            if isinstance(traits, dict) and traits.get("category"):
                attrs[A.ERROR_CATEGORY] = _text(traits["category"])
            msg = data.get("message")
            if isinstance(msg, dict):
                extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
                stack = _text(extra.get("py_callstack", "")) if extra else ""
                return error_from_message(_text(msg.get("message", "")), stack)
            if isinstance(msg, str) and msg and msg != "<NONE>":
                return error_from_message(msg, "")
            return None  # torch's placeholder: the worker wrote no error file
    if text == "None" or text == "<NONE>":
        return None
    # An agent traceback: the last line names the exception.
    last = text.rsplit("\n", 1)[-1].strip()
    err = error_from_message(last, raw)
    if not err.type and last == "NoneType: None":
        return None  # traceback.format_exc() outside an except block
    return err


def _flag_invalid(attrs: Attributes, key: str, raw: object) -> None:
    """A typed field present but unusable: left out, its text kept as
    ``torchelastic.invalid.<key>`` (``null``, i.e. an absent field, is not flagged)."""
    if raw is not None:
        attrs[A.INVALID_PREFIX + key] = _text(raw)[:_INVALID_TEXT_LIMIT]


_INVALID_TEXT_LIMIT = 256


def _put_extra(attrs: Attributes, extra: dict[str, Any]) -> None:
    """Fields a newer torch may add are kept, not dropped."""
    for key, value in extra.items():
        if value is not None:
            attrs.setdefault(A.NS + _text(key), _attr_value(value))


# --- unparsed -------------------------------------------------------------------------------


def _unparsed(text: str, reason: str, created_ns: int, raw_limit: int) -> ElasticEvent:
    truncated = len(text) > raw_limit
    kept = text[:raw_limit]
    attrs: Attributes = {
        A.UNPARSED: True,
        A.PARSE_ERROR: reason[:512],
        A.RAW: kept,
        A.EVENT_SOURCE: A.SOURCE_UNKNOWN,
    }
    if truncated:
        attrs[A.NS + "raw_length"] = len(text)
    body = f"unparsed torch elastic event: {reason[:200]}"
    return ElasticEvent(
        kind=EventKind.UNPARSED, name="", body=body, time_ns=created_ns, attributes=attrs
    )


def _raw_text(payload: object, data: dict[str, Any]) -> str:
    if isinstance(payload, str):
        return payload
    try:
        return json.dumps(data, default=repr)
    except Exception:
        return safe_text(payload)


def safe_text(value: object) -> str:
    """``value`` if it is a ``str``, else its ``repr()``; never raises (a failing or non-str
    ``repr()`` gives ``<unrepresentable …>`` / ``<TypeName>``)."""
    try:
        text = value if isinstance(value, str) else repr(value)
    except Exception as e:
        text = f"<unrepresentable {type(value).__name__}: {type(e).__name__}>"
    return text if isinstance(text, str) else f"<{type(value).__name__}>"


# --- small coercions ------------------------------------------------------------------------


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, Enum):
        inner = value.value  # an enum of any value: never its str(), which may raise
        return inner if isinstance(inner, str) else safe_text(inner)
    return safe_text(value)


def _enum_name(value: object) -> str:
    if isinstance(value, Enum):
        return str(value.name)
    return _text(value)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _opt_int(value: object) -> int | None:
    """An int that fits OTLP's int64, else ``None``: ints, integral floats and ASCII decimal
    text (sign and surrounding whitespace allowed); never bools, NaN, "²", "--5", "1e3"."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        value = int(value) if value.is_integer() else None  # NaN and inf are not integers
    elif isinstance(value, str):
        # ASCII decimal only: str.isdigit() also accepts "²" (int() refuses it) and "٣"
        m = _DECIMAL.fullmatch(value.strip())
        value = int(m.group()) if m else None
    if isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
        return int(value)  # an IntEnum member is a plain int here
    return None


def _rank_list(value: object) -> tuple[int, ...] | None:
    """Global ranks: ``"1,2"`` (torch's metadata holds scalars only), a list of them, or one
    → ``(1, 2)``; ``()`` for ``""``; ``None`` when a part is not a rank."""
    if isinstance(value, str):
        parts: list[object] = [p for p in value.split(",") if p.strip()]
    elif isinstance(value, list | tuple):
        parts = list(value)
    else:
        parts = [value]
    ranks = [_opt_int(part) for part in parts]
    if any(rank is None or rank < 0 for rank in ranks):
        return None
    return tuple(rank for rank in ranks if rank is not None)


def _duration(value: object) -> float | None:
    """A duration in ms that can back-date a span: finite, 0 to 100 days (``None`` else)."""
    if _is_number(value) and 0 <= value <= _MAX_DURATION_MS:  # NaN fails the comparison
        return float(value)
    return None


# Metadata keys parse_event reads as numbers (``worker_pid``: in the nested metadata JSON).
_TYPED_METADATA: dict[str, Callable[[object], int | float | None]] = {
    "global_rank": _opt_int,
    "group_rank": _opt_int,
    "agent_restarts": _opt_int,
    "worker_pid": _opt_int,
    "duration_ms": _duration,
}
# Metadata keys holding lists of global ranks, exported as int arrays that a query can use.
_RANK_LIST_METADATA = frozenset(
    key.removeprefix(A.NS)
    for key in (
        A.STALLED_RANKS,
        A.STALLED_WAITING,
        A.STALLED_NOT_REACHED,
        A.STALLED_LEFT,
        A.FLIGHT_RECORDER_UNANSWERED,
        A.STALLED_SILENT_GROUP_RANKS,
        A.STRAGGLER_WAITING,
    )
)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DECIMAL = re.compile(r"[-+]?[0-9]{1,19}")
_MAX_TIMESTAMP_MS = 9_000_000_000_000  # year 2255: beyond it, ms*1e6 overflows OTLP's uint64 ns
_MAX_DURATION_MS = 100 * 24 * 3600 * 1000.0


def _attr_value(value: object) -> AttrValue:
    """An OpenTelemetry attribute value: scalars kept, everything else as JSON text."""
    if isinstance(value, str | bool | float):
        return value
    if isinstance(value, int):
        return value if _INT64_MIN <= value <= _INT64_MAX else str(value)  # OTLP: int64
    if isinstance(value, Enum):
        return _text(value)
    try:
        return json.dumps(value, default=repr, ensure_ascii=False)
    except Exception:
        return safe_text(value)
