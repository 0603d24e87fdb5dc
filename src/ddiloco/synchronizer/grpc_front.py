"""The gRPC port's front door: connections wait here, on one selector thread, until they have sent
their first bytes, and only then reach gRPC (#46).

gRPC's server accepts every TCP connection and holds it until its handshake deadline (120 s by
default), and a silent connection never reaches an interceptor: at a 1024 descriptor limit 1100 of
them took every descriptor (new channels timed out, checkpoints failed, the honest learner fell to
0.07x). gRPC's C core offers a total cap (`grpc.max_allowed_incoming_connections`) and a handshake
deadline, but nothing per address, so one host can still take the whole cap and lock every other
learner out. So the public port is ours, and gRPC listens on an abstract unix socket behind it:

    deadline   `preface_seconds` from the accept to the first bytes (the whole HTTP/2 client preface,
               or with TLS a handshake record's header); then it is relayed to gRPC, which does the rest
    per peer   at most `per_address` connections waiting from one address
    total      at most `total` waiting (below the descriptor limit, whatever the settings say)

A connection beyond a cap does not lock anyone out: it takes the place of the oldest one waiting
from its own address, or (total cap) from the address holding the most places. A real client sends
its preface at once, so it is never the oldest for long, and a flood only churns its own
connections. Relayed connections are bounded too (`max_relayed`, from the descriptor limit): each
costs three descriptors (both ends here and gRPC's) and two threads that copy bytes with the
interpreter lock released. Closures are counted by reason (`closed`) and logged rate-limited.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import resource
import selectors
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass

from ..records.ratelimit import RateLimit
from ..wire import sockets as wire_sockets

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # every HTTP/2 client's first bytes (RFC 9113 3.4)
TLS_RECORD_HEADER = 5  # a TLS client starts with a handshake record: 0x16, 0x03, version, length
FD_RESERVE = 256  # descriptors kept for everything else: checkpoints, the bulk socket, logs, torch
ACCEPTS_PER_ROUND = 64
ACCEPT_PAUSE = 0.1  # after accept failed for lack of descriptors
RELAY_BUFFER = 1 << 18
BACKEND_CONNECT_SECONDS = 10.0
SEND_STALL_SECONDS = 60  # a relayed peer that takes nothing for this long is gone

# Why the front closed a connection (keys of `GrpcFront.closed`).
PREFACE_TIMEOUT = "preface_timeout"
BAD_PREFACE = "bad_preface"
PER_ADDRESS_CAP = "per_address_cap"
TOTAL_CAP = "total_cap"
RELAY_CAP = "relay_cap"


def raise_fd_limit() -> int:
    """The soft descriptor limit raised to the hard one where the system lets us (a 1024 soft limit is
    a common default, far below what a synchronizer under a flood needs); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


@dataclass(eq=False)
class Waiting:
    sock: socket.socket
    peer: str
    deadline: float
    got: bytes = b""


