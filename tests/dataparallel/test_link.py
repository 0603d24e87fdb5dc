"""The all-reduce pays the emulated link (`dataparallel/link.py`): the ring model by hand, and a real
two-worker run on a slow link that waits measurably longer per step than the same run without it.

What is asserted is the accounting the workers keep (seconds each waited for the link, measured
around the wait), not how fast this machine is: a run with the wait taken out fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddiloco.dataparallel.link import BACKWARD_SHARE, AllReduceLink, ring_bytes
from ddiloco.learner.wan import LinkConfig
from ddiloco.train.tasks import count_parameters, make_task

from .runs import SEQ, TOKENS_PER_WORKER_STEP, finish, running

STEPS = 30
LATENCY_MS, BANDWIDTH_MBPS = 10.0, 2.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def __call__(self) -> float:
        return self.now


def test_ring_model_by_hand():
    assert ring_bytes(1000, 1) == 0.0
    assert ring_bytes(1000, 2) == 1000.0  # 2 (2 - 1) / 2
    assert ring_bytes(1000, 4) == 1500.0  # 2 (4 - 1) / 4
    clock = FakeClock()
    link = AllReduceLink(LinkConfig(latency_ms=10.0, bandwidth_mb_s=0.001), 1000, sleep=clock.sleep, clock=clock)
    # 4 workers: 6 hops of 10 ms + 1500 bytes at 1000 B/s = 0.06 + 1.5
    assert link.seconds(4) == pytest.approx(1.56)
    assert link.seconds(1) == 0.0  # a worker alone sends nothing
    model, waited = link.pay(4, compute_seconds=0.3)  # backward (2/3 of 0.3 s) hides 0.2 s of it
    assert model == pytest.approx(1.56) and waited == pytest.approx(1.56 - 0.2) and BACKWARD_SHARE == 2 / 3
    assert link.pay(4, compute_seconds=3.0) == (pytest.approx(1.56), 0.0)  # all hidden: no wait
    assert AllReduceLink(LinkConfig(), 10**9).seconds(8) == 0.0  # no link given: free, as before
    with pytest.raises(ValueError):
        LinkConfig(bandwidth_mb_s=-1.0)


def test_jitter_is_added_per_hop_within_its_bound():
    link = AllReduceLink(LinkConfig(latency_ms=10.0, jitter_ms=5.0), 0, seed=3)
    values = [link.seconds(3) for _ in range(50)]  # 4 hops
    assert all(0.04 <= v <= 0.06 for v in values) and len(set(values)) > 1


def test_a_slow_link_makes_every_all_reduce_wait(shakespeare: str, tmp_path: Path):
    tokens = 2 * TOKENS_PER_WORKER_STEP * STEPS
    runs = {}
    for name, extra in (
        ("loopback", ()),
        ("slow", ("--net-latency", str(LATENCY_MS), "--net-bandwidth", str(BANDWIDTH_MBPS))),
    ):
        with running(tmp_path / name, shakespeare, "ddp", tokens, *extra) as launcher:
            runs[name] = finish(launcher, tmp_path / name)
    grad_bytes = 4 * count_parameters(make_task("gpt", shakespeare, seq_len=SEQ, model_size="tiny").build_model(0))
    expected = 2 * LATENCY_MS / 1000 + ring_bytes(grad_bytes, 2) / (BANDWIDTH_MBPS * 1e6)  # 2 workers: 2 hops
    slow, fast = runs["slow"], runs["loopback"]
    assert slow["inner_steps"] == fast["inner_steps"] == STEPS and slow["tokens_merged"] == tokens
    assert slow["allreduce_link_seconds_per_step"] == pytest.approx(expected, rel=1e-6)
    # every step waited for what backward (2/3 of the 50 ms step, more if this machine is loaded) did not
    # hide, measured around the wait: about 75 ms here, 0 without the wait
    assert slow["link_seconds_per_step"] >= 0.5 * (expected - BACKWARD_SHARE * 0.05)
    assert slow["link_seconds_per_step"] <= expected + 0.05
    assert fast["link_seconds_per_step"] == 0.0 and fast["allreduce_link_seconds_per_step"] == 0.0
    assert slow["link"] == {"latency_ms": LATENCY_MS, "bandwidth_MBps": BANDWIDTH_MBPS, "jitter_ms": 0.0}
    # the wait is not useful work: goodput counts compute only
    assert slow["goodput"] <= slow["utilization"] + 1e-9
