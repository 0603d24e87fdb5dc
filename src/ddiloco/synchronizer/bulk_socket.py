"""The synchronizer's end of the bulk socket plane (`wire.sockets`): pushes and fetches over plain TCP.

Everything a gRPC bulk call goes through applies here too, through the same code: the auth token
(compared in constant time before anything else is read; until then a connection holds one of a
few greeting places, never a bulk slot), a bulk slot per authenticated push (a fetch, which over gRPC
takes none, holds one of a few fetch places instead), the stream guard's idle and total
deadlines and its limit of pushes per session, the message size limit checked before any buffer is
reserved, and the handlers that take a contribution in or frame the model. A refusal is sent as an
error message; a connection that breaks frees its slot.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
from collections import Counter
from typing import NoReturn, cast

import grpc

from ..records.supervise import Supervisor, run_supervised
from ..wire import auth, framing, rpc
from ..wire import sockets as wire_sockets
from .handlers import CLIENT_ERRORS, Handlers

log = logging.getLogger(__name__)


MAX_GREETING = 32  # connections at once that have not yet said who they are
# Fetches at once. A fetch takes no bulk slot, as over gRPC (whose fetches take none either): fetches
# that are never read could otherwise hold every slot and refuse every learner's push.
MAX_FETCHING = 4
HELLO_SECONDS = 10.0  # at most this long to say it (less with a shorter failure timeout)


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
        self.listener.settimeout(0.25)
        self.port: int = self.listener.getsockname()[1]
        self._greeting = threading.BoundedSemaphore(MAX_GREETING)
        self._fetching = threading.BoundedSemaphore(MAX_FETCHING)
        self.served: Counter[str] = Counter()  # authenticated calls by method
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="ddiloco-bulk-accept", daemon=True)

    def start(self) -> int:
        self._thread.start()
        return self.port

    def stop(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5.0)
        self.listener.close()

    def _accept_loop(self) -> None:
        """Accepts until closed; anything else that goes wrong is logged and retried (`supervise`)."""
        run_supervised(self._accept_one, lambda s: not self._closing.wait(s), Supervisor("bulk socket accept", log))

    def _accept_one(self) -> bool:
        """One connection accepted and handed to its thread (or refused); False once closing."""
        if self._closing.is_set():
            return False
        try:
            conn, _ = self.listener.accept()
        except (TimeoutError, BlockingIOError):
            return True
        except OSError:
            if self._closing.is_set():
                return False
            raise  # the descriptor limit, say: logged by the supervisor, retried after a backoff
        if not self._greeting.acquire(blocking=False):  # too many connections not yet authenticated
            conn.close()
            return True
        threading.Thread(target=self._serve, args=(conn,), name="ddiloco-bulk-conn", daemon=True).start()
        return True

    def _serve(self, conn: socket.socket) -> None:
        """Hello and token first, holding only a greeting place (`MAX_GREETING`, for at most
        `HELLO_SECONDS`): a bulk slot goes only to an authenticated call."""
        method, slot = "bulk socket", None
        try:
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello_deadline = wire_sockets.Deadline(min(HELLO_SECONDS, self.service.settings.timeouts.failure))
                if self.tls is not None:
                    hello_deadline.arm(conn)
                    conn = self.tls.wrap_socket(conn, server_side=True)
                hello = wire_sockets.recv_small(conn, hello_deadline)
            finally:
                self._greeting.release()
            method = (
                cast(str, hello.get("method")) if hello.get("method") in wire_sockets.BULK_METHODS else "bulk socket"
            )
            if self.token is not None and not auth.token_matches(self.token, _text(hello.get("token"))):
                reason = "missing auth token" if hello.get("token") is None else "wrong auth token"
                self.service.refuse_rpc(method, reason)
                self._answer(
                    conn, {"error": "UNAUTHENTICATED", "details": "wrong or missing auth token"}, self.max_frame
                )
                return
            places = self._fetching if method == "Fetch" else self.service.bulk_slots
            if not places.acquire(blocking=False):
                self._answer(
                    conn,
                    {"error": "RESOURCE_EXHAUSTED", "details": "too many bulk transfers at once; retry later"},
                    self.max_frame,
                )
                return
            slot = places
            self.served[method] += 1
            refusal = self._call(conn, method, hello)
            if refusal is not None:
                # Refused: the slot goes back before the drain, which a client trickling bytes could
                # stretch out for as long as its message is long.
                slot = None
                places.release()
                self._answer(conn, refusal, self.message_drain)
        except framing.WireError as exc:  # a bad hello
            self.service.refuse_rpc(method, f"bad {method} hello: {exc}")
            self._answer(conn, {"error": "INVALID_ARGUMENT", "details": f"bad hello: {exc}"}, self.max_frame)
        except OSError as exc:  # the peer went away or stalled (ssl.SSLError is one too)
            log.debug("bulk socket %s ended: %s", method, exc)
        except Exception:  # noqa: BLE001 - our bug: logged, and the service goes on
            log.exception("bulk socket %s failed", method)
        finally:
            try:
                conn.close()
            finally:
                if slot is not None:
                    slot.release()

    def _call(self, conn: socket.socket, method: str, hello: dict) -> dict | None:
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
                elif method == "Fetch":
                    self._fetch(conn, context)
                else:
                    raise Abort(grpc.StatusCode.UNIMPLEMENTED, f"unknown bulk method {str(hello.get('method'))[:40]!r}")
            except framing.WireError as exc:
                code = "RESOURCE_EXHAUSTED" if "exceeds the limit" in str(exc) else "INVALID_ARGUMENT"
                self.service.refuse_rpc(method, f"bad {method}: {exc}")
                raise Abort(getattr(grpc.StatusCode, code), f"bad {method}: {exc}") from None
            except CLIENT_ERRORS as exc:
                log.debug("%s raised on client input", method, exc_info=True)
                self.service.refuse_rpc(method, f"bad {method} request: {str(exc)[:200]}")
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad {method} request: {str(exc)[:200]}") from None
        except Abort as abort:
            return {"error": abort.code.name, "details": abort.details}
        return None

    def _answer(self, conn: socket.socket, head: dict, drain: int) -> None:
        """Send a reply while the peer may still be sending, then take and drop up to `drain` bytes
        it still sends, while they keep coming: closing with unread bytes would reset the connection
        before the peer read the reply."""
        try:
            wire_sockets.send_small(conn, head, wire_sockets.Deadline(self.service.settings.timeouts.rpc))
            if not isinstance(conn, ssl.SSLSocket):
                conn.shutdown(socket.SHUT_WR)  # TLS needs its write side to read on
            left = drain
            sink = memoryview(bytearray(1 << 16))
            conn.settimeout(min(HELLO_SECONDS, self.service.settings.timeouts.failure))
            while left > 0:
                n = conn.recv_into(sink)
                if not n:
                    return
                left -= n
        except (OSError, ValueError):
            pass

    def _push(self, conn: socket.socket, context: SocketContext) -> bytes | dict:
        """The reply frame to a push, or the answer to give before reading its payload (an unknown
        session) as a message head."""
        handlers, service = self.handlers, self.service
        key, stream = handlers.open_push(context)
        try:
            reassembler = handlers.push_reassembler()
            deadline = wire_sockets.Deadline(float("inf"), step=service.settings.timeouts.failure)
            msg = None
            while msg is None:
                stream.waiting()
                frame, body, nbytes = wire_sockets.recv_head(conn, self.max_frame, deadline)
                service.traffic.received(nbytes)
                if stream.session is None:
                    early = handlers.first_frame(frame, key, stream, context)
                    if early is not None:
                        return framing.read_message(early)
                msg = wire_sockets.recv_body(conn, reassembler, frame, body, deadline)
            return handlers.contribution_reply(msg, context)
        finally:
            handlers.streams.close(key)

    def _fetch(self, conn: socket.socket, context: SocketContext) -> None:
        deadline = wire_sockets.Deadline(float("inf"), step=self.service.settings.timeouts.failure)
        for parts in self.handlers.fetch_frames(context):
            wire_sockets.send_frame(conn, parts, deadline)
        wire_sockets.send_small(conn, {"end": True}, deadline)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
