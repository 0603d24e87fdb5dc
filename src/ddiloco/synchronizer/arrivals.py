"""Contributions that have fully arrived and wait for the service lock, counted per fragment.

The core merges a round as soon as its quorum and grace are met; with K = 1 (or no grace) that is
the moment the first contribution is in, and contributions for the same version that arrived a
moment later, queued behind the lock, would be refused as stale. The service asks the core to hold
the merge while others are queued (`SynchronizerCore.receive(hold=...)`); the last of them merges.
"""

from __future__ import annotations

import threading
from collections import Counter


class Arrivals:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: Counter[int] = Counter()

    def arrive(self, fragment: int) -> None:
        """Before taking the service lock."""
        with self._lock:
            self._queued[fragment] += 1

    def enter(self, fragment: int) -> bool:
        """Once holding the service lock: True while other contributions for `fragment` still wait."""
        with self._lock:
            self._queued[fragment] -= 1
            others = self._queued[fragment] > 0
            if not others:
                del self._queued[fragment]
            return others

    def waiting(self) -> bool:
        """Contributions are queued for the lock: a timer, decline or leave must not merge their
        round first (the last of them merges it)."""
        with self._lock:
            return bool(self._queued)
