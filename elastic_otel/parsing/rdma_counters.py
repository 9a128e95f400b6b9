"""RDMA NIC ports as sysfs shows them: rate, state and every port counter, read bounded.

The kernel exposes each port of an InfiniBand or RoCE device under
``/sys/class/infiniband/<device>/ports/<n>/`` (``Documentation/ABI/stable/sysfs-class-infiniband``):
``rate``, ``state``, ``phys_state``, the PortCounters of ``counters/`` and the driver's own
``hw_counters/`` (RoCE's retransmission and sequence errors). The counters are cumulative, so a
window is two readings: :func:`read_ports` takes one, :func:`deltas` compares two. Pure file
reading: an unreadable file is left out, nothing raises. Design: ``docs/hangs.md`` (Slow links
and slowdowns).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

MAX_DEVICES = 32
MAX_PORTS = 8
"""Ports read per device (an HCA has one or two; a switch shows only its port 0)."""
MAX_COUNTERS = 256
"""Counter files read per directory (an mlx5 port has about 30 in ``counters/``, 60 in
``hw_counters/``)."""
MAX_FILE_BYTES = 256

DATA_COUNTERS = ("port_xmit_data", "port_rcv_data")
DATA_UNIT = 4
"""``port_xmit_data`` and ``port_rcv_data`` count octets divided by 4 (the kernel's ABI doc)."""
ERROR_COUNTERS = frozenset(
    {
        # counters/: PortCounters errors (physical lanes, link recovery, dropped packets)
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "port_rcv_switch_relay_errors",
        "port_xmit_discards",
        "port_xmit_constraint_errors",
        "port_rcv_constraint_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "VL15_dropped",
        # hw_counters/: RoCE's lost and reordered packets, timed-out acknowledgements
        "out_of_sequence",
        "packet_seq_err",
        "local_ack_timeout_err",
        "implied_nak_seq_err",
        "duplicate_request",
        "rx_icrc_encapsulated",
    }
)
"""Counters whose every increment is a fault (``port_xmit_wait`` and the congestion
notifications are congestion, which a busy healthy fabric has too)."""
NOT_COUNTERS = frozenset({"lifespan"})
"""Files of ``hw_counters/`` that are settings, not counters."""


@dataclass(frozen=True, slots=True)
class PortReading:
    """One port at one moment."""

    device: str
    port: int
    rate: str  # "100 Gb/sec (4X EDR)"; "" where unreadable
    state: str  # "4: ACTIVE"
    phys_state: str  # "5: LinkUp"
    counters: Mapping[str, int]
    """``counters/`` and ``hw_counters/`` by file name (a ``hw_counters/`` name that is also in
    ``counters/`` is kept as ``hw_counters/<name>``)."""


@dataclass(frozen=True, slots=True)
class PortDelta:
    """One port over a window: its two readings and each counter's increase."""

    before: PortReading
    after: PortReading
    counters: Mapping[str, int]
    """The increase of every counter in both readings; one that went backwards (reset, or
    wrapped) counts as its new value."""
    reset: tuple[str, ...]  # the counters that went backwards

    @property
    def data_bytes(self) -> int:
        """Bytes sent and received (the data counters are in units of 4 octets)."""
        return sum(self.counters.get(name, 0) for name in DATA_COUNTERS) * DATA_UNIT

    @property
    def errors(self) -> dict[str, int]:
        """The error counters that moved, by name."""
        return {
            name: delta
            for name, delta in self.counters.items()
            if delta > 0 and name.rpartition("/")[2] in ERROR_COUNTERS
        }


def read_ports(root: str) -> tuple[PortReading, ...]:
    """Every port of every device under ``root`` (``/sys/class/infiniband``); none if absent."""
    found = []
    for device in _names(root, MAX_DEVICES):
        ports_dir = os.path.join(root, device, "ports")
        for name in _names(ports_dir, MAX_PORTS):
            if name.isdigit():
                found.append(_port(device, int(name), os.path.join(ports_dir, name)))
    return tuple(found)


def deltas(
    before: tuple[PortReading, ...], after: tuple[PortReading, ...]
) -> tuple[PortDelta, ...]:
    """The ports in both readings, with their counters' increases."""
    earlier = {(p.device, p.port): p for p in before}
    found = []
    for now in after:
        then = earlier.get((now.device, now.port))
        if then is None:
            continue
        moved: dict[str, int] = {}
        reset = []
        for name, value in now.counters.items():
            old = then.counters.get(name)
            if old is None:
                continue
            if value < old:
                reset.append(name)
                moved[name] = value
            else:
                moved[name] = value - old
        found.append(PortDelta(then, now, moved, tuple(reset)))
    return tuple(found)


def _port(device: str, port: int, path: str) -> PortReading:
    counters = _counters(os.path.join(path, "counters"))
    for name, value in _counters(os.path.join(path, "hw_counters")).items():
        counters[f"hw_counters/{name}" if name in counters else name] = value
    return PortReading(
        device=device,
        port=port,
        rate=_text(os.path.join(path, "rate")),
        state=_text(os.path.join(path, "state")),
        phys_state=_text(os.path.join(path, "phys_state")),
        counters=counters,
    )


def _counters(directory: str) -> dict[str, int]:
    found = {}
    for name in _names(directory, MAX_COUNTERS):
        if name in NOT_COUNTERS:
            continue
        text = _text(os.path.join(directory, name))
        # Some drivers answer "N/A (no PMA)" or fail the read (EINVAL) for what they lack.
        if text.isdigit():
            found[name] = int(text)
    return found


def _names(directory: str, most: int) -> list[str]:
    try:
        return sorted(os.listdir(directory))[:most]
    except OSError:
        return []


def _text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES).decode("ascii", "replace").strip()
    except OSError:
        return ""
