"""The all-reduce's real bytes on the emulated link (`dataparallel/link.py`), in real two-worker runs:
the books hold exactly the ring bytes of the model's gradients at the all-reduce's precision, and a
slow link makes every step wait at least what the link guarantees (its latency; its pacing, less
the burst the token bucket lets through).

What is asserted is what the link guarantees, lower bounds only: a run with the link's sleeps, or
its bytes, taken out fails here; a slow machine passes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from ddiloco.dataparallel.link import AllReduceLink, ring_bytes
from ddiloco.learner.wan import LinkConfig, WanLink
from ddiloco.train.tasks import count_parameters, make_task

from .runs import SEQ, TOKENS_PER_WORKER_STEP, finish, running

STEPS, WORKERS = 10, 2
LATENCY_MS, BANDWIDTH_MBPS = 10.0, 0.5
BYTES = {"bf16": 2, "fp32": 4}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, s: float) -> None:
        self.now += s

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("world", [2, 3, 8])
def test_a_ring_crosses_the_link_full_duplex_in_its_hops(world: int):
    """On a clock that moves only when the link sleeps: the ring's bytes at the rate, both ways at
    once (never the sum of the two), plus every hop's latency; less at most the bursts the buckets
    hold at the start and refill during the latencies."""
    assert ring_bytes(1000, 1) == 0.0 and ring_bytes(1000, 2) == 1000.0 and ring_bytes(1000, 4) == 1500.0
    clock = FakeClock()
    settings = LinkConfig(latency_ms=10.0, bandwidth_mb_s=1.0)
    link = AllReduceLink(settings, clock=clock, sleep=clock.sleep)
    wire, hops, rate = 2_000_000, 2 * (world - 1), settings.bytes_per_second
    link.cross(wire, world)
    burst = rate * WanLink.BURST_SECONDS
    formula = hops * settings.latency + ring_bytes(wire, world) / rate  # the old formula, as a cross-check
    assert formula - (1 + hops) * burst / rate - 1e-9 <= clock.now <= formula + 1e-9
    assert clock.now > 0.9 * formula  # for these sizes: two directions paced one after the other would be 2x
    free = FakeClock()
    AllReduceLink(LinkConfig(), clock=free, sleep=free.sleep).cross(wire, world)
    assert free.now == 0.0  # no link given: free


@pytest.fixture(scope="module")
def slow_runs(shakespeare: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The same run on the same slow link, its all-reduce in bf16 and in fp32, side by side (each
    mostly waits on its link; every bound asserted below is a lower one, which sharing the machine
    cannot break)."""
    base, tokens = tmp_path_factory.mktemp("link"), WORKERS * TOKENS_PER_WORKER_STEP * STEPS
    link = ("--net-latency", str(LATENCY_MS), "--net-bandwidth", str(BANDWIDTH_MBPS))
    with contextlib.ExitStack() as stack:
        launchers = {
            precision: stack.enter_context(
                running(base / precision, shakespeare, "ddp", tokens, *link, "--allreduce-precision", precision)
            )
            for precision in BYTES
        }
        return {precision: finish(launcher, base / precision) for precision, launcher in launchers.items()}


def _params(data: str) -> int:
    return count_parameters(make_task("gpt", data, seq_len=SEQ, model_size="tiny").build_model(0))


def test_the_books_hold_the_gradients_real_ring_bytes(slow_runs: dict[str, dict], shakespeare: str):
    params = _params(shakespeare)
    for precision, run in slow_runs.items():
        ring = ring_bytes(BYTES[precision] * params, WORKERS)  # each worker, each step, each way
        assert run["inner_steps"] == STEPS and run["failed_steps"] == 0
        assert run["allreduce_precision"] == precision
        assert run["allreduce_bytes_sent"] == pytest.approx(WORKERS * STEPS * ring, rel=1e-9)
        assert run["bytes_up_per_step"] == run["bytes_down_per_step"] == pytest.approx(ring, rel=1e-9)
    assert slow_runs["fp32"]["bandwidth_ratio_up"] == pytest.approx(0.5)  # twice a bf16 ring's bytes
    assert slow_runs["bf16"]["bandwidth_ratio_up"] == pytest.approx(1.0)


def test_every_step_waits_for_the_link(slow_runs: dict[str, dict], shakespeare: str):
    params, hops = _params(shakespeare), 2 * (WORKERS - 1)
    burst = WanLink.BURST_SECONDS  # the bucket refills during a step's compute and lets this much through free
    for precision, run in slow_runs.items():
        ring = ring_bytes(BYTES[precision] * params, WORKERS)
        # the link's time on a step's buckets: at least the ring's bytes at the rate, less the burst the
        # bucket refilled during the step's compute (the hops' latencies refill it by as much as they last)
        assert run["link_busy_seconds_per_step"] >= ring / (BANDWIDTH_MBPS * 1e6) - burst - 1e-3
        # the last bucket crosses the link after backward handed it over: backward waits at least its hops
        assert run["link_seconds_per_step"] >= hops * LATENCY_MS / 1000
        assert run["link"] == {"latency_ms": LATENCY_MS, "bandwidth_MBps": BANDWIDTH_MBPS, "jitter_ms": 0.0}
        assert run["goodput"] <= run["utilization"] + 1e-9  # the wait is not useful work


def test_without_a_link_nothing_is_paced_and_the_bytes_are_booked(shakespeare: str, tmp_path: Path):
    tokens = WORKERS * TOKENS_PER_WORKER_STEP * 5
    with running(tmp_path / "free", shakespeare, "ddp", tokens) as launcher:
        run = finish(launcher, tmp_path / "free")
    assert run["link_busy_seconds_per_step"] == 0.0 and run["allreduce_precision"] == "bf16"
    assert run["allreduce_bytes_sent"] == pytest.approx(WORKERS * 5 * ring_bytes(2 * _params(shakespeare), WORKERS))
