"""Formatting shared by the sections' renderers (each section module renders its own part of
BENCHMARKS.md; :mod:`benchmarks.report` composes them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

Target = tuple[str, str, str, bool | None]
"""A row of the results table: (target, measured, threshold, ok; None: not measured)."""

RECORDED = Path(__file__).resolve().parent / "recorded"
"""Output of the suites that run elsewhere (a lent GPU, CI's scale steps), as they printed it."""


def number(value: Any, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}{suffix}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{suffix}"
    return str(value)


def times(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}x"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return [*lines, ""]


def verdict(ok: bool | None) -> str:
    if ok is None:
        return "not measured"
    return "**met**" if ok else "**MISSED**"


def size(value: int | float | None) -> str:
    """Bytes in decimal units, as Tempo's limit is written (5 MB = 5,000,000 bytes)."""
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:,.2f} MB"
    return f"{value / 1e3:,.1f} KB"


def failures(variants: dict[str, dict[str, Any]]) -> list[str]:
    """The output of a failed run of each variant, if any."""
    lines: list[str] = []
    for name, v in variants.items():
        if v.get("failure"):
            lines += [f"A `{name}` run failed:", "", "```", v["failure"][-4000:], "```", ""]
    return lines
