"""Section 4: what having the package installed costs processes that do not use it.

Environments (hyperfine-style statistics computed here, runs interleaved A/B/C, B/C/A, C/A/B
to cancel drift and order, warm-up runs first so that file caches are hot for all):

* ``with``: the project's venv, elastic-otel installed (editable: a ``.pth`` import hook);
* ``without``: a venv made with ``python -m venv`` from the same interpreter whose
  site-packages holds a symlink to every entry of the project's venv *except* elastic-otel's
  (its dist-info, its editable ``.pth`` and finder): same torch, same OTel, no package;
* ``wheel``: the ``without`` venv plus a regular (non-editable) install of a wheel built from
  this tree, i.e. what users get from ``pip install elastic-otel``.

Commands: ``python -c pass``; ``python -c "import torch.distributed.elastic.rendezvous"``
(which loads the ``torchrun.handlers`` entry points, so the package is registered but not
activated: ``ELASTIC_OTEL_ENABLED`` unset); and a two-agent torchrun job
(``examples/train.py``, c10d) with and without ``--event-log-handler otel``.

Renders section 4 of BENCHMARKS.md (:func:`render`, :func:`targets`).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.format import Target
from benchmarks.format import failures as _failures
from benchmarks.format import number as _f
from benchmarks.format import table as _table
from benchmarks.format import times as _x

CACHE = Path(tempfile.gettempdir()) / "elastic-otel-bench"
JOB_TIMEOUT_S = 120.0
PASS_BOUND = 1.02
"""Issue 48: ``python -c pass`` with the wheel installed ÷ without."""
_OWN_ENTRIES = ("elastic_otel", "__editable__.elastic_otel", "__editable___elastic_otel")


def _site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def _base_python() -> str:
    return getattr(sys, "_base_executable", None) or sys.executable


def _made_for(path: Path, key: str) -> bool:
    """Whether the cached venv at ``path`` was made for ``key`` (what it was built from)."""
    marker = path / ".bench-ok"
    return marker.exists() and marker.read_text() == key


def _source_key(with_tree: bool) -> str:
    """What a cached venv depends on: the venv its symlinks point into and, for the wheel's,
    this tree's package (a venv made from a removed checkout, or from older code, is remade)."""
    key = hashlib.sha256(sys.prefix.encode())
    if with_tree:
        for file in sorted((common.ROOT / "elastic_otel").rglob("*.py")):
            key.update(file.read_bytes())
    return key.hexdigest()


def make_without_venv(path: Path) -> Path:
    """A venv sharing every installed distribution of ours except elastic-otel (symlinks)."""
    src = _site_packages(Path(sys.prefix))
    marker = path / ".bench-ok"
    key = _source_key(with_tree=False)
    if _made_for(path, key):
        return path
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run([_base_python(), "-m", "venv", "--without-pip", str(path)], check=True)
    dst = _site_packages(path)
    for entry in sorted(src.iterdir()):
        if entry.name.startswith(_OWN_ENTRIES) or entry.name == "__pycache__":
            continue
        (dst / entry.name).symlink_to(entry)
    marker.write_text(key)
    return path


def make_wheel_venv(path: Path) -> Path | None:
    """``without`` plus a real non-editable install of this tree's wheel (None if it fails)."""
    marker = path / ".bench-ok"
    key = _source_key(with_tree=True)
    if _made_for(path, key):
        return path
    shutil.rmtree(path, ignore_errors=True)
    try:
        make_without_venv(path)
        marker.unlink()
        with tempfile.TemporaryDirectory(prefix="eo-wheel-") as tmp:
            # Build from a copy: an in-tree build would leave build/ behind in the repo.
            src = Path(tmp) / "src"
            shutil.copytree(
                common.ROOT,
                src,
                ignore=shutil.ignore_patterns(".git", "*.egg-info", "__pycache__", ".*cache*"),
            )
            pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
            subprocess.run(
                [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp, str(src)],
                check=True,
                capture_output=True,
            )
            wheel = next(Path(tmp).glob("elastic_otel-*.whl"))
            subprocess.run(
                [*pip, "--python", str(path / "bin" / "python"), "install", "--no-deps",
                 "--no-index", str(wheel)],
                check=True,
                capture_output=True,
            )  # fmt: skip
    except (subprocess.CalledProcessError, StopIteration, OSError):
        shutil.rmtree(path, ignore_errors=True)
        return None
    marker.write_text(key)
    return path


