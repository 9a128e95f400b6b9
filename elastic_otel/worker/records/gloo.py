"""gloo's record (and any CPU backend's): ``_dump_fr_trace_json`` and ``_dump_fr_trace``, in
every build since torch 2.8 (empty in a job whose groups run on NCCL).

gloo's status is not to be trusted for completion: each of its worker threads writes the seq of
the collective it finished, so a group's last completed collective can go back or stay behind
(three ``all_reduce`` calls waited for: the status may say the first completed; torch 2.13 to
2.15). Its entries' ``retired`` flag is right. The status given here never goes back, and a
whole read settles it from the entries (``docs/hangs.md``, Releases and backends).
"""

from __future__ import annotations

from typing import Any

from elastic_otel.parsing.collectives import group_collectives
from elastic_otel.worker.records.record import FlightRecord


class GlooRecord(FlightRecord):
    backend = "gloo"
    status_function = "_dump_fr_trace_json"
    record_function = "_dump_fr_trace"

    def __init__(self, extension: Any) -> None:
        super().__init__(extension)
        self._given: dict[str, tuple[int, int]] = {}  # per group: (issued, completed) given

    def status(self) -> dict[str, dict[str, Any]]:
        return self._forward(super().status())

    def status_from(self, record: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
        entries = record.get("entries") or []
        status = {name: dict(st) for name, st in (record.get("pg_status") or {}).items()}
        for name, st in status.items():
            retired = retired_through(entries, name)
            if retired is not None:
                completed = int(st.get("last_completed_collective", -1))
                st["last_completed_collective"] = max(completed, retired)
        return self._forward(status)

    def _forward(self, status: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """``status`` with no group's last completed collective before one given already (nor
        after its last issued)."""
        for name, st in status.items():
            issued = int(st.get("last_enqueued_collective", -1))
            completed = int(st.get("last_completed_collective", -1))
            given_issued, given_completed = self._given.get(name, (-1, -1))
            if issued >= given_issued:  # a group made again under the name counts from 1
                completed = max(completed, given_completed)
            completed = min(completed, issued)
            self._given[name] = (issued, completed)
            st["last_completed_collective"] = completed
        return status


def retired_through(entries: list[dict[str, Any]], name: str) -> int | None:
    """The last collective of group ``name`` that, with every one of the group's before it in
    ``entries``, is retired (finished); ``None`` when the entries hold none of the group's."""
    seqs = sorted(
        (int(e.get("collective_seq_id", 0)), bool(e.get("retired")))
        for e in group_collectives(entries, name)
    )
    if not seqs:
        return None
    through = seqs[0][0] - 1
    for seq, retired in seqs:
        if not retired:
            break
        through = seq
    return through
