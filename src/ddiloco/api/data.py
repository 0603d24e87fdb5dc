"""Data that resumes by itself: a learner restarted after kill -9 goes on at the exact sample after
its last counted contribution, with a plain `torch.utils.data.DataLoader` (workers included) and
with Hugging Face `datasets` (map-style through the sampler, streaming through the iterable).

`client.start()` returns the learner's data position in batches; `seek(position)` before iterating
is the whole resume. Learner m of M (rank r of a learner's R ranks) reads shard m*R + r of M*R.

    sampler = ddiloco.ResumableSampler(dataset, learner=m, learners=M, batch_size=16)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=2)
    sampler.seek(client.start())
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized

import numpy as np
import torch


def _shard(learner: int, learners: int, rank: int, world: int) -> tuple[int, int]:
    if not 0 <= learner < learners or not 0 <= rank < world:
        raise ValueError(f"learner {learner} of {learners}, rank {rank} of {world}: out of range")
    return learner * world + rank, learners * world


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Indices of a map-style dataset: this shard's samples in a fresh seeded order every epoch,
    endless, starting at batch `position` after `seek`. Deterministic, so a restart reproduces it."""

    def __init__(
        self,
        dataset: Sized | int,
        learner: int,
        learners: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        n = dataset if isinstance(dataset, int) else len(dataset)
        self.shard, self.shards = _shard(learner, learners, rank, world)
        self.indices = np.arange(self.shard, n, self.shards)
        if self.indices.size == 0:
            raise ValueError(f"a dataset of {n} samples has none for shard {self.shard} of {self.shards}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size, self.seed = batch_size, seed
        self.start = 0

    def seek(self, position: int) -> None:
        """Start at batch `position` (what `client.start()` returned) of this shard's stream."""
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        self.start = position * self.batch_size

    def __iter__(self) -> Iterator[int]:
        per_epoch = self.indices.size
        epoch, offset = divmod(self.start, per_epoch)
        while True:
            order = np.random.default_rng([self.seed, self.shard, epoch]).permutation(self.indices)
            for i in order[offset:]:
                yield int(i)
            epoch, offset = epoch + 1, 0


class ResumableIterable(torch.utils.data.IterableDataset):
    """A stream of samples (a Hugging Face streaming dataset, a generator factory, any iterable that
    can be iterated again from its start): this shard's samples, in stream order, from batch
    `position` after `seek`. With DataLoader workers, worker w yields the batches w, w + W, ... so
    that the loader's round-robin hands them out in stream order. Every learner reads the whole
    stream and keeps its share."""

    def __init__(
        self, source: Iterable, learner: int, learners: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> None:
        self.source = source
        self.shard, self.shards = _shard(learner, learners, rank, world)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.position = 0

    def seek(self, position: int) -> None:
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        self.position = position

    def __iter__(self) -> Iterator:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = (x for i, x in enumerate(self.source) if i % self.shards == self.shard)
        for j, sample in enumerate(mine):
            batch = j // self.batch_size
            if batch >= self.position and (batch - self.position) % workers == worker:
                yield sample
