"""A learner pushes on the synchronizer's bulk socket plane when it offers one (`learner.uplink`)."""

import contextlib
import socket
import threading
import time

import pytest
import torch

from ddiloco.core import AlgorithmConfig
from ddiloco.learner import uplink as uplink_module
from ddiloco.learner.client import LearnerClient
from ddiloco.learner.uplink import Uplink
from ddiloco.learner.wan import WanLink
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire import auth, framing, rpc

from ..support.runtime import FAST, mlp_run, train_until_accepted
from ..wire.test_auth import _self_signed

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def short_link_at_any_load(monkeypatch):
    """Loopback is a short link, but a loaded machine can stretch a heartbeat's round trip past
    `BULK_MAX_ROUND_TRIP`, and the learner then (rightly) pushes over gRPC. The tests that assert the
    socket carries the pushes lift the line; the switch itself is tested on its own, below."""
    monkeypatch.setattr(uplink_module, "BULK_MAX_ROUND_TRIP", 60.0)
    monkeypatch.setattr(uplink_module, "BULK_RETURN_ROUND_TRIP", 30.0)


def test_a_learner_pushes_on_the_bulk_socket_and_counts_what_arrived(short_link_at_any_load):
    with mlp_run(width=256, bulk_socket=True) as (service, client, model):
        assert client.links[0].uplink.socket is not None
        assert train_until_accepted(client, model, 6) >= 6
        client.finish(timeout=30)
        stats = client.links[0].stats
        assert service.server.bulk.served["Push"] == stats.pushed >= 6
        assert stats.bytes_pushed == service.traffic.bytes_received > 0
        assert all(v >= 1 for v in client.core.versions)


