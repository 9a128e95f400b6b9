"""A real in-memory implementation of torch's ``RendezvousBackend`` for handlers in one process.

It keeps the encoded rendezvous state with a fencing token and follows the contract documented
on ``RendezvousBackend.set_state``: a write succeeds only with the token of the state it was
based on (or without a token while no state exists); otherwise the current state and its token
are returned with ``False``, and the caller re-reads and retries, as with the C10d and etcd
backends. Several ``DynamicRendezvousHandler`` instances sharing one backend rendezvous with
each other exactly as separate agents sharing a store would.

``fail_writes`` plays a backend that lost its connection: every ``set_state`` then raises
``RendezvousConnectionError``, which is what torch's own backends raise in that case.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

CONNECTION_LOST = "The connection to the in-memory rendezvous store has failed."


class InMemoryRendezvousBackend(RendezvousBackend):
    """Rendezvous state in memory, written conditionally on a fencing token."""

    def __init__(self, name: str = "in-memory") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._state: bytes | None = None
        self._token = 0
        self.writes = 0
        """Successful ``set_state`` calls so far."""
        self.fail_writes = False

    @property
    def name(self) -> str:
        return self._name

    def get_state(self) -> tuple[bytes, Token] | None:
        with self._cond:
            if self._state is None:
                return None
            return self._state, self._token

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        if self.fail_writes:
            raise RendezvousConnectionError(CONNECTION_LOST)
        with self._cond:
            if self._state is None:
                if token is not None:
                    return None  # a token for a state that does not exist: nothing to return
            elif token != self._token:
                return self._state, self._token, False  # stale: the caller re-reads
            self._state, self._token = state, self._token + 1
            self.writes += 1
            self._cond.notify_all()
            return state, self._token, True

    def wait_for_writes(self, n: int, timeout: float = 10.0) -> int:
        """Block until at least ``n`` writes happened in total; the count, or TimeoutError."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.writes >= n, timeout):
                raise TimeoutError(
                    f"waited {timeout}s for {n} rendezvous writes, saw {self.writes}"
                )
            return self.writes

    def decoded_state(self) -> Any:
        """torch's ``_RendezvousState`` as last written (``None`` before the first write)."""
        with self._cond:
            return None if self._state is None else pickle.loads(self._state)
