"""A live web dashboard for `ddiloco run`: one page and its JSON, from the standard library's HTTP
server (no framework, no build step).

It listens on loopback by default; any other address needs the run to have a token (the gRPC
service's rule). Given a token, the dashboard asks for the run's *view credential* (`dashauth`: an
HMAC of the token, read-only), never the token itself, which authorizes Stop, Fetch and pushes and so
never travels to a page: the `X-Ddiloco-View` header or `?view=` in the page's address (the page
passes it on to its own requests). When the run has TLS (`--tls-cert/--tls-key`), the dashboard is
served over HTTPS with the same certificate and nothing else: a plain-HTTP request gets no answer.

Anyone who can reach the port can open connections before any token is checked, so the server
bounds what they cost (issue 32): each read waits at most `read_timeout` and the whole request at
most `request_seconds` (a client trickling a byte at a time cannot keep its place), at most
`max_connections` are served at once and at most `per_address` of them for one client address (more
are closed at once: one address cannot lock operators out, issue 46), a client that hangs up logs no
traceback, and every line a client can trigger goes through one rate limit. The serving thread is
supervised (`records.supervise`): anything that ends its loop is logged once with its traceback and
the loop is started again with backoff, so the page never dies silently.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from ..records.ratelimit import RateLimit
from ..records.supervise import Supervisor, run_supervised
from .dashauth import VIEW_HEADER, VIEW_PARAM, redact, view_credential, view_url
from .dashboard_page import PAGE

log = logging.getLogger(__name__)

HANDLER_THREAD = "ddiloco-dashboard-conn"  # the name of each connection's thread
# a client that left, went silent or spoke plain HTTP to HTTPS: one debug line, no traceback
HANG_UPS = (ConnectionError, TimeoutError, socket.timeout, ssl.SSLError)


class DeadlineReader(io.RawIOBase):
    """A connection's bytes, each read waiting at most `per_read` seconds and all of them arriving
    within `total` seconds of the first read's set-up: past it a read raises TimeoutError, which the
    handler takes as a timed-out request (one rate-limited line, no traceback)."""

    def __init__(self, sock: socket.socket, per_read: float, total: float) -> None:
        super().__init__()
        self.sock, self.per_read, self.ends = sock, per_read, time.monotonic() + total

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:  # a writable buffer (bytearray, memoryview)
        left = self.ends - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(min(self.per_read, left))
        return self.sock.recv_into(buffer)


class BoundedServer(ThreadingHTTPServer):
    """The standard library's threaded server, with a cap on connections served at once and quiet errors."""

    daemon_threads = True
    block_on_close = False  # stop() must not wait for a client that holds its connection open
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        handler: type,
        max_connections: int,
        per_address: int | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.slots = threading.BoundedSemaphore(max_connections)
        self.max_connections = max_connections
        self.per_address = min(max_connections, per_address or max_connections)
        self.tls = tls
        self.active = 0  # connections being served now (each on its own thread)
        self.by_address: dict[str, int] = {}  # of those, how many each client address holds
        self.refused = 0  # connections closed at once because all slots (or their address's) were taken
        self.log_limit = RateLimit(per_second=5.0, burst=20)
        self._count = threading.Lock()
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        """The accepted connection, wrapped in TLS when the run has it; the handshake happens on the
        connection's own thread (`Handler.setup`), so a silent client never holds the accept loop."""
        sock, address = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def note(self, level: int, msg: str, *args: object, exc_info: bool = False) -> None:
        """A line a client triggered, if the rate limit lets it through."""
        dropped = self.log_limit.allow()
        if dropped is None:
            return
        if dropped:  # said on the same line: one line per token of the bucket
            msg, args = msg + " (%d more lines not logged: rate limit)", (*args, dropped)
        log.log(level, msg, *args, exc_info=exc_info)

    def _refuse(self, request: Any, why: str, host: str) -> None:
        with self._count:
            self.refused += 1
        self.note(logging.WARNING, "dashboard: %s; closed one from %s", why, host)
        self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        host = str(client_address[0])
        if not self.slots.acquire(blocking=False):
            self._refuse(request, f"{self.max_connections} connections open", host)
            return
        with self._count:
            crowded = self.by_address.get(host, 0) >= self.per_address
            if not crowded:
                self.active += 1
                self.by_address[host] = self.by_address.get(host, 0) + 1
        if crowded:  # this address holds its share: the others' slots stay free for them
            self.slots.release()
            self._refuse(request, f"{self.per_address} connections open from one address", host)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: give its slot back
            self._release(host)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        threading.current_thread().name = HANDLER_THREAD
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(str(client_address[0]))

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, HANG_UPS):
            self.note(logging.DEBUG, "dashboard: client %s went away: %r", client_address[0], exc)
        else:
            self.note(logging.WARNING, "dashboard: request from %s failed", client_address[0], exc_info=True)

    def _release(self, host: str) -> None:
        with self._count:
            self.active -= 1
            left = self.by_address.get(host, 1) - 1
            if left > 0:
                self.by_address[host] = left
            else:
                self.by_address.pop(host, None)
        self.slots.release()


