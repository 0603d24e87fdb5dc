"""The synchronizer's bulk socket plane (`--bulk-socket`) over real loopback connections: what it takes
in merges exactly as over gRPC, and everything that guards the gRPC plane guards it too."""

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import grpc
import pytest
import torch

from ddiloco.core import AlgorithmConfig
from ddiloco.synchronizer.bulk_greeting import MAX_WAITING_PER_PEER
from ddiloco.synchronizer.server import SynchronizerServer, build_service
from ddiloco.synchronizer.settings import ServiceSettings
from ddiloco.wire import framing, reassembly, rpc, sockets
from ddiloco.wire.timeouts import Timeouts

from ..support.heads import contribution_head
from ..support.runtime import FAST

pytestmark = pytest.mark.timeout(120)
NUMEL = 1 << 20


@pytest.fixture
def served():
    with _serving(NUMEL, FAST) as running:
        yield running


@contextlib.contextmanager
def _serving(numel, timeouts):
    """A synchronizer of one fragment ("w" of `numel` values, "b" of 3) on the bulk socket plane;
    two learners' pushes of version v merge into version v + 1 (mean, outer lr 1, no momentum)."""
    params = {"w": torch.zeros(numel), "b": torch.ones(3)}
    algorithm = AlgorithmConfig(
        fragments=1, sync_every=4, overlap=1, quorum=2, grace=0.0, outer_lr=1.0, outer_momentum=0.0, merge="mean"
    )
    service = build_service(
        params,
        algorithm,
        ServiceSettings(timeouts=timeouts, max_learners=2, max_message_bytes=8 * numel, workers=24),
    )
    server = SynchronizerServer(service, "127.0.0.1", 0, "tok", bulk_socket=True)
    address = server.start()
    done = threading.Event()
    keeper = threading.Thread(target=_keep_alive, args=(service, done), daemon=True)
    keeper.start()
    try:
        yield service, server, address
    finally:
        done.set()
        keeper.join(5)
        server.stop(grace=0.2)


def _keep_alive(service, done):
    """Heartbeats for every session, as learners send them, so that a slow machine loses none."""
    while not done.wait(FAST.heartbeat / 2):
        with service.lock:
            ids = [session.id for session in service.sessions]
        for sid in ids:
            service.membership.heartbeat(sid, {})


_head = contribution_head


def _client(server, token="tok"):
    return sockets.BulkSocketClient(
        "127.0.0.1", server.handlers.bulk_port, token, framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN
    )


def _wait(predicate, seconds=30):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_pushes_over_the_socket_merge_exactly_into_reused_buffers(served):
    service, server, _ = served
    client = _client(server)
    sessions = [service.membership.register(m, f"inc{m}", True)["session"] for m in range(2)]
    for version in range(3):
        for m in range(2):
            grad = {"w": torch.full((NUMEL,), -0.25 * (m + 1)), "b": torch.zeros(3)}  # exact in bf16
            reply, sent = client.push(framing.iter_frame_parts(_head(sessions[m], version), grad, "bf16"), 30)
            assert reply.get("ok"), reply
            assert sent > 2 * NUMEL
        _wait(lambda: service.core.versions[0] == version + 1)
    pool = server.handlers.push_buffers
    assert pool.allocated == 1 and pool.reused == 5
    with service.lock:
        assert torch.equal(service.core.params["w"], torch.full((NUMEL,), 3 * 0.375))
        assert torch.equal(service.core.params["b"], torch.ones(3))


def test_a_fetch_over_the_socket_is_the_model_gRPC_fetches(served):
    service, server, address = served
    session = service.membership.register(0, "inc0", True)["session"]
    with service.lock:
        service.core.params["w"].copy_(torch.randn(NUMEL))
    msgs = list(_client(server).fetch(30, session=session))
    assert [m.head["fragment"] for m in msgs] == [0] and msgs[0].head["version"] == 0
    bulk = rpc.Stubs(rpc.open_channel(address, "bulk", framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN), "tok")
    via_grpc = list(
        reassembly.read_stream(bulk.fetch(framing.message({}), timeout=30, metadata=bulk.metadata), 1 << 40)
    )
    got, expected = msgs[0].tensors(), via_grpc[0].tensors()
    with service.lock:
        assert torch.equal(got["w"], service.core.params["w"]) and torch.equal(got["w"], expected["w"])


def test_a_wrong_token_is_refused_before_anything_is_read(served):
    service, server, _ = served
    session = service.membership.register(0, "inc0", True)["session"]
    before = service.status()["rejected_contributions"]
    for token in ("wrong", None):
        with pytest.raises(grpc.RpcError) as err:
            _client(server, token).push(
                framing.iter_frame_parts(_head(session, 0), {"w": torch.zeros(NUMEL), "b": torch.zeros(3)}, "bf16"), 30
            )
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert service.traffic.bytes_received == 0 and service.status()["contributions"] == 0
    assert service.status()["rejected_contributions"] == before + 2  # counted as refused pushes
    assert service.refused_rpcs >= 2


