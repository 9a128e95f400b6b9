"""The heap alive when the bridge starts leaves the cyclic GC's scans (``ELASTIC_OTEL_GC_FREEZE``),
after its young garbage was collected; what comes later is collected as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import gc, json, weakref
    from torch.distributed.elastic import events

    class Node:
        pass

    def garbage_cycle():
        node = Node()
        node.itself = node
        return weakref.ref(node)

    kept = Node()  # alive at the start: frozen, still freed by reference counting
    kept_ref = weakref.ref(kept)
    young = garbage_cycle()  # garbage not yet collected when the bridge starts
    import elastic_otel

    elastic_otel.register()
    events.record(events.Event("probe", events.EventSource.AGENT), "otel")
    frozen = gc.get_freeze_count()
    young_collected = young() is None
    del kept
    later = garbage_cycle()
    gc.collect()
    print(json.dumps({
        "frozen": frozen,
        "young_collected": young_collected,
        "kept_freed": kept_ref() is None,
        "later_collected": later() is None,
        "processed": elastic_otel.flush(10.0) and elastic_otel.stats()["processed"],
    }))
    """
)


def _run(freeze: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ELASTIC_OTEL_"))}
    env.update(
        OTEL_TRACES_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
    )
    if freeze is not None:
        env["ELASTIC_OTEL_GC_FREEZE"] = freeze
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_heap_alive_at_start_is_frozen_after_its_young_garbage_went() -> None:
    got = _run(None)
    assert got["frozen"] > 50_000  # torch's modules, not a handful
    assert got["young_collected"] and got["kept_freed"] and got["later_collected"]
    assert got["processed"] == 1  # the bridge works on as before


@pytest.mark.parametrize("value", ["false", "0"])
def test_turned_off_the_collector_is_left_alone(value: str) -> None:
    got = _run(value)
    assert got["frozen"] == 0
    assert got["kept_freed"] and got["later_collected"] and got["processed"] == 1
