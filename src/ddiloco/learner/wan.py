"""An emulated wide-area link in the learner's link layer: latency, jitter and a bandwidth cap.

So that a real run on one machine shows what distant data centres do to training, charging what a
real link charges:

* latency is propagation, not occupancy: a message waits the one-way latency (plus a uniform
  jitter) without holding up the messages behind it. Pushes are sent side by side (`Outbound`), and
  updates pass a delay line (`DelayLine`) that hands each on a latency after it was read, in order,
  as one TCP stream keeps them;
* every call pays the way back too: a push's or heartbeat's reply waits its own one-way latency;
* opening a connection costs a round trip (two with TLS), which the bulk socket plane pays once per
  push (`uplink`); gRPC keeps its channel open and pays it once;
* bulk frames (contributions and donations up, updates down) pass a token bucket per direction.
  Control messages (heartbeats, registration, declines) are exempt from the cap, as on a real
  network where they are tiny next to the tensors. Pacing the download blocks the reading thread, so
  gRPC's flow control pushes back on the synchronizer as a slow link would.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkConfig:
    """An emulated wide-area link, in the units of every command's flags (`--net-latency` and
    `--net-jitter` in milliseconds, `--net-bandwidth` in MB/s): the learner's link layer (`WanLink`)
    and the data-parallel baselines' all-reduce (`dataparallel.link`) pace their real bytes on the same link."""

    latency_ms: float = 0.0  # one way, per message
    bandwidth_mb_s: float = 0.0  # megabytes per second in each direction; 0: no cap
    jitter_ms: float = 0.0  # a uniform [0, jitter] added to each message's latency

    def __post_init__(self) -> None:
        for name, flag in (("latency_ms", "latency"), ("bandwidth_mb_s", "bandwidth"), ("jitter_ms", "jitter")):
            value = getattr(self, name)
            if not (value >= 0 and value < float("inf")):
                raise ValueError(f"--net-{flag} must be a finite number >= 0, got {value!r}")

    @property
    def active(self) -> bool:
        return bool(self.latency_ms or self.bandwidth_mb_s or self.jitter_ms)

    @property
    def latency(self) -> float:
        """One-way latency in seconds."""
        return self.latency_ms / 1000.0

    @property
    def jitter(self) -> float:
        """The jitter's bound in seconds."""
        return self.jitter_ms / 1000.0

    @property
    def bytes_per_second(self) -> float:
        """The cap in bytes per second each way; 0: none."""
        return self.bandwidth_mb_s * 1e6


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

    def take(self, n: float) -> None:
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
        settings: LinkConfig | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings or LinkConfig()
        self._rng = random.Random(seed)
        self._sleep = sleep
        rate = self.settings.bytes_per_second
        burst = rate * self.BURST_SECONDS
        self.up = TokenBucket(rate, burst, clock, sleep) if rate else None
        self.down = TokenBucket(rate, burst, clock, sleep) if rate else None

    def one_way(self) -> float:
        """One message's latency: the latency plus a uniform jitter."""
        s = self.settings
        return s.latency + (self._rng.uniform(0.0, s.jitter) if s.jitter else 0.0)

    def delay(self) -> None:
        """Wait one message's latency (any kind), in the calling thread."""
        wait = self.one_way()
        if wait > 0:
            self._sleep(wait)

    def handshake(self, tls: bool = False) -> None:
        """Opening a connection: a round trip before the first byte can go (TCP), one more for TLS."""
        for _ in range(2 if tls else 1):
            wait = self.one_way() + self.one_way()
            if wait > 0:
                self._sleep(wait)

    def paced_up(self, frames: Iterable[bytes]) -> Iterator[bytes]:
        for frame in frames:
            self.sent(len(frame))
            yield frame

    def sent(self, nbytes: float) -> None:
        if self.up is not None:
            self.up.take(nbytes)

    def received(self, nbytes: float) -> None:
        if self.down is not None:
            self.down.take(nbytes)

    def transfer_seconds(self, nbytes: int) -> float:
        """What the link adds to a bulk transfer of `nbytes`, for its deadline: two round trips to
        open a TLS connection, the way there and back, and the bytes at the capped rate."""
        s = self.settings
        return 6 * (s.latency + s.jitter) + (nbytes / s.bytes_per_second if s.bytes_per_second else 0.0)


class DelayLine:
    """Hands each item on one latency after it was put, in order, on a thread of its own: the
    propagation delay of a stream, which never makes the reader wait (`WanLink`). Without an active
    link it hands items on at once, in the caller's thread."""

    def __init__(
        self,
        link: WanLink,
        deliver: Callable[[object], None],
        closing: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.link, self.deliver, self.closing, self._clock = link, deliver, closing, clock
        self._queue: queue.Queue[tuple[float, object]] = queue.Queue()
        self._last = 0.0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, item: object) -> None:
        if not self.link.settings.active:
            self.deliver(item)
            return
        with self._lock:
            due = max(self._last, self._clock() + self.link.one_way())  # jitter never reorders a stream
            self._last = due
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ddiloco-wan-delay", daemon=True)
                self._thread.start()
        self._queue.put((due, item))

    def pending(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        while not self.closing.is_set():
            try:
                due, item = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            wait = due - self._clock()
            if wait > 0 and self.closing.wait(wait):
                return
            try:
                self.deliver(item)
            except Exception:  # one bad message must not stop the line: the link logs and goes on
                log.exception("delivering a delayed message failed")
