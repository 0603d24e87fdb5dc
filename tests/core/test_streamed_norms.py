"""`StreamedNorms`: a pushed contribution's norms taken as its bytes arrive are `norm`'s to the bit,
and once the last byte is in, no chunk but the last is left to read."""

import math
import random

import torch

from ddiloco.core import round_sum
from ddiloco.core.round_sum import CHUNK, StreamedNorms, norm


def _laid(tensors: dict[str, torch.Tensor]) -> tuple[bytearray, dict[str, torch.Tensor], dict[str, int]]:
    """`tensors` laid end to end in one zeroed buffer (as a push's payload), views of it, and offsets."""
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    buf = bytearray(total)
    flat = torch.frombuffer(buf, dtype=torch.uint8)
    views, offsets, at = {}, {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        views[name] = flat[at : at + n].view(t.dtype).view(t.shape)
        offsets[name], at = at, at + n
    return buf, views, offsets


def _stream(tensors: dict[str, torch.Tensor], seed: int) -> tuple[StreamedNorms, bytearray]:
    """The bytes of `tensors` written into the buffer in uneven pieces, `advance` told after each."""
    source = bytearray(b"".join(t.reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors.values()))
    buf, views, offsets = _laid(tensors)
    streamed = StreamedNorms(views, offsets)
    rng, at = random.Random(seed), 0
    while at < len(buf):
        step = min(len(buf) - at, rng.randint(1, 3 * CHUNK))
        buf[at : at + step] = source[at : at + step]
        at += step
        streamed.advance(at)
    return streamed, buf


def test_streamed_norms_are_norm_to_the_bit():
    torch.manual_seed(0)
    tensors = {
        "big": (torch.randn(3 * CHUNK + 17) * 1e-3).to(torch.bfloat16),
        "exact": torch.randn(2, CHUNK).to(torch.bfloat16),
        "small": torch.randn(CHUNK - 1).to(torch.bfloat16),  # one pass, not chunked
        "fp32": torch.randn(2 * CHUNK + 3),  # float32: one whole-tensor pass, as `norm` takes it
    }
    for seed in range(3):
        streamed, _ = _stream(tensors, seed)
        got = streamed.norms()
        assert got == {n: norm(t) for n, t in tensors.items()}, seed
        assert all(math.isfinite(v) and v > 0 for v in got.values())


def test_once_the_last_byte_is_in_no_chunk_is_left(monkeypatch):
    tensors = {"a": torch.randn(4 * CHUNK + 5).to(torch.bfloat16), "b": torch.randn(CHUNK * 2).to(torch.bfloat16)}
    streamed, _ = _stream(tensors, 7)
    calls = []
    real = round_sum.chunk_square
    monkeypatch.setattr(round_sum, "chunk_square", lambda part: calls.append(part.numel()) or real(part))
    got = streamed.norms()
    assert calls == []  # every chunk was squared as it arrived
    assert got == {n: norm(t) for n, t in tensors.items()}
    assert len(calls) == 5 + 2  # the reference read every chunk: the count above could fail


def test_a_nan_or_inf_anywhere_makes_the_streamed_norm_non_finite():
    for bad in (float("nan"), float("inf")):
        t = torch.randn(3 * CHUNK).to(torch.bfloat16)
        t[2 * CHUNK + 11] = bad
        streamed, _ = _stream({"w": t}, 1)
        assert not math.isfinite(streamed.norms()["w"])


def test_values_whose_squares_overflow_take_norms_rescaled_path_too():
    t = torch.full((2 * CHUNK,), 1e30).to(torch.bfloat16)  # squares overflow float32, the values do not
    streamed, _ = _stream({"w": t}, 2)
    got = streamed.norms()["w"]
    assert math.isfinite(got) and got == norm(t)
