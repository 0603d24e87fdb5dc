"""The wire format: framed JSON headers plus raw tensor bytes, chunked; nothing is ever unpickled.

A frame is

    b"DDL" | u8 protocol version | u32 header length (little-endian) | header (UTF-8 JSON) | body

A logical message (a contribution, a fragment update) is a header dict plus a payload of tensors laid
end to end; it travels as one or more frames of at most `chunk_size` body bytes each. The first frame's
header holds the message header under "head" (with the tensor specs and the payload size); every
frame holds {"msg": id, "part": i, "parts": n}. `reassembly.Reassembler` checks the declared size against a
limit *before* buffering anything, so an oversized message is refused after its first frame.
Tensor specs name the tensor, its shape and its codec (see `quant`); the byte count is implied by the
codec and the shape and is checked, so a malformed spec cannot make the reader over- or under-read.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from . import quant

if TYPE_CHECKING:
    from typing_extensions import Buffer

MAGIC = b"DDL"
PROTOCOL_VERSION = 2  # 2: refusals carry a code the learner acts on (`headers.Reply`), no "action"
_PREFIX = struct.Struct("<3sBI")
PREFIX_BYTES = _PREFIX.size
MAX_HEADER_BYTES = 1 << 20
MIN_HEADER_BYTES = 2  # b"{}": every frame has a JSON object for its header
DEFAULT_CHUNK_BYTES = 1 << 20
_ids = itertools.count(1)


class WireError(ValueError):
    """A frame or message that does not follow the wire format; the reason says what is wrong."""


class MessageTooLarge(WireError):
    """A message that declares more bytes than the reader's limit (`reassembly.Reassembler`): a
    synchronizer answers it RESOURCE_EXHAUSTED, any other WireError INVALID_ARGUMENT."""


def frame_start(header: Mapping[str, object]) -> bytes:
    """A frame's prefix and header: the frame is these bytes followed by its body."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    if len(raw) > MAX_HEADER_BYTES:
        raise WireError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    return _PREFIX.pack(MAGIC, PROTOCOL_VERSION, len(raw)) + raw


def pack_frame(header: Mapping[str, object], body: bytes | memoryview = b"") -> bytes:
    return b"".join((frame_start(header), body))


def header_length(prefix: bytes | memoryview) -> int:
    """The header length a frame's fixed prefix declares (a reader that receives a frame piece by piece
    learns from it how much header to read); WireError on a bad magic, version or length (over
    `MAX_HEADER_BYTES`, or under `MIN_HEADER_BYTES`: no frame is without a header)."""
    if len(prefix) != _PREFIX.size:
        raise WireError(f"frame prefix of {len(prefix)} bytes, expected {_PREFIX.size}")
    magic, version, length = cast("tuple[bytes, int, int]", _PREFIX.unpack(prefix))  # the format is <3sBI
    if magic != MAGIC:
        raise WireError("not a ddiloco frame (bad magic)")
    if version != PROTOCOL_VERSION:
        raise WireError(f"protocol version mismatch: peer speaks {version}, this side speaks {PROTOCOL_VERSION}")
    if length > MAX_HEADER_BYTES:
        raise WireError(f"header length {length} exceeds {MAX_HEADER_BYTES}")
    if length < MIN_HEADER_BYTES:  # refused here, before a reader sizes anything from it (#46)
        raise WireError(f"header length {length}: a frame's header is a JSON object, at least {MIN_HEADER_BYTES} bytes")
    return length


def unpack_frame(data: bytes) -> tuple[dict[str, Any], memoryview]:
    """(header, body) of one frame; WireError on a bad magic, protocol version, length or JSON."""
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise WireError(f"frame of {len(view)} bytes is shorter than the {_PREFIX.size}-byte prefix")
    length = header_length(view[: _PREFIX.size])
    if _PREFIX.size + length > len(view):
        raise WireError(f"header length {length} does not fit the frame of {len(view)} bytes")
    return parse_header(view[_PREFIX.size : _PREFIX.size + length]), view[_PREFIX.size + length :]


def parse_header(raw: bytes | memoryview) -> dict[str, Any]:
    """A frame's JSON header (the bytes after its prefix); WireError unless it is a JSON object."""
    try:
        header = json.loads(bytes(raw))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, integers over 4300 digits, deep nesting
        raise WireError(f"header is not acceptable JSON: {str(exc)[:200]}") from None
    if not isinstance(header, dict):
        raise WireError("header must be a JSON object")
    return header


