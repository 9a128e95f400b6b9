"""The worker start-up's hook: Python imports ``sitecustomize`` from the first directory on
``sys.path`` that has one, before the program runs. The agent puts this directory first on a
worker's ``PYTHONPATH`` (:mod:`elastic_otel.worker.startup` says why).

It is a directory of its own, holding only this file, so that nothing else of the package
shadows a module of the worker. A ``sitecustomize`` further down the path (the user's,
``opentelemetry-instrument``'s) would be hidden by this one: it is imported here, with this
directory out of the way, and so runs once, as it would have without this one. Its error
propagates, for ``site`` to report as it would have. A start-up that fails changes nothing.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

_NAME = "sitecustomize"


def _start() -> None:
    # Also an elastic_otel that cannot be imported (another interpreter, a broken install).
    try:
        from elastic_otel.worker.startup import start

        start()
    except Exception:
        pass


def _chain() -> ModuleType | None:
    """Import the next ``sitecustomize`` on ``sys.path``, if any, as ``site`` would have."""
    chained = None
    here = os.path.normcase(os.path.realpath(os.path.dirname(os.path.abspath(__file__))))
    ours = sys.modules[_NAME]
    removed = [
        (i, entry)
        for i, entry in enumerate(sys.path)
        if isinstance(entry, str) and os.path.normcase(os.path.realpath(entry)) == here
    ]
    for i, _ in reversed(removed):
        del sys.path[i]
    del sys.modules[_NAME]
    try:
        chained = importlib.import_module(_NAME)
    except ImportError as e:
        if e.name != _NAME:
            raise  # site reports an ImportError inside the other sitecustomize
    finally:
        sys.modules[_NAME] = ours
        for i, entry in removed:
            sys.path.insert(i, entry)
    return chained


if __name__ == _NAME:  # not when imported by its package path (documentation tools)
    _start()
    _chained = _chain()  # the next sitecustomize: sys.modules keeps this one, not it
