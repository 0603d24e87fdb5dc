"""Data that resumes by itself: the sampler and the iterable give, after seek(k), exactly the samples
a run from the start gives from batch k on; shards are disjoint; DataLoader workers keep the order."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader

from ddiloco.api.data import ResumableIterable, ResumableSampler


def take(iterable, n):
    return list(itertools.islice(iter(iterable), n))


def test_sampler_resumes_at_the_exact_sample_across_epochs():
    full = take(ResumableSampler(50, learner=1, learners=3, batch_size=4, seed=7), 40)  # 17 per epoch: 2+ epochs
    resumed = ResumableSampler(50, learner=1, learners=3, batch_size=4, seed=7)
    resumed.seek(5)
    assert take(resumed, 20) == full[20:40]
    assert set(full[:17]) == set(range(1, 50, 3)) and full[:17] != sorted(full[:17])  # the shard, shuffled


def test_learners_and_ranks_read_disjoint_shards_covering_the_data():
    seen = [set(take(ResumableSampler(24, m, 2, batch_size=1, rank=r, world=3), 4)) for m in range(2) for r in range(3)]
    assert all(not (a & b) for a, b in itertools.combinations(seen, 2))
    assert set().union(*seen) == set(range(24))


def test_sampler_through_a_dataloader_with_workers_resumes_too():
    data = torch.arange(100)
    first = ResumableSampler(data, 0, 2, batch_size=5, seed=1)
    loader = DataLoader(data, batch_size=5, sampler=first, num_workers=2)
    batches = [b.tolist() for b in take(loader, 6)]
    again = ResumableSampler(data, 0, 2, batch_size=5, seed=1)
    again.seek(3)
    resumed = [b.tolist() for b in take(DataLoader(data, batch_size=5, sampler=again, num_workers=2), 3)]
    assert resumed == batches[3:]


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_keeps_stream_order_with_workers_and_resumes(workers):
    stream = list(range(200))

    def loader(position):
        it = ResumableIterable(stream, learner=1, learners=2, batch_size=4)
        it.seek(position)
        return [b.tolist() for b in DataLoader(it, batch_size=4, num_workers=workers)]

    batches = loader(0)
    assert batches[0] == [1, 3, 5, 7] and batches[1] == [9, 11, 13, 15] and len(batches) == 25
    assert loader(7) == batches[7:]


def test_bad_positions_and_shards_are_refused():
    with pytest.raises(ValueError, match="out of range"):
        ResumableSampler(10, learner=2, learners=2, batch_size=1)
    with pytest.raises(ValueError, match="none for shard"):
        ResumableSampler(1, learner=1, learners=2, batch_size=1)
    with pytest.raises(ValueError, match=">= 0"):
        ResumableSampler(10, 0, 1, batch_size=1).seek(-1)
