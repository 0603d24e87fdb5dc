"""A deterministic discrete-event queue: ties in time are broken by insertion order."""

from __future__ import annotations

import heapq
import itertools
from typing import Any


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = itertools.count()
        self.now = 0.0

    def push(self, time: float, event: Any) -> None:
        if time < self.now:
            raise ValueError(f"cannot schedule in the past: {time} < {self.now}")
        heapq.heappush(self._heap, (time, next(self._seq), event))

    def pop(self) -> tuple[float, Any]:
        time, _, event = heapq.heappop(self._heap)
        self.now = time
        return time, event

    def peek(self) -> tuple[float, Any] | None:
        """The next (time, event) without removing it."""
        return (self._heap[0][0], self._heap[0][2]) if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)
