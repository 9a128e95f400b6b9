"""The kernel's OOM-kill count of this process's memory cgroup (elastic_otel.integration.
oom_kills), from cgroup trees laid out as the kernel lays them out (v1, v2, hybrid)."""

from __future__ import annotations

from pathlib import Path

from elastic_otel.integration.oom_kills import oom_kill_count, parse_oom_kill

V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 3\noom_kill {n}\noom_group_kill 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"


def _tree(tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    proc = tmp_path / "cgroup"
    proc.write_text(proc_cgroup)
    root = tmp_path / "sys-fs-cgroup"
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(proc), str(root)


def test_cgroup_v2_memory_events(tmp_path: Path) -> None:
    proc, root = _tree(
        tmp_path,
        "0::/kubepods/pod42/job\n",
        {"kubepods/pod42/job/memory.events": V2_EVENTS.format(n=2)},
    )
    assert oom_kill_count(proc, root) == 2


def test_cgroup_v1_memory_controller_on_a_hybrid_host(tmp_path: Path) -> None:
    proc, root = _tree(
        tmp_path,
        "9:pids:/\n4:memory:/process_api/70ad\n0::/\n",
        {
            "memory/process_api/70ad/memory.oom_control": V1_OOM_CONTROL.format(n=5),
            "unified/cgroup.procs": "",  # v2 mounted beside it, without memory counters
        },
    )
    assert oom_kill_count(proc, root) == 5


def test_a_container_sees_its_own_cgroup_as_the_root(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, "0::/\n", {"memory.events": V2_EVENTS.format(n=1)})
    assert oom_kill_count(proc, root) == 1


def test_nothing_is_claimed_where_the_kernel_does_not_count(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, "0::/job\n", {"job/memory.events": "low 0\nhigh 0\n"})
    assert oom_kill_count(proc, root) is None
    assert oom_kill_count(str(tmp_path / "no-such-file"), root) is None
    assert parse_oom_kill("oom_kill many\n") is None
