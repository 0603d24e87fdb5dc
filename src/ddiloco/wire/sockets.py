"""The bulk socket plane: our frames over a plain TCP connection (optionally TLS), for pushes and
fetches of fragment-sized tensors.

gRPC moves at most about 0.6 of what a plain socket moves on this machine (`benchmarks/transport.py`):
every message is copied into its buffers and out again, and crosses its threads. Here a frame's
pieces go out with one `sendmsg` from the tensors' own memory, and each body is received with
`recv_into` straight to its place in the message buffer (`reassembly.Reassembler.place`), so the bytes
are touched once on each side. Control stays on gRPC; this carries only bulk tensors.

A connection carries one call. Every frame is a u32 length and then the frame. The client opens with
a hello message {"method", "token"} (a fetch's names its "session" too); the server answers a push
with one reply message, a fetch with its messages and then {"end": true}, and any refusal with
{"error": CODE, "details"}, which the client raises as a `SocketRpcError` (a `grpc.RpcError`, so
callers handle both planes alike). Every receive is bounded by a deadline and every length is
checked before anything is read or reserved.
"""

from __future__ import annotations

import errno
import select
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import grpc

from . import framing, reassembly
from .buffers import BufferPool

_LENGTH = struct.Struct("<I")
MAX_HELLO_BYTES = 1 << 16
CONNECT_SECONDS = 10.0  # a bulk port behind a firewall that drops packets is given up after this
BULK_METHODS = ("Push", "Fetch")


class SocketRpcError(grpc.RpcError):
    """A bulk socket call that failed: a refusal from the server, a broken connection or a deadline."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class ConnectFailed(SocketRpcError):
    """The bulk socket could not be reached (nothing was sent)."""


class Deadline:
    """The time left for a call; every blocking socket operation waits at most `step` and at most
    until the deadline."""

    def __init__(self, seconds: float, step: float | None = None) -> None:
        self.end = time.monotonic() + seconds
        self.step = step

    def arm(self, sock: socket.socket) -> None:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline exceeded")
        timeout = left if self.step is None else min(left, self.step)
        # Set only when it changes: every settimeout is a system call (fcntl), and a TLS receive
        # returns one record (16 KiB) at a time, so a server receiving with a step (its deadline
        # far off) made one for every record: a fifth of its push thread's time under TLS.
        if sock.gettimeout() != timeout:
            sock.settimeout(timeout)


def send_frame(sock: socket.socket, parts: Iterable[bytes | memoryview], deadline: Deadline) -> int:
    """One frame (its buffers laid end to end) with its length; the bytes sent."""
    views = [memoryview(p).cast("B") for p in parts]
    n = sum(len(v) for v in views)
    views.insert(0, memoryview(_LENGTH.pack(n)))
    if isinstance(sock, ssl.SSLSocket):  # TLS has no sendmsg: its records are copied anyway
        for v in _whole_records(views):
            deadline.arm(sock)
            sock.sendall(v)
        return n
    views = [v for v in views if len(v)]
    while views:
        deadline.arm(sock)
        sent = sock.sendmsg(views)
        while sent:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0], sent = views[0][sent:], 0
    return n


TLS_RECORD = 16384  # TLS's largest record of plaintext


def _whole_records(views: list[memoryview]) -> list[bytes | memoryview]:
    """`views` to send over TLS, the first TLS_RECORD bytes joined into one buffer: each `sendall`
    ends in a record of its own, so the length, the header and the body sent apart made two small
    records per frame, each a decryption and a read for the receiver."""
    first, rest, room = [], [], TLS_RECORD
    for v in views:
        if room > 0:
            first.append(v[:room])
            if len(v) > room:
                rest.append(v[room:])
            room -= len(first[-1])
        else:
            rest.append(v)
    return [b"".join(first), *rest]


def recv_into(sock: socket.socket, view: memoryview, deadline: Deadline) -> None:
    """Exactly len(view) bytes into `view`; ConnectionError if the peer closes first."""
    got = 0
    while got < len(view):
        deadline.arm(sock)
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("the peer closed the connection in the middle of a frame")
        got += k


def recv_head(sock: socket.socket, max_frame: int, deadline: Deadline) -> tuple[dict[str, Any], int, int]:
    """A frame's header: (header, body bytes still to read, frame bytes). The sizes are checked
    before anything more is read."""
    small = memoryview(bytearray(_LENGTH.size + framing.PREFIX_BYTES))
    recv_into(sock, small, deadline)
    (n,) = _LENGTH.unpack(small[: _LENGTH.size])
    if not framing.PREFIX_BYTES <= n <= max_frame:
        raise framing.WireError(f"frame of {n} bytes (at most {max_frame})")
    length = framing.header_length(small[_LENGTH.size :])
    if framing.PREFIX_BYTES + length > n:
        raise framing.WireError(f"header length {length} does not fit the frame of {n} bytes")
    header = memoryview(bytearray(length))
    recv_into(sock, header, deadline)
    return framing.parse_header(header), n - framing.PREFIX_BYTES - length, n


def recv_body(
    sock: socket.socket, reassembler: reassembly.Reassembler, frame: dict[str, Any], nbytes: int, deadline: Deadline
) -> reassembly.Message | None:
    """A frame's body, straight into its place in the message buffer; the message it completes."""
    recv_into(sock, reassembler.place(frame, nbytes), deadline)
    return reassembler.complete()


