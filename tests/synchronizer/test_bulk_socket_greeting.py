"""The bulk socket plane before authentication (`synchronizer/bulk_greeting.py`, #32 item 3) and its
fetches bound to a session, over real loopback connections: connections that have not said who they
are wait in one selector thread, within caps per peer and in total and a hello deadline, and a
fetch is served only to a live session, within that session's cap."""

import contextlib
import socket
import struct
import threading
import time

import grpc
import pytest
import torch

from ddiloco.core import AlgorithmConfig
from ddiloco.synchronizer import bulk_greeting
from ddiloco.synchronizer.bulk_socket import MAX_FETCHES_PER_SESSION
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire import framing, rpc, sockets
from ddiloco.wire.timeouts import Timeouts

from ..support.runtime import RawClient
from .fuzz_support import contribution_head

pytestmark = pytest.mark.timeout(120)
NUMEL = 1 << 20
# failure 3 s: the hello deadline is the full HELLO_SECONDS, so connections outlive their opening
TIMEOUTS = Timeouts.derive(0.5)
# a hello's length (60 000 bytes, within the limit) and a good prefix: all that follows may be JSON
ENDLESS_HELLO = struct.pack("<I3sBI", 60_000, framing.MAGIC, framing.PROTOCOL_VERSION, 60_000 - framing.PREFIX_BYTES)


@pytest.fixture
def served():
    params = {"w": torch.zeros(NUMEL), "b": torch.ones(3)}
    algorithm = AlgorithmConfig(fragments=1, sync_every=4, overlap=1, quorum=1, grace=0.0, merge="mean")
    service = build_service(
        params, algorithm, ServiceSettings(timeouts=TIMEOUTS, max_learners=2, max_message_bytes=8 << 20)
    )
    server = SynchronizerServer(service, "127.0.0.1", 0, "tok", bulk_socket=True)
    server.start()
    try:
        yield service, server
    finally:
        server.stop(grace=0.2)


def _connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.handlers.bulk_port), timeout=10)


