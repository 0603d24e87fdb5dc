"""Bulk socket connections kept between calls (`wire.kept`, `Greeter.keep`), over real loopback
connections: reused while open, every call's hello still checked, replaced when the synchronizer has
closed one, and a push on a connection that breaks under it applied exactly once."""

import socket
import struct

import grpc
import pytest
import torch

from ddiloco.synchronizer.bulk_greeting import KEPT_IDLE, KEPT_NO_ROOM, MAX_WAITING_PER_PEER, PER_ADDRESS_CAP
from ddiloco.wire import framing, kept

from .test_bulk_socket import NUMEL, _client, _head, _wait, served  # noqa: F401 - `served` is a fixture

pytestmark = pytest.mark.timeout(120)


def _grad(value=-0.25):
    return {"w": torch.full((NUMEL,), value), "b": torch.zeros(3)}  # exact in bf16


def _push(client, session, version=0, value=-0.25):
    return client.push(lambda: framing.iter_frame_parts(_head(session, version), _grad(value), "bf16"), 30)


def _merged_once(service, value):
    """The first round merged learner 0's -0.25 with learner 1's `value`, each taken once (a push taken
    twice would weigh twice in the mean, or be refused as a duplicate)."""
    _wait(lambda: service.status()["contributions"] == 2)
    with service.lock:
        assert service.core.versions[0] == 1
        assert torch.equal(service.core.params["w"], torch.full((NUMEL,), -(-0.25 + value) / 2))


def test_calls_reuse_one_connection_and_each_hello_is_still_checked(served):  # noqa: F811
    service, server, _ = served
    sessions = [service.register(m, f"inc{m}", True)["session"] for m in range(2)]
    client = _client(server)
    for m in range(2):
        reply, _ = _push(client, sessions[m])
        assert reply.get("ok"), reply
    assert list(client.fetch(30, session=sessions[0]))  # a fetch on the same connection
    assert client.connections == 1 and server.bulk.served["Push"] == 2 and server.bulk.served["Fetch"] == 1
    _merged_once(service, -0.25)
    client.token = "wrong"  # the kept connection authenticated once: its next call must again
    with pytest.raises(grpc.RpcError) as err:
        _push(client, sessions[0], 1)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert service.status()["contributions"] == 2


def test_a_kept_connection_the_server_closed_when_idle_is_replaced(served):  # noqa: F811
    service, server, _ = served
    server.bulk.greeter.keep_seconds = 0.2
    sessions = [service.register(m, f"inc{m}", True)["session"] for m in range(2)]
    client = _client(server)
    assert _push(client, sessions[0])[0].get("ok")
    _wait(lambda: service.traffic.closed_counts().get(KEPT_IDLE) == 1)  # closed by the server, quietly
    assert not server.bulk.greeter.waiting
    assert _push(client, sessions[1], value=-0.5)[0].get("ok")
    assert client.connections == 2
    _merged_once(service, -0.5)


@pytest.mark.parametrize("when", ["idle", "restarted"])
def test_a_push_on_a_kept_connection_that_breaks_is_sent_again_once_and_taken_once(served, monkeypatch, when):  # noqa: F811
    """The close the client cannot see before it sends (the server closed it as the call began): the
    push goes again on a new connection, and the synchronizer takes it once."""
    service, server, _ = served
    sessions = [service.register(m, f"inc{m}", True)["session"] for m in range(2)]
    client = _client(server)
    assert _push(client, sessions[0])[0].get("ok")
    _wait(lambda: len(server.bulk.greeter.waiting) == 1)
    (w,) = server.bulk.greeter.waiting
    if when == "idle":
        server.bulk.greeter.keep_seconds = 0.0
        w.deadline = 0.0
        _wait(lambda: not server.bulk.greeter.waiting)
    else:  # what a restarted synchronizer leaves: a connection reset under the client
        w.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closed with a reset
        server.bulk.greeter.keep_seconds = 0.0
        w.deadline = 0.0
        _wait(lambda: not server.bulk.greeter.waiting)
    monkeypatch.setattr(kept, "_idle_and_open", lambda sock: True)  # the client does not see it closed
    served_before = server.bulk.served["Push"]
    reply, sent = _push(client, sessions[1], value=-0.5)
    assert reply.get("ok"), reply
    assert sent > 2 * NUMEL and client.connections == 2
    assert server.bulk.served["Push"] == served_before + 1  # the broken attempt never reached a call
    _merged_once(service, -0.5)


def test_frames_given_as_an_iterator_are_not_sent_twice(served, monkeypatch):  # noqa: F811
    service, server, _ = served
    session = service.register(0, "inc0", True)["session"]
    client = _client(server)
    assert _push(client, session)[0].get("ok")
    _wait(lambda: len(server.bulk.greeter.waiting) == 1)
    server.bulk.greeter.keep_seconds = 0.0
    next(iter(server.bulk.greeter.waiting)).deadline = 0.0
    _wait(lambda: not server.bulk.greeter.waiting)
    monkeypatch.setattr(kept, "_idle_and_open", lambda sock: True)
    with pytest.raises(grpc.RpcError) as err:  # an iterator half used cannot be sent again
        client.push(framing.iter_frame_parts(_head(session, 1), _grad(), "bf16"), 30)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.bulk.served["Push"] == 1


def test_kept_connections_count_in_the_per_address_cap_and_give_way_first(served):  # noqa: F811
    """Kept connections wait in the greeter within its caps: more clients than the cap from one
    address leave at most the cap kept, an idle kept one gives its place up before a new connection
    is closed, and every client still pushes."""
    service, server, _ = served
    session = service.register(0, "inc0", True)["session"]
    clients = [_client(server) for _ in range(MAX_WAITING_PER_PEER + 2)]
    for i, client in enumerate(clients):
        reply, _ = _push(client, session, i)
        assert reply.get("ok") or reply.get("code") in ("duplicate", "stale"), reply
    _wait(lambda: len(server.bulk.greeter.waiting) <= MAX_WAITING_PER_PEER)
    assert server.bulk.greeter.per_peer["127.0.0.1"] <= MAX_WAITING_PER_PEER
    for i, client in enumerate(clients):  # the evicted ones open a new connection
        reply, _ = _push(client, session, i)
        assert "ok" in reply
    assert sum(c.connections for c in clients) >= len(clients) + 2
    closed = service.traffic.closed_counts()
    assert closed.get(KEPT_NO_ROOM, 0) >= 2 and closed.get(PER_ADDRESS_CAP, 0) == 0
