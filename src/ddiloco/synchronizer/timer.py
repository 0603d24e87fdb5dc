"""The service's timer thread: it wakes at the core's next grace deadline, or every half heartbeat
interval, and runs the service's `tick` (silent learners, grace windows, the run's budget). A tick
that fails is logged (its traceback once) and retried: a dead timer would never end a round again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..records.supervise import Supervisor, run_supervised

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
        self._supervisor = Supervisor("timer tick", log)
        self._thread = threading.Thread(target=self._loop, name="ddiloco-sync-timer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        run_supervised(self._step, self._pause, self._supervisor)

    def _step(self) -> bool:
        """One tick, then sleep until the next deadline; False once the service is closed. Whatever
        raises (the tick, or the deadline it reads) is logged and retried by `run_supervised`."""
        with self._cond:
            if self._closed():
                return False
            self._tick()
            wait = self._period
            deadline = self._next_deadline()
            if deadline is not None:
                wait = max(0.001, min(wait, deadline - self._now()))
            self._cond.wait(wait)
        return True

    def _pause(self, seconds: float) -> bool:
        with self._cond:
            if self._closed():
                return False
            self._cond.wait(min(seconds, self._period))
        return True