def message(header: Mapping[str, object]) -> bytes:
    """A small single-frame message (control plane)."""
    return pack_frame({"msg": 0, "part": 0, "parts": 1, "head": dict(header, nbytes=0)})


def read_message(data: bytes) -> dict[str, Any]:
    """The header of a single-frame message without payload."""
    frame, body = unpack_frame(data)
    head = frame.get("head")
    if frame.get("parts") != 1 or not isinstance(head, dict) or len(body):
        raise WireError("expected a single-frame message without payload")
    return head


# --- tensors --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    codec: str

    @property
    def nbytes(self) -> int:
        return quant.get(self.codec).nbytes(self.shape)

    def to_json(self) -> list[object]:
        return [self.name, list(self.shape), self.codec]

    @classmethod
    def from_json(cls, item: object) -> TensorSpec:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[1], list)):
            raise WireError(f"bad tensor spec {str(item)[:80]}")
        if not all(isinstance(d, int) and 0 <= d < 1 << 40 for d in item[1]) or len(item[1]) > 8:
            raise WireError(f"bad shape in tensor spec for {item[0]!r}")
        if item[2] not in quant.CODECS:
            raise WireError(f"unknown codec {item[2]!r} for {item[0]!r}; known: {', '.join(quant.CODECS)}")
        return cls(item[0], tuple(item[1]), item[2])


def encode_tensors(tensors: Mapping[str, torch.Tensor], codec: str) -> tuple[list[TensorSpec], list[memoryview]]:
    """Specs and encoded byte blobs, in the mapping's order."""
    c = quant.get(codec)
    specs, blobs = [], []
    for name, t in tensors.items():
        specs.append(TensorSpec(name, tuple(t.shape), codec))
        blobs.append(c.encode(t))
    return specs, blobs


def decode_tensors(
    specs: Sequence[TensorSpec],
    payload: memoryview,
    expected: Mapping[str, tuple[int, ...]] | None = None,
    wire_dtype: bool = False,
) -> dict[str, torch.Tensor]:
    """float32 tensors from a payload (`wire_dtype`: bf16 stays bf16, a view of the payload); checks
    names and shapes against `expected` when given."""
    if expected is not None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise WireError("duplicate tensor names")
        extra, missing = sorted(set(names) - set(expected)), sorted(set(expected) - set(names))
        if extra or missing:
            raise WireError(f"wrong tensor names: unexpected {extra[:3]}, missing {missing[:3]}")
        for s in specs:
            if tuple(s.shape) != tuple(expected[s.name]):
                raise WireError(f"{s.name}: shape {tuple(s.shape)} != expected {tuple(expected[s.name])}")
    total = sum(s.nbytes for s in specs)
    if total != len(payload):
        raise WireError(f"payload has {len(payload)} bytes, the tensor specs need {total}")
    out, offset = {}, 0
    for s in specs:
        n = s.nbytes
        out[s.name] = quant.get(s.codec).decode(payload[offset : offset + n], s.shape, wire_dtype)
        offset += n
    return out


