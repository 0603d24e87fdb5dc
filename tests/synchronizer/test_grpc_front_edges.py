"""The gRPC front's refusals, each on a real listening socket on 127.0.0.1 (no gRPC server behind it
needed): bytes that are not HTTP/2's preface, a connection that closes before its preface, the relay cap,
and a port already taken."""

from __future__ import annotations

import socket
import time

import pytest

from ddiloco.synchronizer import grpc_front
from ddiloco.synchronizer.grpc_front import BAD_PREFACE, PREFACE, RELAY_CAP, GrpcFront


@pytest.fixture()
def front():
    f = GrpcFront("127.0.0.1", 0, tls=False, per_address=4, total=8, preface_seconds=30.0)
    f.start()
    yield f
    f.stop()


def closed_by_peer(sock: socket.socket, timeout: float = 10.0) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return bool(condition())


def test_bytes_that_are_not_the_http2_preface_are_closed_and_counted(front):
    with socket.create_connection(("127.0.0.1", front.port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert closed_by_peer(s)
    assert wait_until(lambda: front.closed[BAD_PREFACE] == 1)
    assert front.waiting == 0 and front.by_peer == {}


def test_a_connection_that_closes_before_its_preface_is_forgotten(front):
    s = socket.create_connection(("127.0.0.1", front.port), timeout=5)
    s.sendall(PREFACE[:5])  # a start, then nothing more
    assert wait_until(lambda: front.waiting == 1)
    s.close()
    assert wait_until(lambda: front.waiting == 0 and front.by_peer == {})
    assert sum(front.closed.values()) == 0  # not a refusal: the peer left


def test_past_the_relay_cap_a_whole_preface_is_closed(front):
    front.max_relayed = 0  # no room to relay: as when every descriptor of the budget is in use
    with socket.create_connection(("127.0.0.1", front.port), timeout=5) as s:
        s.sendall(PREFACE)
        assert closed_by_peer(s)
    assert wait_until(lambda: front.closed[RELAY_CAP] == 1)


def test_a_port_already_taken_is_refused_naming_it():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            GrpcFront("127.0.0.1", port, tls=False, per_address=4, total=8, preface_seconds=5.0)
    finally:
        taken.close()


def test_the_fd_limit_is_raised_to_the_hard_one_where_allowed():
    soft = grpc_front.raise_fd_limit()
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert soft == (hard if hard != resource.RLIM_INFINITY else 1 << 20)
