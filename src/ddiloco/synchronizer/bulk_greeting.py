"""The bulk socket plane's front door: every connection, from its accept until it has said who it is,
waits on one thread with a selector (`selectors`), never on a thread of its own (#32, item 3).

Until its hello and token have arrived (and its TLS handshake, with TLS) a connection holds only a
place here:

    total      at most `MAX_WAITING` connections at once
    per peer   at most `MAX_WAITING_PER_PEER` of them from one address
    deadline   `HELLO_SECONDS` (less with a shorter failure timeout) from its accept to its whole hello

A connection beyond a cap takes the place of the oldest one waiting from its own address or (total
cap) from the address holding the most places (its own if tied), so that no address, however many
connections it opens, locks another out (#46: 64 connections waiting from a few addresses refused
every push); that oldest one is closed unless its hello is there by now. One that misses its
deadline is closed then; both are counted by reason (`count`, with one of the reason keys below:
Status shows them) and logged rate-limited, without a traceback. A complete hello goes to the
server's `admit` (in this thread: it must not block), which either takes the connection for its call
(an authenticated call, on a thread the server starts) or returns the refusal to send. A refusal is
sent from here, and what the client still sends is taken and dropped (so that closing does not reset
the connection before the client has read it) for at most `DRAIN_SECONDS`, holding the same place.
The server hands back calls it refuses later (a push refused for a bad frame) the same way
(`drain`), so a client that keeps trickling bytes after a refusal holds no thread either.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from ..records.ratelimit import RateLimit
from ..wire import framing
from ..wire import sockets as wire_sockets

log = logging.getLogger(__name__)

MAX_WAITING = 64  # connections at once that have not authenticated, or are answered and drained
MAX_WAITING_PER_PEER = 16  # of them from one address: one host cannot take every place
HELLO_SECONDS = 2.0  # from accept to the whole hello (and the TLS handshake)
DRAIN_SECONDS = 2.0  # from a refusal to the close: the client's time to stop and read it
ACCEPTS_PER_ROUND = 64
ACCEPT_PAUSE = 0.1  # after accept failed for lack of descriptors: the waiting ones free theirs
READS_PER_ROUND = 16  # of one draining connection, so a fast sender cannot hold the thread

# An admission's refusal: the message head to answer, and how many more bytes to take and drop.
Refusal = tuple[dict, int]

# Why the greeter closed a connection before its call (the keys of Status's `bulk.closed`).
HELLO_TIMEOUT = "hello_timeout"
PER_ADDRESS_CAP = "per_address_cap"
TOTAL_CAP = "total_cap"
TLS_HANDSHAKE = "tls_handshake"
NO_ROOM_TO_DRAIN = "no_room_to_drain"


@dataclass(eq=False)
class Waiting:
    """A connection held here: reading its hello, or answering a refusal and draining."""

    sock: socket.socket
    peer: str
    deadline: float
    reader: wire_sockets.SmallReader | None  # None once answered
    handshake: bool = False  # a TLS handshake still to finish
    out: bytes = b""  # the answer still to send
    drain_left: int = 0
    events: int = selectors.EVENT_READ
    since: float = field(default_factory=time.monotonic)  # its accept (or hand-over): the oldest goes first


class Greeter:
    """One thread's worth of pre-auth connections (`step` under `records.supervise.run_supervised`)."""

    def __init__(
        self,
        listener: socket.socket,
        tls: ssl.SSLContext | None,
        hello_seconds: float,
        admit: Callable[[socket.socket, dict], Refusal | None],
        bad_hello: Callable[[Exception], Refusal],
        count: Callable[[str], None],
    ) -> None:
        self.listener, self.tls, self.hello_seconds = listener, tls, hello_seconds
        self.admit, self.bad_hello, self.count = admit, bad_hello, count
        self.places = threading.BoundedSemaphore(MAX_WAITING)  # taken only in this thread (and by tests)
        self.per_peer: collections.Counter[str] = collections.Counter()
        self.waiting: set[Waiting] = set()
        self._log = RateLimit(per_second=0.2, burst=5)
        self._handed: collections.deque[tuple[socket.socket, dict, int]] = collections.deque()
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)
        self._resume_accepting: float | None = None
        listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "listener")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")

    # --- from other threads ----------------------------------------------------------------------
    def drain(self, conn: socket.socket, head: dict, limit: int) -> None:
        """Answer `head` on `conn` and drop up to `limit` more bytes from it (a call refused after its
        hello), here rather than on the caller's thread. The connection is this thread's from now on."""
        self._handed.append((conn, head, limit))
        self.wake()

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or closed
            self._wake_w.send(b"x")

    # --- this thread -----------------------------------------------------------------------------
    def step(self) -> bool:
        """One round: accept, read, answer, drain, close the expired. Always True (the owner stops it)."""
        now = time.monotonic()
        if self._resume_accepting is not None and now >= self._resume_accepting:
            self._resume_accepting = None
            self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        soonest = min((w.deadline for w in self.waiting), default=now + 0.25)
        for key, events in self.selector.select(max(0.0, min(0.25, soonest - now))):
            if key.data == "listener":
                self._accept()
            elif key.data == "wake":
                self._take_handed()
            else:
                self._serve(key.data, events)
        self._expire(time.monotonic())
        return True

    def close(self) -> None:
        for w in list(self.waiting):
            self._drop(w)
        while self._handed:
            self._handed.popleft()[0].close()
        self.selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_ROUND):
            try:
                conn, addr = self.listener.accept()
            except wire_sockets.WOULD_BLOCK:
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue
                # the descriptor limit, say: a line (rate-limited, no traceback) and a pause, while the
                # connections waiting here reach their deadlines and free theirs
                self._say(f"cannot accept bulk socket connections ({exc}); pausing {ACCEPT_PAUSE:g} s")
                self.selector.unregister(self.listener)
                self._resume_accepting = time.monotonic() + ACCEPT_PAUSE
                return
            peer = str(addr[0]) if isinstance(addr, tuple) else str(addr)
            if self._make_room(peer):
                self._hold(conn, peer)
            else:  # every place held outside this thread (a test's): nothing to take
                self._refuse(conn, peer, TOTAL_CAP, f"more than {MAX_WAITING} unauthenticated connections")

    def _make_room(self, peer: str) -> bool:
        """Below both caps for one more connection from `peer`, and its place taken (True), making
        room as the module's docstring says."""
        if self.per_peer[peer] >= MAX_WAITING_PER_PEER:
            self._evict(peer, PER_ADDRESS_CAP, f"more than {MAX_WAITING_PER_PEER} unauthenticated from it")
            if self.per_peer[peer] >= MAX_WAITING_PER_PEER:
                return False
        if self.places.acquire(blocking=False):
            return True
        if self.per_peer:
            most = max(self.per_peer, key=self.per_peer.__getitem__)
            victim = peer if self.per_peer[peer] == self.per_peer[most] else most
            self._evict(victim, TOTAL_CAP, f"more than {MAX_WAITING} unauthenticated connections, the most from it")
        return self.places.acquire(blocking=False)

    def _evict(self, peer: str, reason: str, why: str) -> None:
        """The oldest connection waiting from `peer` goes: served first if its hello is there by now
        (a burst of real clients is accepted in one round before any is read), else closed."""
        oldest = min((w for w in self.waiting if w.peer == peer), key=lambda w: w.since, default=None)
        if oldest is None:
            return
        self._serve(oldest, selectors.EVENT_READ)
        if oldest in self.waiting:
            self._drop(oldest)
            self._count(reason, f"closed a bulk socket connection from {peer}: {why}")

    def _refuse(self, conn: socket.socket, peer: str, reason: str, why: str) -> None:
        conn.close()
        self._count(reason, f"closed a bulk socket connection from {peer}: {why}")

    def _hold(self, conn: socket.socket, peer: str) -> None:
        """A new connection, holding its place: its handshake and hello now have `hello_seconds`."""
        self.per_peer[peer] += 1
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        except OSError:  # gone already
            conn.close()
            self._release(peer)
            return
        w = Waiting(conn, peer, time.monotonic() + self.hello_seconds, wire_sockets.SmallReader())
        w.handshake = self.tls is not None
        self.waiting.add(w)
        self.selector.register(conn, selectors.EVENT_READ, w)

    def _take_handed(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        while self._handed:
            conn, head, limit = self._handed.popleft()
            try:
                peer = str(conn.getpeername()[0])
                conn.setblocking(False)
            except OSError:
                conn.close()
                continue
            if self.per_peer[peer] >= MAX_WAITING_PER_PEER or not self.places.acquire(blocking=False):
                # no room to drain: the answer goes out if it fits the send buffer, then the connection closes
                with contextlib.suppress(OSError):
                    conn.send(wire_sockets.small_bytes(head))
                self._refuse(conn, peer, NO_ROOM_TO_DRAIN, "a refused call with no room left to drain it")
                continue
            self.per_peer[peer] += 1
            w = Waiting(conn, peer, 0.0, None)
            self.waiting.add(w)
            self.selector.register(conn, selectors.EVENT_READ, w)
            self._answer(w, head, limit)

    def _serve(self, w: Waiting, events: int) -> None:
        if w not in self.waiting:  # dropped earlier in this round
            return
        try:
            if w.handshake:
                cast(ssl.SSLSocket, w.sock).do_handshake()  # `handshake` is set only with TLS
                w.handshake = False
            if w.reader is not None:
                self._read_hello(w)
            else:
                self._send_and_drain(w)
        except ssl.SSLWantReadError:
            self._want(w, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            self._want(w, selectors.EVENT_WRITE)
        except framing.WireError as exc:  # a bad hello: answered, and its rest dropped
            refusal = self.bad_hello(exc)
            self._answer(w, *refusal)
        except OSError as exc:  # the peer went away, or a TLS handshake that failed
            self._drop(w)
            if w.handshake:
                self._count(TLS_HANDSHAKE, f"bulk socket TLS handshake with {w.peer} failed: {exc}")

    def _read_hello(self, w: Waiting) -> None:
        hello = w.reader.read(w.sock) if w.reader is not None else None
        if hello is None:
            self._want(w, selectors.EVENT_READ)
            return
        self.selector.unregister(w.sock)
        self.waiting.discard(w)
        try:
            refusal = self.admit(w.sock, hello)
        except Exception:  # our bug: logged, and that connection closed  # noqa: BLE001
            log.exception("bulk socket: admitting a call failed")
            w.sock.close()
            self._release(w.peer)
            return
        if refusal is None:  # the server took the connection: its place is free again
            self._release(w.peer)
            return
        self.waiting.add(w)
        w.events = selectors.EVENT_READ
        self.selector.register(w.sock, selectors.EVENT_READ, w)
        self._answer(w, *refusal)

    def _answer(self, w: Waiting, head: dict, limit: int) -> None:
        w.reader, w.out, w.drain_left = None, wire_sockets.small_bytes(head), limit
        w.deadline = time.monotonic() + DRAIN_SECONDS
        self._send_and_drain(w)

    def _send_and_drain(self, w: Waiting) -> None:
        """Send what is left of the answer, then take and drop what arrives; closed when the client
        closes or has sent `drain_left` bytes, or fails."""
        try:
            self._send_and_drain_once(w)
        except OSError:  # the client went away or reset the connection: nothing more to tell it
            self._drop(w)

    def _send_and_drain_once(self, w: Waiting) -> None:
        if w.out:
            try:
                sent = w.sock.send(w.out)
            except wire_sockets.WOULD_BLOCK:
                self._want(w, selectors.EVENT_WRITE)
                return
            w.out = w.out[sent:]
            if w.out:
                self._want(w, selectors.EVENT_WRITE)
                return
            if not isinstance(w.sock, ssl.SSLSocket):  # TLS needs its write side to read on
                with contextlib.suppress(OSError):
                    w.sock.shutdown(socket.SHUT_WR)
        self._want(w, selectors.EVENT_READ)
        for _ in range(READS_PER_ROUND):
            try:
                data = w.sock.recv(min(1 << 16, max(1, w.drain_left)))
            except wire_sockets.WOULD_BLOCK:
                return
            w.drain_left -= len(data)
            if not data or w.drain_left <= 0:
                self._drop(w)
                return

    def _want(self, w: Waiting, events: int) -> None:
        if w.events != events and w in self.waiting:
            w.events = events
            self.selector.modify(w.sock, events, w)

    def _expire(self, now: float) -> None:
        for w in [w for w in self.waiting if w.deadline <= now]:
            self._drop(w)
            if w.reader is not None:
                self._count(
                    HELLO_TIMEOUT,
                    f"closed a bulk socket connection from {w.peer}: no hello within {self.hello_seconds:g} s",
                )

    def _drop(self, w: Waiting) -> None:
        if w in self.waiting:
            self.waiting.discard(w)
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(w.sock)
            w.sock.close()
            self._release(w.peer)

    def _release(self, peer: str) -> None:
        self.per_peer[peer] -= 1
        if self.per_peer[peer] <= 0:
            del self.per_peer[peer]
        self.places.release()

    def _count(self, reason: str, line: str) -> None:
        self.count(reason)
        self._say(line)

    def _say(self, line: str) -> None:
        dropped = self._log.allow()
        if dropped is not None:
            log.warning("%s%s", line, f" ({dropped} more such lines held back)" if dropped else "")
