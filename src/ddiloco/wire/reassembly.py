"""The receiving side of the wire format (`framing`): frames back into messages, size-checked first.

Frames of different messages may interleave; each message's buffer is taken whole at its first frame,
after its declared size is checked against a limit, and each body is written once, to its place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch

from .buffers import BufferPool, new_buffer
from .framing import MessageTooLarge, TensorSpec, WireError, decode_tensors, unpack_frame


@dataclass
class Message:
    head: dict[str, Any]
    payload: memoryview

    def specs(self) -> list[TensorSpec]:
        items = self.head.get("tensors", [])
        if not isinstance(items, list):
            raise WireError("'tensors' must be a list of specs")
        return [TensorSpec.from_json(item) for item in items]

    def tensors(
        self, expected: Mapping[str, tuple[int, ...]] | None = None, wire_dtype: bool = False
    ) -> dict[str, torch.Tensor]:
        return decode_tensors(self.specs(), self.payload, expected, wire_dtype)


class Reassembler:
    """Collects frames into messages; frames of different messages may interleave (a small control
    message may overtake a large update). Each message's declared size is checked against `limit`
    before anything is buffered, and at most `max_open` messages may be incomplete at once.

    A message's buffer is taken whole at its first frame (from `pool`, see `buffers`, else new) and
    each body is copied once, to its place. It is address space until written, so memory grows only
    as payload actually arrives: a header that declares a gigabyte costs nothing until the gigabyte
    comes, and one the system cannot even reserve is refused as a WireError."""

    def __init__(self, limit: int, max_open: int = 4, pool: BufferPool | None = None) -> None:
        self.limit = limit
        self.max_open = max_open
        self.pool = pool
        self._open: dict[int, list[Any]] = {}  # msg id -> [head, buffer, bytes filled, next part, parts]
        self._placed: tuple[int, list[Any], int] | None = None  # (msg id, its state, bytes filled)
        # the message the last complete() wrote to: (head, its whole buffer, bytes filled, frames in)
        self.filling: tuple[dict[str, Any], memoryview, int, int] | None = None

    def feed(self, data: bytes) -> Message | None:
        """Add one frame; returns the message when its last frame arrives."""
        frame, body = unpack_frame(data)
        self.place(frame, len(body))[:] = body
        return self.complete()

    def place(self, frame: Mapping[str, object], nbytes: int) -> memoryview:
        """Where the `nbytes` of body of the frame with header `frame` go, after the checks `feed`
        makes; write them there, then call `complete` (a socket reader receives straight into it)."""
        part, parts, msg = frame.get("part"), frame.get("parts"), frame.get("msg")
        if not (isinstance(part, int) and isinstance(parts, int) and 0 <= part < parts):
            raise WireError(f"bad part numbering {part}/{parts}")
        if not isinstance(msg, int):
            raise WireError("frame lacks a message id")
        state: list[Any] | None  # [head, buffer, bytes filled, next part, parts]
        if part == 0:
            if msg in self._open:
                raise WireError(f"message {msg} started twice")
            head = frame.get("head")
            if not isinstance(head, dict) or not isinstance(head.get("nbytes"), int) or head["nbytes"] < 0:
                raise WireError("first frame lacks a head with nbytes")
            if head["nbytes"] > self.limit:
                raise MessageTooLarge(f"message of {head['nbytes']} bytes exceeds the limit of {self.limit} bytes")
            if parts > 1 and len(self._open) >= self.max_open:
                raise WireError(f"more than {self.max_open} messages in flight at once")
            state = [head, self._reserve(head["nbytes"]), 0, 0, parts]
            if parts > 1:
                self._open[msg] = state
        else:
            state = self._open.get(msg)
            if state is None or part != state[3] or parts != state[4]:
                raise WireError(f"frame {part}/{parts} of message {msg} arrived out of order")
        buf: memoryview = state[1]
        filled: int = state[2]
        end = filled + nbytes
        if end > len(buf):
            self._open.pop(msg, None)
            raise WireError(f"message body is longer than its declared {len(buf)} bytes")
        self._placed = (msg, state, end)
        return buf[filled:end]

    def complete(self) -> Message | None:
        """The frame `place` answered has been written; returns the message when it was the last."""
        msg, state, end = cast("tuple[int, list[Any], int]", self._placed)  # set by `place`, which comes first
        self._placed = None
        head, buf, _, part, parts = state
        state[2], state[3] = end, part + 1
        self.filling = (head, buf, end, part + 1)  # a reader may look at what is in so far (`core.StreamedNorms`)
        if part + 1 < parts:
            return None
        self._open.pop(msg, None)
        if end != len(buf):
            raise WireError(f"message body has {end} bytes, declared {len(buf)}")
        return Message(head, buf)

    def _reserve(self, nbytes: int) -> memoryview:
        try:
            return self.pool.take(nbytes) if self.pool is not None else new_buffer(nbytes)
        except (RuntimeError, MemoryError) as exc:
            raise WireError(f"cannot reserve {nbytes} bytes for a message: {str(exc)[:120]}") from None


def read_stream(frames_in: Iterable[bytes], limit: int) -> Iterator[Message]:
    """Messages from an iterator of frames."""
    r = Reassembler(limit)
    for data in frames_in:
        m = r.feed(data)
        if m is not None:
            yield m
