"""The dashboard keeps the run's token secret and one address cannot lock others out (issue 46): it
reads with a view credential and never takes the control token, serves HTTPS with the gRPC plane's
certificate when the run has TLS, logs no credential, and caps the connections of one address."""

from __future__ import annotations

import logging
import shutil
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest

from ddiloco.launch.dashauth import redact, view_credential
from ddiloco.launch.dashboard import Dashboard
from ddiloco.wire import auth, framing, rpc

from ..support.processes import start_synchronizer
from ..support.runtime import wait_for

TOKEN = "control-s3cret-0123456789"


def get(url: str, headers: dict | None = None, context: ssl.SSLContext | None = None) -> int | None:
    """The status of one GET; None when the connection was closed without an answer."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10, context=context):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def test_the_view_credential_reads_and_the_control_token_is_refused_and_never_logged(caplog):
    board = Dashboard(lambda: {"version": 1}, token=TOKEN)
    url = board.start()
    base = board.url
    view = view_credential(TOKEN)
    try:
        assert url == f"{base}?view={view}" and TOKEN not in url  # the URL the user is told to open
        assert get(url) == 200 and get(base + "state.json", {"X-Ddiloco-View": view}) == 200
        assert get(base + "state.json") == 401
        assert get(base + "state.json", {"X-Ddiloco-Token": TOKEN}) == 401  # the control token opens nothing here
        with caplog.at_level(logging.DEBUG, logger="ddiloco.launch.dashboard"):
            assert get(f"{base}state.json?token={TOKEN}") == 401
            assert get(f"{base}state.json?view={view}") == 200
        # a read-only view: nothing but GET is served, whoever asks
        request = urllib.request.Request(base + "stop", data=b"", headers={"X-Ddiloco-View": view}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 501
    finally:
        board.stop()
    logged = caplog.text
    assert "state.json" in logged  # the request lines were logged ...
    assert TOKEN not in logged and view not in logged  # ... without either credential
    assert redact(f"/x?a=1&token={TOKEN}&view={view}") == "/x?a=1&token=<redacted>&view=<redacted>"


def make_cert(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not available to make a test certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "1", "-subj", "/CN=ddiloco-test", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def printed_url(stdout: Path) -> str | None:
    """The dashboard's address as the synchronizer printed it (`dashboard: URL`)."""
    words = stdout.read_text().split() if stdout.is_file() else []
    return next((w for w in words if w.startswith("http")), None)


def plain_http_answer(port: int) -> bytes:
    """What a plain-HTTP request with the control token gets back (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET /state.json HTTP/1.1\r\nHost: x\r\nX-Ddiloco-Token: {TOKEN}\r\n\r\n".encode())
        chunks = []
        for _ in range(64):
            try:
                chunk = s.recv(4096)
            except (ConnectionError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.mark.timeout(180)
def test_with_tls_the_dashboard_is_https_with_the_runs_certificate_and_the_view_cannot_stop(
    tmp_path, shakespeare, procs
):
    cert, key = make_cert(tmp_path)
    tls = ("--tls-cert", str(cert), "--tls-key", str(key), "--token", TOKEN)
    _, address = start_synchronizer(procs, tmp_path, shakespeare, 2, 0, "--dashboard", "--duration", "120", *tls)
    stdout = tmp_path / "sync" / "stdout.log"
    line = wait_for(lambda: printed_url(stdout), 60, 0.1, "the dashboard's address")
    view = view_credential(TOKEN)
    assert line.startswith("https://127.0.0.1:") and line.endswith(f"?view={view}") and TOKEN not in line
    port = int(line.split(":")[2].split("/")[0])
    trusted = ssl.create_default_context(cafile=str(cert))
    assert get(line, context=trusted) == 200  # verified against the run's certificate, by IP
    assert get(f"https://127.0.0.1:{port}/state.json", {"X-Ddiloco-Token": TOKEN}, trusted) == 401
    served = ssl.get_server_certificate(("127.0.0.1", port), timeout=10)
    assert ssl.PEM_cert_to_DER_cert(served) == ssl.PEM_cert_to_DER_cert(cert.read_text())
    assert b"HTTP/1." not in plain_http_answer(port)  # plain HTTP: no answer, the token refused unread
    # the view credential is no control credential: the synchronizer refuses Stop with it
    channel = rpc.open_channel(address, "control", framing.DEFAULT_CHUNK_BYTES, auth.channel_credentials(cert))
    try:
        with pytest.raises(grpc.RpcError) as refused:
            rpc.Stubs(channel, view).call("Stop", framing.message({"reason": "a viewer"}), 10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        framing.read_message(rpc.Stubs(channel, TOKEN).call("Stop", framing.message({"reason": "test"}), 10))
    finally:
        channel.close()


def test_connections_of_one_address_leave_room_for_another():
    board = Dashboard(lambda: {"version": 1}, token=TOKEN)
    board.start()
    host, port = board.server.server_address[:2]
    cap = board.server.max_connections
    view = view_credential(TOKEN)
    try:
        with ExitStack() as stack:
            for _ in range(cap + 8):  # more silent connections from 127.0.0.1 than the dashboard serves in all
                stack.enter_context(socket.create_connection((host, port), timeout=10))
            wait_for(
                lambda: board.server.active + board.server.refused >= cap + 8,
                30,
                0.05,
                "every silent connection taken or refused",
            )
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
                other.settimeout(10)
                other.bind(("127.0.0.2", 0))  # another client address (loopback is 127.0.0.0/8)
                other.connect((host, port))
                other.sendall(f"GET /state.json HTTP/1.0\r\nX-Ddiloco-View: {view}\r\n\r\n".encode())
                answer = b""
                for _ in range(64):
                    chunk = other.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            assert answer.startswith(b"HTTP/1.0 200"), answer[:100]
    finally:
        board.stop()
