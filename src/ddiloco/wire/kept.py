"""Bulk socket connections kept open between calls, so that a learner's next push to a shard reuses
the connection of its last one instead of opening another (a TCP and, with TLS, a TLS handshake, and
a connection whose windows start small again).

The synchronizer keeps a connection only while it waits for its next hello, for at most
`bulk_greeting.KEEP_SECONDS`, and may close it sooner (its caps, a restart). So a connection is taken
again only if it was put back less than `REUSE_SECONDS` ago (well inside the server's bound) and has
nothing to read: an idle connection the server closed reads as its end of stream. The race that
remains (the server closes it as the client starts a call) is caught by the caller, which retries
once on a new connection (`sockets.BulkSocketClient`). At most `MAX_KEPT` are kept per client.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time

REUSE_SECONDS = 10.0  # a connection idle longer is closed rather than used again
MAX_KEPT = 4  # per client (per shard): a learner's pushes side by side (the synchronizer's MAX_PUSHES_PER_SESSION)


class KeptConnections:
    """A client's idle connections to one bulk port, newest last; safe to share between threads."""

    def __init__(self, reuse_seconds: float = REUSE_SECONDS, max_kept: int = MAX_KEPT) -> None:
        self.reuse_seconds, self.max_kept = reuse_seconds, max_kept
        self._idle: list[tuple[socket.socket, float]] = []
        self._lock = threading.Lock()

    def take(self) -> socket.socket | None:
        """The newest kept connection that is still usable, or None; stale ones are closed."""
        while True:
            with self._lock:
                if not self._idle:
                    return None
                sock, since = self._idle.pop()
            if time.monotonic() - since < self.reuse_seconds and _idle_and_open(sock):
                return sock
            sock.close()

    def idle(self) -> bool:
        """Whether a connection is kept that a call would try first (not checked for staleness)."""
        with self._lock:
            return bool(self._idle) and time.monotonic() - self._idle[-1][1] < self.reuse_seconds

    def give(self, sock: socket.socket) -> None:
        """Keep `sock` (its call complete: nothing of it is left unread) for the next call."""
        with self._lock:
            self._idle.append((sock, time.monotonic()))
            extra = self._idle[: -self.max_kept] if len(self._idle) > self.max_kept else []
            del self._idle[: len(extra)]
        for old, _ in extra:
            old.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock, _ in idle:
            sock.close()


def _idle_and_open(sock: socket.socket) -> bool:
    """Whether nothing has arrived on `sock` since its call: a closed or reset connection is readable
    (its end of stream), and a server sends nothing unasked on a kept one."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return False
    poller = select.poll()  # not select.select: it fails on descriptors above 1023
    poller.register(sock, select.POLLIN | select.POLLPRI)
    with contextlib.suppress(OSError):
        return not poller.poll(0)
    return False
