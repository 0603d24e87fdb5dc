import json
import struct

import pytest
import torch

from ddiloco.wire import framing, reassembly


def test_single_frame_message_round_trip():
    head = framing.read_message(framing.message({"kind": "register", "learner": 3}))
    assert head["kind"] == "register" and head["learner"] == 3 and head["nbytes"] == 0


@pytest.mark.parametrize("chunk", [7, 100, 1 << 20])
def test_tensors_survive_chunking(chunk):
    tensors = {"a": torch.randn(13, 7), "b": torch.arange(5, dtype=torch.float32)}
    frames = framing.tensor_frames({"kind": "update", "fragment": 2}, tensors, "fp32", chunk)
    assert len(frames) == -(-(13 * 7 + 5) * 4 // chunk)
    [msg] = list(reassembly.read_stream(frames, limit=10_000))
    assert msg.head["fragment"] == 2
    out = msg.tensors({"a": (13, 7), "b": (5,)})
    assert torch.equal(out["a"], tensors["a"]) and torch.equal(out["b"], tensors["b"])


def test_interleaved_control_frame_is_delivered_between_chunks():
    big = framing.tensor_frames({"kind": "update"}, {"x": torch.ones(100)}, "fp32", 64)
    small = framing.message({"kind": "request", "fragment": 1})
    r = reassembly.Reassembler(1 << 20)
    got = [r.feed(big[0]), r.feed(small)] + [r.feed(f) for f in big[1:]]
    kinds = [m.head["kind"] for m in got if m is not None]
    assert kinds == ["request", "update"]


def test_bad_magic_and_protocol_version_are_refused_with_a_reason():
    frame = framing.message({"kind": "x"})
    with pytest.raises(framing.WireError, match="magic"):
        framing.unpack_frame(b"XYZ" + frame[3:])
    other = frame[:3] + bytes([framing.PROTOCOL_VERSION + 1]) + frame[4:]
    with pytest.raises(framing.WireError, match="protocol version mismatch"):
        framing.unpack_frame(other)


def test_truncated_and_non_json_headers_are_refused():
    with pytest.raises(framing.WireError, match="shorter"):
        framing.unpack_frame(b"DD")
    raw = b"not json"
    frame = struct.pack("<3sBI", b"DDL", framing.PROTOCOL_VERSION, len(raw)) + raw
    with pytest.raises(framing.WireError, match="JSON"):
        framing.unpack_frame(frame)
    frame = struct.pack("<3sBI", b"DDL", framing.PROTOCOL_VERSION, 1000) + b"{}"
    with pytest.raises(framing.WireError, match="does not fit"):
        framing.unpack_frame(frame)


def test_oversized_message_is_refused_at_its_first_frame():
    frames = framing.tensor_frames({"kind": "contribution"}, {"x": torch.zeros(1000)}, "fp32", 100)
    r = reassembly.Reassembler(limit=3999)
    with pytest.raises(framing.WireError, match="exceeds the limit"):
        r.feed(frames[0])


def test_out_of_order_and_overlong_bodies_are_refused():
    frames = framing.tensor_frames({"kind": "u"}, {"x": torch.zeros(100)}, "fp32", 100)
    r = reassembly.Reassembler(1 << 20)
    r.feed(frames[0])
    with pytest.raises(framing.WireError, match="out of order"):
        r.feed(frames[2])
    lying = framing.pack_frame({"msg": 99, "part": 0, "parts": 1, "head": {"nbytes": 4}}, b"12345678")
    with pytest.raises(framing.WireError, match="longer than"):
        reassembly.Reassembler(1 << 20).feed(lying)


@pytest.mark.parametrize(
    "expected, message",
    [({"a": (3, 3)}, "shape"), ({"b": (2, 3)}, "wrong tensor names"), ({"a": (2, 3), "c": (1,)}, "missing")],
)
def test_decode_checks_names_and_shapes(expected, message):
    [msg] = list(reassembly.read_stream(framing.tensor_frames({}, {"a": torch.ones(2, 3)}, "bf16"), 1 << 20))
    with pytest.raises(framing.WireError, match=message):
        msg.tensors(expected)


def test_payload_size_must_match_specs_and_codec_must_be_known():
    head = {"msg": 1, "part": 0, "parts": 1, "head": {"nbytes": 8, "tensors": [["a", [3], "fp32"]]}}
    [msg] = list(reassembly.read_stream([framing.pack_frame(head, b"\0" * 8)], 100))
    with pytest.raises(framing.WireError, match="payload has 8 bytes"):
        msg.tensors()
    head["head"]["tensors"] = [["a", [2], "pickle"]]
    [msg] = list(reassembly.read_stream([framing.pack_frame(head, b"\0" * 8)], 100))
    with pytest.raises(framing.WireError, match="unknown codec"):
        msg.tensors()


def test_headers_are_plain_json():
    frame = framing.message({"kind": "k"})
    header, _ = framing.unpack_frame(frame)
    assert json.loads(json.dumps(header)) == header


def _strip_ids(frames: list[bytes]) -> list[tuple[dict, bytes]]:
    out = []
    for f in frames:
        header, body = framing.unpack_frame(f)
        out.append((dict(header, msg=0), bytes(body)))
    return out


@pytest.mark.parametrize("codec", ["fp32", "bf16"])
@pytest.mark.parametrize("chunk", [2, 4, 6, 64, 1000, 4096, 1 << 20])
def test_frames_converted_chunk_by_chunk_are_those_of_the_whole_tensors(codec, chunk):
    """`tensor_frames` converts a frame at a time (no fragment-sized copy in the wire dtype): its frames
    must be byte for byte those of encoding every tensor whole and cutting the bytes, across tensor
    boundaries, for 0-dim, empty and non-contiguous tensors (chunk 6 is no multiple of an fp32)."""
    g = torch.Generator().manual_seed(3)
    tensors = {
        "a": torch.randn(1000, generator=g),
        "b": torch.randn(3, 7, generator=g) * 1e30,  # bf16 rounding at large magnitudes
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "strided": torch.randn(16, 33, generator=g)[:, ::2],
        "c": torch.tensor([float("nan"), float("inf"), -0.0, 1e-40]),
    }
    specs, blobs = framing.encode_tensors(tensors, codec)
    whole = framing.frames({"k": 1, "tensors": [s.to_json() for s in specs]}, blobs, chunk)
    assert _strip_ids(framing.tensor_frames({"k": 1}, tensors, codec, chunk)) == _strip_ids(whole)
    for empty in ({}, {"z": torch.empty(0)}):
        specs, blobs = framing.encode_tensors(empty, codec)
        whole = framing.frames({"k": 1, "tensors": [s.to_json() for s in specs]}, blobs, chunk)
        assert _strip_ids(framing.tensor_frames({"k": 1}, empty, codec, chunk)) == _strip_ids(whole)
