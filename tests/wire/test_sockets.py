"""The bulk socket plane's framing over real loopback TCP connections (`wire.sockets`)."""

import socket
import struct
import threading
import time

import pytest
import torch

from ddiloco.wire import framing, reassembly, sockets
from ddiloco.wire.buffers import BufferPool

V = bytes([framing.PROTOCOL_VERSION])  # the version byte of a frame prefix this side accepts

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pair():
    """A connected pair of loopback TCP sockets."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    yield client, server
    client.close()
    server.close()


def _receive_message(sock, limit=1 << 30, pool=None, max_frame=1 << 24):
    r = reassembly.Reassembler(limit, pool=pool)
    deadline = sockets.Deadline(20)
    while True:
        _, _, msg = sockets.recv_frame(sock, max_frame, deadline, r)
        if msg is not None:
            return msg


@pytest.mark.parametrize(
    "codec,chunk", [("bf16", 1000), ("fp32", 1 << 12), ("fp32", 12), ("int8", 333), ("bf16", 1 << 20)]
)
def test_frame_parts_over_a_socket_arrive_as_the_tensors_sent(pair, codec, chunk):
    """Bodies received straight into the message buffer give the tensors a gRPC push would: frames that
    span tensors, odd chunk sizes, pieces sent from the tensors' own memory (fp32) or converted."""
    client, server = pair
    torch.manual_seed(0)
    tensors = {"a": torch.randn(37, 5), "b": torch.randn(0, 4), "c": torch.randn(()), "d": torch.randn(1000)[::3]}
    expected = reassembly.Reassembler(1 << 30)
    for frame in framing.tensor_frames({"kind": "x"}, tensors, codec, chunk):
        via_grpc = expected.feed(frame)
    sender = threading.Thread(
        target=lambda: [
            sockets.send_frame(client, parts, sockets.Deadline(20))
            for parts in framing.iter_frame_parts({"kind": "x"}, tensors, codec, chunk)
        ]
    )
    sender.start()
    msg = _receive_message(server, pool=BufferPool(1 << 20, min_bytes=0))
    sender.join(10)
    assert msg.head == via_grpc.head
    assert bytes(msg.payload) == bytes(via_grpc.payload)
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    for name, t in msg.tensors(shapes).items():
        assert torch.equal(t, via_grpc.tensors(shapes)[name])


def test_over_tls_a_frames_length_header_and_first_body_bytes_go_as_one_full_record_by_hand():
    """TLS makes a record of every `sendall`: the length (4 bytes), the header and the body sent
    apart made two small records per frame. The first 16384 bytes go as one buffer, the rest as
    they are, and the bytes on the wire are the same."""
    length, header, body = memoryview(b"LLLL"), memoryview(b"h" * 100), memoryview(bytes(range(256)) * 4096)
    out = sockets._whole_records([length, header, body])
    assert [len(v) for v in out] == [16384, 4 + 100 + len(body) - 16384]
    assert b"".join(bytes(v) for v in out) == bytes(length) + bytes(header) + bytes(body)
    small = sockets._whole_records([length, header, memoryview(b"xyz")])
    assert [bytes(v) for v in small] == [b"LLLL" + b"h" * 100 + b"xyz"]


def test_partial_sends_are_completed(pair):
    """A receiver slower than the socket buffers: sendmsg returns short counts, and every byte still
    arrives in order."""
    client, server = pair
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    values = {"w": torch.arange(300_000, dtype=torch.float32)}
    sender = threading.Thread(
        target=lambda: [
            sockets.send_frame(client, parts, sockets.Deadline(20))
            for parts in framing.iter_frame_parts({}, values, "fp32", 1 << 18)
        ]
    )
    sender.start()
    time.sleep(0.2)  # the sender's buffers fill up first
    msg = _receive_message(server)
    sender.join(10)
    assert torch.equal(msg.tensors({"w": (300_000,)})["w"], values["w"])


def test_a_frame_longer_than_allowed_is_refused_before_its_body_is_read(pair):
    client, server = pair
    client.sendall(struct.pack("<I", 1 << 30) + framing.pack_frame({"msg": 1, "part": 0, "parts": 1})[:8])
    with pytest.raises(framing.WireError, match="at most"):
        sockets.recv_frame(server, 1 << 20, sockets.Deadline(5), reassembly.Reassembler(1 << 40))


@pytest.mark.parametrize(
    "bad,match",
    [
        (b"XYZ\x01\x05\x00\x00\x00", "magic"),
        (b"DDL\x09\x05\x00\x00\x00", "version"),
        (b"DDL" + V + b"\xff\x00\x00\x00", "does not fit"),
    ],
)
def test_a_bad_prefix_is_refused(pair, bad, match):
    client, server = pair
    client.sendall(struct.pack("<I", 100) + bad)
    with pytest.raises(framing.WireError, match=match):
        sockets.recv_frame(server, 1 << 20, sockets.Deadline(5), reassembly.Reassembler(1 << 40))


