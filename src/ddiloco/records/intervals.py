"""Accounting shared by the simulator and the real runtime, so that "uptime" means one thing."""

from __future__ import annotations

from collections.abc import Iterable


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the union of [start, end) intervals."""
    total = 0.0
    cur_start: float = 0.0
    cur_end: float | None = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total
