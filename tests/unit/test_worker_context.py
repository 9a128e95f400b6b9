"""The rank's ``worker`` span as the worker's current OpenTelemetry context (issue 43), in real
worker processes started as the instrumented agent starts them (``tests/support/worker_env.py``:
the start-up on ``PYTHONPATH``, ``TRACEPARENT`` set), without torchrun: the main thread's spans
are its children whatever the script imports first; a plain thread starts empty, a copied
context carries it, a forked child keeps what the forking thread had; nothing is attached, and
nothing of OpenTelemetry imported, when it should not be. On a real job:
tests/e2e/test_worker_context.py.
"""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from elastic_otel.names import environment_variables as env
from tests.support.worker_env import agent_environment, json_lines, run, write_script

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPAN_ID = "b7ad6b7169203331"
WORKER = [TRACE_ID, SPAN_ID]
TRACEPARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"

# A script's spans, as (trace id, parent span id) of each, printed as JSON.
SPANS = """
import contextvars, json, os, sys, threading
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("test")

def span(name):
    with tracer.start_as_current_span(name):
        pass

def started():
    found = {}
    for s in exporter.get_finished_spans():
        parent = s.parent
        found[s.name] = [
            f"{s.context.trace_id:032x}", f"{parent.span_id:016x}" if parent else None
        ]
    return found
"""


def _worker(tmp_path: Path, **extra: str) -> dict[str, str]:
    error_file = tmp_path / "reports" / "error.json"
    error_file.parent.mkdir(exist_ok=True)
    return agent_environment(error_file, **{env.TRACEPARENT: TRACEPARENT, **extra})


def _spans(tmp_path: Path, source: str, **extra: str) -> dict[str, list]:
    source = dedent(source) + "print(json.dumps(started()))\n"
    script = write_script(tmp_path, source, prefix=SPANS)
    done = run(script, _worker(tmp_path, **extra))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    (spans,) = json_lines(done.stdout)
    return spans


@pytest.mark.parametrize(
    "first_import",
    [
        "import opentelemetry.context",
        "import opentelemetry.propagate",
        "from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator",
        "from opentelemetry.sdk.trace import TracerProvider",
    ],
)
def test_spans_of_the_main_thread_are_children_of_the_worker_span(
    tmp_path: Path, first_import: str
) -> None:
    # SPANS imports opentelemetry.trace first; the worker may import any part of it first.
    script = write_script(
        tmp_path, first_import + "\n" + SPANS + "span('step')\nprint(json.dumps(started()))\n"
    )
    done = run(script, _worker(tmp_path))
    assert (done.returncode, done.stderr) == (0, "")
    assert json_lines(done.stdout) == [{"step": WORKER}]


def test_a_span_the_script_makes_current_stacks_on_it_and_it_comes_back(tmp_path: Path) -> None:
    spans = _spans(
        tmp_path,
        """
        with tracer.start_as_current_span("train"):
            span("forward")
        span("after")
        """,
    )
    assert spans["train"] == WORKER
    assert spans["after"] == WORKER
    assert spans["forward"][0] == TRACE_ID and spans["forward"][1] not in (SPAN_ID, None)


def test_threads_start_empty_unless_given_the_context(tmp_path: Path) -> None:
    spans = _spans(
        tmp_path,
        """
        plain = threading.Thread(target=span, args=("plain",))
        copied = threading.Thread(target=contextvars.copy_context().run, args=(span, "copied"))
        for thread in (plain, copied):
            thread.start()
            thread.join()
        """,
    )
    assert spans["plain"][1] is None and spans["plain"][0] != TRACE_ID  # a trace of its own
    assert spans["copied"] == WORKER


def test_a_forked_child_keeps_the_context_of_the_thread_that_forked(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        def current():
            c = trace.get_current_span().get_span_context()
            return [f"{c.trace_id:032x}", f"{c.span_id:016x}"] if c.is_valid else None

        for inside in (False, True):
            with tracer.start_as_current_span("loader") if inside else open(os.devnull):
                pid = os.fork()
                if pid == 0:
                    print(json.dumps({"inside": inside, "child": current()}), flush=True)
                    os._exit(0)
                os.waitpid(pid, 0)
        print(json.dumps(started()))
        """,
        prefix=SPANS,
    )
    done = run(script, _worker(tmp_path))
    assert done.returncode == 0, done.stderr
    outside, inside, spans = json_lines(done.stdout)
    assert outside == {"inside": False, "child": WORKER}
    assert inside["child"][0] == TRACE_ID and inside["child"][1] != SPAN_ID  # the loader span
    assert spans["loader"] == WORKER


def test_a_thread_that_imports_opentelemetry_first_attaches_nothing(tmp_path: Path) -> None:
    """Attaching there would put that thread's spans in and leave the main thread's out."""
    first = dedent(
        """
        import threading
        importer = threading.Thread(target=__import__, args=("opentelemetry.trace",))
        importer.start()
        importer.join()
        """
    )
    rest = dedent(
        """
        thread = threading.Thread(target=span, args=("thread",))
        thread.start()
        thread.join()
        span("main")
        print(json.dumps(started()))
        """
    )
    script = write_script(tmp_path, first + SPANS + rest)
    done = run(script, _worker(tmp_path))
    assert done.returncode == 0, done.stderr
    (spans,) = json_lines(done.stdout)
    assert spans["main"][1] is None and spans["thread"][1] is None


@pytest.mark.parametrize(
    "extra",
    [
        {env.ELASTIC_OTEL_WORKER_CONTEXT: "false"},
        {env.TRACEPARENT: "00-zz-1-01"},
        {env.TRACEPARENT: ""},
    ],
    ids=["turned off", "malformed", "empty"],
)
def test_nothing_is_attached_when_off_or_without_a_span(
    tmp_path: Path, extra: dict[str, str]
) -> None:
    spans = _spans(tmp_path, "span('step')\n", **extra)
    assert spans["step"][1] is None


def test_a_worker_that_never_imports_opentelemetry_loads_none_of_it(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        import json, sys
        print(json.dumps({
            "loaded": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
            "finders": [type(f).__name__ for f in sys.meta_path],
        }))
        """,
    )
    done = run(script, _worker(tmp_path))
    assert done.returncode == 0, done.stderr
    (state,) = json_lines(done.stdout)
    assert state["loaded"] == []
    assert "_WorkerContextFinder" in state["finders"]  # waiting, at no cost


def test_the_hook_leaves_no_trace_once_it_ran(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        import json, sys
        from opentelemetry import trace
        print(json.dumps({
            "finders": [type(f).__name__ for f in sys.meta_path],
            "loader": type(trace.__spec__.loader).__name__,
            "same": trace.__loader__ is trace.__spec__.loader,
        }))
        """,
    )
    done = run(script, _worker(tmp_path))
    assert done.returncode == 0, done.stderr
    (state,) = json_lines(done.stdout)
    assert "_WorkerContextFinder" not in state["finders"]
    assert state["loader"] == "SourceFileLoader" and state["same"]
