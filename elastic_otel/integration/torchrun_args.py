"""What this process's torchrun command line says: read once, here only.

The bridge needs three facts from torchrun's arguments: whether ``--event-log-handler`` is
``otel`` (which asks for the bridge), the ``--rdzv-id`` (to label metrics before the first
rendezvous) and, for ``--rdzv-backend otel-static``, the node rank and master address that
torchrun gives only to its built-in ``static``. torch's own parser reads the last two, so that
every spelling torchrun accepts is understood (cached per ``sys.argv``); the first is needed
while torch is still importing, before its parser can be imported.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import NoReturn

from elastic_otel.names import environment_variables as env
from elastic_otel.names.torch_names import DESTINATION

_TORCHRUN_PROGRAMS = frozenset({"torchrun", "run.py", "launch.py"})
_EVENT_LOG_HANDLER_FLAGS = frozenset({"--event-log-handler", "--event_log_handler"})


def torchrun_arguments() -> argparse.Namespace | None:
    """This process's torchrun arguments, or ``None`` when it is not torchrun."""
    return _parse(tuple(sys.argv))


@functools.lru_cache(maxsize=1)  # parsed once per command line
def _parse(argv: tuple[str, ...]) -> argparse.Namespace | None:
    if os.path.basename(argv[0] if argv else "") not in _TORCHRUN_PROGRAMS:
        return None
    try:
        from torch.distributed.run import get_args_parser

        parser = get_args_parser()

        def fail(message: str) -> NoReturn:
            raise ValueError(message)

        parser.error = fail  # type: ignore[method-assign]  # no sys.exit on bad arguments
        args, _ = parser.parse_known_args(list(argv[1:]))
        return args
    except (Exception, SystemExit):
        return None


def event_log_handler(argv: list[str] | None = None) -> str:
    """torchrun's ``--event-log-handler`` (else ``PET_EVENT_LOG_HANDLER``); ``""`` when unset.

    Read from the raw command line, not with torch's parser: this runs while torch is still
    importing the modules its parser lives in.
    """
    argv = sys.argv if argv is None else argv
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in _EVENT_LOG_HANDLER_FLAGS:
            if eq:
                return value
            if i + 1 < len(argv):
                return argv[i + 1]
    return os.environ.get(env.PET_EVENT_LOG_HANDLER, "").strip()


def asks_for_bridge() -> bool:
    """Whether the command line names the ``otel`` destination."""
    return event_log_handler() == DESTINATION


def rdzv_run_id() -> str | None:
    """torchrun's ``--rdzv-id`` (``None`` with ``--standalone``, which makes up its own)."""
    args = torchrun_arguments()
    if args is None or getattr(args, "standalone", False):
        return None
    return getattr(args, "rdzv_id", None) or None
