"""Background threads that never die silently: a failed step is logged, backed off and retried.

A service's thread that dies on an unexpected exception leaves the process running and looking
healthy while its work (a checkpoint writer's: releasing held updates) never happens again. So a
thread's loop runs one step at a time under `run_supervised`: a step that raises is logged with its
traceback the first time that error (its type, raised at the same place) is seen, repeats are one
short line at a bounded rate (an error that recurs every 100 ms must not fill the disk), and the step
is retried after a delay that doubles from `first` to `cap`. A step that succeeds after failures
resets the delay and says the thread recovered.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

from .ratelimit import RateLimit

MAX_SIGNATURES = 32  # distinct errors whose traceback was logged; later new ones are logged as short lines


def _signature(exc: BaseException) -> tuple[str, str, int]:
    """The same error, for the log: its type and the innermost frame that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    return (type(exc).__qualname__, last.filename if last else "", (last.lineno or 0) if last else 0)


class Supervisor:
    """The log and backoff of one thread's failures (used by one thread only)."""

    def __init__(
        self,
        name: str,
        log: logging.Logger,
        first: float = 0.1,
        cap: float = 5.0,
        repeats: RateLimit | None = None,
    ) -> None:
        if not 0 < first <= cap:
            raise ValueError("need 0 < first <= cap")
        self.name, self.log, self.first, self.cap = name, log, first, cap
        self.repeats = repeats or RateLimit(per_second=1 / 30, burst=3)
        self._recoveries = RateLimit(per_second=1 / 30, burst=3)  # apart: a recovery is worth its line
        self.failures = 0  # in a row, since the last step that succeeded
        self.total = 0
        self._traced: set[tuple[str, str, int]] = set()

    def delay(self) -> float:
        """Seconds to wait before the next try: `first`, doubled per failure in a row, at most `cap`."""
        return min(self.cap, self.first * 2 ** max(0, min(self.failures - 1, 60)))

    def failed(self, exc: Exception) -> float:
        """Log `exc` (its traceback once per distinct error) and return how long to wait before retrying."""
        self.failures += 1
        self.total += 1
        wait = self.delay()
        signature = _signature(exc)
        if signature not in self._traced and len(self._traced) < MAX_SIGNATURES:
            self._traced.add(signature)
            self.log.error(
                "%s failed (%s: %s); retrying in %.1f s", self.name, type(exc).__name__, exc, wait, exc_info=exc
            )
            return wait
        dropped = self.repeats.allow()
        if dropped is not None:
            self.log.error(
                "%s failed again (%d in a row, %d lines dropped): %s: %s; retrying in %.1f s",
                self.name,
                self.failures,
                dropped,
                type(exc).__name__,
                str(exc)[:300],
                wait,
            )
        return wait

    def succeeded(self) -> None:
        if self.failures:
            dropped = self._recoveries.allow()
            if dropped is not None:
                self.log.warning("%s recovered after %d failures (%d lines dropped)", self.name, self.failures, dropped)
            self.failures = 0


def run_supervised(step: Callable[[], bool], pause: Callable[[float], bool], supervisor: Supervisor) -> None:
    """Run `step` until it returns False. When it raises, log (`supervisor`) and call `pause(seconds)`,
    which waits and returns False to stop instead of retrying (the owner is closing). An exception
    that is not an `Exception` (SystemExit and the like) is logged and ends the thread."""
    try:
        while True:
            try:
                if not step():
                    return
            except Exception as exc:  # noqa: BLE001 - the point: anything a step meets is retried
                if not pause(supervisor.failed(exc)):
                    supervisor.log.error("%s stopped while failing (it is closing)", supervisor.name)
                    return
                continue
            supervisor.succeeded()
    except BaseException:
        supervisor.log.critical("%s ended by an exception that is not retried", supervisor.name, exc_info=True)
        raise
