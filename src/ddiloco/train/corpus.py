"""A tokenized train/validation corpus, cached per process.

Every learner of an in-process simulation builds its own task; reading, (training a BPE
on) and encoding a corpus once instead of once per learner keeps start-up cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .text import load_text
from .tokenize import BPETokenizer, ByteTokenizer, make_tokenizer


@dataclass(frozen=True)
class EncodedCorpus:
    """Token ids of the train and validation splits, stored compactly (uint16 when they fit)."""

    tokenizer: ByteTokenizer | BPETokenizer
    train: np.ndarray
    val: np.ndarray
    source: str


_CACHE: dict[tuple, EncodedCorpus] = {}


def _compact(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    arr = ids.astype(dtype)
    arr.setflags(write=False)  # shared by every stream and task built from the cache
    return arr


def encoded_corpus(
    path: str | Path | None, tokenizer: str = "byte", bpe_vocab_size: int = 1024, val_fraction: float = 0.1
) -> EncodedCorpus:
    """Load, split, (train a BPE on the train split) and encode; cached per arguments."""
    source = "<stdlib>" if path is None else str(Path(path).expanduser().resolve())
    key = (source, tokenizer, bpe_vocab_size if tokenizer == "bpe" else None, val_fraction)
    if key not in _CACHE:
        train_text, val_text = load_text(path, val_fraction)
        tok = make_tokenizer(tokenizer, train_text, bpe_vocab_size)
        _CACHE[key] = EncodedCorpus(
            tokenizer=tok,
            train=_compact(tok.encode(train_text), tok.vocab_size),
            val=_compact(tok.encode(val_text), tok.vocab_size),
            source=source,
        )
    return _CACHE[key]


def clear_cache() -> None:
    _CACHE.clear()
