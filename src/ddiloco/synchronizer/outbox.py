"""One learner's outbound queue on the synchronizer: control first, newest update per fragment only.

Control frames (fragment requests, stop notices) overtake bulk frames between any two chunks of an
update, so a pull request is never stuck behind megabytes of tensors. Updates are coalesced: if a
newer version of a fragment is queued before the older one started streaming, only the newer one is
sent (the learner would discard the older one anyway). So the queue holds at most one update per
fragment plus the one being streamed, whatever the learner's speed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque


class Outbox:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._control: deque[bytes] = deque()
        self._updates: OrderedDict[int, tuple[float, list[bytes]]] = OrderedDict()
        self._current: deque[bytes] = deque()
        self.closed = False

    def put_control(self, frame: bytes) -> None:
        with self._cond:
            if not self.closed:
                self._control.append(frame)
                self._cond.notify()

    def put_update(self, fragment: int, version: float, frames: list[bytes]) -> None:
        """Queue an update; a forced re-send of version v is queued as v + 0.5 so that it replaces a
        plain v but a newer version still replaces it."""
        with self._cond:
            if self.closed:
                return
            queued = self._updates.get(fragment)
            if queued is not None and queued[0] >= version:
                return
            self._updates.pop(fragment, None)
            self._updates[fragment] = (version, frames)
            self._cond.notify()

    def get(self, timeout: float) -> bytes | None:
        """The next frame to send, or None after `timeout` seconds or once closed."""
        with self._cond:
            if not self._ready():
                self._cond.wait_for(self._ready, timeout)
            if self.closed:
                return None
            if self._control:
                return self._control.popleft()
            if not self._current and self._updates:
                _, (_, frames) = self._updates.popitem(last=False)
                self._current.extend(frames)
            return self._current.popleft() if self._current else None

    def _ready(self) -> bool:
        return self.closed or bool(self._control or self._current or self._updates)

    def pending_updates(self) -> int:
        with self._cond:
            return len(self._updates) + (1 if self._current else 0)

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._control.clear()
            self._updates.clear()
            self._current.clear()
            self._cond.notify_all()