def _wait(predicate, seconds=30):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _closed_by_server(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closed (or reset) the connection within `seconds`, whatever it sent first."""
    sock.settimeout(seconds)
    try:
        for _ in range(1000):
            if not sock.recv(1 << 16):
                return True
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return False


def _head(session, version=0):
    return contribution_head(session, version)


def _push(server, session, version=0) -> dict:
    client = sockets.BulkSocketClient(
        "127.0.0.1", server.handlers.bulk_port, "tok", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN
    )
    grads = {"w": torch.full((NUMEL,), -0.5), "b": torch.zeros(3)}
    reply, _ = client.push(framing.iter_frame_parts(_head(session, version), grads, "bf16"), 30)
    return reply


class Trickler(threading.Thread):
    """Sends one byte to each of its connections every `interval` until stopped: a hello that never
    ends (`ENDLESS_HELLO`, then the spaces of its JSON header one by one)."""

    def __init__(self, socks, interval=0.1):
        super().__init__(daemon=True)
        self.socks, self.interval, self.halt = socks, interval, threading.Event()
        for s in socks:
            s.sendall(ENDLESS_HELLO)

    def run(self):
        while not self.halt.wait(self.interval):
            for s in self.socks:
                with contextlib.suppress(OSError):
                    s.send(b" ")

    def stop(self):
        self.halt.set()
        self.join(5)


def test_trickling_unauthenticated_connections_hold_no_thread_and_are_closed_at_the_hello_deadline(served):
    """#32 item 3: each such connection kept a thread (and 300 of them, 300 threads). Now they wait in
    the greeter's selector, and each is closed once its hello deadline passes, however it trickles."""
    service, server = served
    n = bulk_greeting.MAX_WAITING_PER_PEER - 2
    threads_before = threading.active_count()
    socks = [_connect(server) for _ in range(n)]
    trickler = Trickler(socks)
    trickler.start()
    try:
        _wait(lambda: len(server.bulk.greeter.waiting) == n, 10)
        assert threading.active_count() <= threads_before + 1  # the trickler only
        assert server.bulk.greeter.per_peer["127.0.0.1"] == n
        _wait(lambda: server.bulk.closed[bulk_greeting.HELLO_TIMEOUT] >= n, 10 + 3 * bulk_greeting.HELLO_SECONDS)
        assert all(_closed_by_server(s, 10) for s in socks)
        assert not server.bulk.greeter.waiting and server.bulk._greeting._value == bulk_greeting.MAX_WAITING
    finally:
        trickler.stop()
        for s in socks:
            s.close()
    assert service.bulk_slots._value == service.settings.workers - service.settings.reserved_control_workers


def test_connections_beyond_the_cap_per_peer_are_closed_at_once_and_counted(served):
    service, server = served
    cap = bulk_greeting.MAX_WAITING_PER_PEER
    socks = [_connect(server) for _ in range(cap + 5)]
    try:
        _wait(lambda: sum(server.bulk.closed.values()) + len(server.bulk.greeter.waiting) >= cap + 5, 10)
        refused = server.bulk.closed[bulk_greeting.PER_ADDRESS_CAP]
        # all but `cap` were refused at once, unless some of the first ones reached their deadline meanwhile
        assert refused + server.bulk.closed[bulk_greeting.HELLO_TIMEOUT] >= 5
        assert len(server.bulk.greeter.waiting) <= cap
        session = service.membership.register(0, "inc0", True)["session"]
        _wait(lambda: len(server.bulk.greeter.waiting) == 0, 10 + 3 * bulk_greeting.HELLO_SECONDS)
        assert _push(server, session).get("ok")  # once they are gone, the socket serves again
    finally:
        for s in socks:
            s.close()


def test_connections_beyond_the_total_cap_are_closed_at_once(served, monkeypatch):
    """The total cap, seen from one address: the cap per peer is lifted for the test."""
    service, server = served
    monkeypatch.setattr(bulk_greeting, "MAX_WAITING_PER_PEER", 10_000)
    cap = bulk_greeting.MAX_WAITING
    socks = [_connect(server) for _ in range(cap + 5)]
    try:
        _wait(lambda: sum(server.bulk.closed.values()) + len(server.bulk.greeter.waiting) >= cap + 5, 10)
        refused = service.status()["bulk"]["closed"].get(bulk_greeting.TOTAL_CAP, 0)  # as Status shows it
        assert refused + server.bulk.closed[bulk_greeting.HELLO_TIMEOUT] >= 5
        assert len(server.bulk.greeter.waiting) <= cap
    finally:
        for s in socks:
            s.close()


def test_a_push_refused_for_a_bad_frame_is_drained_without_a_thread_while_its_client_trickles(served):
    """Refused pushes whose clients keep sending are answered and drained by the greeter: they hold no
    bulk slot (item 4) and no thread either, and an honest push meanwhile is merged."""
    service, server = served
    session = service.membership.register(0, "inc0", True)["session"]
    assert _push(server, session).get("ok")  # (which also starts the stream guard's thread)
    _wait(lambda: service.core.versions[0] == 1, 10)
    n = 8
    threads_before = threading.active_count()
    socks = []
    try:
        for _ in range(n):
            s = _connect(server)
            socks.append(s)
            sockets.send_small(s, {"method": "Push", "token": "tok"}, sockets.Deadline(10))
            s.sendall(b"x" * 64)  # not a frame
            assert sockets.recv_small(s, sockets.Deadline(10))["error"] == "INVALID_ARGUMENT"
        trickler = Trickler(socks, 0.05)
        trickler.start()
        # each drained by the greeter, its call's thread gone
        _wait(lambda: len(server.bulk.greeter.waiting) == n and threading.active_count() <= threads_before + 1, 10)
        assert service.bulk_slots._value == service.settings.workers - service.settings.reserved_control_workers
        assert _push(server, session, version=1).get("ok")
        trickler.stop()
    finally:
        for s in socks:
            s.close()


def test_a_fetch_must_name_a_live_session_and_is_refused_before_any_work(served):
    service, server = served
    client = sockets.BulkSocketClient(
        "127.0.0.1", server.handlers.bulk_port, "tok", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN
    )
    refused = service.refused_rpcs
    for session in (None, "nobody", ["a list"], {"a": 1}, 7):
        if isinstance(session, str) or session is None:
            with pytest.raises(grpc.RpcError) as err:
                list(client.fetch(30, session=session))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        else:  # what no client of ours sends: the hello by hand
            s = _connect(server)
            try:
                sockets.send_small(s, {"method": "Fetch", "token": "tok", "session": session}, sockets.Deadline(10))
                assert sockets.recv_small(s, sockets.Deadline(10))["error"] == "NOT_FOUND"
            finally:
                s.close()
    assert server.bulk.served["Fetch"] == 0 and service.refused_rpcs == refused + 5
    live = service.membership.register(0, "inc0", True)["session"]
    msgs = list(client.fetch(30, session=live))
    assert [m.head["fragment"] for m in msgs] == [0]
    assert not server.bulk.fetches  # its booking ended before its end marker went out


def test_a_sessions_fetches_beyond_its_cap_are_refused(served):
    """Fetches nobody reads, all of one session: that session's cap, then RESOURCE_EXHAUSTED."""
    service, server = served
    session = service.membership.register(0, "inc0", True)["session"]
    socks = []
    try:
        for i in range(MAX_FETCHES_PER_SESSION):
            s = _connect(server)
            socks.append(s)
            sockets.send_small(s, {"method": "Fetch", "token": "tok", "session": session}, sockets.Deadline(10))
            _wait(lambda n=i + 1: server.bulk.served["Fetch"] >= n, 10)
        s = _connect(server)
        socks.append(s)
        sockets.send_small(s, {"method": "Fetch", "token": "tok", "session": session}, sockets.Deadline(10))
        head = sockets.recv_small(s, sockets.Deadline(10))
        assert head["error"] == "RESOURCE_EXHAUSTED" and "of this session" in head["details"]
        assert server.bulk.served["Fetch"] == MAX_FETCHES_PER_SESSION
    finally:
        for s in socks:
            s.close()


def test_status_shows_the_bulk_planes_refusals_by_reason(served):
    """An operator sees an attack on the bulk socket in Status (over gRPC, as `ddiloco status` reads
    it): connections closed by reason, and how many wait unauthenticated now."""
    service, server = served
    cap = bulk_greeting.MAX_WAITING_PER_PEER
    client = RawClient(server.address, "tok")
    socks = []
    try:
        for hello in ({"method": "Push", "token": "wrong"}, {"method": "Fetch", "token": "tok", "session": "x"}):
            with _connect(server) as s:
                sockets.send_small(s, hello, sockets.Deadline(10))
                assert "error" in sockets.recv_small(s, sockets.Deadline(10))
        socks += [_connect(server) for _ in range(cap + 3)]  # silent: 3 beyond the cap per address
        _wait(lambda: client.call("Status", {})["bulk"]["waiting"] >= cap - 3, 10)
        _wait(lambda: client.call("Status", {})["bulk"]["waiting"] == 0, 10 + 3 * bulk_greeting.HELLO_SECONDS)
        closed = client.call("Status", {})["bulk"]["closed"]
        assert closed["bad_token"] == 1 and closed["unknown_session"] == 1, closed
        # each silent one refused at once, or (if an earlier one had already gone) closed at its deadline
        assert closed.get(bulk_greeting.PER_ADDRESS_CAP, 0) >= 1
        assert closed.get(bulk_greeting.PER_ADDRESS_CAP, 0) + closed[bulk_greeting.HELLO_TIMEOUT] == cap + 3, closed
    finally:
        client.close()
        for s in socks:
            s.close()


def test_a_fetch_right_after_a_fetch_of_the_same_session_is_served(served):
    """A session's fetch booking ends before the end marker goes out: a learner that fetches again as
    soon as the last fetch ended is never refused by its own finished fetch (MAX_FETCHES_PER_SESSION)."""
    service, server = served
    client = sockets.BulkSocketClient(
        "127.0.0.1", server.handlers.bulk_port, "tok", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN
    )
    session = service.membership.register(0, "inc0", True)["session"]
    for _ in range(40):  # back to back: before, a few in 40 met the last one's booking
        assert [m.head["fragment"] for m in client.fetch(30, session=session)] == [0]
    assert server.bulk.served["Fetch"] == 40
