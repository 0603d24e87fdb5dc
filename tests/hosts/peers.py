"""Small TCP and UDP peers that the host tests run inside a host (`python peers.py MODE ARGS...`).

Each prints one JSON line per thing it observed and stops by itself: every wait has a timeout.
The TCP protocol is rounds of an 8-byte length, that many bytes, and an 8-byte reply with the count.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

CHUNK = 1 << 16


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        data = conn.recv(min(CHUNK, n - len(buf)))
        if not data:
            return None
        buf += data
    return bytes(buf)


def send_round(conn: socket.socket, n: int) -> None:
    block = b"x" * CHUNK
    first = min(n, CHUNK)
    conn.sendall(n.to_bytes(8, "big") + block[:first])  # one write: no Nagle wait between header and body
    left = n - first
    while left:
        conn.sendall(block[: min(left, CHUNK)])
        left -= min(left, CHUNK)


def handle(conn: socket.socket, lifetime: float) -> None:
    conn.settimeout(lifetime)
    with conn:
        try:
            while (head := recv_exact(conn, 8)) is not None:
                n = int.from_bytes(head, "big")
                got = 0
                while got < n:
                    data = conn.recv(min(CHUNK, n - got))
                    if not data:
                        return
                    got += len(data)
                conn.sendall(got.to_bytes(8, "big"))
        except OSError:
            return


def serve(addr: str, port: str, lifetime: str) -> None:
    """Answer rounds on every connection until `lifetime` seconds have passed."""
    server = socket.create_server((addr, int(port)))
    deadline = time.monotonic() + float(lifetime)
    say(ready=True)
    while (left := deadline - time.monotonic()) > 0:
        server.settimeout(left)
        try:
            conn, peer = server.accept()
        except TimeoutError:
            break
        say(accepted=peer[0])
        threading.Thread(target=handle, args=(conn, float(lifetime)), daemon=True).start()


def send(addr: str, port: str, n: str, timeout: str) -> None:
    """Connect, send one round of `n` bytes, wait for the reply; say how long it took or what failed."""
    start = time.monotonic()
    try:
        with socket.create_connection((addr, int(port)), timeout=float(timeout)) as conn:
            send_round(conn, int(n))
            reply = recv_exact(conn, 8)
        say(ok=reply is not None and int.from_bytes(reply, "big") == int(n), elapsed=time.monotonic() - start)
    except TimeoutError:
        say(ok=False, error="timeout")
    except OSError as e:
        say(ok=False, error=repr(e))


def hold(addr: str, port: str, cut_wait: str, heal_wait: str) -> None:
    """One connection across a cut: a round, then (on a stdin line) a round whose reply is awaited
    `cut_wait` s, then (on another line) the rest of the wait, up to `heal_wait` s."""
    conn = socket.create_connection((addr, int(port)), timeout=30.0)
    send_round(conn, 1)
    say(phase="connected", replied=recv_exact(conn, 8) is not None)
    sys.stdin.readline()
    send_round(conn, 1000)
    conn.settimeout(float(cut_wait))
    try:
        reply = recv_exact(conn, 8)
    except TimeoutError:
        reply = None
    say(phase="cut", replied=reply is not None)
    sys.stdin.readline()
    if reply is None:
        conn.settimeout(float(heal_wait))
        try:
            reply = recv_exact(conn, 8)
        except TimeoutError:
            reply = None
    say(phase="healed", replied=reply is not None and int.from_bytes(reply, "big") == 1000)


def rtt(addr: str, port: str, rounds: str) -> None:
    """One connection, `rounds` one-byte rounds; say each round trip's seconds."""
    with socket.create_connection((addr, int(port)), timeout=60.0) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(int(rounds)):
            start = time.monotonic()
            send_round(conn, 1)
            if recv_exact(conn, 8) is None:
                break
            times.append(time.monotonic() - start)
    say(rtts=times)


def udp_recv(addr: str, port: str, lifetime: str) -> None:
    """Say `got` for each datagram until `lifetime` s pass (or the test ends this process)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((addr, int(port)))
    deadline = time.monotonic() + float(lifetime)
    say(ready=True)
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data, peer = sock.recvfrom(2048)
        except TimeoutError:
            break
        say(got=data.decode(), peer=peer[0])


def udp_send(addr: str, port: str, count: str, tag: str) -> None:
    """`count` datagrams that say `tag`, so the receiver tells which sending it got."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(int(count)):
        sock.sendto(tag.encode(), (addr, int(port)))
        time.sleep(0.01)
    say(sent=int(count))


MODES = {"serve": serve, "send": send, "hold": hold, "rtt": rtt, "udp-recv": udp_recv, "udp-send": udp_send}

if __name__ == "__main__":
    MODES[sys.argv[1]](*sys.argv[2:])
