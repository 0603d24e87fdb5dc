"""Digests of parameter values: equal exactly when shape and float32 bits are equal."""

import torch

from ddiloco.wire.digest import DIGEST_CHARS, is_digest, value_digest, value_digests


def test_a_digest_is_equal_exactly_when_the_float32_values_and_shape_are():
    torch.manual_seed(0)
    a = torch.randn(6, 5)
    assert value_digest(a) == value_digest(a.clone()) == value_digest(a.t().contiguous().t())  # layout aside
    one_ulp = a.clone()
    one_ulp[3, 2] = torch.nextafter(one_ulp[3, 2], torch.tensor(10.0))
    assert value_digest(one_ulp) != value_digest(a)
    assert value_digest(a.reshape(5, 6)) != value_digest(a)  # same bytes, another shape
    assert value_digest(a.to(torch.bfloat16)) == value_digest(a.to(torch.bfloat16).float())  # its float32 values
    assert value_digest(torch.tensor(2.0)) != value_digest(torch.tensor([2.0]))
    assert value_digest(torch.zeros(0, 3)) != value_digest(torch.zeros(3, 0))
    d = value_digests({"w": a, "b": torch.zeros(2)})
    assert list(d) == ["w", "b"] and all(is_digest(v) and len(v) == DIGEST_CHARS for v in d.values())


def test_only_lowercase_hex_of_the_right_length_is_a_digest():
    assert is_digest("0" * DIGEST_CHARS)
    for bad in (
        "0" * (DIGEST_CHARS - 1),
        "0" * (DIGEST_CHARS + 1),
        "G" * DIGEST_CHARS,
        "A" * DIGEST_CHARS,
        5,
        None,
        ["0" * DIGEST_CHARS],
    ):
        assert not is_digest(bad)
