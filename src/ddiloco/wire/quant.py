"""Tensor codecs for the wire: fp32, bf16 (the default for outer gradients), int8 and int4.

The integer codecs are blockwise absmax quantisers: each block of `block` values shares one float32
scale absmax / qmax, values are rounded to the nearest integer in [-qmax, qmax]. int4 packs two values
per byte. The paper finds 4-bit outer gradients almost lossless; 2- and 1-bit collapse, so they are
not offered. A block holding NaN or Inf gets a non-finite scale, so it decodes to non-finite values and
the synchronizer's finiteness check still catches it: quantisation never launders bad values.
Bytes are little-endian (every platform PyTorch supports in practice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

if TYPE_CHECKING:
    from typing_extensions import Buffer


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _from_bytes(buf: memoryview | bytes, dtype: torch.dtype) -> torch.Tensor:
    if len(buf) == 0:
        return torch.empty(0, dtype=dtype)
    if isinstance(buf, memoryview) and not buf.readonly:
        return torch.frombuffer(buf, dtype=dtype)
    return torch.frombuffer(bytearray(buf), dtype=dtype)


def _to_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (a view that keeps the tensor alive)."""
    t = t.detach().contiguous().cpu().reshape(-1)  # flat: a shape with a zero cannot be cast to bytes
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    # cast: numpy's stubs type ndarray's buffer protocol (__buffer__) for Python >= 3.12 only
    return memoryview(cast("Buffer", t.numpy())).cast("B")


@dataclass(frozen=True)
class FloatCodec:
    name: str
    dtype: torch.dtype
    itemsize: int

    def nbytes(self, shape: tuple[int, ...]) -> int:
        return _numel(shape) * self.itemsize

    def encode(self, t: torch.Tensor) -> memoryview:
        """The bytes; when `t` already has the wire dtype they are `t`'s own memory, not a copy, so the
        caller must not change `t` until the bytes are sent (ours are always fresh copies)."""
        return _to_bytes(t.detach().to(self.dtype))

    def decode(self, buf: memoryview | bytes, shape: tuple[int, ...], wire_dtype: bool = False) -> torch.Tensor:
        """float32 values (with `wire_dtype`, the values in the codec's own dtype); from a writable buffer
        (a reassembled message, which nothing else holds) a tensor already in the wanted dtype is a view of
        that buffer, not a copy: a synchronizer summing bf16 contributions into float32 keeps only their
        wire bytes."""
        t = _from_bytes(buf, self.dtype).reshape(shape)
        return t if wire_dtype else t.to(torch.float32)


@dataclass(frozen=True)
class BlockIntCodec:
    """Blockwise absmax integer quantisation with `bits` in {4, 8}."""

    name: str
    bits: int
    block: int

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    def _blocks(self, n: int) -> int:
        return -(-n // self.block)

    def nbytes(self, shape: tuple[int, ...]) -> int:
        n = _numel(shape)
        blocks = self._blocks(n)
        values = blocks * self.block
        return blocks * 4 + (values if self.bits == 8 else values // 2)

    def encode(self, t: torch.Tensor) -> memoryview:
        x = t.detach().to("cpu", torch.float32).reshape(-1)
        n = x.numel()
        blocks = self._blocks(n)
        if blocks == 0:
            return memoryview(b"")
        padded = torch.zeros(blocks * self.block, dtype=torch.float32)
        padded[:n] = x
        v = padded.view(blocks, self.block)
        scale = v.abs().amax(dim=1) / self.qmax  # NaN/Inf stay in the scale on purpose
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(v / safe[:, None]).clamp(-self.qmax, self.qmax)
        q = torch.nan_to_num(q, nan=0.0).to(torch.int8)
        if self.bits == 4:
            u = (q + 8).to(torch.uint8).view(-1)
            q = (u[0::2] | (u[1::2] << 4)).to(torch.uint8)
        return memoryview(b"".join((_to_bytes(scale), _to_bytes(q))))

    def decode(self, buf: memoryview | bytes, shape: tuple[int, ...], wire_dtype: bool = False) -> torch.Tensor:
        """float32 values, whatever `wire_dtype` says (integers are no floating-point dtype to keep)."""
        n = _numel(shape)
        blocks = self._blocks(n)
        if blocks == 0:
            return torch.zeros(shape, dtype=torch.float32)
        if len(buf) != self.nbytes(shape):
            raise ValueError(f"{self.name}: {len(buf)} bytes for shape {shape}, expected {self.nbytes(shape)}")
        scale = _from_bytes(buf[: blocks * 4], torch.float32)
        body = buf[blocks * 4 :]
        if self.bits == 8:
            q = _from_bytes(body, torch.int8).to(torch.float32)
        else:
            packed = torch.from_numpy(np.frombuffer(body, dtype=np.uint8).copy())
            q = torch.empty(blocks * self.block, dtype=torch.float32)
            q[0::2] = (packed & 0x0F).to(torch.float32) - 8
            q[1::2] = (packed >> 4).to(torch.float32) - 8
        out = q.view(blocks, self.block) * scale[:, None]
        return out.reshape(-1)[:n].reshape(shape).clone()


CODECS: dict[str, FloatCodec | BlockIntCodec] = {
    "fp32": FloatCodec("fp32", torch.float32, 4),
    "bf16": FloatCodec("bf16", torch.bfloat16, 2),
    "int8": BlockIntCodec("int8", 8, 256),
    "int4": BlockIntCodec("int4", 4, 64),
}


def get(name: str) -> FloatCodec | BlockIntCodec:
    try:
        return CODECS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; choose one of {', '.join(CODECS)}") from None