def test_a_message_over_the_limit_is_refused_at_its_first_frame(served):
    service, server, _ = served
    session = service.membership.register(0, "inc0", True)["session"]
    big = {"w": torch.zeros(5 << 20)}  # 10 MB in bf16, the limit is 8 MB
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        _client(server).push(framing.iter_frame_parts(_head(session, 0), big, "bf16"), 30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "exceeds the limit" in err.value.details()
    assert time.monotonic() - t0 < 20


def test_an_unknown_session_is_answered_before_the_payload_is_read(served):
    """The synchronizer answers after the first frame's header: it reserves no buffer and reads no more
    frames, and the client reads that reply (however much it had sent by then)."""
    service, server, _ = served
    grad = {"w": torch.zeros(4 * NUMEL)}  # 8 MB in 8 frames
    reply, _ = _client(server).push(framing.iter_frame_parts(_head("nobody", 0), grad, "bf16"), 30)
    assert reply["ok"] is False and reply["code"] == "unknown_session"
    assert service.traffic.bytes_received < 2 * framing.DEFAULT_CHUNK_BYTES  # the first frame only
    assert server.handlers.push_buffers.allocated == 0


def test_a_wrong_shape_is_an_ordinary_rejection(served):
    service, server, _ = served
    session = service.membership.register(0, "inc0", True)["session"]
    reply, _ = _client(server).push(
        framing.iter_frame_parts(_head(session, 0), {"w": torch.zeros(7), "b": torch.zeros(3)}, "bf16"), 30
    )
    assert reply["ok"] is False and "shape" in reply["reason"]


def test_a_silent_connection_takes_no_bulk_slot_and_is_closed(served):
    """Connections that never authenticate hold only a greeting place, and lose it after the hello
    deadline; honest pushes meanwhile find their slots."""
    service, server, _ = served
    free = service.bulk_slots._value
    # fewer than the cap per peer: the honest push below comes from the same address (more: test_bulk_socket_greeting)
    n = MAX_WAITING_PER_PEER - 2
    silent = [socket.create_connection(("127.0.0.1", server.handlers.bulk_port)) for _ in range(n)]
    try:
        time.sleep(0.1)
        assert service.bulk_slots._value == free
        session = service.membership.register(0, "inc0", True)["session"]
        reply, _ = _client(server).push(
            framing.iter_frame_parts(_head(session, 0), {"w": torch.zeros(NUMEL), "b": torch.zeros(3)}, "bf16"), 30
        )
        assert reply.get("ok"), reply
        for sock in silent:
            sock.settimeout(10 + 3 * FAST.failure)
            assert sock.recv(1) == b""  # closed by the synchronizer
    finally:
        for sock in silent:
            sock.close()


def test_a_pusher_killed_mid_push_frees_its_slot_and_the_next_push_merges(served, tmp_path):
    """kill -9 of a real process half way through a push: the synchronizer drops the half message,
    gives the slot back, and a complete push afterwards is taken in."""
    service, server, _ = served
    free = service.bulk_slots._value
    sessions = [service.membership.register(m, f"inc{m}", True)["session"] for m in range(2)]
    script = f"""
import sys, time, torch
from ddiloco.wire import framing, sockets
from ddiloco.wire.sockets import Deadline, send_frame, send_small
import socket
s = socket.create_connection(("127.0.0.1", {server.handlers.bulk_port}))
send_small(s, {{"method": "Push", "token": "tok"}}, Deadline(10))
head = {_head(sessions[0], 0)!r}
for i, parts in enumerate(framing.iter_frame_parts(head, {{"w": torch.ones({NUMEL}), "b": torch.zeros(3)}}, "bf16")):
    if i == 1:
        print("half", flush=True)
        time.sleep(60)
    send_frame(s, parts, Deadline(10))
"""
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "half"
        _wait(lambda: service.bulk_slots._value == free - 1, 10)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        _wait(lambda: service.bulk_slots._value == free, 10)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
    assert service.status()["contributions"] == 0
    client = _client(server)
    for m in range(2):
        reply, _ = client.push(
            framing.iter_frame_parts(
                _head(sessions[m], 0), {"w": torch.full((NUMEL,), -0.5), "b": torch.zeros(3)}, "bf16"
            ),
            30,
        )
        assert reply.get("ok"), reply
    _wait(lambda: service.core.versions[0] == 1)
    with service.lock:
        assert torch.equal(service.core.params["w"], torch.full((NUMEL,), 0.5))


def test_connections_beyond_the_bulk_slots_are_refused(served):
    service, server, _ = served
    session = service.membership.register(0, "inc0", True)["session"]
    taken = 0
    while service.bulk_slots.acquire(blocking=False):
        taken += 1
    try:
        with pytest.raises(grpc.RpcError) as err:
            _client(server).push(
                framing.iter_frame_parts(_head(session, 0), {"w": torch.zeros(NUMEL), "b": torch.zeros(3)}, "bf16"),
                10,
            )
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        for _ in range(taken):
            service.bulk_slots.release()


def test_a_garbage_hello_is_refused(served):
    service, server, _ = served
    sock = socket.create_connection(("127.0.0.1", server.handlers.bulk_port))
    try:
        sock.sendall(struct.pack("<I", 50) + b"x" * 50)
        head = sockets.recv_small(sock, sockets.Deadline(10))
        assert head["error"] == "INVALID_ARGUMENT" and "magic" in head["details"]
    finally:
        sock.close()


def test_a_fixed_bulk_port_is_taken_again_after_a_restart_but_never_twice_at_once(served):
    service, server, _ = served
    port = server.bulk.port
    client = _client(server)
    list(client.fetch(30, session=service.membership.register(0, "inc0", True)["session"]))  # leaves TIME_WAIT behind
    params = {"w": torch.zeros(NUMEL), "b": torch.ones(3)}
    other = SynchronizerServer(
        build_service(params, AlgorithmConfig(fragments=1), ServiceSettings(timeouts=FAST)),
        "127.0.0.1",
        0,
        bulk_port=port,
    )
    with pytest.raises(OSError, match="cannot listen for bulk sockets"):
        other.start()  # the running one holds it
    other.service.close()
    server.stop(grace=0.2)
    again = SynchronizerServer(
        build_service(params, AlgorithmConfig(fragments=1), ServiceSettings(timeouts=FAST)),
        "127.0.0.1",
        0,
        bulk_port=port,
    )
    try:
        again.start()
        assert again.bulk.port == port
    finally:
        again.stop(grace=0.2)


def test_a_refused_push_gives_its_slot_back_while_its_client_trickles_bytes(served):
    """A push refused for a bad frame is answered at once and its bulk slot freed before the drain:
    clients that keep trickling bytes after their refusal cannot hold every slot (#32, item 4)."""
    service, server, _ = served
    reserved = 0  # all slots but a few taken here, so that the refused pushes could hold every one left
    while service.bulk_slots._value > 4 and service.bulk_slots.acquire(blocking=False):
        reserved += 1
    free = service.bulk_slots._value
    session = service.membership.register(0, "inc0", True)["session"]
    refused: list[socket.socket] = []
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.2):
            for sock in refused:
                with contextlib.suppress(OSError):
                    sock.send(b"x")

    trickler = threading.Thread(target=trickle, daemon=True)
    try:
        for _ in range(free):
            sock = socket.create_connection(("127.0.0.1", server.handlers.bulk_port))
            refused.append(sock)
            sockets.send_small(sock, {"method": "Push", "token": "tok"}, sockets.Deadline(10))
            sock.sendall(b"x" * 64)  # not a frame
            head = sockets.recv_small(sock, sockets.Deadline(10))
            assert head["error"] == "INVALID_ARGUMENT", head
        trickler.start()
        _wait(lambda: service.bulk_slots._value == free, 10)
        reply, _ = _client(server).push(
            framing.iter_frame_parts(_head(session, 0), {"w": torch.zeros(NUMEL), "b": torch.zeros(3)}, "bf16"), 30
        )
        assert reply.get("ok"), reply
    finally:
        stop.set()
        if trickler.is_alive():
            trickler.join(5)
        for sock in refused:
            sock.close()
        for _ in range(reserved):
            service.bulk_slots.release()


