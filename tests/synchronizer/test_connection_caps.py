"""Connection floods against a live synchronizer on loopback (#46): silent connections to the gRPC port
are capped per address and in total (`grpc_front`), the bulk socket's waiting places go to whoever
holds the fewest (`bulk_greeting`), and one session holds at most one fetch place (`bulk_socket`).
Flood and honest clients come from different loopback addresses (127.0.0.x) where a test needs it."""

from __future__ import annotations

import contextlib
import socket
import time

import grpc
import pytest
import torch

from ddiloco.core import AlgorithmConfig
from ddiloco.synchronizer import bulk_greeting, bulk_socket
from ddiloco.synchronizer.grpc_front import PREFACE
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire import framing, rpc, sockets

from ..support.runtime import RawClient
from .fuzz_support import contribution_head

pytestmark = pytest.mark.timeout(180)
NUMEL = 1 << 20
TOKEN = "tok"
SMALL_BUFFER = 4096  # a fetch of NUMEL parameters blocks on these buffers until it is read


@contextlib.contextmanager
def synchronizer(**settings):
    params = {"w": torch.zeros(NUMEL), "b": torch.ones(3)}
    algorithm = AlgorithmConfig(fragments=1, sync_every=4, overlap=1, quorum=1, grace=0.0, merge="mean")
    service = build_service(params, algorithm, ServiceSettings(max_learners=4, max_message_bytes=8 << 20, **settings))
    server = SynchronizerServer(service, "127.0.0.1", 0, TOKEN, bulk_socket=True)
    address = server.start()
    try:
        yield service, server, address
    finally:
        server.stop(grace=0.2)


@contextlib.contextmanager
def connections():
    """Sockets a test opens; all closed at the end."""
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for s in opened:
            s.close()


def connect(port: int, source: str, opened: list[socket.socket], rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    opened.append(s)
    s.bind((source, 0))
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server has closed `s` (without waiting)."""
    s.setblocking(False)
    try:
        return s.recv(1 << 16) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def wait_until(predicate, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    for _ in range(100_000):
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return False


def test_silent_grpc_connections_beyond_the_caps_are_closed_and_honest_clients_are_served():
    """40 silent connections from two addresses against caps of 8 per address and 12 in all (and a
    preface deadline of 60 s, so only the caps close them): all but 12 are closed by the synchronizer
    (gRPC alone held every one until its 120 s handshake deadline), while a new channel from a flooding
    address and an HTTP/2 client from another one are served, and stay served as the flood goes on."""
    with synchronizer(grpc_waiting=12, grpc_waiting_per_address=8, grpc_preface_seconds=60.0) as (_, server, address):
        port = int(address.rsplit(":", 1)[1])
        with connections() as opened:
            flood = [connect(port, source, opened) for source in ("127.0.0.1", "127.0.0.3") for _ in range(20)]
            assert wait_until(lambda: sum(closed_by_server(s) for s in flood) >= 40 - 12), "the caps closed none"
            assert server.front is not None and server.front.waiting <= 12
            client = RawClient(address, TOKEN)  # from 127.0.0.1, a flooding address
            try:
                assert "merges" in client.call("Status", {}, timeout=30)
                other = connect(port, "127.0.0.2", opened)
                other.sendall(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # the preface, empty SETTINGS
                other.settimeout(30)
                assert other.recv(9)[3] == 0x04  # gRPC's SETTINGS: it reached gRPC
                flood += [connect(port, "127.0.0.1", opened) for _ in range(20)]  # and the flood goes on
                assert wait_until(lambda: sum(closed_by_server(s) for s in flood) >= 60 - 12)
                assert "merges" in client.call("Status", {}, timeout=30)  # its channel was not one of them
            finally:
                client.close()


def test_a_flood_of_the_bulk_sockets_waiting_places_from_some_addresses_does_not_refuse_another(monkeypatch):
    """Every waiting place held by silent connections from four addresses (4 x 4 = 16 places): a push
    from a fifth address, and one from a flooding address, still go through the socket plane (each
    connection beyond a cap now takes the place of the oldest from the address holding the most;
    before, it was closed at once and the push refused)."""
    monkeypatch.setattr(bulk_greeting, "MAX_WAITING", 16)
    monkeypatch.setattr(bulk_greeting, "MAX_WAITING_PER_PEER", 4)
    monkeypatch.setattr(bulk_socket, "HELLO_SECONDS", 60.0)  # the flood holds its places for the test
    with synchronizer() as (service, server, _):
        assert server.bulk is not None
        port = server.handlers.bulk_port
        sessions = [service.membership.register(m, f"inc{m}", True)["session"] for m in (0, 1)]
        with connections() as opened:
            for source in ("127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"):
                for _ in range(4):
                    connect(port, source, opened)
            assert wait_until(lambda: len(server.bulk.greeter.waiting) == 16)
            for n, source in enumerate(("127.0.0.2", "127.0.0.3"), start=1):
                reply = push_from(source, port, sessions[n - 1], service.core.versions[0], opened)
                assert reply.get("ok") is True, reply
                assert server.bulk.served["Push"] == n  # on the socket plane
            assert len(server.bulk.greeter.waiting) <= 16


def push_from(source: str, port: int, session: str, version: int, opened: list[socket.socket]) -> dict:
    """A well-formed push on the bulk socket, by hand from `source`: the synchronizer's reply."""
    s = connect(port, source, opened)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    deadline = sockets.Deadline(30)
    sockets.send_small(s, {"method": "Push", "token": TOKEN}, deadline)
    grads = {"w": torch.full((NUMEL,), -0.5), "b": torch.zeros(3)}
    for parts in framing.iter_frame_parts(contribution_head(session, version), grads, "bf16"):
        sockets.send_frame(s, parts, deadline)
    return sockets.recv_small(s, deadline)


def test_one_session_holds_at_most_one_fetch_place_so_two_cannot_hold_them_all():
    """Two sessions open fetches they never read, two each: one of each is served and one refused, so
    a third session's fetch still finds a place (with two per session, the two held all four places)."""
    with synchronizer() as (service, server, _):
        assert server.bulk is not None
        server.bulk.listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)  # accepted ones inherit it
        port = server.handlers.bulk_port
        squatters = [service.membership.register(m, f"inc{m}", True)["session"] for m in (1, 2)]
        with connections() as opened:
            for session in squatters:
                for _ in range(2):
                    s = connect(port, "127.0.0.3", opened, rcvbuf=SMALL_BUFFER)
                    sockets.send_small(s, {"method": "Fetch", "token": TOKEN, "session": session}, sockets.Deadline(10))
            capped = lambda: server.bulk.closed  # noqa: E731
            assert wait_until(lambda: server.bulk.served["Fetch"] + capped()[bulk_socket.SESSION_FETCH_CAP] >= 4)
            assert server.bulk.served["Fetch"] == 2 and capped()[bulk_socket.SESSION_FETCH_CAP] == 2
            honest = service.membership.register(0, "inc0", True)["session"]
            client = sockets.BulkSocketClient("127.0.0.1", port, TOKEN, framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN)
            try:
                msgs = list(client.fetch(60, session=honest))
            except grpc.RpcError as exc:
                pytest.fail(f"a third session's fetch was refused: {exc}")
            assert [m.head["fragment"] for m in msgs] == [0]
