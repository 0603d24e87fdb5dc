"""One learner's outbound queue on the synchronizer: control first, newest update per fragment only.

Control frames (fragment requests, stop notices) overtake bulk frames between any two chunks of an
update, so a pull request is never stuck behind megabytes of tensors. Updates are coalesced: if a
newer version of a fragment is queued before the older one started streaming, only the newer one is
sent (the learner would discard the older one anyway). So the queue holds at most one update per
fragment plus the one being streamed, whatever the learner's speed. An update sent down as a
difference (`downlink`) goes as one only if the version it needs is the last this outbox streamed,
and a version this outbox already streamed is not sent again unless forced.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable

from .downlink import Encoded

# (bytes of one update's frames, sent as a difference?, the bf16 payload of its whole value: 0 if unknown)
UpdateCounter = Callable[[int, bool, int], None]


class Outbox:
    def __init__(self, counted: UpdateCounter | None = None) -> None:
        self._counted = counted  # told of each update as it starts streaming (`Traffic.update`)
        self._cond = threading.Condition()
        self._control: deque[bytes] = deque()
        # fragment -> (version, frames): plain frames, one Encoded, or a chain of differences
        self._updates: OrderedDict[int, tuple[float, list[bytes] | Encoded | tuple[Encoded, ...]]] = OrderedDict()
        self._streamed: dict[int, float] = {}  # fragment -> the last version streamed to this learner
        self._current: deque[bytes] = deque()
        self.closed = False

    def put_control(self, frame: bytes) -> None:
        with self._cond:
            if not self.closed:
                self._control.append(frame)
                self._cond.notify()

    def put_update(self, fragment: int, version: float, frames: list[bytes] | Encoded) -> None:
        """Queue an update; a forced re-send of version v is queued as v + 0.5 so that it replaces a
        plain v but a newer version still replaces it."""
        with self._cond:
            if self.closed:
                return
            queued = self._updates.get(fragment)
            if queued is not None and queued[0] >= version:
                return
            if float(version).is_integer() and self._streamed.get(fragment, -1.0) >= version:
                return  # this learner has it already (a reply to stale work after the broadcast): it would drop it
            chain = self._chain(fragment, queued, frames)
            self._updates.pop(fragment, None)
            self._updates[fragment] = (version, frames if chain is None else chain)
            self._cond.notify()

    def _chain(self, fragment: int, queued: tuple | None, new: object) -> tuple[Encoded, ...] | None:
        """A difference from the version still queued: both stay, as a chain of differences, while the
        chain starts from what this learner holds and is smaller than the whole value (two merges that
        one group commit made durable at once would otherwise cost a whole value)."""
        if queued is None or not isinstance(new, Encoded) or new.delta is None or new.base != queued[0]:
            return None
        before = queued[1] if isinstance(queued[1], tuple) else (queued[1],)
        if not all(isinstance(e, Encoded) and e.delta is not None for e in before):
            return None
        chain = (*before, new)
        if chain[0].base != self._streamed.get(fragment) or sum(e.delta_nbytes for e in chain) >= new.full_nbytes:
            return None
        return chain

    def get(self, timeout: float) -> bytes | None:
        """The next frame to send, or None after `timeout` seconds or once closed."""
        with self._cond:
            if not self._ready():
                self._cond.wait_for(self._ready, timeout)
            if self.closed:
                return None
            if self._control:
                return self._control.popleft()
            if self._current or not self._updates:
                return self._current.popleft() if self._current else None
            fragment, (version, item) = self._updates.popitem(last=False)
            held, self._streamed[fragment] = self._streamed.get(fragment), version
        counts: list[tuple[int, bool, int]] = []  # each update's bytes, form, whole payload; a chain's links apart
        if not isinstance(item, list):  # outside the lock: a whole value may have to be encoded first
            frames: list[bytes] = []
            for e in item if isinstance(item, tuple) else (item,):
                delta = e.delta if held == e.base else None  # a difference needs the version it is from
                link = delta if delta is not None else e.full()
                counts.append((sum(len(f) for f in link), delta is not None, e.full_nbytes))
                frames += link
                held = e.version
            item = frames
        else:
            counts.append((sum(len(f) for f in item), False, 0))
        if self._counted is not None:
            for nbytes, as_difference, whole in counts:
                self._counted(nbytes, as_difference, whole)
        with self._cond:  # one thread streams an outbox: nothing else filled _current meanwhile
            if self.closed:
                return None
            self._current.extend(item[1:])
            return item[0]

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
