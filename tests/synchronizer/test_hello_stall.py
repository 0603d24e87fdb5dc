"""#46: one 12-byte packet stopped the bulk plane for good. Its u32 length (8) is exactly a frame
prefix, and that prefix declares an empty header: the hello reader (`wire.sockets.SmallReader`) then
needed as many bytes as it had started with, took that for "the length is not read yet" and looped
without reading, in the greeter's only thread. Against a live synchronizer on loopback, with and
without a token: that packet is refused as a bad hello, its connection closed, and an honest push on
the bulk socket itself (no gRPC fallback) is merged afterwards."""

from __future__ import annotations

import socket

import pytest

from ddiloco.wire import framing

from .fuzz_support import TOKEN, live_plane

pytestmark = pytest.mark.timeout(120)

# the packet, byte for byte but the version byte (1 then): with another, its version would be refused first
STALL = b"\x08\x00\x00\x00DDL" + bytes([framing.PROTOCOL_VERSION]) + b"\x00\x00\x00\x00"
ANSWER_SECONDS = 20.0  # a liveness bound on a loaded machine: the greeter answers within its hello deadline


def answer_and_close(port: int, data: bytes) -> tuple[bytes, bool]:
    """Send `data` (and keep the connection open for writing, as the attacker did); what came back
    and whether the server closed the connection within `ANSWER_SECONDS`."""
    got = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_SECONDS) as sock:
        sock.sendall(data)
        try:
            for _ in range(1000):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return bytes(got), True
                got += chunk
        except TimeoutError:
            return bytes(got), False
        except ConnectionError:
            return bytes(got), True
    return bytes(got), False


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "open"])
def test_the_12_byte_hello_is_refused_and_the_bulk_plane_keeps_serving(token):
    assert len(STALL) == 12 and STALL[4:7] == framing.MAGIC
    with live_plane(token) as plane:
        plane.honest_push(fallback=False)  # the plane works before
        answer, closed = answer_and_close(plane.port, STALL)
        assert closed, "the synchronizer neither answered nor closed the 12-byte hello's connection"
        head = framing.read_message(answer[4:])
        assert head["error"] == "INVALID_ARGUMENT" and "header length 0" in head["details"], head
        assert plane.server.bulk.closed["bad_hello"] >= 1
        for _ in range(3):  # the greeter is free: several of them, each refused
            assert answer_and_close(plane.port, STALL)[1]
        plane.alive()
        plane.honest_push(fallback=False)  # and the socket itself still takes an honest push, merged