# Neutral working directory: ``python -c`` puts the cwd on sys.path, and the repository's
# ``elastic_otel.egg-info`` there would register the package in the "without" venv too.
NEUTRAL_CWD = tempfile.gettempdir()


def _time_once(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run(
        cmd,
        env=env,
        cwd=NEUTRAL_CWD,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        check=True,
        text=True,
    )
    return time.perf_counter() - t0, res.stdout


def compare(
    commands: dict[str, list[str]], env: dict[str, str], runs: int, warmup: int
) -> dict[str, Any]:
    """Interleaved timings of each named command, each run in a rotated order; mean, stdev,
    median, min and their ratios to the last (the baseline)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    stdout: dict[str, str] = {}
    for _ in range(warmup):
        for cmd in commands.values():
            _time_once(cmd, env)
    names = list(commands)
    for run in range(runs):
        # Each run starts with another variant: a fixed order biases the ratios (the one
        # after another reads what that one left in the caches) by about as much as 1.02x.
        for name in names[run % len(names) :] + names[: run % len(names)]:
            elapsed, stdout[name] = _time_once(commands[name], env)
            times[name].append(elapsed)
    out: dict[str, Any] = {"runs": runs, "variants": {}, "stdout": stdout}
    base = names[-1]  # the last one is the baseline ("without")
    b_mean, b_sd = statistics.fmean(times[base]), _sd(times[base])
    for name in names:
        t = times[name]
        mean, sd = statistics.fmean(t), _sd(t)
        ratio = mean / b_mean
        out["variants"][name] = {
            "mean_ms": mean * 1e3,
            "stdev_ms": sd * 1e3,
            "median_ms": statistics.median(t) * 1e3,
            "min_ms": min(t) * 1e3,
            "ratio_mean": ratio,
            # hyperfine's error propagation for a ratio of means.
            "ratio_err": ratio * math.sqrt((sd / mean) ** 2 + (b_sd / b_mean) ** 2),
            "ratio_median": statistics.median(t) / statistics.median(times[base]),
            "ratio_min": min(t) / min(times[base]),
        }
    out["baseline"] = base
    return out


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_job(
    with_otel: bool, env: dict[str, str], tag: str, extra_args: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Two agents of one job (c10d on localhost), started together; wall time until both end."""
    torchrun = str(Path(sys.executable).parent / "torchrun")
    port = _free_port()
    cmd = [
        torchrun,
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id=bench-{tag}",
        *(["--event-log-handler", "otel"] if with_otel else []),
        *extra_args,
        str(common.ROOT / "examples" / "train.py"),
    ]
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(cmd, cwd=common.child_cwd(), env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for _ in range(2)
    ]  # fmt: skip
    hung = False
    outputs = []
    for p in procs:
        try:
            outputs.append(
                p.communicate(timeout=max(1.0, t0 + JOB_TIMEOUT_S - time.perf_counter()))[0]
            )
        except subprocess.TimeoutExpired:
            hung = True
            for q in procs:  # each agent leads its own session: kill it with its workers
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(q.pid, signal.SIGKILL)
            outputs.append(p.communicate()[0])
    wall = time.perf_counter() - t0
    codes = [p.returncode for p in procs]
    ok = not hung and all(c == 0 for c in codes)
    ok = ok and any("trained on 2 workers" in o for o in outputs)
    tail = (f"HUNG: killed after {JOB_TIMEOUT_S:.0f} s\n" if hung else "") + "\n".join(
        f"--- agent {i} (exit {c}), last lines:\n" + "\n".join(o.splitlines()[-12:])
        for i, (c, o) in enumerate(zip(codes, outputs, strict=True))
        if hung or c != 0 or "trained on 2 workers" not in o
    )
    return {"wall_s": wall, "ok": ok, "hung": hung, "exit_codes": codes, "tail": "" if ok else tail}


def run(quick: bool) -> dict[str, Any]:
    without = make_without_venv(CACHE / "venv-without")
    # Building the wheel takes ~10 s: not in the CI-sized run.
    wheel = None if quick else make_wheel_venv(CACHE / "venv-wheel")
    env = common.clean_env()
    env.pop("PYTHONPATH", None)  # nothing but what each venv itself provides
    pythons = {"with (editable, /work venv)": sys.executable}
    if wheel is not None:
        pythons["with (wheel install)"] = str(wheel / "bin" / "python")
    pythons["without"] = str(without / "bin" / "python")
    out: dict[str, Any] = {
        "venvs": {name: str(Path(p).parent.parent) for name, p in pythons.items()}
    }
    out["pass"] = compare(
        {name: [py, "-c", "pass"] for name, py in pythons.items()},
        env,
        runs=5 if quick else 200,  # 0.2 ms on 9 ms: 40 runs cannot tell 1.02x from noise
        warmup=1 if quick else 10,
    )
    out["pass"].pop("stdout")
    torch_pythons = {k: v for k, v in pythons.items() if "wheel" not in k}
    res = compare(
        {name: [py, "-W", "ignore", "-c", IMPORT_AND_CHECK] for name, py in torch_pythons.items()},
        env,
        runs=1 if quick else 20,
        warmup=0 if quick else 1,
    )
    res["check"] = {name: _describe_check(text) for name, text in res.pop("stdout").items()}
    out["import_rendezvous"] = res
    if quick:
        out["torchrun"] = {"skipped": "--quick"}
        return out
    from benchmarks.receiver import ReceiverProcess

    reps = 10  # a job's stdev is 0.3 s of 4.6 s: fewer runs leave the median to chance
    names = ("without --event-log-handler", "--event-log-handler otel")
    jobs: dict[str, list[dict]] = {name: [] for name in names}
    with ReceiverProcess("grpc") as rx:
        job_env = common.clean_env(
            {
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "ELASTIC_OTEL_JOB_ID": "benchmark",
                "TRAIN_OTEL": "0",  # the agents' bridge only, not the script's own spans
            }
        )
        for i in range(reps):
            jobs[names[0]].append(torchrun_job(False, job_env, f"a{i}"))
            jobs[names[1]].append(torchrun_job(True, job_env, f"b{i}"))
        received = rx.stats()["records"]
    summary: dict[str, Any] = {
        "reps": reps,
        "received": received,
        "variants": {},
        "job_timeout_s": JOB_TIMEOUT_S,
    }
    for name, runs in jobs.items():
        walls = [r["wall_s"] for r in runs if not r.get("hung")] or [math.nan]
        summary["variants"][name] = {
            "mean_s": statistics.fmean(walls),
            "median_s": statistics.median(walls),
            "min_s": min(walls),
            "stdev_s": _sd(walls),
            "all_ok": all(r["ok"] for r in runs),
            "hung": sum(1 for r in runs if r.get("hung")),
            "walls": walls,
            "failure": next((r["tail"] for r in runs if not r["ok"]), ""),
        }
    base, otel = (summary["variants"][name] for name in names)
    for key in ("mean", "median", "min"):
        r = otel[f"{key}_s"] / base[f"{key}_s"]
        summary[f"ratio_{key}"] = r if math.isfinite(r) else None
    out["torchrun"] = summary
    return out


# The import under test, then (after the import, negligible) whether it registered ``otel``
# and whether the OTel SDK got imported: printed, and read from the last timed run.
IMPORT_AND_CHECK = (
    "import sys, torch.distributed.elastic.rendezvous\n"
    "from torch.distributed.elastic.events import handlers\n"
    "print('otel' in handlers._log_handlers, 'opentelemetry.sdk' in sys.modules)"
)


def _describe_check(stdout: str) -> str:
    words = stdout.split()
    if len(words) != 2:
        return f"check failed: {stdout[-200:]!r}"
    return f"otel registered: {words[0]}, OTel SDK imported: {words[1]}"


# --- its part of BENCHMARKS.md -----------------------------------------------------------------


TITLE = "## 4. Start-up"


def render(st: dict[str, Any]) -> list[str]:
    """Section 4, from :func:`run`'s results."""
    lines = [
        TITLE,
        "",
        "Wall time of whole processes, runs of the variants interleaved (each run in a rotated "
        "order) after warm-up runs, "
        "from a neutral working directory; ratio ± error as hyperfine computes it. "
        "Environments: " + "; ".join(f"*{k}* = `{v}`" for k, v in st["venvs"].items()) + ". "
        "*without* is a venv made from the same interpreter whose site-packages symlinks every "
        "entry of the project venv except elastic-otel's; *wheel install* adds a regular install "
        "of a wheel built from this tree.",
        "",
    ]
    for key, title in (
        ("pass", "`python -c pass`"),
        ("import_rendezvous", "`python -c \"import torch.distributed.elastic.rendezvous\"` "
         "(`ELASTIC_OTEL_ENABLED` unset: registered, not activated)"),
    ):  # fmt: skip
        if key not in st:
            continue
        res = st[key]
        lines += [f"### {title}, {res['runs']} runs each", ""]
        lines += _table(
            ["environment", "mean ms", "stdev", "median", "min", "ratio (mean)", "ratio (median)"],
            (
                (
                    name,
                    _f(v["mean_ms"]),
                    _f(v["stdev_ms"]),
                    _f(v["median_ms"]),
                    _f(v["min_ms"]),
                    f"{_x(v['ratio_mean'], 3)} ± {v['ratio_err']:.3f}",
                    _x(v["ratio_median"], 3),
                )
                for name, v in res["variants"].items()
            ),
        )
        if res.get("check"):
            lines += [
                "After the import: "
                + "; ".join(f"*{k}*: {v}" for k, v in res["check"].items())
                + ".",
                "",
            ]
    tr = st.get("torchrun") or {}
    lines += ["### Two-agent torchrun job (`examples/train.py`, c10d, 1 worker per agent)", ""]
    if "skipped" in tr:
        lines += [f"Skipped ({tr['skipped']}).", ""]
    elif "variants" in tr:
        lines += [
            f"Both agents started together on this machine, wall time until both exited, "
            f"{tr['reps']} repetitions each, alternating (a job still running after "
            f"{tr.get('job_timeout_s', 120):.0f} s is killed, counted as hung and left out of the "
            "times); the `otel` runs export to a local "
            f"receiver (received: {tr['received']['logs']:,} logs, "
            f"{tr['received']['traces']:,} spans).",
            "",
        ]
        lines += _table(
            ["variant", "mean s", "stdev", "median", "min", "all succeeded", "hung", "runs"],
            (
                (
                    name,
                    _f(v["mean_s"], 2),
                    _f(v["stdev_s"], 2),
                    _f(v["median_s"], 2),
                    _f(v["min_s"], 2),
                    _f(v["all_ok"]),
                    _f(v.get("hung", 0)),
                    ", ".join(f"{w:.2f}" for w in v["walls"]),
                )
                for name, v in tr["variants"].items()
            ),
        )
        lines += [
            f"Ratio with ÷ without: median {_x(tr['ratio_median'], 3)}, mean "
            f"{_x(tr['ratio_mean'], 3)}, min {_x(tr['ratio_min'], 3)}.",
            "",
        ]
        lines += _failures(tr["variants"])
    return lines


def targets(st: dict[str, Any]) -> list[Target]:
    """Section 4's rows of the results table: with ÷ without, per command. ``python -c pass``
    in an editable install is measured but is no target: its import finder (at every start)
    is the development set-up's, not what a user installs."""
    rows: list[Target] = []
    for key, label in (("pass", "`python -c pass`"), ("import_rendezvous", "import rendezvous")):
        if key in st:
            for name, v in st[key]["variants"].items():
                if name == st[key]["baseline"] or (key == "pass" and "editable" in name):
                    continue
                bound = PASS_BOUND if key == "pass" else 1.05
                rows.append(
                    (
                        f"4. {label}, {name} ÷ without",
                        f"{_x(v['ratio_mean'], 3)} ± {v['ratio_err']:.3f} "
                        f"(median {_x(v['ratio_median'], 3)})",
                        f"≤ {bound:.2f}x",
                        v["ratio_median"] <= bound,
                    )
                )
    tr = st.get("torchrun") or {}
    if tr.get("ratio_median") is not None:
        rows.append(
            (
                "4. two-agent torchrun job, with ÷ without `--event-log-handler otel`",
                f"{_x(tr['ratio_median'], 3)} median ({_x(tr['ratio_mean'], 3)} mean)",
                "≤ 1.05x",
                tr["ratio_median"] <= 1.05,
            )
        )
    return rows
