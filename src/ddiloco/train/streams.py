"""Deterministic, random-access batch streams over one shard of the training data.

Batch i of a stream depends only on (seed, shard, i): it is drawn with
`np.random.default_rng([seed, shard, i])`. So a learner that restarts after a failure
resumes exactly where it was by `seek(position)` -- O(1), no replay -- and two runs with
the same seed see the same data whatever failed in between.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Batch:
    """One training batch; `tokens` counts what was trained on (LM: target tokens; vision: images)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    tokens: int


def shard_bounds(n: int, shard: int, num_shards: int) -> tuple[int, int]:
    """[start, end) of contiguous chunk `shard` when n items are split into num_shards nearly equal chunks."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard must be in [0, {num_shards}), got {shard}")
    return n * shard // num_shards, n * (shard + 1) // num_shards


class BatchStream(ABC):
    """Deterministic, random-access stream of batches for one shard: batch i depends only on (seed, shard, i)."""

    def __init__(self, shard: int, num_shards: int, batch_size: int, seed: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        shard_bounds(0, shard, num_shards)  # validates shard / num_shards
        self.shard = shard
        self.num_shards = num_shards
        self.batch_size = batch_size
        self.seed = seed
        #: Batches drawn so far; the resume point.
        self.position = 0

    def rng(self, index: int) -> np.random.Generator:
        """The generator that batch `index` is drawn with."""
        return np.random.default_rng([self.seed, self.shard, index])

    @abstractmethod
    def sample_indices(self, index: int) -> np.ndarray:
        """Where batch `index` reads from: absolute positions in the task's training data."""

    @abstractmethod
    def batch_at(self, index: int) -> Batch:
        """Batch `index` (does not move `position`)."""

    def next(self) -> Batch:
        batch = self.batch_at(self.position)
        self.position += 1
        return batch

    def seek(self, position: int) -> None:
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        self.position = int(position)

    def state_dict(self) -> dict:
        """JSON-serialisable; the configuration is kept so a mismatched restore fails loudly."""
        return {
            "position": self.position,
            "seed": self.seed,
            "shard": self.shard,
            "num_shards": self.num_shards,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "shard", "num_shards", "batch_size"):
            if key in state and int(state[key]) != getattr(self, key):
                raise ValueError(
                    f"stream state is for {key}={state[key]}, but this stream has {key}={getattr(self, key)}"
                )
        self.seek(int(state["position"]))

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Batch:
        return self.next()


#: How a text corpus is dealt to the shards (`TokenWindowStream`).
SHARD_LAYOUTS = ("interleaved", "contiguous")


def check_shard_layout(layout: str) -> str:
    """`layout`, if it is one of SHARD_LAYOUTS; a one-line ValueError otherwise."""
    if layout not in SHARD_LAYOUTS:
        raise ValueError(f"unknown shard layout {layout!r}; choose one of {', '.join(SHARD_LAYOUTS)}")
    return layout


#: Tokens per block of the interleaved layout: whole passages (tens of lines of a play, a few
#: functions of a module), far longer than a window, dealt round-robin.
BLOCK_TOKENS = 4096


class TokenWindowStream(BatchStream):
    """Random windows of seq_len + 1 tokens from this shard's part of the corpus, each wholly inside it.

    `layout` "interleaved" (the default): the corpus is cut into blocks of BLOCK_TOKENS (fewer when
    the corpus is too short for one block per shard), dealt round-robin, so every shard spans the
    whole text and the shards are disjoint. "contiguous": shard s is the s-th of num_shards equal
    chunks, as before 0.4. A corpus is rarely uniform from end to end (a book's acts, a library's
    modules; the validation split is its tail): with contiguous chunks each learner trains on its
    own part of it, and whichever learner is down or slow takes its part away from the model (in the
    preemptible scenario every elastic method stalled while the learner of the last chunk, the one
    nearest the validation text, was down; docs/results.md, "Learners' shards")."""

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        shard: int,
        num_shards: int,
        batch_size: int,
        seed: int,
        layout: str = "interleaved",
    ) -> None:
        super().__init__(shard, num_shards, batch_size, seed)
        check_shard_layout(layout)
        self.seq_len = seq_len
        self.layout = layout
        n = len(tokens)
        block = n // num_shards if layout == "contiguous" else min(BLOCK_TOKENS, n // num_shards)
        if block < seq_len + 1:
            raise ValueError(
                f"shard {shard}/{num_shards} holds {block} tokens a block, fewer than "
                f"seq_len + 1 = {seq_len + 1}; use fewer shards, a shorter seq_len or more text"
            )
        if layout == "contiguous":
            bounds = [shard_bounds(n, shard, num_shards)]
        else:  # blocks shard, shard + num_shards, ...; the last block of the corpus takes its tail
            count = n // block
            bounds = [(b * block, n if b == count - 1 else (b + 1) * block) for b in range(shard, count, num_shards)]
        self._starts = np.array([lo for lo, _ in bounds], dtype=np.int64)
        # window starts per block: every window ends inside its block
        self._room = np.array([hi - lo - seq_len for lo, hi in bounds], dtype=np.int64)
        self._cumulative = np.cumsum(self._room)
        self._tokens = tokens
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)

    def blocks(self) -> list[tuple[int, int]]:
        """[start, end) of each of this shard's blocks of the corpus: every token it can read."""
        return [(int(lo), int(lo + room + self.seq_len)) for lo, room in zip(self._starts, self._room, strict=True)]

    def sample_indices(self, index: int) -> np.ndarray:
        """Start positions [batch_size] of the windows of batch `index`: uniform over every window
        that lies wholly inside one of this shard's blocks."""
        k = self.rng(index).integers(0, int(self._cumulative[-1]), size=self.batch_size, dtype=np.int64)
        b = np.searchsorted(self._cumulative, k, side="right")
        before = np.where(b > 0, self._cumulative[np.maximum(b - 1, 0)], 0)
        return self._starts[b] + (k - before)

    def batch_at(self, index: int) -> Batch:
        idx = self.sample_indices(index)[:, None] + self._offsets
        windows = torch.from_numpy(self._tokens[idx].astype(np.int64))
        return Batch(
            inputs=windows[:, :-1].contiguous(),
            targets=windows[:, 1:].contiguous(),
            tokens=self.batch_size * self.seq_len,
        )


class ImageStream(BatchStream):
    """Random images (with replacement) from this shard's contiguous chunk of the training set."""

    def __init__(
        self, images: np.ndarray, labels: np.ndarray, shard: int, num_shards: int, batch_size: int, seed: int
    ) -> None:
        super().__init__(shard, num_shards, batch_size, seed)
        self.start, self.end = shard_bounds(len(images), shard, num_shards)
        if self.end <= self.start:
            raise ValueError(f"shard {shard}/{num_shards} holds no images ({len(images)} in all)")
        self._images = images
        self._labels = labels

    def sample_indices(self, index: int) -> np.ndarray:
        return self.start + self.rng(index).integers(0, self.end - self.start, size=self.batch_size, dtype=np.int64)

    def batch_at(self, index: int) -> Batch:
        idx = self.sample_indices(index)
        return Batch(
            inputs=torch.from_numpy(self._images[idx]),
            targets=torch.from_numpy(self._labels[idx]),
            tokens=self.batch_size,
        )
