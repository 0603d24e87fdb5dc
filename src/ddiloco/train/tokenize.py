"""Tokenizers: raw UTF-8 bytes (the default) or a byte-level BPE trained locally.

Bytes need no training and no files, so any corpus works out of the box. BPE shortens
sequences about 2-3x for the same text, trained in well under a second on ~1 MB with the
`tokenizers` library, on the training split only, so nothing is downloaded and
validation text never leaks into the vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import tokenizers

#: Texts are encoded in chunks of about this many characters, cut at line ends, so the
#: Rust tokenizer can work on them in parallel.
_CHUNK_CHARS = 16_384


@runtime_checkable
class Tokenizer(Protocol):
    """What the tasks need from a tokenizer."""

    name: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: np.ndarray | list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocab 256, exact round trip for any text."""

    name = "byte"

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: np.ndarray | list[int]) -> str:
        arr = np.asarray(ids)
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise ValueError("byte token ids must be in [0, 255]")
        # A window may cut a multi-byte character in half; show it rather than fail.
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def _line_chunks(text: str, size: int = _CHUNK_CHARS) -> Iterator[str]:
    """Consecutive pieces of `text` of about `size` characters, each ending at a newline."""
    start = 0
    n = len(text)
    while start < n:
        end = min(start + size, n)
        if end < n:
            nl = text.find("\n", end)
            end = n if nl < 0 else nl + 1
        yield text[start:end]
        start = end


class BPETokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenization), exact round trip for any text."""

    name = "bpe"

    def __init__(self, tokenizer: tokenizers.Tokenizer) -> None:
        self._tok = tokenizer

    @classmethod
    def train(cls, text: str, vocab_size: int = 1024) -> BPETokenizer:
        """Learn merges on `text`; the vocab may end up smaller if the text is tiny."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        if vocab_size < 256:
            raise ValueError(f"BPE vocab_size must be >= 256 (the byte alphabet), got {vocab_size}")
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[],
            show_progress=False,
        )
        tok.train_from_iterator(_line_chunks(text), trainer)
        return cls(tok)

    @classmethod
    def from_json(cls, data: str) -> BPETokenizer:
        """Rebuild from `to_json()` (e.g. stored next to a checkpoint)."""
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_str(data))

    def to_json(self) -> str:
        return self._tok.to_str()

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        encodings = self._tok.encode_batch(list(_line_chunks(text)))
        if not encodings:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in encodings])

    def decode(self, ids: np.ndarray | list[int]) -> str:
        return self._tok.decode([int(i) for i in np.asarray(ids).ravel()])


TOKENIZERS = ("byte", "bpe")


def make_tokenizer(kind: str, train_text: str = "", vocab_size: int = 1024) -> ByteTokenizer | BPETokenizer:
    """ "byte" or "bpe" (trained on `train_text` with `vocab_size` entries)."""
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        if not train_text:
            raise ValueError("a BPE tokenizer needs non-empty training text")
        return BPETokenizer.train(train_text, vocab_size)
    raise ValueError(f"unknown tokenizer {kind!r}; choose one of {', '.join(TOKENIZERS)}")
