"""The kernel's OOM kills in this process's memory cgroup, where the kernel counts them.

A worker killed by SIGKILL may have been killed by the kernel's OOM killer, by a user, or by a
scheduler; its exit code says none of that. The kernel counts OOM kills per memory cgroup:
cgroup v2's ``memory.events`` and cgroup v1's ``memory.oom_control`` both have an
``oom_kill <n>`` line (v1 since Linux 4.13). The agent and the workers it starts share a
cgroup, so the agent reads the count before it starts its workers and again when one dies of
SIGKILL: a rise means the OOM killer acted. Where no counter can be read the answer is
``None`` and nothing is claimed: the bridge never guesses that a SIGKILL was an OOM kill.
"""

from __future__ import annotations

import os

_CGROUP_ROOT = "/sys/fs/cgroup"
_READ_LIMIT = 4096


def oom_kill_count(proc_cgroup: str = "/proc/self/cgroup", root: str = _CGROUP_ROOT) -> int | None:
    """This process's cgroup's ``oom_kill`` count (``None``: not available here)."""
    for path in _counter_files(proc_cgroup, root):
        count = _read_count(path)
        if count is not None:
            return count
    return None


def _counter_files(proc_cgroup: str, root: str) -> list[str]:
    """Candidate counter files, the process's own cgroup first, then the namespace's root."""
    try:
        with open(proc_cgroup, encoding="utf-8", errors="replace") as f:
            lines = f.read(_READ_LIMIT).splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        relative = path.strip().lstrip("/")
        if controllers == "":  # cgroup v2's unified hierarchy
            for base in (root, os.path.join(root, "unified")):
                found.append(os.path.join(base, relative, "memory.events"))
                found.append(os.path.join(base, "memory.events"))
        elif "memory" in controllers.split(","):  # cgroup v1's memory controller
            base = os.path.join(root, "memory")
            found.append(os.path.join(base, relative, "memory.oom_control"))
            found.append(os.path.join(base, "memory.oom_control"))
    # The v1 memory controller first: on a hybrid host, v2 holds no memory counters.
    return sorted(dict.fromkeys(found), key=lambda p: not p.endswith("memory.oom_control"))


def _read_count(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(_READ_LIMIT)
    except OSError:
        return None
    return parse_oom_kill(text)


def parse_oom_kill(text: str) -> int | None:
    """The ``oom_kill`` count of a ``memory.events`` / ``memory.oom_control`` text."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None