def test_a_message_over_the_limit_is_refused_at_its_first_header(pair):
    """The declared size is checked before a buffer is reserved or a body byte read."""
    client, server = pair
    start = framing.frame_start({"msg": 1, "part": 0, "parts": 2, "head": {"nbytes": 1 << 40}})
    client.sendall(struct.pack("<I", len(start) + 10) + start)
    with pytest.raises(framing.WireError, match="exceeds the limit"):
        sockets.recv_frame(server, 1 << 20, sockets.Deadline(5), reassembly.Reassembler(1 << 20))


def test_a_silent_peer_hits_the_deadline(pair):
    client, server = pair
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        sockets.recv_frame(server, 1 << 20, sockets.Deadline(0.3), reassembly.Reassembler(1 << 20))
    assert time.monotonic() - t0 < 10


def test_a_peer_that_closes_mid_frame_is_an_error(pair):
    client, server = pair
    frame = framing.pack_frame({"msg": 1, "part": 0, "parts": 1, "head": {"nbytes": 100}}, bytes(100))
    client.sendall(struct.pack("<I", len(frame)) + frame[:-40])
    client.close()
    with pytest.raises(ConnectionError):
        sockets.recv_frame(server, 1 << 20, sockets.Deadline(5), reassembly.Reassembler(1 << 20))


def test_an_error_reply_is_raised_as_an_rpc_error():
    import grpc

    with pytest.raises(sockets.SocketRpcError) as err:
        sockets.raise_if_error({"error": "RESOURCE_EXHAUSTED", "details": "too many"})
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and err.value.details() == "too many"
    assert isinstance(err.value, grpc.RpcError)
    assert sockets.raise_if_error({"ok": True}) == {"ok": True}


def test_an_unreachable_port_is_a_connect_failure():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    client = sockets.BulkSocketClient("127.0.0.1", port, None, 1 << 20)
    with pytest.raises(sockets.ConnectFailed):
        client.push(iter([]), timeout=5)


def test_a_small_message_is_read_as_it_trickles_in_and_never_past_its_end(pair):
    """`SmallReader` (the synchronizer reads every hello with it, on one thread for all connections):
    a message sent a byte at a time, then what follows it, which it must leave in the socket."""
    client, server = pair
    server.setblocking(False)
    reader = sockets.SmallReader()
    data = sockets.small_bytes({"method": "Push", "token": "t"})
    head = None
    for i in range(len(data)):
        assert head is None
        client.sendall(data[i : i + 1] + (b"NEXT" if i == len(data) - 1 else b""))
        for _ in range(1000):  # until this byte has arrived (bounded)
            head = reader.read(server)
            if head is not None or len(reader.buffer) == i + 1:
                break
            time.sleep(0.001)
    assert head == {"method": "Push", "token": "t", "nbytes": 0}
    server.setblocking(True)
    server.settimeout(10)
    assert server.recv(4) == b"NEXT"


@pytest.mark.parametrize(
    "data,match",
    [
        (struct.pack("<I", 1 << 20) + b"DDL" + V + b"\x00\x00\x00\x00", "at most"),
        (struct.pack("<I", 100) + b"XYZ\x01\x00\x00\x00\x00", "magic"),
        (struct.pack("<I", 100) + b"DDL" + V + b"\x05\x00\x00\x00", "does not fit"),
    ],
)
def test_a_small_message_with_a_bad_length_or_prefix_is_refused_before_the_rest_arrives(pair, data, match):
    client, server = pair
    server.setblocking(False)
    client.sendall(data)
    reader = sockets.SmallReader()
    with pytest.raises(framing.WireError, match=match):
        for _ in range(1000):
            assert reader.read(server) is None
            time.sleep(0.001)


def test_a_peer_that_closes_before_its_small_message_is_complete_is_an_error(pair):
    client, server = pair
    server.setblocking(False)
    client.sendall(sockets.small_bytes({"method": "Push"})[:7])
    client.close()
    reader = sockets.SmallReader()
    with pytest.raises(ConnectionError):
        for _ in range(1000):
            assert reader.read(server) is None
            time.sleep(0.001)


def test_a_deadline_sets_the_timeout_only_when_it_changes_and_never_past_its_end(pair):
    """A deadline far off waits `step` per operation, set once and kept (a TLS receive arms once
    per 16 KiB record); a nearer deadline, or a socket another call left with a longer timeout,
    is armed again, so no wait outlasts the step or the deadline."""
    _, server = pair
    far = sockets.Deadline(float("inf"), step=5.0)
    far.arm(server)
    assert server.gettimeout() == 5.0
    far.arm(server)
    assert server.gettimeout() == 5.0
    near = sockets.Deadline(0.5, step=5.0)  # the socket still holds 5 s from the call before
    near.arm(server)
    assert 0 < server.gettimeout() <= 0.5
    server.setblocking(False)  # as the greeter hands connections over
    far.arm(server)
    assert server.gettimeout() == 5.0
