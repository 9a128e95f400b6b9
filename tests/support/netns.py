"""Hosts of their own on this machine, for tests that need several nodes with distinct addresses
and host names (the Slurm cluster of ``tests/support/slurm_cluster.py``, the 16-node jobs of
``tests/scale/``).

Each host is a network namespace (``ip netns``) joined to a bridge in the root namespace by a
veth pair, with its own address; a process started through :meth:`HostNetwork.command` also gets
a UTS namespace with the host's name (what ``socket.gethostname()`` and ``host.name`` read) and a
mount namespace with the host's ``/etc/hosts`` bound over the machine's, which lists every host
of the network (and ``extra_hosts``). Processes on a host reach the others, and anything
listening on the bridge's address in the root namespace (an OTLP receiver, a controller), only
over that link, as separate machines would; :meth:`HostNetwork.shape` rate-limits one host's
link (``tc tbf``: the slow links of ``tests/links/``). ``nsenter``, not ``ip netns exec``: that
remounts ``/sys``, which hides the cgroup hierarchy ``slurmd`` needs. Root is required; the
bridge and the namespaces have fixed names, so a lock file makes a second user wait for the
first; :meth:`HostNetwork.stop` removes everything.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

BINARIES = ("ip", "unshare", "nsenter", "mount")

_ENTER = 'mount --bind "/etc/netns/$0/hosts" /etc/hosts && hostname "$0" && exec "$@"'
"""Run inside the host's namespaces: its ``/etc/hosts``, its host name, then the command."""


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def run(*cmd: str, check: bool = True, env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr}")
    return done.stdout


class HostNetwork:
    """``hosts`` (names of at most 11 characters: the veth ends are ``<name>-h``, ``<name>-c``)
    on the bridge ``bridge``, addressed ``<subnet>.<first_addr + index>``; the bridge itself is
    ``<subnet>.1`` (:attr:`gateway`). Start with :meth:`start`, end with :meth:`stop`."""

    def __init__(
        self,
        bridge: str,
        subnet: str,
        hosts: Sequence[str],
        lock_file: Path,
        lock_wait_s: float = 900,
        extra_hosts: Mapping[str, str] | None = None,
        first_addr: int = 11,
    ) -> None:
        self.bridge = bridge
        self.subnet = subnet
        self.hosts = tuple(hosts)
        self.gateway = f"{subnet}.1"
        self.lock_file = lock_file
        self.lock_wait_s = lock_wait_s
        self.extra_hosts = dict(extra_hosts or {})
        self.first_addr = first_addr
        self._made: list[str] = []
        self._lock: int | None = None

    def addr(self, host: str) -> str:
        return f"{self.subnet}.{self.first_addr + self.hosts.index(host)}"

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> HostNetwork:
        try:
            self._take_lock()
            self._network()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGKILL whatever still runs on the hosts; remove the namespaces and the bridge."""
        self.signal_all(signal.SIGKILL)
        for host in self._made:
            run("ip", "netns", "del", host, check=False)
            shutil.rmtree(f"/etc/netns/{host}", ignore_errors=True)
        self._made.clear()
        run("ip", "link", "del", self.bridge, check=False)
        if self._lock is not None:
            os.close(self._lock)  # releases the lock
            self._lock = None

    def __enter__(self) -> HostNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _take_lock(self) -> None:
        self._lock = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.lock_wait_s
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"another test network holds {self.lock_file}") from None
                time.sleep(1)

    def _network(self) -> None:
        run("ip", "link", "del", self.bridge, check=False)  # left over by a killed session
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        hosts = ["127.0.0.1 localhost"]
        hosts += [f"{addr} {name}" for name, addr in self.extra_hosts.items()]
        hosts += [f"{self.addr(host)} {host}" for host in self.hosts]
        for host in self.hosts:
            run("ip", "netns", "del", host, check=False)
            run("ip", "netns", "add", host)
            self._made.append(host)
            outside, inside = f"{host}-h", f"{host}-c"
            run("ip", "link", "del", outside, check=False)
            run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            run("ip", "link", "set", outside, "master", self.bridge, "up")
            run("ip", "link", "set", inside, "netns", host)
            ns = ("ip", "netns", "exec", host)
            run(*ns, "ip", "addr", "add", f"{self.addr(host)}/24", "dev", inside)
            run(*ns, "ip", "link", "set", inside, "up")
            run(*ns, "ip", "link", "set", "lo", "up")
            etc = Path("/etc/netns") / host
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("\n".join(hosts) + "\n")
            (etc / "hostname").write_text(host + "\n")

    # --- on a host ------------------------------------------------------------------------

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as a command line that runs it on ``host``: in its network namespace, with
        its host name and ``/etc/hosts``. Each step ``exec``s the next, so the process started
        is, once inside, ``argv`` itself (its pid is the command's)."""
        return [
            "nsenter", f"--net=/run/netns/{host}",
            "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", _ENTER, host, *argv,
        ]  # fmt: skip

    def shape(self, host: str, rate: str, burst: str = "64kb", latency: str = "200ms") -> None:
        """Rate-limit ``host``'s link in both directions, as a NIC fallen back to a lower rate or
        a bad cable would: a token bucket (``tc qdisc ... tbf``, this kernel has no ``netem``)
        on the egress of both veth ends, ``<host>-h`` (towards the host) and ``<host>-c``
        (from it). ``rate``, ``burst`` and ``latency`` (the longest a packet may queue) in
        ``tc``'s units (``40mbit``, ``64kb``, ``200ms``). Again: replaces the limit."""
        tbf = ("root", "tbf", "rate", rate, "burst", burst, "latency", latency)
        run("tc", "qdisc", "replace", "dev", f"{host}-h", *tbf)
        run("ip", "netns", "exec", host, "tc", "qdisc", "replace", "dev", f"{host}-c", *tbf)

    def unshape(self, host: str) -> None:
        """Remove :meth:`shape`'s limit from ``host``'s link (none there: nothing to do)."""
        run("tc", "qdisc", "del", "dev", f"{host}-h", "root", check=False)
        inside = ("tc", "qdisc", "del", "dev", f"{host}-c", "root")
        run("ip", "netns", "exec", host, *inside, check=False)

    def signal_all(self, signum: int) -> None:
        """:meth:`signal` every host this network made (none before it holds its lock)."""
        for host in self._made:
            self.signal(host, signum)

    def pids(self, host: str) -> list[int]:
        """Every process on ``host`` (in its network namespace)."""
        return [int(p) for p in run("ip", "netns", "pids", host, check=False).split()]

    def signal(self, host: str, signum: int) -> list[int]:
        """Send ``signum`` to every process on ``host`` at once (SIGKILL: the host is lost;
        SIGSTOP: it freezes, as a host hung in the kernel); the pids signalled."""
        pids = self.pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        return pids
