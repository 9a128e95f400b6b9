"""Traced rendezvous for any backend: a wrapper around a ``RendezvousHandler``.

Only torch's c10d and etcd-v2 backends record rendezvous events; static, etcd and third-party
backends record none, so their joins would leave no spans. The wrapper feeds the bridge events
shaped like torch's own around each ``next_rendezvous`` (none twice where torch's arrive too)
and reports its durations as metrics; torchrun reaches it through the ``otel-*`` backends.
Design: ``docs/architecture.md`` (Traced rendezvous backends).
"""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import os
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from torch.distributed.elastic.rendezvous import RendezvousHandler

from elastic_otel.bridge.handler import OtelHandler, get_handler
from elastic_otel.integration import torchrun_args
from elastic_otel.integration.activation import activate
from elastic_otel.integration.registration import rendezvous_routed
from elastic_otel.names import attributes as A
from elastic_otel.names.torch_names import NodeState

_logger = logging.getLogger("elastic_otel")

_local_ids = itertools.count()


class RendezvousLike(Protocol):
    """What is wrapped: torch's ``RendezvousHandler`` or torchelastic 0.2's (duck-typed)."""

    def next_rendezvous(self) -> Any: ...

    def is_closed(self) -> bool: ...

    def set_closed(self) -> None: ...

    def num_nodes_waiting(self) -> int: ...

    def get_run_id(self) -> str: ...

    def shutdown(self) -> bool: ...


