"""Frames with hostile lengths (#46), for the readers' property test (tests/wire) and the plane fuzz
suites (tests/synchronizer): mostly a good magic and version, so that what is tested is the lengths
behind them, the header length and the frame's u32 length each at the values that matter (none, one,
the prefix exactly and either side, the header's own length and either side, the limits and either
side, the largest u32), the frame cut anywhere, then whatever follows."""

from __future__ import annotations

import json
import struct

from hypothesis import strategies as st

from ddiloco.wire import framing, sockets

PREFIX = framing.PREFIX_BYTES
U32 = (1 << 32) - 1
MAX_FRAME = sockets.MAX_HELLO_BYTES
# #46's 12-byte hello: a frame of exactly its prefix (its version byte today's, so that the length is what is refused)
STALL = b"\x08\x00\x00\x00DDL" + bytes([framing.PROTOCOL_VERSION]) + b"\x00\x00\x00\x00"
HEADER_LENGTHS = [0, 1, 2, 3, framing.MAX_HEADER_BYTES, framing.MAX_HEADER_BYTES + 1, U32]
FRAME_LENGTHS = [0, 1, PREFIX - 1, PREFIX, PREFIX + 1, MAX_FRAME, MAX_FRAME + 1, U32]
FRAME_OFFSETS = [0, 0, 0, -1, 1, -2, 2]  # from the prefix plus the header length


def small_header(head: dict) -> bytes:
    """The JSON header of a small message (a hello) with `head`."""
    return json.dumps({"msg": 0, "part": 0, "parts": 1, "head": dict(head, nbytes=0)}).encode()


@st.composite
def hostile_frames(draw: st.DrawFn, hello: dict | None = None) -> bytes:
    """A frame with its u32 length, well formed or with any field hostile, then whatever follows.
    `hello`: the head of the well-formed small message among the headers tried."""
    good = small_header(hello if hello is not None else {"method": "Push", "token": "t"})
    body = draw(st.sampled_from([b"", b"{}", good, b'{"parts":1,"head":{}}']) | st.binary(max_size=64))
    hlen = draw(st.sampled_from([len(body), *HEADER_LENGTHS]) | st.integers(0, U32))
    if draw(st.sampled_from(["relative"] * 3 + ["absolute"])) == "relative":
        n = min(max(PREFIX + hlen + draw(st.sampled_from(FRAME_OFFSETS)), 0), U32)
    else:
        n = draw(st.sampled_from(FRAME_LENGTHS))
    magic = draw(st.sampled_from([framing.MAGIC] * 4 + [b"DDM", b"\x00\x00\x00"]))
    version = draw(st.sampled_from([framing.PROTOCOL_VERSION] * 4 + [0, framing.PROTOCOL_VERSION + 1, 255]))
    prefix = struct.pack("<I3sBI", n, magic, version, hlen)
    frame = prefix + body
    ending = draw(st.sampled_from(["whole", "prefix", "cut"]))  # a frame may end anywhere, even in its prefix
    if ending == "prefix":
        frame = prefix
    elif ending == "cut":
        frame = frame[: draw(st.integers(0, len(frame)))]
    return frame + draw(st.binary(max_size=32))


def stalls(data: bytes) -> bool:
    """Whether `data` starts with #46's shape: a frame of exactly its prefix that declares an empty header."""
    return data[:12] == STALL
