"""Server-side deadlines for the bulk streams, so that no stalled or unread stream holds a slot.

Bulk handlers hold one of a fixed number of slots. A client that opens a push and stops sending
(slowloris), or subscribes and never reads, would hold its slot forever and, with enough of them,
lock every honest learner out. Every bulk stream is therefore tracked here:

    idle    a push that receives no frame, or a stream whose last frame nobody takes, for one failure
            timeout is cancelled (the same silence that declares a learner gone)
    total   a push or fetch that outlives the bulk deadline of its size plus one failure timeout is
            cancelled (`Timeouts.bulk`, the deadline the learner itself uses)
    per session: at most `MAX_PUSHES_PER_SESSION` pushes at once (more are refused), and one
            Subscribe (a new one replaces the old: a reconnecting learner must never wait for its
            dead stream to time out)

A watchdog thread checks the streams every half heartbeat and cancels the expired ones; gRPC then
unblocks the handler, whose `finally` gives the slot back. A check that raises is logged and retried
(`records.supervise`): a dead watchdog would let stalled streams keep their slots for good.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..records.supervise import Supervisor, run_supervised
from ..wire.timeouts import Timeouts

log = logging.getLogger(__name__)

# A learner pushes this many side by side (`learner.outbound`): on a long link each push waits
# several round trips, and fewer in flight would queue its pushes up behind each other.
MAX_PUSHES_PER_SESSION = 4


class Cancellable(Protocol):
    def cancel(self) -> object: ...  # gRPC's returns a bool, which no one reads


@dataclass
class Stream:
    method: str
    context: Cancellable
    started: float
    total: float  # seconds from start; inf: as long as it makes progress
    waiting_since: float | None  # since when it waits on the peer; None while it waits on us
    session: str | None = None
    cancelled: str | None = field(default=None)  # why the watchdog ended it

    def waiting(self) -> None:
        """The stream now waits on the peer: a frame to arrive, or a sent frame to be taken."""
        self.waiting_since = time.monotonic()

    def not_waiting(self) -> None:
        self.waiting_since = None


class StreamGuard:
    def __init__(self, timeouts: Timeouts, on_expired: Callable[[str, str], None]) -> None:
        self.timeouts = timeouts
        self.on_expired = on_expired
        self._streams: dict[int, Stream] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self, method: str, context: Cancellable, total: float = math.inf) -> tuple[int, Stream]:
        stream = Stream(method, context, time.monotonic(), total, time.monotonic())
        with self._lock:
            key = next(self._ids)
            self._streams[key] = stream
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="ddiloco-stream-guard", daemon=True)
                self._thread.start()
        return key, stream

    def close(self, key: int) -> None:
        with self._lock:
            self._streams.pop(key, None)

    def claim(self, key: int, session: str) -> str | None:
        """Book the stream to a session; the reason it may not run, or None."""
        with self._lock:
            stream = self._streams.get(key)
            if stream is None:
                return "stream closed"
            same = [
                s for k, s in self._streams.items() if k != key and s.session == session and s.method == stream.method
            ]
            if stream.method == "Push" and len(same) >= MAX_PUSHES_PER_SESSION:
                return f"{len(same)} pushes of this session are in flight (at most {MAX_PUSHES_PER_SESSION})"
            stream.session = session
        if stream.method == "Subscribe":
            for old in same:  # a reconnecting learner replaces its old stream
                self._cancel(old, "replaced by a new Subscribe of the same session")
        return None

    def count(self) -> int:
        with self._lock:
            return len(self._streams)

    def shutdown(self) -> None:
        self._stop.set()

    def _cancel(self, stream: Stream, reason: str) -> None:
        if stream.cancelled is None:
            stream.cancelled = reason
            try:
                stream.context.cancel()
            except Exception:  # noqa: BLE001 - a call that already ended
                log.debug("cancel of an ended %s stream", stream.method, exc_info=True)

    def _watch(self) -> None:
        supervisor = Supervisor("stream guard", log)
        run_supervised(self._watch_once, lambda seconds: not self._stop.wait(seconds), supervisor)

    def _watch_once(self) -> bool:
        """Wait half a heartbeat and cancel what expired; False once shut down (a failure is retried)."""
        if self._stop.wait(self.timeouts.heartbeat / 2):
            return False
        self.check(time.monotonic())
        return True

    def check(self, now: float) -> list[str]:
        """Cancel the expired streams; returns why, one line each."""
        idle_limit = self.timeouts.failure
        with self._lock:
            streams = list(self._streams.values())
        expired = []
        for s in streams:
            if s.cancelled is not None:
                continue
            if s.waiting_since is not None and now - s.waiting_since > idle_limit:
                reason = f"{s.method} stream idle for {now - s.waiting_since:.1f} s (limit {idle_limit:g} s)"
            elif now - s.started > s.total:
                reason = f"{s.method} stream open for {now - s.started:.1f} s (limit {s.total:.1f} s)"
            else:
                continue
            self._cancel(s, reason)
            self.on_expired(s.method, reason)
            expired.append(reason)
        return expired