class Dashboard:
    def __init__(
        self,
        state: Callable[[], dict],
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        read_timeout: float = 3.0,
        max_connections: int = 64,
        request_seconds: float = 5.0,
        per_address: int = 8,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.state = state
        self.view = view_credential(token) if token is not None else None  # the token itself is never kept
        self.tls = tls
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            timeout = read_timeout  # per socket operation: a silent client gives its slot back

            def setup(self) -> None:
                if isinstance(self.request, ssl.SSLSocket):  # bounded: each step of it waits read_timeout
                    self.request.settimeout(read_timeout)
                    self.request.do_handshake()
                super().setup()
                self.rfile.close()  # the plain reader: replaced by one that also has a deadline in all
                self.rfile = io.BufferedReader(DeadlineReader(self.connection, read_timeout, request_seconds))

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urlsplit(self.path)
                if not dashboard.allowed(self.headers.get(VIEW_HEADER), parse_qs(url.query).get(VIEW_PARAM)):
                    self._send(401, "text/plain", b"wrong or missing view credential (open the printed URL)")
                elif url.path in ("/", "/index.html"):
                    self._send(200, "text/html; charset=utf-8", PAGE.encode())
                elif url.path == "/state.json":
                    try:
                        body = json.dumps(dashboard.state(), default=str).encode()
                    except Exception as exc:  # noqa: BLE001 - the page shows the reason, the run goes on
                        log.warning("dashboard state failed: %s", exc)
                        self._send(503, "text/plain", f"state unavailable: {exc}".encode())
                        return
                    self._send(200, "application/json", body)
                else:
                    self._send(404, "text/plain", b"not found")

            def _send(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
                # the request line carries ?view= (and a confused client's ?token=): never logged
                dashboard.server.note(logging.DEBUG, "dashboard: " + format, *(redact(str(a)) for a in args))

        self.server = BoundedServer((host, port), Handler, max_connections, per_address, tls)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="ddiloco-dashboard", daemon=True)

    def _serve(self) -> None:
        def step() -> bool:
            self.server.serve_forever()  # returns only once `stop` shut it down
            return False

        run_supervised(step, lambda s: not self._stopping.wait(s), Supervisor("dashboard server", log))

    def allowed(self, header: str | None, query: list[str] | None) -> bool:
        """The view credential, or no token at all for the run (loopback only: `require_token_policy`)."""
        if self.view is None:
            return True
        given = header or (query[0] if query else None)
        return given is not None and hmac.compare_digest(self.view.encode(), given.encode())

    @property
    def url(self) -> str:
        """The dashboard's address, without any credential."""
        host, port = cast(tuple[str, int], self.server.server_address[:2])  # an AF_INET address
        return f"{'https' if self.tls is not None else 'http'}://{host}:{port}/"

    @property
    def view_url(self) -> str:
        """The address to open: with the view credential when the run has a token (never the token)."""
        return view_url(self.url, self.view)

    def start(self) -> str:
        """Serve; returns the address to open (`view_url`)."""
        self._thread.start()
        return self.view_url

    def stop(self) -> None:
        self._stopping.set()
        self.server.shutdown()  # returns at once if the loop is between a failure and its restart
        self.server.server_close()
        if self._thread.is_alive():
            self._thread.join(5.0)