def recv_frame(
    sock: socket.socket, max_frame: int, deadline: Deadline, reassembler: reassembly.Reassembler | None = None
) -> tuple[dict[str, Any], int, reassembly.Message | None]:
    """One frame: (its header, its size, the message it completes or None). Without a `reassembler`
    it must have no body (a small message)."""
    frame, body, n = recv_head(sock, max_frame, deadline)
    if reassembler is None:
        if body:
            raise framing.WireError("expected a message without payload")
        return frame, n, None
    return frame, n, recv_body(sock, reassembler, frame, body, deadline)


def recv_small(sock: socket.socket, deadline: Deadline, max_frame: int = MAX_HELLO_BYTES) -> dict[str, Any]:
    """The head of a single-frame message without payload."""
    frame, _, _ = recv_frame(sock, max_frame, deadline)
    head = frame.get("head")
    if frame.get("parts") != 1 or not isinstance(head, dict):
        raise framing.WireError("expected a single-frame message")
    return head


def send_small(sock: socket.socket, head: Mapping[str, object], deadline: Deadline) -> None:
    send_frame(sock, [framing.message(head)], deadline)


def small_bytes(head: Mapping[str, object]) -> bytes:
    """A small message as it goes on the wire (its length, then the frame): what `send_small` sends."""
    frame = framing.message(head)
    return _LENGTH.pack(len(frame)) + frame


# What a non-blocking socket raises when it would wait (TLS: its records need more bytes, or a write).
WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class SmallReader:
    """A small message (what `recv_small` reads) taken from a non-blocking socket as its bytes arrive,
    so that one thread can wait on many connections at once (the synchronizer reads every hello this
    way). It asks the socket for exactly the bytes the message still needs, never more: what the peer
    sent after it stays in the socket for whoever serves the connection next. The sizes are checked as
    soon as they arrive, before anything more is read."""

    def __init__(self, max_frame: int = MAX_HELLO_BYTES) -> None:
        self.max_frame = max_frame
        self.buffer = bytearray()
        self.need = _LENGTH.size + framing.PREFIX_BYTES  # a frame is at least its prefix
        # Whether `need` is the whole message's size yet (its length and prefix read and checked). An
        # explicit state, not `need` compared with its first value: a frame of exactly its prefix has
        # the same total, and that comparison made such a hello loop forever without reading (#46).
        self.sized = False

    def read(self, sock: socket.socket) -> dict[str, Any] | None:
        """The message's head once it is complete; None while more must arrive. WireError for a bad
        frame, ConnectionError when the peer closes first. Each pass of the loop either reads at
        least one byte or leaves it (sizing happens once), so a call ends as soon as the socket has
        nothing more to give."""
        while True:
            want = self.need - len(self.buffer)
            if want <= 0:
                if not self.sized:
                    self.need, self.sized = self._frame_bytes(), True
                    continue
                return self._head()
            try:
                chunk = sock.recv(want)
            except WOULD_BLOCK:
                return None
            if not chunk:
                raise ConnectionError(errno.ECONNRESET, "the peer closed the connection before its message")
            self.buffer += chunk

    def _frame_bytes(self) -> int:
        """From the length and the prefix: the bytes of the whole message, checked."""
        view = memoryview(self.buffer)
        n = int(_LENGTH.unpack(view[: _LENGTH.size])[0])
        if not framing.PREFIX_BYTES <= n <= self.max_frame:
            raise framing.WireError(f"frame of {n} bytes (at most {self.max_frame})")
        length = framing.header_length(view[_LENGTH.size :])
        if framing.PREFIX_BYTES + length != n:
            raise framing.WireError(f"header length {length} does not fit a message of {n} bytes without payload")
        return _LENGTH.size + n

    def _head(self) -> dict[str, Any]:
        frame = framing.parse_header(memoryview(self.buffer)[_LENGTH.size + framing.PREFIX_BYTES :])
        head = frame.get("head")
        if frame.get("parts") != 1 or not isinstance(head, dict):
            raise framing.WireError("expected a single-frame message")
        return head


def raise_if_error(head: dict[str, Any]) -> dict[str, Any]:
    if "error" in head:
        code = getattr(grpc.StatusCode, str(head["error"]), None)
        raise SocketRpcError(
            code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN, str(head.get("details", ""))[:500]
        )
    return head


