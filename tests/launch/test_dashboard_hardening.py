"""The dashboard under clients that cost it without asking for anything (issue 32, item 6): silent
connections are capped and timed out, and clients that hang up leave no tracebacks and few lines."""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack

from ddiloco.launch.dashauth import view_credential
from ddiloco.launch.dashboard import HANDLER_THREAD, Dashboard

from ..support.runtime import wait_for

TOKEN = "s3cret"


def handler_threads() -> int:
    return sum(t.name == HANDLER_THREAD and t.is_alive() for t in threading.enumerate())


def honest_get(url: str) -> int | None:
    """The status of one GET of state.json with the view credential, or None if the connection was dropped."""
    request = urllib.request.Request(url + "state.json", headers={"X-Ddiloco-View": view_credential(TOKEN)})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def test_silent_connections_are_capped_and_timed_out_and_an_honest_client_gets_in():
    cap, silent = 8, 40
    board = Dashboard(lambda: {"version": 1}, token=TOKEN, read_timeout=1.0, max_connections=cap)
    board.start()
    url = board.url
    host, port = board.server.server_address[:2]
    try:
        with ExitStack() as stack:
            for _ in range(silent):  # connect and say nothing
                s = stack.enter_context(socket.create_connection((host, port), timeout=10))
                s.settimeout(10)
            wait_for(lambda: board.server.refused >= silent - cap, 30, 0.05, "the connections beyond the cap refused")
            assert board.server.active <= cap and handler_threads() <= cap
            # the silent ones time out and give their slots back: an honest client then gets its answer
            deadline = time.monotonic() + 30
            status = None
            while status != 200 and time.monotonic() < deadline:
                status = honest_get(url)
                assert board.server.active <= cap and handler_threads() <= cap
                if status != 200:
                    time.sleep(0.2)
            assert status == 200
        wait_for(lambda: board.server.active == 0, 30, 0.05, "every connection's slot given back")
    finally:
        board.stop()


def test_clients_that_hang_up_leave_no_traceback_and_few_lines(capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="ddiloco.launch.dashboard")
    board = Dashboard(lambda: {"version": 1}, token=TOKEN)
    board.start()
    host, port = board.server.server_address[:2]
    partial = b"GET /state.json HTTP/1.1\r\nHost: abc\r\n"  # 37 bytes: the headers never end
    assert len(partial) == 37
    sent = 0
    try:
        started = time.monotonic()
        for _ in range(200):
            with socket.create_connection((host, port), timeout=10) as s:
                s.sendall(partial)
                sent += len(partial)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
        # every connection is served and gone: whatever it logs has been logged
        wait_for(lambda: board.server.active == 0, 30, 0.05, "the hung-up connections served")
        elapsed = time.monotonic() - started
        assert honest_get(board.url) == 200
    finally:
        board.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Traceback" not in caplog.text
    lines = [r for r in caplog.records if r.name == "ddiloco.launch.dashboard"]
    assert len(lines) <= 20 + 5 * elapsed + 2  # the rate limit: a burst of 20, then 5 a second
    assert len(err.encode()) + len(caplog.text.encode()) < sent  # far less than the 42x the issue measured


def test_a_client_trickling_its_request_is_cut_at_the_request_deadline():
    """Each byte arrives within the read timeout, so only a deadline for the whole request frees the
    place of a client that trickles one byte at a time (it would otherwise keep it for as long as the
    request line and 100 header lines of 64 kB take)."""
    board = Dashboard(lambda: {"version": 1}, token=TOKEN, read_timeout=1.0, request_seconds=2.0)
    board.start()
    host, port = board.server.server_address[:2]
    try:
        with socket.create_connection((host, port), timeout=10) as s:
            started, cut = time.monotonic(), None
            for byte in (b"GET /state.json HTTP/1.1\r\nX-Pad: " + b"a" * 200)[:100]:  # 0.2 s apart: 20 s in all
                try:
                    s.sendall(bytes([byte]))
                    readable, _, _ = select.select([s], [], [], 0.2)
                    closed = bool(readable) and s.recv(1 << 16) == b""  # by the server (any answer first)
                except OSError:  # reset by the server
                    closed = True
                if closed:
                    cut = time.monotonic() - started
                    break
            assert cut is not None and cut < 2.0 + 4.0, cut  # the deadline, plus a loaded machine's slack
        wait_for(lambda: board.server.active == 0, 30, 0.05, "its place given back")
    finally:
        board.stop()


def test_the_serving_loop_survives_an_unexpected_exception_and_says_so_once(caplog):
    """#32: no background thread dies silently. The server's loop raising is logged with its
    traceback, the loop starts again (backoff) and serves, and `stop` still ends it."""
    caplog.set_level(logging.DEBUG, logger="ddiloco.launch.dashboard")
    board = Dashboard(lambda: {"version": 1}, token=TOKEN)
    loops = []
    original = board.server.service_actions

    def failing() -> None:  # called by serve_forever every round
        loops.append(1)
        if len(loops) == 1:
            raise RuntimeError("an unexpected bug")
        original()

    board.server.service_actions = failing
    board.start()
    try:
        wait_for(lambda: len(loops) >= 2, 30, 0.05, "the serving loop started again")
        assert honest_get(board.url) == 200
    finally:
        board.stop()
    assert not board._thread.is_alive()
    failed = [r for r in caplog.records if "dashboard server failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None
