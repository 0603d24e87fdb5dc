import pytest
import torch

from ddiloco.wire import quant


@pytest.mark.parametrize(
    "codec, bound, ratio", [("fp32", 0.0, 1.0), ("bf16", 0.005, 0.5), ("int8", 0.01, 0.27), ("int4", 0.15, 0.15)]
)
def test_round_trip_error_and_size(codec, bound, ratio):
    torch.manual_seed(0)
    x = torch.randn(64, 129)
    c = quant.get(codec)
    data = c.encode(x)
    assert len(data) == c.nbytes(tuple(x.shape))
    assert len(data) <= ratio * x.numel() * 4 + 64
    y = c.decode(memoryview(bytearray(data)), tuple(x.shape))
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert float((y - x).norm() / x.norm()) <= bound


@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_integer_codecs_keep_zero_and_extremes(codec):
    x = torch.zeros(300)
    x[5], x[290] = 3.0, -7.0  # in different blocks: each is its block's absmax
    y = quant.get(codec).decode(quant.get(codec).encode(x), (300,))
    assert torch.allclose(y[[5, 290]], x[[5, 290]], rtol=1e-6)
    assert int((y != 0).sum()) == 2


@pytest.mark.parametrize("codec", list(quant.CODECS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_stay_non_finite(codec, bad):
    x = torch.randn(100)
    x[17] = bad
    c = quant.get(codec)
    y = c.decode(c.encode(x), (100,))
    assert not bool(torch.isfinite(y).all())


def test_empty_and_scalar_tensors():
    for name, c in quant.CODECS.items():
        assert c.decode(c.encode(torch.zeros(0)), (0,)).numel() == 0, name
        assert c.decode(c.encode(torch.tensor(2.5)), ()).shape == (), name


def test_unknown_codec_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown codec 'int2'"):
        quant.get("int2")


def test_wrong_buffer_size_is_refused():
    with pytest.raises(ValueError, match="bytes for shape"):
        quant.get("int4").decode(b"\0" * 3, (100,))


def test_bf16_decoded_in_its_wire_dtype_is_a_view_of_the_received_bytes():
    t = torch.randn(33, 5)
    buf = memoryview(bytearray(quant.get("bf16").encode(t)))  # a reassembled (writable) message
    kept = quant.get("bf16").decode(buf, (33, 5), wire_dtype=True)
    assert kept.dtype == torch.bfloat16 and torch.equal(kept, t.bfloat16())
    buf[0:2] = bytes(2)  # the tensor is the buffer: no copy was made
    assert kept.flatten()[0] == 0
    widened = quant.get("bf16").decode(buf, (33, 5))
    assert widened.dtype == torch.float32 and torch.equal(widened, kept.float())
    assert quant.get("int8").decode(quant.get("int8").encode(t), (33, 5), wire_dtype=True).dtype == torch.float32