# --- chunking -------------------------------------------------------------------------------------
def frames(
    head: Mapping[str, object], blobs: Iterable[bytes | memoryview], chunk_size: int = DEFAULT_CHUNK_BYTES
) -> list[bytes]:
    """A message as frames of at most chunk_size body bytes; head gains "nbytes".

    The blobs are cut into chunks where they lie, never joined into one buffer first: each frame is
    one copy of at most a chunk, so no single copy holds the interpreter for long (a heartbeat
    handler waits for none of them)."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    views = [memoryview(b).cast("B") for b in blobs]
    total = sum(len(v) for v in views)
    parts = max(1, -(-total // chunk_size))
    msg = next(_ids)
    out: list[bytes] = []
    pieces: list[memoryview] = []
    room = chunk_size
    for view in views:
        while len(view):
            take = min(room, len(view))
            pieces.append(view[:take])
            view, room = view[take:], room - take
            if room == 0:
                out.append(_frame(head, msg, len(out), parts, total, pieces))
                pieces, room = [], chunk_size
    if len(out) < parts:  # the last, partial chunk (or the only, empty one)
        out.append(_frame(head, msg, len(out), parts, total, pieces))
    return out


def _frame(head: Mapping[str, object], msg: int, part: int, parts: int, total: int, pieces: list[memoryview]) -> bytes:
    return b"".join(_frame_parts(head, msg, part, parts, total, pieces))


def _frame_parts(
    head: Mapping[str, object], msg: int, part: int, parts: int, total: int, pieces: list[memoryview]
) -> list[bytes | memoryview]:
    header: dict[str, object] = {"msg": msg, "part": part, "parts": parts}
    if part == 0:
        header["head"] = dict(head, nbytes=total)
    return [frame_start(header), *pieces]


def tensor_frames(
    head: Mapping[str, object], tensors: Mapping[str, torch.Tensor], codec: str, chunk_size: int = DEFAULT_CHUNK_BYTES
) -> list[bytes]:
    return list(iter_tensor_frames(head, tensors, codec, chunk_size))


def iter_tensor_frames(
    head: Mapping[str, object], tensors: Mapping[str, torch.Tensor], codec: str, chunk_size: int = DEFAULT_CHUNK_BYTES
) -> Iterator[bytes]:
    """The frames of `tensors`, each made when it is asked for: a sender that streams them overlaps
    the encoding with the transfer and holds a frame, not the message (`tensors` must not change
    until the last frame is made)."""
    return (b"".join(parts) for parts in iter_frame_parts(head, tensors, codec, chunk_size))


def iter_frame_parts(
    head: Mapping[str, object], tensors: Mapping[str, torch.Tensor], codec: str, chunk_size: int = DEFAULT_CHUNK_BYTES
) -> Iterator[list[bytes | memoryview]]:
    """Each frame as the buffers it is made of, laid end to end (prefix and header, then body pieces),
    for a sender that writes them out without joining them (`sockets`). Body pieces may be the
    tensors' own memory or a scratch buffer the next frame reuses: send each before asking for the
    next, and do not change `tensors` until the last is sent."""
    c = quant.get(codec)
    if isinstance(c, quant.FloatCodec) and chunk_size % c.itemsize == 0:
        specs = [TensorSpec(name, tuple(t.shape), codec) for name, t in tensors.items()]
        yield from _converted_frames(dict(head, tensors=[s.to_json() for s in specs]), tensors.values(), c, chunk_size)
        return
    specs, blobs = encode_tensors(tensors, codec)
    for frame in frames(dict(head, tensors=[s.to_json() for s in specs]), blobs, chunk_size):
        yield [frame]


def payload_nbytes(tensors: Mapping[str, torch.Tensor], codec: str) -> int:
    """The bytes of `tensors` in `codec`, without their frames' headers."""
    c = quant.get(codec)
    return sum(c.nbytes(tuple(t.shape)) for t in tensors.values())


class Counted:
    """Frames passed through, counting their bytes as a sender takes them."""

    def __init__(self, frames: Iterable[bytes]) -> None:
        self._frames = iter(frames)
        self.nbytes = 0

    def __iter__(self) -> Counted:
        return self

    def __next__(self) -> bytes:
        frame = next(self._frames)
        self.nbytes += len(frame)
        return frame


def _byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    # cast: numpy's stubs type ndarray's buffer protocol (__buffer__) for Python >= 3.12 only
    return memoryview(cast("Buffer", (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy())).cast("B")


def _converted_frames(
    head: Mapping[str, object], tensors: Iterable[torch.Tensor], codec: quant.FloatCodec, chunk_size: int
) -> Iterator[list[bytes | memoryview]]:
    """The frames of `frames(head, [codec.encode(t) for t in tensors])`, a frame at a time: values in
    another dtype (or on a device) are converted into one chunk-sized scratch buffer; values already
    in the wire dtype on the host are sent from their own memory. Encoding whole tensors first made a
    fragment-sized copy in the wire dtype (its memory and page faults, on the learner for every push
    and on the synchronizer for every update) that the frames then copied again."""
    flats = [t.detach().reshape(-1) for t in tensors]
    per_frame = chunk_size // codec.itemsize
    total = sum(f.numel() for f in flats)
    parts = max(1, -(-total // per_frame))
    msg = next(_ids)
    scratch = None
    pending = iter(flats)
    flat, start = next(pending, None), 0
    for part in range(parts):
        filled, pieces = 0, []
        while flat is not None and filled < per_frame:
            take = min(per_frame - filled, flat.numel() - start)
            piece = flat[start : start + take]
            if piece.dtype == codec.dtype and piece.device.type == "cpu" and piece.is_contiguous():
                pieces.append(_byte_view(piece))  # already wire bytes: no copy
            else:
                if scratch is None:
                    scratch = torch.empty(min(per_frame, total), dtype=codec.dtype)
                scratch[filled : filled + take].copy_(piece)  # converts (and leaves a device)
                pieces.append(_byte_view(scratch[filled : filled + take]))
            filled, start = filled + take, start + take
            if start == flat.numel():
                flat, start = next(pending, None), 0
        yield _frame_parts(head, msg, part, parts, total * codec.itemsize, pieces)
