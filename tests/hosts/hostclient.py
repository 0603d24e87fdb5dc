"""A client that the multi-host tests run inside a host (`python hostclient.py`), so that what it asks
crosses the network of hosts (the test process itself lives in the root namespace, which has no
route to 198.18.0.0/15).

It reads one JSON request a line on stdin and answers each with one JSON line on stdout; it ends at
the end of its input, or after `LIFETIME` seconds whatever happens. Every call has a timeout.

- `{"op": "status", "address": "A:P", "token": T, "ca": PEM path or null}`: the synchronizer's Status
  over gRPC (TLS verified against `ca` when given): `{"ok": true, "status": {...}}` or
  `{"ok": false, "code": ..., "error": ...}`.
- `{"op": "bulk", "host": A, "port": P, "token": T, "ca": ...}`: one call on the bulk socket plane (a
  Fetch for a session that does not exist): the TCP connection, the TLS handshake and the token check
  all happen before the synchronizer looks at the session, so `NOT_FOUND` means all three passed.
  `{"ok": false, "code": NAME, "error": details}`.
- `{"op": "http", "url": U, "view": V or null, "token": T or null, "ca": PEM path or null}`: a GET,
  the dashboard's view credential as `X-Ddiloco-View` and the control token (which the dashboard
  refuses) as `X-Ddiloco-Token`, HTTPS verified against `ca`: `{"code": 200, "body": ...}` (JSON
  bodies parsed).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import grpc

from ddiloco.wire import auth, framing, rpc, sockets

LIFETIME = 600.0
TIMEOUT = 5.0


def _credentials(ca: str | None) -> auth.Tls | None:
    return auth.channel_credentials(Path(ca)) if ca else None


def status(req: dict) -> dict:
    channel = rpc.open_channel(req["address"], "control", 1 << 20, _credentials(req.get("ca")))
    try:
        stubs = rpc.Stubs(channel, req.get("token"))
        reply = framing.read_message(stubs.call("Status", framing.message({}), TIMEOUT))
        return {"ok": True, "status": reply}
    except grpc.RpcError as exc:
        return {"ok": False, "code": exc.code().name, "error": str(exc.details())}
    finally:
        channel.close()


def bulk(req: dict) -> dict:
    tls = _credentials(req.get("ca"))
    client = sockets.BulkSocketClient(
        req["host"], int(req["port"]), req.get("token"), 1 << 20, tls.ssl if tls is not None else None
    )
    try:
        for _ in client.fetch(TIMEOUT, session="no-such-session"):
            pass
        return {"ok": True}
    except sockets.SocketRpcError as exc:
        return {"ok": False, "code": exc.code().name, "error": exc.details()}
    except (OSError, ssl.SSLError) as exc:
        return {"ok": False, "code": type(exc).__name__, "error": str(exc)}


def http(req: dict) -> dict:
    headers = {"X-Ddiloco-View": req["view"]} if req.get("view") else {}
    if req.get("token"):
        headers["X-Ddiloco-Token"] = req["token"]
    context = ssl.create_default_context(cafile=req["ca"]) if req.get("ca") else None
    request = urllib.request.Request(req["url"], headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as r:
            code, raw, kind = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        code, raw, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    except OSError as exc:
        return {"code": None, "error": str(exc)}
    body = json.loads(raw) if "json" in kind else raw.decode(errors="replace")
    return {"code": code, "body": body}


OPS = {"status": status, "bulk": bulk, "http": http}


def main() -> None:
    timer = threading.Timer(LIFETIME, os._exit, (3,))  # a forgotten client ends by itself
    timer.daemon = True
    timer.start()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            answer = OPS[req["op"]](req)
        except Exception as exc:  # noqa: BLE001 - said to the test, which fails on it
            answer = {"ok": False, "code": "client_error", "error": repr(exc)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