class TracedRendezvousHandler(RendezvousHandler):
    """Wraps ``inner`` (torch's interface or torchelastic 0.2's); records what it does.

    ``backend_name`` is what :meth:`get_backend` reports (default: the wrapped backend's).
    ``event_handler`` receives the rendezvous events (default: the shared bridge handler).
    """

    def __init__(
        self,
        inner: RendezvousLike,
        backend_name: str | None = None,
        event_handler: OtelHandler | None = None,
    ) -> None:
        self._inner = inner
        self._wrapped_backend = _backend_of(inner)
        self._backend_name = backend_name or self._wrapped_backend
        self._event_handler = event_handler
        self._successes = 0
        self._local_id = next(_local_ids)
        self._hostname = ""
        self._closed_recorded = False
        run_id = self._run_id()
        if run_id:
            from elastic_otel.integration import torch_metrics as metrics  # imported when used

            metrics.set_run_id(run_id)

    # --- the RendezvousHandler interface -------------------------------------------------

    @property
    def inner(self) -> RendezvousLike:
        """The wrapped handler."""
        return self._inner

    @property
    def wrapped_backend(self) -> str:
        """The wrapped handler's backend name (``static``, ``etcd``, ``c10d``, ...)."""
        return self._wrapped_backend

    def get_backend(self) -> str:
        return self._backend_name

    @property
    def use_agent_store(self) -> bool:
        return bool(getattr(self._inner, "use_agent_store", False))

    def next_rendezvous(self) -> Any:
        synthetic = not self._torch_records_events()
        if synthetic:
            self._record(
                "next_rendezvous",
                self._message("attempts to join the next round of the rendezvous"),
            )
        start = time.monotonic()
        try:
            result = self._inner.next_rendezvous()
        except BaseException as e:
            outcome = _outcome(e)
            self._duration(start, outcome)
            if synthetic:
                self._record_failure(e, outcome)
            raise
        rank, world_size = _rank_and_world(result)
        round_ = self._round()
        self._successes += 1
        self._closed_recorded = False
        self._duration(start, "ok")
        if synthetic:
            self._record(
                "next_rendezvous",
                f"The node '{self._node()}' has joined round {round_} of the rendezvous "
                f"'{self._run_id()}' as rank {rank} in a world of size {world_size}.",
                rank=rank,
            )
        return result

    def is_closed(self) -> bool:
        return self._inner.is_closed()

    def set_closed(self) -> None:
        self._inner.set_closed()
        if not self._torch_records_events():
            self._record("set_closed", self._message("has marked the rendezvous", "as closed"))

    def num_nodes_waiting(self) -> int:
        from elastic_otel.integration import torch_metrics as metrics

        waiting = self._inner.num_nodes_waiting()
        handler = metrics.installed_handler()
        if handler is not None and isinstance(waiting, int):
            handler.record(
                metrics.GAUGE,
                A.METRIC_RDZV_NODES_WAITING,
                waiting,
                {A.RDZV_BACKEND: self._backend_name},
            )
        return waiting

    def get_run_id(self) -> str:
        return self._inner.get_run_id()

    def shutdown(self) -> bool:
        synthetic = not self._torch_records_events()
        try:
            ok = self._inner.shutdown()
        except Exception as e:
            if synthetic:
                self._record_shutdown_failed(e)
            raise
        if synthetic and not self._closed_recorded:
            if ok is False:
                self._record_shutdown_failed(None)
            else:
                self._closed_recorded = True
                self._record("shutdown", self._message("has closed the rendezvous"))
        return ok

    def __getattr__(self, name: str) -> Any:
        # Anything beyond the interface (settings, backend-specific helpers) is the inner's.
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"TracedRendezvousHandler({self._inner!r})"

    # --- events --------------------------------------------------------------------------

    def _torch_records_events(self) -> bool:
        """Whether the wrapped handler's own rendezvous events already reach the bridge."""
        return _is_dynamic(self._inner) and rendezvous_routed(self._bridge())

    def _bridge(self) -> OtelHandler:
        if self._event_handler is None:
            self._event_handler = get_handler()
        return self._event_handler

    def _node(self) -> str:
        host, pid, local_id = self._identity()
        return f"{host}_{pid}_{local_id}"

    def _identity(self) -> tuple[str, int, int]:
        node = getattr(self._inner, "_this_node", None)  # torch's dynamic handler
        if node is not None:
            try:
                return str(node.addr), int(node.pid), int(node.local_id)
            except (AttributeError, TypeError, ValueError):
                pass
        if not self._hostname:
            self._hostname = socket.getfqdn()
        return self._hostname, os.getpid(), self._local_id

    def _run_id(self) -> str:
        try:
            return str(self._inner.get_run_id())
        except Exception:
            return ""

    def _message(self, verb: str, suffix: str = "") -> str:
        tail = f" {suffix}" if suffix else ""
        return f"The node '{self._node()}' {verb} '{self._run_id()}'{tail}."

    def _record(
        self,
        operation: str,
        message: str,
        node_state: str = "RUNNING",
        rank: int | None = None,
        error_trace: str = "",
    ) -> None:
        host, pid, local_id = self._identity()
        event = {
            "name": f"{type(self).__name__}.{operation}",
            "run_id": self._run_id(),
            "message": message,
            "hostname": host,
            "pid": pid,
            "node_state": node_state,
            "master_endpoint": "",
            "rank": rank,
            "local_id": local_id,
            "error_trace": error_trace,
            "rdzv_backend": self._backend_name,
        }
        try:
            self._bridge().info(event)
        except Exception:  # telemetry never breaks the rendezvous
            _logger.debug("elastic-otel: rendezvous event not recorded", exc_info=True)

    def _record_failure(self, error: BaseException, outcome: str) -> None:
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        if outcome == "graceful_exit":  # torch: "not a failure", the node was not admitted
            message = self._message("has closed the rendezvous", f"({_describe(error)})")
            self._record("next_rendezvous", message)
            return
        self._record(
            "next_rendezvous",
            _describe(error),
            node_state=NodeState.FAILED.value,
            error_trace=trace,
        )

    def _record_shutdown_failed(self, error: BaseException | None) -> None:
        kind = type(error).__name__ if error is not None else "a False result"
        trace = (
            "".join(traceback.format_exception(type(error), error, error.__traceback__))
            if error is not None
            else ""
        )
        self._record(
            "shutdown",
            self._message(
                "has failed to shutdown the rendezvous", f"due to an error of type {kind}"
            ),
            node_state=NodeState.FAILED.value,
            error_trace=trace,
        )

    # --- rounds and metrics --------------------------------------------------------------

    def _round(self) -> int:
        if self._wrapped_backend == "static":
            return 0
        state_holder = getattr(self._inner, "_state_holder", None)  # dynamic: c10d, etcd-v2
        if state_holder is not None:
            try:
                return int(state_holder.state.round)
            except (AttributeError, TypeError, ValueError):
                pass
        impl = getattr(self._inner, "_rdzv_impl", None)  # etcd (torch's and torchelastic's)
        if impl is not None:
            try:
                _, state = impl.get_rdzv_state()
                return int(state["version"])
            except Exception:
                pass
        return self._successes

    def _duration(self, start: float, outcome: str) -> None:
        from elastic_otel.integration import torch_metrics as metrics

        handler = metrics.installed_handler()
        if handler is None:
            return
        handler.record(
            metrics.HISTOGRAM,
            A.METRIC_RDZV_DURATION,
            (time.monotonic() - start) * 1000.0,
            {A.RDZV_BACKEND: self._backend_name, A.RDZV_OUTCOME: outcome},
            unit="ms",
        )


