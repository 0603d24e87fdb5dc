"""What a link really delivers, measured with real TCP between two hosts: the round trip of one byte
(min and median of a few) and the throughput each way over a fixed time from a cold connection
(slow start included, as a run's first push would see it).

Run inside hosts by the network's user: `python -m ddiloco.hosts.probe serve HOST PORT` prints its
port and serves until stdin closes (or at most SERVE_LIMIT_S); `python -m ddiloco.hosts.probe measure
HOST PORT SECONDS` prints one JSON line and ends. Every socket wait has a timeout.
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import sys
import threading
import time

CHUNK = 1 << 16
PINGS = 8
SOCKET_TIMEOUT_S = 30.0
SERVE_LIMIT_S = 3600.0
MAX_SECONDS = 60.0


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        data = conn.recv(n - len(buf))
        if not data:
            raise ConnectionError("closed early")
        buf += data
    return bytes(buf)


def _serve_one(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(SOCKET_TIMEOUT_S)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        kind = conn.recv(1)
        if kind == b"p":  # echo single bytes until the client closes
            while byte := conn.recv(1):
                conn.sendall(byte)
        elif kind == b"u":  # count what arrives until the client's end of stream, then say how much
            total = 0
            while data := conn.recv(CHUNK):
                total += len(data)
            conn.sendall(struct.pack("!Q", total))
        elif kind == b"d":  # send for the asked number of seconds, then close
            seconds = min(MAX_SECONDS, struct.unpack("!d", _recv_exact(conn, 8))[0])
            block, end = b"\0" * CHUNK, time.monotonic() + seconds
            while time.monotonic() < end:
                conn.sendall(block)


def serve(host: str, port: int) -> None:
    listener = socket.create_server((host, port))
    listener.settimeout(1.0)
    print(listener.getsockname()[1], flush=True)
    closed = threading.Event()

    def watch_stdin() -> None:  # the caller closes our stdin to end the server
        sys.stdin.read()
        closed.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    end = time.monotonic() + SERVE_LIMIT_S
    while not closed.is_set() and time.monotonic() < end:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()


def _connect(host: str, port: int, kind: bytes) -> socket.socket:
    conn = socket.create_connection((host, port), timeout=SOCKET_TIMEOUT_S)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.sendall(kind)
    return conn


def measure(host: str, port: int, seconds: float) -> dict[str, float]:
    """Round trip in ms (min, median of PINGS), and Mbit/s up (to `host`) and down (from it)."""
    rtts = []
    with _connect(host, port, b"p") as conn:
        for _ in range(PINGS):
            t = time.perf_counter()
            conn.sendall(b"x")
            _recv_exact(conn, 1)
            rtts.append((time.perf_counter() - t) * 1e3)
    with _connect(host, port, b"u") as conn:
        block, t = b"\0" * CHUNK, time.perf_counter()
        while time.perf_counter() - t < seconds:
            conn.sendall(block)
        conn.shutdown(socket.SHUT_WR)
        sent = struct.unpack("!Q", _recv_exact(conn, 8))[0]
        up = sent * 8 / (time.perf_counter() - t) / 1e6
    with _connect(host, port, b"d" + struct.pack("!d", seconds)) as conn:
        got, t = 0, time.perf_counter()
        while data := conn.recv(CHUNK):
            got += len(data)
        down = got * 8 / (time.perf_counter() - t) / 1e6
    return {
        "rtt_ms_min": round(min(rtts), 2),
        "rtt_ms_median": round(statistics.median(rtts), 2),
        "up_mbit_s": round(up, 1),
        "down_mbit_s": round(down, 1),
        "seconds_each_way": seconds,
    }


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[0] == "serve":
        serve(argv[1], int(argv[2]))
    elif len(argv) == 4 and argv[0] == "measure":
        print(json.dumps(measure(argv[1], int(argv[2]), float(argv[3]))), flush=True)
    else:
        raise SystemExit("usage: probe serve HOST PORT | probe measure HOST PORT SECONDS")


if __name__ == "__main__":
    main(sys.argv[1:])
