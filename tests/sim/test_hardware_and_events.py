import pytest

from ddiloco.sim.events import EventQueue
from ddiloco.sim.hardware import LinkModel, StepTimeModel, half_slow


def test_event_queue_orders_by_time_then_insertion():
    q = EventQueue()
    q.push(2.0, "c")
    q.push(1.0, "a")
    q.push(1.0, "b")
    assert [q.pop()[1] for _ in range(3)] == ["a", "b", "c"]
    assert q.now == 2.0
    with pytest.raises(ValueError):
        q.push(1.0, "past")


def test_step_times_heterogeneity_jitter_and_determinism():
    model = StepTimeModel(base=2.0, speeds=half_slow(4, 1.2), jitter=0.1)
    assert model.speeds == (1.0, 1.0, 1.2, 1.2)
    first = model.sampler(0, seed=3)
    fast = [first() for _ in range(200)]
    slow = model.sampler(3, seed=3)
    slow_times = [slow() for _ in range(200)]
    assert all(1.8 <= t <= 2.2 for t in fast)
    assert all(2.16 <= t <= 2.64 for t in slow_times)
    again = model.sampler(0, seed=3)
    assert [again() for _ in range(200)] == fast
    assert model.sampler(1, seed=3)() != fast[0]


def test_stragglers_are_rare_and_slow():
    model = StepTimeModel(straggle_prob=0.1, straggle_factor=5.0)
    sample = model.sampler(0, seed=0)
    times = [sample() for _ in range(2000)]
    share = sum(t == 5.0 for t in times) / len(times)
    assert 0.07 < share < 0.13 and set(times) == {1.0, 5.0}


def test_link_model():
    link = LinkModel(latency=0.1, bandwidth=1000.0, merge_rate=100.0)
    assert link.transfer(500) == pytest.approx(0.6)
    assert link.merge(numel=50, contributors=4) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        LinkModel(bandwidth=0)
    with pytest.raises(ValueError):
        StepTimeModel(jitter=1.5)
