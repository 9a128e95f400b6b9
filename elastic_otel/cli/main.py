"""The ``elastic-otel`` command: ``demo``, ``replay`` and ``timeline``.

Errors are one line on stderr and a non-zero exit status: 1 when there was nothing to show
(no events found, no spans in the file, the demo job failed), 2 for bad input or a failed
export, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

from elastic_otel.version import __version__

EXIT_NOTHING = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A user-facing error: printed as one line, exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


# --- arguments ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastic-otel",
        description="PyTorch elastic (torchrun) events as OpenTelemetry logs and traces.",
        epilog="Zero-code use in a job: torchrun --event-log-handler otel ... "
        "(OTLP settings from the OTEL_* environment variables).",
    )
    parser.add_argument("--version", action="version", version=f"elastic-otel {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="run a two-node elastic job here, with a failure and a restart, and show it",
        description="Run a two-agent torchrun job on this machine (c10d rendezvous on "
        "localhost, --max-restarts=1, worker rank 1 fails once), export its telemetry to a "
        "local OTLP JSON file (and to OTEL_EXPORTER_OTLP_ENDPOINT when set), and print the "
        "job's timeline. Needs PyTorch.",
    )
    demo.add_argument(
        "--out",
        type=Path,
        metavar="OUT.jsonl",
        default=Path("elastic-otel-demo.jsonl"),
        help="OTLP JSON file for the job's spans and logs, overwritten "
        "(default: ./elastic-otel-demo.jsonl)",
    )
    demo.add_argument("--html", type=Path, metavar="OUT.html", help="also write the HTML timeline")
    demo.add_argument(
        "--nproc-per-node", type=int, choices=(1, 2), default=1, help="workers per agent (1)"
    )
    demo.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="stop the job after S seconds (120)",
    )
    demo.add_argument("--logs-dir", type=Path, metavar="DIR", help="keep the agents' logs in DIR")
    demo.add_argument("--no-failure", action="store_true", help="do not inject the worker failure")

    replay = commands.add_parser(
        "replay",
        help="turn torch elastic events found in log files into OpenTelemetry data",
        description="Find torch elastic events (torchrun --event-log-handler console prints "
        "them as JSON, possibly behind prefixes) in log files and export them as the live "
        "bridge would: to the OTLP endpoint configured by the OTEL_* environment variables, "
        "or with --out to an OTLP JSON file. One file is one agent's log. Files may be "
        "gzip-compressed; - reads standard input.",
    )
    replay.add_argument("files", nargs="+", metavar="FILE", help="log file, or - for stdin")
    replay.add_argument("--run-id", help="only events of this rendezvous run id")
    replay.add_argument(
        "--out", metavar="OUT.jsonl", help="write a new OTLP JSON file instead of exporting"
    )
    replay.add_argument(
        "--job-id",
        help="trace-id salt, as ELASTIC_OTEL_JOB_ID in the live job (default: that variable)",
    )
    replay.add_argument(
        "--progress", action="store_true", help="progress bar on stderr even when not a terminal"
    )
    replay.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="give up when an export does not finish within S seconds (default 30)",
    )

    timeline = commands.add_parser(
        "timeline",
        help="print the per-round, per-node timeline of an OTLP JSON file",
        description="Print the timeline (rounds, nodes, workers, failures, restarts) of the "
        "spans in an OTLP JSON file, as written by the elastic_otel_file or OpenTelemetry's "
        "otlp_json_file exporter, 'elastic-otel replay --out' or the Collector's file exporter.",
    )
    timeline.add_argument("file", metavar="FILE", help="OTLP JSON file (plain or gzip)")
    timeline.add_argument(
        "--html", type=Path, metavar="OUT.html", help="also write a self-contained HTML page"
    )
    timeline.add_argument("--no-color", action="store_true", help="no terminal colours")
    return parser


# --- commands -------------------------------------------------------------------------------


def cmd_timeline(args: argparse.Namespace) -> int:
    from elastic_otel.cli.otlp_json_reader import OtlpJsonError, read_otlp_json
    from elastic_otel.cli.timeline.analysis.build import build_timeline
    from elastic_otel.cli.timeline.render.text import render_text, use_color

    try:
        spans, logs = read_otlp_json(args.file)
    except OtlpJsonError as e:
        raise CliError(str(e)) from None
    timeline = build_timeline(spans, logs)
    if not timeline.rounds:
        raise CliError(f"{args.file}: no rendezvous, agent or worker spans", EXIT_NOTHING)
    sys.stdout.write(render_text(timeline, color=not args.no_color and use_color()))
    if args.html is not None:
        from elastic_otel.cli.timeline.render.html import render_html

        args.html.write_text(render_html(timeline, f"elastic-otel timeline: {args.file}"))
        print(f"wrote {args.html}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from elastic_otel.cli.replay import (
        ExportError,
        FileSink,
        PipelineSink,
        Progress,
        replay_files,
    )
    from elastic_otel.emit.pipeline import build_pipeline, exporter_names
    from elastic_otel.model.trace_ids import job_salt

    for path in args.files:
        if path != "-" and not os.path.isfile(path):
            kind = "is not a file" if os.path.exists(path) else "no such file"
            raise CliError(f"{path}: {kind}")
    if args.files.count("-") > 1:
        raise CliError("standard input (-) can be read only once")
    sink: FileSink | PipelineSink
    if args.out:
        sink = FileSink(args.out)
        where = args.out
    else:
        check_endpoints()
        try:
            pipeline = build_pipeline(__version__)
        except Exception as e:  # an exporter that cannot be set up from the environment
            raise CliError(f"cannot set up the OpenTelemetry exporters: {e}") from None
        if pipeline is None:
            raise CliError("OTEL_SDK_DISABLED=true: nothing would be exported (or use --out)")
        where = describe_destination(exporter_names("traces") + exporter_names("logs"))
        sink = PipelineSink(pipeline, where)
    progress = Progress(sys.stderr) if args.progress or sys.stderr.isatty() else None
    salt = args.job_id if args.job_id is not None else job_salt()
    try:
        stats = replay_files(args.files, sink, salt, args.run_id, progress, args.timeout)
    except ExportError as e:
        raise CliError(f"export to {where} failed: {e}") from None
    kinds = ", ".join(f"{n} {kind.lower()}" for kind, n in sorted(stats.events.items()))
    runs = ", ".join(sorted(stats.run_ids)) or "-"
    print(
        f"read {stats.files} file(s), {stats.lines:,} lines ({stats.bytes / 1e6:,.1f} MB): "
        f"{stats.found:,} events ({kinds or 'none'}) of run id(s) {runs}"
    )
    delivered = sink.delivered()
    exported = f"{delivered:,} records delivered" if delivered is not None else "handed over"
    print(f"exported {stats.spans:,} spans and {stats.logs:,} log records to {where}: {exported}")
    if stats.skipped:
        skipped = ", ".join(f"{n:,} {reason}" for reason, n in stats.skipped.most_common())
        print(f"skipped: {skipped}")
    if not stats.found:
        filtered = f" of run id {args.run_id}" if args.run_id else ""
        raise CliError(f"no torch elastic events{filtered} found", EXIT_NOTHING)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from elastic_otel.cli.demo import DemoConfig, DemoError, otlp_endpoint, run_demo

    if otlp_endpoint():
        check_endpoints()
    if args.timeout <= 0:
        raise CliError("--timeout must be positive")
    config = DemoConfig(
        out=args.out,
        nproc_per_node=args.nproc_per_node,
        timeout_s=args.timeout,
        html=args.html,
        logs_dir=args.logs_dir,
        fail_rank=None if args.no_failure else 1,
    )
    try:
        code = run_demo(config)
    except DemoError as e:
        raise CliError(str(e)) from None
    if code:
        raise CliError("the demo job did not succeed (see the agents' logs above)", code)
    return 0


# --- helpers --------------------------------------------------------------------------------

_HOST_PORT = re.compile(r"^[\w.\-]+:\d{1,5}$")


def check_endpoints(environ: dict[str, str] | None = None) -> None:
    """Refuse an OTLP endpoint variable that is not a URL (the SDK would fail obscurely)."""
    environ = dict(os.environ) if environ is None else environ
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    ):
        value = environ.get(name, "").strip()
        if not value or _HOST_PORT.match(value):
            continue
        try:
            url = urlparse(value)
            port_ok = url.port is None or 0 < url.port < 65536
        except ValueError:
            port_ok = False
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.hostname or not port_ok:
            raise CliError(f"{name}={value!r} is not an endpoint URL like http://host:4317")


def describe_destination(names: list[str]) -> str:
    """Where the environment's exporters send data, for the summary line."""
    names = list(dict.fromkeys(names))
    if not names:
        return "no exporter (OTEL_TRACES_EXPORTER / OTEL_LOGS_EXPORTER are none)"
    parts = []
    for name in names:
        if name.startswith("otlp_proto") or name == "otlp":
            http = "http" in name
            default = "http://localhost:4318" if http else "http://localhost:4317"
            endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or default
            parts.append(f"{endpoint} ({name})")
        else:
            parts.append(name)
    return ", ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"demo": cmd_demo, "replay": cmd_replay, "timeline": cmd_timeline}
    try:
        return handlers[args.command](args)
    except CliError as e:
        _error(str(e))
        return e.code
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. piped into head: not an error worth a message
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        _error(f"{where}{e.strerror or e}")
        return EXIT_ERROR
    except Exception as e:  # a bug of ours: still one line, never a traceback
        _error(f"unexpected {type(e).__name__}: {e}")
        return EXIT_ERROR


def _error(message: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(f"elastic-otel: error: {message}\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
