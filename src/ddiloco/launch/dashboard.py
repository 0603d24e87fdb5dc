"""A live web dashboard for `ddiloco run`: one page and its JSON, from the standard library's HTTP
server (no framework, no build step).

It listens on loopback by default. The auth rule is the gRPC service's: any other address needs the
run's token, sent as the `X-Ddiloco-Token` header or `?token=` in the page's address (the page
passes it on to its own requests).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import cast
from urllib.parse import parse_qs, urlsplit

from .dashboard_page import PAGE

log = logging.getLogger(__name__)


class Dashboard:
    def __init__(
        self, state: Callable[[], dict], host: str = "127.0.0.1", port: int = 0, token: str | None = None
    ) -> None:
        self.state, self.token = state, token
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urlsplit(self.path)
                if not dashboard.allowed(self.headers.get("X-Ddiloco-Token"), parse_qs(url.query).get("token")):
                    self._send(401, "text/plain", b"wrong or missing token (X-Ddiloco-Token or ?token=)")
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
                log.debug("dashboard: " + format, *args)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="ddiloco-dashboard", daemon=True)

    def allowed(self, header: str | None, query: list[str] | None) -> bool:
        if self.token is None:
            return True
        given = header or (query[0] if query else None)
        return given is not None and hmac.compare_digest(self.token.encode(), given.encode())

    @property
    def url(self) -> str:
        host, port = cast(tuple[str, int], self.server.server_address[:2])  # an AF_INET address
        return f"http://{host}:{port}/"

    def start(self) -> str:
        self._thread.start()
        return self.url

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