def _backend_of(inner: Any) -> str:
    get_backend = getattr(inner, "get_backend", None)
    if callable(get_backend):
        try:
            return str(get_backend())
        except Exception:
            pass
    if type(inner).__name__ == "EtcdRendezvousHandler":  # torchelastic 0.2 has no get_backend
        return "etcd"
    return type(inner).__name__


def _is_dynamic(inner: Any) -> bool:
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler,
        )
    except ImportError:  # pragma: no cover
        return False
    return isinstance(inner, DynamicRendezvousHandler)


def _rank_and_world(result: Any) -> tuple[Any, Any]:
    """(rank, world size) of torch's ``RendezvousInfo`` or torchelastic 0.2's tuple."""
    if isinstance(result, tuple) and len(result) == 3:
        return result[1], result[2]
    return getattr(result, "rank", None), getattr(result, "world_size", None)


def _outcome(error: BaseException) -> str:
    names = {cls.__name__ for cls in type(error).__mro__}
    if "RendezvousGracefulExitError" in names:
        return "graceful_exit"
    if names & {"RendezvousClosedError", "RendezvousClosedException"}:
        return "closed"
    if names & {"RendezvousTimeoutError", "RendezvousTimeoutException", "TimeoutError"}:
        return "timeout"
    if "timed out" in str(error).lower():  # e.g. static's store: "Timed out after 2 seconds"
        return "timeout"
    return "error"


def _describe(error: BaseException) -> str:
    text = str(error)
    name = type(error).__name__
    return f"{name}: {text}" if text else f"{name}: {_DEFAULT_TEXT.get(name, name)}"


_DEFAULT_TEXT = {
    "RendezvousTimeoutError": "the rendezvous did not complete on time",
    "RendezvousTimeoutException": "the rendezvous did not complete on time",
    "RendezvousClosedError": "the rendezvous is closed",
    "RendezvousClosedException": "the rendezvous is closed",
}


# --- torchrun integration ---------------------------------------------------------------------


def _torch_creator(name: str) -> Callable[[Any], Any]:
    from torch.distributed.elastic.rendezvous import registry

    return {
        "c10d": registry._create_c10d_handler,
        "static": registry._create_static_handler,
        "etcd": registry._create_etcd_handler,
        "etcd-v2": registry._create_etcd_v2_handler,
    }[name]


def _static_defaults(params: Any) -> None:
    """What torchrun gives ``--rdzv-backend static`` only: the node rank, the endpoint."""
    if "rank" in params.config and params.endpoint.strip():
        return
    args = torchrun_args.torchrun_arguments()
    if args is None:
        return
    if "rank" not in params.config:
        params.config["rank"] = args.node_rank
    if not params.endpoint.strip():
        params.endpoint = f"{args.master_addr}:{args.master_port or 29500}"


@functools.cache
def traced_creator(name: str) -> Callable[[Any], TracedRendezvousHandler]:
    """A ``RendezvousHandlerCreator``: torch's built-in backend ``name``, traced.

    Cached, so that registering it twice registers the same creator (torch refuses two).
    """

    def create(params: Any) -> TracedRendezvousHandler:
        activate(context_requests=True)  # choosing a traced backend asks for telemetry
        inner_params = copy.copy(params)
        inner_params.config = dict(params.config)
        inner_params.backend = name
        if name == "static":
            _static_defaults(inner_params)
        inner = _torch_creator(name)(inner_params)
        return TracedRendezvousHandler(inner, backend_name=params.backend)

    create.__name__ = create.__qualname__ = f"create_traced_{name.replace('-', '_')}_handler"
    return create
