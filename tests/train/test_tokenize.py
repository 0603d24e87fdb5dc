from __future__ import annotations

import numpy as np
import pytest

from ddiloco.train.text import load_text
from ddiloco.train.tokenize import BPETokenizer, ByteTokenizer, make_tokenizer

SAMPLE = "Hello, wörld! 🙂\n\tTabs, ünïcödé, 数字 and\x00 control chars.\n"


def test_byte_round_trip() -> None:
    tok = ByteTokenizer()
    ids = tok.encode(SAMPLE)
    assert tok.vocab_size == 256
    assert np.issubdtype(ids.dtype, np.integer)
    assert len(ids) == len(SAMPLE.encode("utf-8"))
    assert ids.min() >= 0 and ids.max() < 256
    assert tok.decode(ids) == SAMPLE
    assert tok.decode(list(ids)) == SAMPLE


def test_byte_decode_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        ByteTokenizer().decode([65, 300])


@pytest.fixture(scope="module")
def bpe(shakespeare: str) -> BPETokenizer:
    train, _ = load_text(shakespeare)
    return BPETokenizer.train(train[:300_000], vocab_size=512)


def test_bpe_round_trip_and_compression(bpe: BPETokenizer, shakespeare: str) -> None:
    _, val = load_text(shakespeare)
    val = val[:50_000]
    ids = bpe.encode(val)
    assert bpe.vocab_size == 512
    assert ids.min() >= 0 and ids.max() < bpe.vocab_size
    assert bpe.decode(ids) == val
    assert len(ids) < 0.7 * len(val.encode("utf-8"))  # merges actually shorten the text
    assert bpe.decode(bpe.encode(SAMPLE)) == SAMPLE  # unseen characters still round-trip


def test_bpe_serialisation(bpe: BPETokenizer) -> None:
    again = BPETokenizer.from_json(bpe.to_json())
    text = "To be, or not to be: that is the question.\n"
    np.testing.assert_array_equal(again.encode(text), bpe.encode(text))


def test_make_tokenizer() -> None:
    assert make_tokenizer("byte").vocab_size == 256
    assert make_tokenizer("bpe", "abc abd abe " * 200, vocab_size=300).vocab_size <= 300
    with pytest.raises(ValueError, match="byte, bpe"):
        make_tokenizer("wordpiece")
    with pytest.raises(ValueError):
        make_tokenizer("bpe", "")
