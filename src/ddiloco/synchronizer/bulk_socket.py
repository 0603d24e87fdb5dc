"""The synchronizer's end of the bulk socket plane (`wire.sockets`): pushes and fetches over plain TCP.

Everything a gRPC bulk call goes through applies here too, through the same code: the auth token
(compared in constant time before anything else is read; until then a connection waits, with no
thread of its own, in `bulk_greeting`'s selector, within its caps and deadline), a bulk slot per
authenticated push (a fetch, which over gRPC takes none, holds one of a few fetch places instead,
and must name a live session, at most `MAX_FETCHES_PER_SESSION` of whose fetches run at once), the
stream guard's idle and total deadlines and its limit of pushes per session, the message size limit
checked before any buffer is reserved, and the handlers that take a contribution in or frame the
model. A refusal is sent as an error message (by the greeter, which also drains what follows); a
connection that breaks frees its slot. Every connection closed or call refused is counted by reason
in `service.traffic` (Status's `bulk.closed`), so an operator sees an attack as it happens.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
from collections import Counter
from collections.abc import Callable
from typing import NoReturn, cast

import grpc

from ..records.supervise import Supervisor, run_supervised
from ..wire import auth, framing, rpc
from ..wire import sockets as wire_sockets
from .bulk_greeting import HELLO_SECONDS, Greeter, Refusal
from .handlers import CLIENT_ERRORS, Handlers
from .one_thread import one_thread

log = logging.getLogger(__name__)


# Fetches at once. A fetch takes no bulk slot, as over gRPC (whose fetches take none either): fetches
# that are never read could otherwise hold every slot and refuse every learner's push.
MAX_FETCHING = 4
# A fetch names a live session, and one session holds at most one place at once (a joining learner
# fetches a fragment at a time): with two, two sessions could hold all four places until the idle cut
# (#46), and with one it takes as many sessions as places.
MAX_FETCHES_PER_SESSION = 1

# Why a call was refused after its hello (with the greeter's reasons, the keys of Status's `bulk.closed`).
BAD_TOKEN = "bad_token"
BAD_HELLO = "bad_hello"
UNKNOWN_METHOD = "unknown_method"
UNKNOWN_SESSION = "unknown_session"
SESSION_FETCH_CAP = "session_fetch_cap"
NO_FREE_PLACE = "no_free_place"  # every bulk slot (a push) or fetch place (a fetch) taken
REFUSED_CALL = "refused_call"  # an authenticated call refused on its frames (bad frame, size, request)


class Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class SocketContext:
    """What the handlers use of a gRPC context: `abort` raises `Abort`, `cancel` (the stream guard's)
    shuts the connection so that a blocked receive or send returns."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Abort(code, details)

    def cancel(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)


class BulkSocketServer:
    def __init__(
        self, handlers: Handlers, host: str, token: str | None, tls: ssl.SSLContext | None = None, port: int = 0
    ) -> None:
        self.handlers, self.service = handlers, handlers.service
        self.token, self.tls = token, tls
        self.max_frame = self.service.settings.chunk_bytes + rpc.FRAME_MARGIN
        self.message_drain = self.service.settings.max_message_bytes + self.max_frame  # a whole push, dropped
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        # a restart on the same --bulk-port must not wait out the old connections' TIME_WAIT (on Linux
        # this never lets two processes listen on one port)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((host.strip("[]"), port))
        except OSError as exc:
            self.listener.close()
            raise OSError(f"cannot listen for bulk sockets on {host}:{port}: {exc}") from None
        self.listener.listen(64)
        self.port: int = self.listener.getsockname()[1]
        hello_seconds = min(HELLO_SECONDS, self.service.settings.timeouts.failure)
        self.greeter = Greeter(
            self.listener, tls, hello_seconds, self._admit, self._bad_hello, self.service.traffic.closed
        )
        self._greeting = self.greeter.places  # the places of connections not yet authenticated
        self._fetching = threading.BoundedSemaphore(MAX_FETCHING)
        self._lock = threading.Lock()
        self.fetches: Counter[str] = Counter()  # fetches in flight by session id
        self.served: Counter[str] = Counter()  # authenticated calls by method
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._greet_loop, name="ddiloco-bulk-accept", daemon=True)

    @property
    def closed(self) -> Counter[str]:
        """Connections closed and calls refused, by reason (caps, hello deadline, TLS handshakes, token,
        method, session, places, frames): a copy of what Status shows as `bulk.closed`."""
        return Counter(self.service.traffic.closed_counts())

    def start(self) -> int:
        self._thread.start()
        return self.port

    def stop(self) -> None:
        self._closing.set()
        self.greeter.wake()
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self.greeter.close()
        self.listener.close()

    def _greet_loop(self) -> None:
        """Accepts and greets until closed; anything else that goes wrong is logged and retried (`supervise`)."""
        run_supervised(
            lambda: not self._closing.is_set() and self._greet(),
            lambda s: not self._closing.wait(s),
            Supervisor("bulk socket accept", log),
        )

    def _greet(self) -> bool:
        self.greeter.step()
        self.service.traffic.bulk_waiting = len(self.greeter.waiting)  # Status's gauge
        return True

    def _admit(self, conn: socket.socket, hello: dict) -> Refusal | None:
        """A complete hello, in the greeter's thread (nothing here waits): the token, then for a fetch
        its session, then a place (a bulk slot, or a fetch place). The call then runs on a thread of
        its own, so there are at most as many such threads as places; None means it was taken."""
        method = cast(str, hello.get("method")) if hello.get("method") in wire_sockets.BULK_METHODS else "bulk socket"
        if self.token is not None and not auth.token_matches(self.token, _text(hello.get("token"))):
            self.service.refuse_rpc(method, "missing auth token" if hello.get("token") is None else "wrong auth token")
            self.service.traffic.closed(BAD_TOKEN)
            return {"error": "UNAUTHENTICATED", "details": "wrong or missing auth token"}, self.max_frame
        if method not in wire_sockets.BULK_METHODS:
            details = f"unknown bulk method {str(hello.get('method'))[:40]!r}"
            self.service.refuse_rpc(method, details)
            self.service.traffic.closed(UNKNOWN_METHOD)
            return {"error": "UNIMPLEMENTED", "details": details}, self.max_frame
        session = None
        if method == "Fetch":
            sid = _text(hello.get("session"))
            session = self.service.membership.session(sid) if sid is not None else None
            if session is None:
                self.service.refuse_rpc(method, "unknown session")
                self.service.traffic.closed(UNKNOWN_SESSION)
                return {"error": "NOT_FOUND", "details": "unknown session: register again"}, self.max_frame
            with self._lock:
                if self.fetches[session.id] >= MAX_FETCHES_PER_SESSION:
                    details = f"{MAX_FETCHES_PER_SESSION} fetches of this session are in flight; retry later"
                    self.service.traffic.closed(SESSION_FETCH_CAP)
                    return {"error": "RESOURCE_EXHAUSTED", "details": details}, self.max_frame
                self.fetches[session.id] += 1
        places = self._fetching if method == "Fetch" else self.service.bulk_slots
        if places.acquire(blocking=False):
            self.served[method] += 1  # before the call can end: a caller's reply implies the count
            try:
                threading.Thread(
                    target=self._serve,
                    args=(conn, method, places, session.id if session is not None else None),
                    name="ddiloco-bulk-call",
                    daemon=True,
                ).start()
                return None
            except RuntimeError:  # no thread to be had
                self.served[method] -= 1
                places.release()
        if session is not None:
            self._unbook(session.id)
        self.service.traffic.closed(NO_FREE_PLACE)
        return {"error": "RESOURCE_EXHAUSTED", "details": "too many bulk transfers at once; retry later"}, (
            self.message_drain
        )

    def _bad_hello(self, exc: Exception) -> Refusal:
        self.service.refuse_rpc("bulk socket", f"bad bulk socket hello: {exc}")
        self.service.traffic.closed(BAD_HELLO)
        return {"error": "INVALID_ARGUMENT", "details": f"bad hello: {exc}"}, self.max_frame

    def _unbook(self, session_id: str) -> None:
        with self._lock:
            self.fetches[session_id] -= 1
            if self.fetches[session_id] <= 0:
                del self.fetches[session_id]

    def _serve(self, conn: socket.socket, method: str, slot: threading.Semaphore, session_id: str | None) -> None:
        """An authenticated call, holding its place (`slot`) until it ends or is refused."""
        held: threading.Semaphore | None = slot
        owned: socket.socket | None = conn
        booked = [session_id] if session_id is not None else []

        def unbook() -> None:
            """The fetch's booking ends once, before its end marker goes out (`_fetch`): a learner that
            fetches again as soon as it has read the marker must not meet this fetch's booking."""
            while booked:
                self._unbook(booked.pop())

        try:
            refusal = self._call(conn, method, unbook)
            if refusal is not None:
                # Refused: the slot goes back at once, and the greeter answers and drains, so a client
                # trickling bytes after its refusal holds neither a slot nor a thread.
                held = None
                slot.release()
                self.service.traffic.closed(REFUSED_CALL)
                owned = None  # the greeter's from now on
                self.greeter.drain(conn, refusal, self.message_drain)
        except OSError as exc:  # the peer went away or stalled (ssl.SSLError is one too)
            log.debug("bulk socket %s ended: %s", method, exc)
        except Exception:  # noqa: BLE001 - our bug: logged, and the service goes on
            log.exception("bulk socket %s failed", method)
        finally:
            try:
                if owned is not None:
                    owned.close()
            finally:
                if held is not None:
                    held.release()
                unbook()

    def _call(self, conn: socket.socket, method: str, unbook: Callable[[], None]) -> dict | None:
        """An authenticated call, holding a bulk slot. A refusal, or an answer given before the payload
        was read, is returned for the caller to send once it has given the slot back."""
        context = SocketContext(conn)
        try:
            try:
                if method == "Push":
                    reply = self._push(conn, context)
                    if isinstance(reply, dict):
                        return reply
                    wire_sockets.send_frame(conn, [reply], wire_sockets.Deadline(self.service.settings.timeouts.rpc))
                else:
                    self._fetch(conn, context, unbook)
            except framing.WireError as exc:
                code = "RESOURCE_EXHAUSTED" if isinstance(exc, framing.MessageTooLarge) else "INVALID_ARGUMENT"
                self.service.refuse_rpc(method, f"bad {method}: {exc}")
                raise Abort(getattr(grpc.StatusCode, code), f"bad {method}: {exc}") from None
            except CLIENT_ERRORS as exc:
                log.debug("%s raised on client input", method, exc_info=True)
                self.service.refuse_rpc(method, f"bad {method} request: {str(exc)[:200]}")
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad {method} request: {str(exc)[:200]}") from None
        except Abort as abort:
            return {"error": abort.code.name, "details": abort.details}
        return None

    def _push(self, conn: socket.socket, context: SocketContext) -> bytes | dict:
        """The reply frame to a push, or the answer to give before reading its payload (an unknown
        session) as a message head."""
        handlers, service = self.handlers, self.service
        key, stream = handlers.open_push(context)
        try:
            reassembler = handlers.push_reassembler()
            deadline = wire_sockets.Deadline(float("inf"), step=service.settings.timeouts.failure)
            msg, norms = None, None
            with one_thread():  # the learner's send keeps the other cores busy (`one_thread`)
                while msg is None:
                    stream.waiting()
                    frame, body, nbytes = wire_sockets.recv_head(conn, self.max_frame, deadline)
                    service.traffic.received(nbytes)
                    if stream.session is None:
                        early = handlers.first_frame(frame, key, stream, context)
                        if early is not None:
                            return framing.read_message(early)
                    msg = wire_sockets.recv_body(conn, reassembler, frame, body, deadline)
                    norms = handlers.push_norms(reassembler, norms)  # while the next frame arrives
            return handlers.contribution_reply(msg, context, norms)
        finally:
            handlers.streams.close(key)

    def _fetch(self, conn: socket.socket, context: SocketContext, unbook: Callable[[], None]) -> None:
        deadline = wire_sockets.Deadline(float("inf"), step=self.service.settings.timeouts.failure)
        for parts in self.handlers.fetch_frames(context):
            wire_sockets.send_frame(conn, parts, deadline)
        unbook()
        wire_sockets.send_small(conn, {"end": True}, deadline)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