class BulkSocketClient:
    """Pushes and fetches on a synchronizer's bulk socket port; one connection per call."""

    def __init__(
        self, host: str, port: int, token: str | None, max_frame: int, tls: ssl.SSLContext | None = None
    ) -> None:
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"bad bulk socket port {port!r}")
        self.host, self.port, self.token, self.max_frame, self.tls = host.strip("[]"), int(port), token, max_frame, tls
        # The last TLS session, resumed by the next connection: it skips the certificate's signature
        # and its check (a connection per call; the key exchange is still new each time).
        self._session: ssl.SSLSession | None = None
        self.resumed = 0  # connections that resumed a session

    def _connect(self, method: str, deadline: Deadline, session: str | None = None) -> socket.socket:
        try:
            left = max(0.001, deadline.end - time.monotonic())
            sock = socket.create_connection((self.host, self.port), timeout=min(left, CONNECT_SECONDS))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host, session=self._session)
            hello = {"method": method, "token": self.token}
            if session is not None:
                hello["session"] = session
            send_small(sock, hello, deadline)
            return sock
        except OSError as exc:
            raise ConnectFailed(grpc.StatusCode.UNAVAILABLE, f"bulk socket {self.host}:{self.port}: {exc}") from None

    def push(
        self, frames: Iterable[list[bytes | memoryview]], timeout: float, pace: Callable[[int], None] | None = None
    ) -> tuple[dict[str, Any], int]:
        """Send one message's frames (`framing.iter_frame_parts`); (the reply's head, bytes sent)."""
        deadline = Deadline(timeout)
        sock = self._connect("Push", deadline)
        sent = 0
        try:
            for parts in frames:
                if _answered(sock):  # the server answered early: it reads no more
                    break
                if pace is not None:
                    pace(sum(len(p) for p in parts))
                sent += send_frame(sock, parts, deadline)
            reply = raise_if_error(recv_small(sock, deadline))
            self._keep_session(sock)
            return reply, sent
        except (OSError, framing.WireError) as exc:
            early = _early_reply(sock)  # refused after its first frame: the reply says why
            if early is not None:
                return raise_if_error(early), sent
            raise _failure(exc) from None
        finally:
            sock.close()

    def fetch(
        self, timeout: float, pool: BufferPool | None = None, limit: int = 1 << 40, session: str | None = None
    ) -> Iterator[reassembly.Message]:
        """The messages a fetch returns, each received straight into its buffer. The synchronizer serves
        a fetch on this plane only to a registered `session` (gRPC's `Fetch` needs none)."""
        deadline = Deadline(timeout)
        sock = self._connect("Fetch", deadline, session)
        try:
            reassembler = reassembly.Reassembler(limit, max_open=1, pool=pool)
            while True:
                _, _, msg = recv_frame(sock, self.max_frame, deadline, reassembler)
                if msg is None:
                    continue
                if msg.head.get("end") is True or "error" in msg.head:
                    self._keep_session(sock)
                    raise_if_error(msg.head)
                    return
                yield msg
        except (OSError, framing.WireError) as exc:
            raise _failure(exc) from None
        finally:
            sock.close()

    def _keep_session(self, sock: socket.socket) -> None:
        """Keep `sock`'s TLS session for the next connection, once the server has answered (TLS 1.3
        sends its session tickets after the handshake; they are read with the answer)."""
        if isinstance(sock, ssl.SSLSocket) and sock.session is not None:
            self.resumed += bool(sock.session_reused)
            self._session = sock.session


def _answered(sock: socket.socket) -> bool:
    """Whether the server has sent something (its early reply). Not asked of TLS, whose own records
    (session tickets after the handshake) make a socket readable: there the server takes and drops
    the rest of the message before it closes."""
    if isinstance(sock, ssl.SSLSocket):
        return False
    poller = select.poll()  # not select.select: it fails on descriptors above 1023
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _early_reply(sock: socket.socket) -> dict[str, Any] | None:
    """The reply a server sent before it stopped reading (an unknown session, a refusal), if any."""
    try:
        return recv_small(sock, Deadline(1.0))
    except (OSError, framing.WireError):
        return None


def _failure(exc: BaseException) -> SocketRpcError:
    if isinstance(exc, SocketRpcError):
        return exc
    if isinstance(exc, TimeoutError):
        return SocketRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"bulk socket: {exc}")
    if isinstance(exc, framing.WireError):
        return SocketRpcError(grpc.StatusCode.INTERNAL, f"bulk socket: bad frame from the server: {exc}")
    return SocketRpcError(grpc.StatusCode.UNAVAILABLE, f"bulk socket: {type(exc).__name__}: {exc}")
