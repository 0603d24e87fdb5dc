"""An emulated wide-area link in the learner's link layer: latency, jitter and a bandwidth cap.

So that a real run on one machine shows what distant data centres do to training. Every message,
control or bulk, waits the latency (plus a uniform jitter) once; bulk frames (contributions and
donations up, updates down) also pass a token bucket per direction. Control messages (heartbeats,
registration, declines) are exempt from the cap, as on a real network where they are tiny next to
the tensors. Pacing the download blocks the reading thread, so gRPC's flow control pushes back on
the synchronizer as a slow link would.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class WanSettings:
    latency: float = 0.0  # seconds, one way, per message
    bandwidth: float = 0.0  # bytes per second in each direction; 0: no cap
    jitter: float = 0.0  # seconds: a uniform [0, jitter] added to each message's latency

    def __post_init__(self) -> None:
        for name in ("latency", "bandwidth", "jitter"):
            value = getattr(self, name)
            if not (value >= 0 and value < float("inf")):
                raise ValueError(f"WAN emulation: {name} must be a finite number >= 0, got {value!r}")

    @property
    def active(self) -> bool:
        return bool(self.latency or self.bandwidth or self.jitter)


class TokenBucket:
    """`rate` bytes per second with bursts of up to `burst` bytes; `take` sleeps until the bytes fit."""

    def __init__(
        self,
        rate: float,
        burst: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not rate > 0 or not burst > 0:
            raise ValueError("a token bucket needs rate > 0 and burst > 0")
        self.rate, self.burst = rate, burst
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._tokens = burst
        self._last = clock()
        self.waited = 0.0  # seconds slept in total

    def take(self, n: int) -> None:
        with self._lock:  # one sender at a time per direction, as on one link
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
            if wait > 0:
                self.waited += wait
                self._sleep(wait)


class WanLink:
    """One learner's emulated link to its synchronizer shards (shared by its shard links)."""

    BURST_SECONDS = 0.05  # the bucket holds 50 ms of bandwidth; a larger frame waits for its whole size

    def __init__(
        self,
        settings: WanSettings | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings or WanSettings()
        self._rng = random.Random(seed)
        self._sleep = sleep
        rate = self.settings.bandwidth
        burst = rate * self.BURST_SECONDS
        self.up = TokenBucket(rate, burst, clock, sleep) if rate else None
        self.down = TokenBucket(rate, burst, clock, sleep) if rate else None

    def delay(self) -> None:
        """The latency of one message (any kind)."""
        s = self.settings
        wait = s.latency + (self._rng.uniform(0.0, s.jitter) if s.jitter else 0.0)
        if wait > 0:
            self._sleep(wait)

    def paced_up(self, frames: Iterable[bytes]) -> Iterator[bytes]:
        for frame in frames:
            self.sent(len(frame))
            yield frame

    def sent(self, nbytes: int) -> None:
        if self.up is not None:
            self.up.take(nbytes)

    def received(self, nbytes: int) -> None:
        if self.down is not None:
            self.down.take(nbytes)

    def transfer_seconds(self, nbytes: int) -> float:
        """What the link adds to a bulk transfer of `nbytes`, for its deadline."""
        s = self.settings
        return s.latency + s.jitter + (nbytes / s.bandwidth if s.bandwidth else 0.0)
