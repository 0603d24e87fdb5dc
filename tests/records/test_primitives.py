"""The small records primitives against hand-computed values: a token bucket, atomic writes, the
length of a union of intervals."""

from __future__ import annotations

import os

import pytest

from ddiloco.records.atomic import atomic_save, atomic_write, atomic_write_json, read_json
from ddiloco.records.intervals import union_length
from ddiloco.records.ratelimit import RateLimit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rate_limit_passes_a_burst_then_the_rate_and_counts_what_it_dropped():
    clock = Clock()
    limit = RateLimit(per_second=2.0, burst=3, clock=clock)
    assert [limit.allow() for _ in range(5)] == [0, 0, 0, None, None]
    clock.now += 0.5  # one token back at 2 per second
    assert limit.allow() == 2  # the two lines held back are counted on the next one through
    assert limit.allow() is None
    clock.now += 100.0  # refills to the burst, never beyond
    assert [limit.allow() for _ in range(4)] == [1, 0, 0, None]


@pytest.mark.parametrize("per_second,burst", [(0.0, 1), (-1.0, 3), (1.0, 0)])
def test_rate_limit_refuses_nonsense(per_second, burst):
    with pytest.raises(ValueError):
        RateLimit(per_second=per_second, burst=burst)


@pytest.mark.parametrize("durable", [True, False])
def test_atomic_writes_replace_the_file_and_leave_no_temporary(tmp_path, durable):
    path = tmp_path / "state.json"
    atomic_write_json(path, {"b": 2, "a": [1.5]}, durable=durable)
    assert read_json(path) == {"a": [1.5], "b": 2}
    atomic_write(path, b"{}", durable=durable)
    assert read_json(path) == {}
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_failed_save_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "weights.bin"
    atomic_write(path, b"old")

    def half_write(tmp):
        tmp.write_bytes(b"ne")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_save(path, half_write)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["weights.bin"]


@pytest.mark.parametrize(
    "intervals,length",
    [
        ([], 0.0),
        ([(0.0, 1.0)], 1.0),
        ([(0.0, 1.0), (2.0, 3.5)], 2.5),  # apart
        ([(0.0, 2.0), (1.0, 3.0)], 3.0),  # overlapping
        ([(1.0, 3.0), (0.0, 4.0), (5.0, 6.0)], 5.0),  # nested, unsorted
        ([(0.0, 1.0), (1.0, 2.0)], 2.0),  # touching
    ],
)
def test_union_length(intervals, length):
    assert union_length(intervals) == pytest.approx(length)
