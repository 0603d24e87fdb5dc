"""Every reader of the wire makes progress or gives up (#46, item 4): whatever a frame's header
declares (its u32 length, magic, version, header length, header bytes) and however its bytes are cut
into arrivals, a read ends with the message, a WireError or a ConnectionError, or (the non-blocking
`SmallReader` only) returns None having taken at least one of the bytes it was offered. Never a loop
that reads nothing: the 12-byte hello (a frame of exactly its prefix, declaring an empty header) sent
`SmallReader.read` round forever in the bulk plane's greeter. Each call runs on a thread of its own
and is bounded in time; one that does not return in it is stopped and fails the test."""

from __future__ import annotations

import contextlib
import ctypes
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ddiloco.wire import framing, reassembly, sockets

from ..support.hostile_frames import MAX_FRAME, PREFIX, STALL, hostile_frames

pytestmark = pytest.mark.timeout(300)

CALL_SECONDS = 10.0  # a liveness bound, far above any honest read of these few bytes on a loaded machine
DONE = (framing.WireError, ConnectionError)


class Stalled(Exception):
    """Raised into a reader's thread that did not return within its bound."""


def bounded(call: Callable[[], Any]) -> Any:
    """`call()` on a thread of its own, within `CALL_SECONDS`: its result, or its exception raised
    here. One still running then is stopped (an exception raised into it between two bytecodes: a
    loop that reads nothing is pure Python) and fails the test."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            out["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(CALL_SECONDS)
    if worker.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident or 0), ctypes.py_object(Stalled))
        worker.join(CALL_SECONDS)
        pytest.fail(f"a read did not return within {CALL_SECONDS:g} s: it loops without reading")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def arrivals(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` in pieces, cut at `cuts` (positions, any order, repeats ignored); none empty."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]


fast = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@fast
@given(hostile_frames(), st.lists(st.integers(0, 1 << 16), max_size=8), st.booleans())
@example(STALL, [], False)
@example(STALL, [1, 4, 11], True)
def test_the_small_reader_completes_refuses_or_takes_a_byte_on_every_call(data, cuts, closes):
    """The non-blocking reader the greeter runs for every hello: each call with bytes waiting takes at
    least one of them (or ends), never more than its message, and once the peer has closed a call
    ends (with the message, or an error); never a call that loops without reading."""
    ours, peer = socket.socketpair()
    with ours, peer:
        ours.setblocking(False)
        reader = sockets.SmallReader()
        sent = 0
        try:
            for piece in arrivals(data, cuts):
                peer.sendall(piece)
                sent += len(piece)
                before = len(reader.buffer)
                head = bounded(lambda: reader.read(ours))
                if head is not None:
                    assert len(reader.buffer) == reader.need <= sent  # the whole message, not a byte past it
                    return
                assert len(reader.buffer) > before, "a read with bytes waiting took none of them"
                assert len(reader.buffer) <= sent
            if not closes:
                return
            peer.shutdown(socket.SHUT_WR)
            head = bounded(lambda: reader.read(ours))
            assert head is not None, "the peer closed, and the read neither ended nor failed"
            assert len(reader.buffer) == reader.need
        except DONE:
            return


@fast
@given(hostile_frames(), st.sampled_from(["small", "frame", "frames"]))
@example(STALL, "small")
@example(STALL + STALL, "frames")
def test_the_blocking_readers_complete_or_fail_once_the_peer_has_closed(data, reader):
    """`recv_small`, `recv_frame` (with and without a reassembler) and a fetch's loop over frames, on a
    blocking socket under a deadline: with the bytes sent and the peer closed, each read ends."""
    ours, peer = socket.socketpair()
    with ours, peer:
        peer.sendall(data)
        peer.shutdown(socket.SHUT_WR)
        deadline = sockets.Deadline(CALL_SECONDS / 2)

        def read() -> object:
            if reader == "small":
                return sockets.recv_small(ours, deadline)
            if reader == "frame":
                return sockets.recv_frame(ours, MAX_FRAME, deadline)
            r = reassembly.Reassembler(1 << 20, max_open=1)
            for _ in range(len(data) // (4 + PREFIX + framing.MIN_HEADER_BYTES) + 1):  # each frame takes bytes
                _, _, msg = sockets.recv_frame(ours, MAX_FRAME, deadline, r)
                if msg is not None:
                    return msg
            raise AssertionError("more frames read than the bytes sent can hold")

        with contextlib.suppress(*DONE):  # an error is an end too
            assert bounded(read) is not None


def test_a_frame_that_declares_an_empty_header_is_refused_where_its_prefix_is_read():
    """No frame is without a header (a JSON object, at least `MIN_HEADER_BYTES`): refused from the
    prefix, before any reader sizes a message by it."""
    for length in (0, 1):
        with pytest.raises(framing.WireError, match=f"header length {length}"):
            framing.header_length(struct.pack("<3sBI", framing.MAGIC, framing.PROTOCOL_VERSION, length))
    assert framing.header_length(struct.pack("<3sBI", framing.MAGIC, framing.PROTOCOL_VERSION, 2)) == 2
    assert framing.unpack_frame(framing.pack_frame({}))[0] == {}
