"""torchrun's ``torchrun.handlers`` entry points: the zero-code activation hook.

Importing ``torch.distributed.elastic.rendezvous`` (torchrun does, before it parses its
arguments) loads this entry-point group, where elastic-otel registers rendezvous backends
``otel-c10d``, ``otel-static``, ``otel-etcd`` and ``otel-etcd-v2``. Loading one calls
:func:`elastic_otel.integration.activation.activate`. Why this route: a ``.pth`` hook would
run in every Python process on the machine; this one runs only where torch elastic is
imported, costs nothing elsewhere, and needs neither a wrapper command nor a change to the
training script.

Each backend is torch's built-in one, traced (:mod:`elastic_otel.integration.traced_rendezvous`);
choosing it asks for telemetry, so creating it activates the bridge unless
``ELASTIC_OTEL_ENABLED=false``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from elastic_otel.integration.activation import activate

if TYPE_CHECKING:
    from elastic_otel.integration.traced_rendezvous import TracedRendezvousHandler

Creator = Callable[[Any], "TracedRendezvousHandler"]


def _backend_creator(name: str) -> Creator:
    activate()
    # Imported here: torch loads this module while importing its rendezvous package, which
    # traced_rendezvous imports in turn.
    from elastic_otel.integration.traced_rendezvous import traced_creator

    return traced_creator(name)  # cached: torch refuses a second creator for one name


def c10d_handler() -> Creator:
    """``torchrun.handlers`` entry point ``otel-c10d``."""
    return _backend_creator("c10d")


def static_handler() -> Creator:
    """``torchrun.handlers`` entry point ``otel-static``."""
    return _backend_creator("static")


def etcd_handler() -> Creator:
    """``torchrun.handlers`` entry point ``otel-etcd``."""
    return _backend_creator("etcd")


def etcd_v2_handler() -> Creator:
    """``torchrun.handlers`` entry point ``otel-etcd-v2``."""
    return _backend_creator("etcd-v2")