class GrpcFront:
    """Listens on (host, port) and relays admitted connections to gRPC at `backend` (an abstract unix
    socket name, `backend_target` for gRPC's `add_*_port`). `step` runs on one thread (`start`)."""

    def __init__(self, host: str, port: int, tls: bool, per_address: int, total: int, preface_seconds: float) -> None:
        self.backend = f"ddiloco-grpc-{uuid.uuid4().hex}"
        self.backend_target = f"unix-abstract:{self.backend}"
        self.tls, self.preface_seconds = tls, preface_seconds
        budget = max(8, raise_fd_limit() - FD_RESERVE)
        self.total = max(1, min(total, budget // 4))  # one descriptor each
        self.per_address = max(1, min(per_address, self.total))
        self.max_relayed = max(1, budget // 4)  # three each: the rest of the budget
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # never two listeners on Linux
        try:
            self.listener.bind((host.strip("[]"), port))
        except OSError as exc:
            self.listener.close()
            raise OSError(f"cannot listen on {host}:{port}: {exc}") from None
        self.listener.listen(1024)
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.by_peer: dict[str, collections.deque[Waiting]] = {}
        self.waiting = 0
        self.relayed = 0
        self.closed: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()  # `relayed` and `closed`, also touched by relay threads
        self._log = RateLimit(per_second=0.2, burst=5)
        self._resume_accepting: float | None = None
        self._closing = threading.Event()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)  # None: the listener
        self._thread = threading.Thread(target=self._loop, name="ddiloco-grpc-front", daemon=True)

    def start(self) -> int:
        self._thread.start()
        return self.port

    def stop(self) -> None:
        """No new connections; the waiting ones closed. Relayed ones end when gRPC closes its side."""
        self._closing.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            for queue in list(self.by_peer.values()):
                for w in list(queue):
                    self._drop(w)
            self.selector.close()
        self.listener.close()

    def _loop(self) -> None:
        for _ in range(1 << 62):  # until stopped; a failed round is logged and the loop goes on
            if self._closing.is_set():
                return
            try:
                self.step()
            except Exception:  # noqa: BLE001 - our bug: logged, and the port stays served
                log.exception("the gRPC front failed a round")
                self._closing.wait(0.1)

    def step(self) -> None:
        now = time.monotonic()
        if self._resume_accepting is not None and now >= self._resume_accepting:
            self._resume_accepting = None
            self.selector.register(self.listener, selectors.EVENT_READ, None)
        soonest = min((q[0].deadline for q in self.by_peer.values()), default=now + 0.25)
        for key, _ in self.selector.select(max(0.0, min(0.25, soonest - now))):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data)
        now = time.monotonic()
        for queue in list(self.by_peer.values()):
            while queue and queue[0].deadline <= now:  # oldest first: deadlines are in accept order
                self._close(queue[0], PREFACE_TIMEOUT, f"nothing within {self.preface_seconds:g} s")

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_ROUND):
            try:
                conn, addr = self.listener.accept()
            except wire_sockets.WOULD_BLOCK:
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue
                self._say(f"cannot accept gRPC connections ({exc}); pausing {ACCEPT_PAUSE:g} s")
                self.selector.unregister(self.listener)
                self._resume_accepting = time.monotonic() + ACCEPT_PAUSE
                return
            peer = str(addr[0]) if isinstance(addr, tuple) else str(addr)
            self._make_room(peer)
            w = Waiting(conn, peer, time.monotonic() + self.preface_seconds)
            try:
                conn.setblocking(False)
                self.selector.register(conn, selectors.EVENT_READ, w)
            except (OSError, ValueError):
                conn.close()
                continue
            self.by_peer.setdefault(peer, collections.deque()).append(w)
            self.waiting += 1

    def _make_room(self, peer: str) -> None:
        """Past a cap, the oldest connection waiting from `peer` or (total cap) from the address with
        the most places (its own if tied) goes: relayed if its preface is there by now, else closed."""
        mine = self.by_peer.get(peer)
        if mine is not None and len(mine) >= self.per_address:
            oldest, reason, why = mine[0], PER_ADDRESS_CAP, f"more than {self.per_address} waiting from it"
        elif self.waiting >= self.total:
            most = max(self.by_peer.values(), key=len)
            oldest = mine[0] if mine is not None and len(mine) == len(most) else most[0]
            reason, why = TOTAL_CAP, f"{self.total} waiting, the most from it"
        else:
            return
        self._read(oldest)  # a burst of real clients: accepted in one round, their prefaces not yet read
        if oldest in self.by_peer.get(oldest.peer, ()):
            self._close(oldest, reason, why)

    def _read(self, w: Waiting) -> None:
        need = TLS_RECORD_HEADER if self.tls else len(PREFACE)
        try:
            data = w.sock.recv(need - len(w.got))
        except wire_sockets.WOULD_BLOCK:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(w)
            return
        w.got += data
        expected = b"\x16\x03" if self.tls else PREFACE
        if not w.got.startswith(expected[: len(w.got)]):
            self._close(w, BAD_PREFACE, "not gRPC")
            return
        if len(w.got) < need:
            return
        self._forget(w)
        with self._lock:
            full = self.relayed >= self.max_relayed
            if not full:
                self.relayed += 1
        if full:
            w.sock.close()
            self._count(RELAY_CAP, f"closed a gRPC connection from {w.peer}: {self.max_relayed} relayed already")
            return
        try:
            threading.Thread(target=self._relay, args=(w.sock, w.got), name="ddiloco-grpc-relay", daemon=True).start()
        except RuntimeError:  # no thread to be had
            w.sock.close()
            with self._lock:
                self.relayed -= 1

    def _relay(self, client: socket.socket, first: bytes) -> None:
        """Connects to gRPC, sends what was read, then copies both ways until either side ends."""
        backend = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.setblocking(True)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            stall = struct.pack("ll", SEND_STALL_SECONDS, 0)
            for s in (client, backend):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, stall)
            backend.settimeout(BACKEND_CONNECT_SECONDS)  # gRPC's own backlog full: give up, not hang
            backend.connect("\0" + self.backend)
            backend.settimeout(None)
            backend.sendall(first)
            down = threading.Thread(target=_copy, args=(backend, client), name="ddiloco-grpc-relay", daemon=True)
            down.start()
            _copy(client, backend)
            down.join()
        except (OSError, RuntimeError) as exc:
            log.debug("gRPC relay ended: %s", exc)
        finally:
            backend.close()
            client.close()
            with self._lock:
                self.relayed -= 1

    def _close(self, w: Waiting, reason: str, why: str) -> None:
        self._drop(w)
        self._count(reason, f"closed a gRPC connection from {w.peer}: {why}")

    def _drop(self, w: Waiting) -> None:
        self._forget(w)
        w.sock.close()

    def _forget(self, w: Waiting) -> None:
        queue = self.by_peer.get(w.peer)
        if queue is None or w not in queue:
            return
        queue.remove(w)
        if not queue:
            del self.by_peer[w.peer]
        self.waiting -= 1
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(w.sock)

    def _count(self, reason: str, line: str) -> None:
        with self._lock:
            self.closed[reason] += 1
        self._say(line)

    def _say(self, line: str) -> None:
        dropped = self._log.allow()
        if dropped is not None:
            log.warning("%s%s", line, f" ({dropped} more such lines held back)" if dropped else "")


def _copy(src: socket.socket, dst: socket.socket) -> None:
    """Bytes from `src` to `dst` until either ends; then both are shut, so the other direction ends too."""
    buf = bytearray(RELAY_BUFFER)
    view = memoryview(buf)
    try:
        for _ in range(1 << 62):
            n = src.recv_into(buf)
            if not n:
                break
            dst.sendall(view[:n])
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
