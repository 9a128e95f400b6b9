"""A worker whose spans come from a plain OpenTelemetry tracer, with no ``elastic_otel`` call and
no ``context=`` argument (issue 43): it sets up its own ``TracerProvider`` exporting OTLP (the
``OTEL_EXPORTER_OTLP_*`` variables of its environment) and starts, on the main thread,
``script.step`` with ``script.inner`` inside it; on a plain thread, ``thread.plain``; on a thread
that runs in a copy of the main thread's context (what ``opentelemetry-instrumentation-threading``
does), ``thread.copied``. Each span carries its ``rank``. No torch: the job costs what its
agent does.
"""

from __future__ import annotations

import contextvars
import os
import threading

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


def main() -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "context-spans"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("context_spans")
    rank = {"rank": int(os.environ["RANK"])}

    with tracer.start_as_current_span("script.step", attributes=rank):
        tracer.start_span("script.inner", attributes=rank).end()  # its parent: the current span

    def work(name: str) -> None:
        with tracer.start_as_current_span(name, attributes=rank):
            pass

    plain = threading.Thread(target=work, args=("thread.plain",))
    copied_context = contextvars.copy_context()
    copied = threading.Thread(target=copied_context.run, args=(work, "thread.copied"))
    for thread in (plain, copied):
        thread.start()
        thread.join()
    provider.shutdown()


if __name__ == "__main__":
    main()
