"""A flapping link: cut and healed on a timer thread, a bounded number of times, always left healed.

The network's own cut and heal do the work; the flapper only decides when. It stops by itself after
`count` cuts, and `stop()` (or leaving the `with`) ends it at once and heals the link.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

MAX_FLAPS = 10_000


class Flapper:
    """Every `period` seconds: `up` seconds healed, then `period - up` seconds cut; `count` times."""

    def __init__(
        self, cut: Callable[[], None], heal: Callable[[], None], period: float, count: int, up: float | None = None
    ) -> None:
        up = period / 2 if up is None else up
        if not period > 0 or not 0 < up < period:
            raise ValueError(f"flapping needs period > 0 and 0 < up < period (period {period}, up {up})")
        if not 1 <= count <= MAX_FLAPS:
            raise ValueError(f"flapping count {count}: between 1 and {MAX_FLAPS}")
        self._cut, self._heal = cut, heal
        self.period, self.count, self.up = period, count, up
        self.cuts = 0  # how many times the link was cut so far
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ddiloco-hosts-flap", daemon=True)

    def start(self) -> Flapper:
        if not self._thread.is_alive() and self._thread.ident is None:
            self._thread.start()
        return self

    def _loop(self) -> None:
        try:
            for _ in range(self.count):
                if self._stop.wait(self.up):
                    return
                self._cut()
                self.cuts += 1
                if self._stop.wait(self.period - self.up):
                    return
                self._heal()
        except BaseException as e:  # kept for stop() to raise in the caller's thread
            self.error = e
        finally:
            try:
                self._heal()
            except BaseException as e:  # a teardown that removed the host first: nothing left to heal
                self.error = self.error or e

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> bool:
        """Wait for the last flap; True once it ended (the link is healed then)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """End the flapping now (the link ends healed) and raise what went wrong in the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def __enter__(self) -> Flapper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