def test_fetches_that_are_never_read_take_no_bulk_slot_and_pushes_go_on(served, monkeypatch):
    """A fetch holds one of a few fetch places, not a bulk slot (as over gRPC): fetches nobody reads,
    however many, cannot refuse a learner's push (#32, item 5). Those beyond the places are refused.
    Two sessions fill the places here, two fetches each (one each since #46: lifted for the test)."""
    service, server, _ = served
    from ddiloco.synchronizer import bulk_socket
    from ddiloco.synchronizer.bulk_socket import MAX_FETCHING

    monkeypatch.setattr(bulk_socket, "MAX_FETCHES_PER_SESSION", 2)

    free = service.bulk_slots._value
    sessions = [service.membership.register(m, f"inc{m}", True)["session"] for m in range(2)]
    session = sessions[0]
    unread: list[socket.socket] = []
    try:
        for i in range(free + 2):
            sock = socket.create_connection(("127.0.0.1", server.handlers.bulk_port))
            unread.append(sock)
            hello = {"method": "Fetch", "token": "tok", "session": sessions[i % 2]}
            sockets.send_small(sock, hello, sockets.Deadline(10))
            if i < MAX_FETCHING:  # in order: the fetch places go to the first ones
                _wait(lambda n=i + 1: server.bulk.served["Fetch"] >= n, 10)
        _wait(lambda: server.bulk.served["Fetch"] >= MAX_FETCHING, 10)  # the first fetches are being served
        assert service.bulk_slots._value == free
        reply, _ = _client(server).push(
            framing.iter_frame_parts(_head(session, 0), {"w": torch.zeros(NUMEL), "b": torch.zeros(3)}, "bf16"), 30
        )
        assert reply.get("ok"), reply
        refused = 0
        for sock in unread[MAX_FETCHING:]:
            sock.settimeout(10)
            with contextlib.suppress(OSError, framing.WireError):
                head = sockets.recv_small(sock, sockets.Deadline(10))
                refused += head.get("error") == "RESOURCE_EXHAUSTED"
        assert refused == len(unread) - MAX_FETCHING
    finally:
        for sock in unread:
            sock.close()


