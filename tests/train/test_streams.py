from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ddiloco.train.streams import BLOCK_TOKENS, TokenWindowStream, shard_bounds
from ddiloco.train.tasks import make_task


@pytest.fixture(scope="module")
def lm_task(shakespeare: str):
    return make_task("gpt", shakespeare, model_size="tiny", seq_len=32)


def _same(a, b) -> bool:
    return torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets) and a.tokens == b.tokens


def test_batch_depends_only_on_seed_shard_index(lm_task) -> None:
    s1 = lm_task.stream(1, 4, 8, seed=3)
    s2 = lm_task.stream(1, 4, 8, seed=3)
    for _ in range(3):
        s2.next()  # a different position must not matter for random access
    assert _same(s1.batch_at(5), s2.batch_at(5))
    assert not _same(s1.batch_at(5), s1.batch_at(6))
    assert not _same(s1.batch_at(5), lm_task.stream(1, 4, 8, seed=4).batch_at(5))
    assert not _same(s1.batch_at(5), lm_task.stream(2, 4, 8, seed=3).batch_at(5))


def test_lm_batch_shapes_and_shift(lm_task) -> None:
    stream = lm_task.stream(0, 2, 8, seed=0)
    batch = stream.next()
    assert batch.inputs.shape == batch.targets.shape == (8, 32)
    assert batch.inputs.dtype == batch.targets.dtype == torch.long
    assert batch.tokens == 8 * 32
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    starts = stream.sample_indices(0)
    train = lm_task.corpus.train
    expected = np.stack([train[s : s + 33] for s in starts]).astype(np.int64)
    assert torch.equal(batch.inputs, torch.from_numpy(expected[:, :-1]))
    assert torch.equal(batch.targets, torch.from_numpy(expected[:, 1:]))


def test_seek_then_next_equals_sequential(lm_task) -> None:
    seq = lm_task.stream(0, 3, 4, seed=9)
    drawn = [seq.next() for _ in range(7)]
    assert seq.position == 7
    jump = lm_task.stream(0, 3, 4, seed=9)
    jump.seek(4)
    for i in range(4, 7):
        assert _same(jump.next(), drawn[i])
    assert jump.position == 7


def test_state_dict_json_round_trip_resumes_exactly(lm_task) -> None:
    a = lm_task.stream(2, 3, 4, seed=1)
    for _ in range(5):
        a.next()
    state = json.loads(json.dumps(a.state_dict()))
    assert state["position"] == 5
    b = lm_task.stream(2, 3, 4, seed=1)
    b.load_state_dict(state)
    assert _same(a.next(), b.next())
    with pytest.raises(ValueError, match="shard"):
        lm_task.stream(1, 3, 4, seed=1).load_state_dict(state)
    with pytest.raises(ValueError):
        a.seek(-1)


def test_contiguous_shards_read_disjoint_contiguous_chunks(shakespeare: str) -> None:
    lm_task = make_task("gpt", shakespeare, model_size="tiny", seq_len=32, shard_layout="contiguous")
    n = len(lm_task.corpus.train)
    num_shards = 4
    ranges = [shard_bounds(n, s, num_shards) for s in range(num_shards)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(num_shards - 1))
    touched = []
    for s in range(num_shards):
        stream = lm_task.stream(s, num_shards, 64, seed=0)
        starts = np.concatenate([stream.sample_indices(i) for i in range(50)])
        lo, hi = ranges[s]
        assert starts.min() >= lo and starts.max() + 32 + 1 <= hi  # whole window inside the chunk
        touched.append((starts.min(), starts.max() + 33))
    for (_, a_hi), (b_lo, _) in zip(touched, touched[1:], strict=False):
        assert a_hi <= b_lo


def test_interleaved_shards_are_disjoint_blocks_dealt_in_turn_that_span_the_whole_text(lm_task) -> None:
    """The default: blocks of BLOCK_TOKENS dealt round-robin; every window lies inside one block of its
    own shard, and each shard reads from the first and the last tenth of the text alike."""
    n = len(lm_task.corpus.train)
    num_shards = 4
    for s in range(num_shards):
        stream = lm_task.stream(s, num_shards, 256, seed=0)
        starts = np.concatenate([stream.sample_indices(i) for i in range(40)])
        block = starts // BLOCK_TOKENS
        last = n // BLOCK_TOKENS - 1  # the last block also takes the text's tail
        assert set(np.unique(np.minimum(block, last)) % num_shards) == {s}  # its own blocks only
        ends = starts + 32  # the window's last token
        assert np.all(np.minimum(ends // BLOCK_TOKENS, last) == np.minimum(block, last))  # inside the block
        assert starts.min() < n // 10 and starts.max() > n - n // 10  # the whole text, not a quarter
        assert all(lo // BLOCK_TOKENS % num_shards == s for lo, _ in stream.blocks())
        assert sum(hi - lo for lo, hi in stream.blocks()) >= n // num_shards - BLOCK_TOKENS


def test_a_text_too_short_for_a_block_per_shard_is_dealt_in_smaller_blocks(shakespeare: str) -> None:
    task = make_task("gpt", shakespeare, model_size="tiny", seq_len=32)
    text = task.corpus.train[: 3 * BLOCK_TOKENS]  # 12 shards: blocks of 1024
    streams = [TokenWindowStream(text, 32, s, 12, 64, seed=0) for s in range(12)]
    seen = [set(np.concatenate([st.sample_indices(i) for i in range(20)]) // 1024) for st in streams]
    assert all(len(blocks) >= 1 for blocks in seen)
    assert all(b % 12 == s for s, blocks in enumerate(seen) for b in blocks)
    with pytest.raises(ValueError, match="shard layout"):
        TokenWindowStream(text, 32, 0, 2, 4, seed=0, layout="striped")


def test_too_many_shards_is_a_clear_error(lm_task) -> None:
    with pytest.raises(ValueError, match="fewer than seq_len"):
        lm_task.stream(0, len(lm_task.corpus.train) // 10, 2, seed=0)
    with pytest.raises(ValueError):
        lm_task.stream(4, 4, 2, seed=0)


def test_vision_stream_determinism_and_shards() -> None:
    task = make_task("vision", model_size="tiny")
    s = task.stream(1, 2, 16, seed=5)
    b = s.next()
    assert b.inputs.shape == (16, 1, 8, 8) and b.inputs.dtype == torch.float32
    assert b.targets.shape == (16,) and b.tokens == 16
    assert _same(b, task.stream(1, 2, 16, seed=5).batch_at(0))
    s.seek(10)
    assert _same(s.next(), task.stream(1, 2, 16, seed=5).batch_at(10))
    n = len(task.data.x_train)
    idx0 = np.concatenate([task.stream(0, 2, 64, 0).sample_indices(i) for i in range(20)])
    idx1 = np.concatenate([task.stream(1, 2, 64, 0).sample_indices(i) for i in range(20)])
    assert idx0.max() < n // 2 <= idx1.min() and idx1.max() < n
    assert torch.equal(b.targets, torch.from_numpy(task.data.y_train[s.sample_indices(0)]))
