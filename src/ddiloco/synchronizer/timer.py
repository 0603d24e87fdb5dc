"""The service's timer thread: it wakes at the core's next grace deadline, or every half heartbeat
interval, and runs the service's `tick` (silent learners, grace windows, the run's budget)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Timer:
    def __init__(
        self,
        cond: threading.Condition,
        tick: Callable[[], None],
        next_deadline: Callable[[], float | None],
        now: Callable[[], float],
        closed: Callable[[], bool],
        period: float,
    ) -> None:
        self._cond, self._tick, self._next_deadline, self._now, self._closed = cond, tick, next_deadline, now, closed
        self._period = period
        self._thread = threading.Thread(target=self._loop, name="ddiloco-sync-timer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed():
                    return
                try:
                    self._tick()
                except Exception:  # the service must survive anything a tick meets
                    log.exception("timer tick failed")
                wait = self._period
                deadline = self._next_deadline()
                if deadline is not None:
                    wait = max(0.001, min(wait, deadline - self._now()))
                self._cond.wait(wait)
