"""Bytes a synchronizer shard moves to and from learners: bandwidth is one of the paper's headlines."""

from __future__ import annotations

import threading


class Traffic:
    """Counted per frame on the bulk streams (contributions in, updates out), from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_received = 0
        self.bytes_sent = 0

    def received(self, n: int) -> None:
        with self._lock:
            self.bytes_received += n

    def sent(self, n: int) -> None:
        with self._lock:
            self.bytes_sent += n