def test_a_nan_deep_in_a_socket_push_is_refused_as_non_finite(served):
    service, server, _ = served
    sessions = [service.membership.register(m, f"inc{m}", True)["session"] for m in range(2)]
    grad = {"w": torch.zeros(NUMEL), "b": torch.zeros(3)}
    grad["w"][NUMEL - 3] = float("nan")  # in the last chunk, whose norm is taken after the last frame
    reply, _ = _client(server).push(framing.iter_frame_parts(_head(sessions[0], 0), grad, "bf16"), 30)
    assert reply.get("ok") is False and reply.get("code") == "non_finite", reply
    grad["w"][NUMEL - 3], grad["w"][5] = 0.0, float("inf")  # in the first, taken while the rest arrived
    reply, _ = _client(server).push(framing.iter_frame_parts(_head(sessions[1], 0), grad, "bf16"), 30)
    assert reply.get("code") == "non_finite", reply


def test_fetches_send_the_live_model_and_always_the_current_one(served):
    service, server, _ = served
    session = service.membership.register(0, "inc0", True)["session"]
    for value in (torch.randn(NUMEL), torch.randn(NUMEL)):
        with service.lock:
            service.core.params["w"].copy_(value)
        (msg,) = list(_client(server).fetch(30, session=session))
        assert torch.equal(msg.tensors()["w"], value)
        _wait(lambda: service.membership.session(session) is not None and not server.bulk.fetches)
    with service.lock:
        assert not service.readers.reading(0)  # every fetch let go of what it sent


def test_a_fetch_that_a_merge_overtakes_sends_the_version_it_began_with_whole():
    """A fetch sends the live tensors without copying them; a merge of the fragment while the fetch
    is still sending must step a copy, or the fetch sends half one version and half the next."""
    numel = 1 << 22  # 16 MB: far more than the sockets' buffers hold, so the fetch is still sending
    max_frame = framing.DEFAULT_CHUNK_BYTES + rpc.FRAME_MARGIN
    with _serving(numel, Timeouts.derive(2.0)) as (service, server, _):
        sessions = [service.membership.register(m, f"inc{m}", True)["session"] for m in range(2)]
        before = torch.randn(numel)
        with service.lock:
            service.core.params["w"].copy_(before)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 15)  # the fetch's sender soon waits on us
        sock.connect(("127.0.0.1", server.handlers.bulk_port))
        try:
            deadline = sockets.Deadline(60)
            sockets.send_small(sock, {"method": "Fetch", "token": "tok", "session": sessions[0]}, deadline)
            reassembler = reassembly.Reassembler(1 << 40, max_open=1)
            frame, body, _ = sockets.recv_head(sock, max_frame, deadline)
            assert frame["head"]["version"] == 0  # under way: its first frame is in, the rest waits on us
            client = _client(server)
            for m in range(2):
                grad = {"w": torch.full((numel,), -0.25 * (m + 1)), "b": torch.zeros(3)}
                reply, _ = client.push(framing.iter_frame_parts(_head(sessions[m], 0), grad, "bf16"), 30)
                assert reply.get("ok"), reply
            _wait(lambda: service.core.versions[0] == 1)
            assert server.bulk.fetches[sessions[0]] == 1  # the merge came while the fetch was sending
            msg = sockets.recv_body(sock, reassembler, frame, body, deadline)
            while msg is None:
                _, _, msg = sockets.recv_frame(sock, max_frame, deadline, reassembler)
        finally:
            sock.close()
        assert msg.head["version"] == 0
        assert torch.equal(msg.tensors()["w"], before)  # version 0 whole, not half of version 1
        (after,) = list(_client(server).fetch(30, session=sessions[1]))
        assert after.head["version"] == 1
        assert torch.equal(after.tensors()["w"], before + 0.375)  # the mean of -0.25 and -0.5, at outer lr 1