def test_tls_covers_the_bulk_socket_too(tmp_path, short_link_at_any_load):
    cert, key = _self_signed(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    service = build_service(
        params, AlgorithmConfig(fragments=2, sync_every=4, overlap=1), ServiceSettings(timeouts=FAST, tokens=10**9)
    )
    server = SynchronizerServer(service, "127.0.0.1", 0, "tok", auth.server_credentials(cert, key), bulk_socket=True)
    address = server.start()
    try:
        with LearnerClient(
            model, address, 0, token="tok", timeouts=FAST, report_every=1e9, credentials=auth.channel_credentials(cert)
        ) as client:
            bulk = client.links[0].uplink.socket
            assert bulk.tls is not None
            assert train_until_accepted(client, model, 2) >= 2
        assert server.bulk.served["Push"] >= 2
        # every connection after the first resumed the last one's session (no signature, no check)
        assert bulk.resumed >= 1
    finally:
        server.stop(grace=0.2)


def test_bare_grpc_credentials_cannot_serve_the_bulk_socket(tiny_task, tmp_path):
    cert, key = _self_signed(tmp_path)
    params = {n: p.detach() for n, p in tiny_task.build_model(0).named_parameters()}
    service = build_service(params, AlgorithmConfig(fragments=2), ServiceSettings(timeouts=FAST))
    server = SynchronizerServer(service, "127.0.0.1", 0, None, auth.server_credentials(cert, key).grpc)
    assert server.bulk_socket is False  # bulk on gRPC only
    uplink = Uplink(None, auth.channel_credentials(cert).grpc, 1 << 22, WanLink())
    uplink.configure("127.0.0.1:1", {"bulk_port": 5000})
    assert uplink.socket is None  # a learner with bare gRPC TLS credentials stays on gRPC


def test_an_unreachable_bulk_port_falls_back_to_grpc():
    with mlp_run(width=64, bulk_socket=False) as (service, client, model):
        link = client.links[0]
        session = link.session
        dead = Uplink(None, None, 1 << 22, WanLink())
        dead.configure(link.address, {"bulk_port": _free_port()})
        head = _contribution_head(session)
        names = service.core.plan.names[0]
        grads = {n: torch.zeros(service.shapes[n]) for n in names}
        reply, sent = dead.push(link.bulk, head, grads, "bf16", framing.DEFAULT_CHUNK_BYTES, 30)
        assert not dead.on_socket() and sent > 0  # set aside for a while (see the next test)
        assert reply.get("ok") or "reason" in reply  # gRPC answered it
        assert service.traffic.bytes_received >= sent


def test_an_unreachable_bulk_socket_is_tried_again_after_a_pause(monkeypatch):
    """#46: a connection flood sometimes left a learner's bulk socket unreachable for a moment, and the
    learner gave it up until it registered again. Now it is set aside for a pause, then tried again:
    here the port answers only after the first push (a forwarder to the synchronizer's bulk port)."""
    monkeypatch.setattr(uplink_module, "SOCKET_RETRY_SECONDS", 0.3)
    with mlp_run(width=64, bulk_socket=True) as (service, client, model):
        link = client.links[0]
        port = _free_port()
        uplink = Uplink(None, None, 1 << 22, WanLink())
        uplink.configure(link.address, {"bulk_port": port})
        grads = {n: torch.zeros(service.shapes[n]) for n in service.core.plan.names[0]}
        served = service.server.bulk.served["Push"]
        head = _contribution_head(link.session)
        reply, _ = uplink.push(link.bulk, head, grads, "bf16", framing.DEFAULT_CHUNK_BYTES, 30)
        assert service.server.bulk.served["Push"] == served and not uplink.on_socket()  # over gRPC
        with _forward(port, service.server.bulk.port):
            for _ in range(100):  # the pause, bounded
                if uplink.on_socket():
                    break
                time.sleep(0.05)
            head = {**head, "step": 2, "position": 2}
            reply, _ = uplink.push(link.bulk, head, grads, "bf16", framing.DEFAULT_CHUNK_BYTES, 30)
        assert service.server.bulk.served["Push"] == served + 1  # on the socket again
        assert reply.get("ok") or "reason" in reply


@contextlib.contextmanager
def _forward(port: int, to: int):
    """Connections to 127.0.0.1:`port` relayed to `to` (both ways), while the block runs."""
    listener = socket.create_server(("127.0.0.1", port))
    listener.settimeout(0.1)
    halt = threading.Event()
    opened: list[socket.socket] = []

    def pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            for _ in range(1 << 20):
                data = a.recv(1 << 16)
                if not data:
                    break
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def accept() -> None:
        for _ in range(10_000):
            if halt.is_set():
                return
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(30)
            up = socket.create_connection(("127.0.0.1", to), timeout=30)
            opened.extend((conn, up))
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield
    finally:
        halt.set()
        acceptor.join(5)
        listener.close()
        for s in opened:
            s.close()


def _contribution_head(session: str | None) -> dict:
    """The header of a one-step contribution to fragment 0 at version 0."""
    return {
        "kind": "contribution",
        "session": session,
        "fragment": 0,
        "base_version": 0,
        "steps": 1,
        "tokens": 1,
        "seconds": 0.1,
        "step_time": 0.1,
        "step": 1,
        "position": 1,
    }


def _free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_the_register_reply_names_the_bulk_port_only_when_served():
    for bulk_socket in (False, True):
        with mlp_run(bulk_socket=bulk_socket) as (service, client, model):
            port = client.links[0].info.get("bulk_port")
            assert (port == service.server.bulk.port) if bulk_socket else port is None
    assert rpc.FRAME_MARGIN > 0


def test_a_push_the_flooded_bulk_socket_drops_goes_over_grpc_and_the_socket_stays_first_choice(caplog):
    """Connections that never say who they are fill the bulk socket's greeting places (taken here
    directly, as 32 silent connections would); the synchronizer then closes every new connection at
    once. The learner's push goes over gRPC instead, says so, and keeps the socket for the next (#32)."""
    with mlp_run(width=64, bulk_socket=True) as (service, client, model):
        link = client.links[0]
        uplink = Uplink(None, None, 1 << 22, WanLink())  # the run has no token
        uplink.configure(link.address, link.info)
        assert uplink.socket is not None
        head = _contribution_head(link.session)
        grads = {n: torch.zeros(service.shapes[n]) for n in service.core.plan.names[0]}
        greeting = service.server.bulk._greeting
        taken = 0
        while greeting.acquire(blocking=False):
            taken += 1
        try:
            received = service.traffic.bytes_received
            with caplog.at_level("WARNING", logger="ddiloco.learner.uplink"):
                reply, sent = uplink.push(link.bulk, head, grads, "bf16", framing.DEFAULT_CHUNK_BYTES, 30)
        finally:
            for _ in range(taken):
                greeting.release()
        assert taken > 0 and uplink.fallbacks == 1
        assert reply.get("ok") or "reason" in reply  # gRPC answered it
        assert service.traffic.bytes_received - received >= sent > 0
        assert uplink.socket is not None  # the socket is tried first again next time
        assert any("goes over gRPC" in r.getMessage() for r in caplog.records)


def test_behind_a_long_round_trip_pushes_go_over_grpc_and_return_to_the_socket_on_a_short_one(caplog):
    """A bulk push opens a connection of its own (three round trips or more); on a real 100 ms link
    that made each push 0.7 s against 0.23 s over gRPC's kept connection (docs/results.md)."""
    from ddiloco.learner.overlap import LinkTime
    from ddiloco.learner.uplink import BULK_MAX_ROUND_TRIP, BULK_RETURN_ROUND_TRIP

    with mlp_run(width=64, bulk_socket=True) as (service, client, model):
        link = client.links[0]
        times = LinkTime(alpha=1.0)
        uplink = Uplink(None, None, 1 << 22, WanLink(), times)
        uplink.configure(link.address, link.info)
        head = _contribution_head(link.session)
        grads = {n: torch.zeros(service.shapes[n]) for n in service.core.plan.names[0]}

        def push_on_socket() -> bool:
            before = service.server.bulk.served["Push"]
            reply, sent = uplink.push(link.bulk, head, grads, "bf16", framing.DEFAULT_CHUNK_BYTES, 30)
            assert sent > 0 and (reply.get("ok") or "reason" in reply)
            return service.server.bulk.served["Push"] == before + 1

        assert push_on_socket()  # nothing measured yet: the socket
        with caplog.at_level("INFO", logger="ddiloco.learner.uplink"):
            times.observe_round_trip(0.2)
            assert not push_on_socket() and uplink.long_link
            times.observe_round_trip((BULK_MAX_ROUND_TRIP + BULK_RETURN_ROUND_TRIP) / 2)  # inside the band: stays
            assert not push_on_socket()
            times.observe_round_trip(BULK_RETURN_ROUND_TRIP / 2)
            assert push_on_socket() and not uplink.long_link
        said = [r.getMessage() for r in caplog.records]
        assert any("round trip 200.0 ms: pushing over gRPC" in m for m in said)
        assert any("pushing over the bulk socket again" in m for m in said)
