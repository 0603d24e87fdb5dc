"""A token bucket for log lines a client can trigger, so that no caller can fill the disk.

Refused calls are logged and written to the event log; an unauthenticated caller can make as many as
it likes. The bucket lets `burst` lines through at once and `per_second` on average, and counts the
ones it holds back so that the next line that passes says how many were dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimit:
    def __init__(self, per_second: float = 5.0, burst: int = 20, clock: Callable[[], float] = time.monotonic) -> None:
        if per_second <= 0 or burst < 1:
            raise ValueError("per_second must be > 0 and burst >= 1")
        self.per_second, self.burst, self.clock = per_second, burst, clock
        self._tokens = float(burst)
        self._last = clock()
        self._dropped = 0
        self._lock = threading.Lock()

    def allow(self) -> int | None:
        """None: drop this line. Otherwise write it, and say that this many were dropped before it."""
        with self._lock:
            now = self.clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.per_second)
            self._last = now
            if self._tokens < 1:
                self._dropped += 1
                return None
            self._tokens -= 1
            dropped, self._dropped = self._dropped, 0
            return dropped
