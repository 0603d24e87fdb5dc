"""The emulated link under the all-reduce: what a ring all-reduce of a step's gradients costs on
`--net-latency/--net-bandwidth/--net-jitter`, paid as a wait after the step's compute.

gloo's sockets are not ours to shape, so the link is charged by a model (docs/dataparallel.md):

    ring      = 2 (W - 1) hops (reduce-scatter, then all-gather) over W workers
    transfer  = 2 (W - 1) / W x B bytes each worker sends (and receives) over its own link, / bandwidth
    latency   = 2 (W - 1) x one-way latency (each hop waits for the one before it; + jitter per hop)
    link      = latency + transfer
    exposed   = max(0, link - BACKWARD_SHARE x compute)

DDP starts all-reducing a bucket as soon as backward has produced it, so up to the backward pass
(about two thirds of a step's compute) of the link hides behind compute: only the rest is waited
for. That favours the baseline; counting the whole link would not. The wait is real (the worker
sleeps), measured, and kept out of the step's useful seconds (goodput counts compute only).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from ..learner.wan import LinkConfig  # the learners' emulated link, the same settings

BACKWARD_SHARE = 2.0 / 3.0  # of a step's compute: the part DDP's bucketed all-reduce overlaps


def ring_bytes(grad_bytes: int, world: int) -> float:
    """Bytes each worker sends (and receives) in a ring all-reduce of `grad_bytes` over `world`."""
    return 2.0 * (world - 1) / world * grad_bytes if world > 1 else 0.0


class AllReduceLink:
    """Charges each step's all-reduce to the emulated link; keeps the books of what it charged."""

    def __init__(
        self,
        settings: LinkConfig,
        grad_bytes: int,
        seed: int = 0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings, self.grad_bytes = settings, grad_bytes
        self._rng = random.Random(seed)
        self._sleep, self._clock = sleep, clock

    def seconds(self, world: int) -> float:
        """The whole all-reduce on the link (latency of every hop, plus the transfer)."""
        if world <= 1 or not self.settings.active:
            return 0.0
        s, hops = self.settings, 2 * (world - 1)
        latency = hops * s.latency + (sum(self._rng.uniform(0.0, s.jitter) for _ in range(hops)) if s.jitter else 0.0)
        transfer = ring_bytes(self.grad_bytes, world) / s.bytes_per_second if s.bytes_per_second else 0.0
        return latency + transfer

    def pay(self, world: int, compute_seconds: float) -> tuple[float, float]:
        """Wait out the part of this step's all-reduce that compute did not hide.
        Returns (the link's seconds by the model, the seconds actually waited, measured)."""
        link = self.seconds(world)
        exposed = max(0.0, link - BACKWARD_SHARE * compute_seconds)
        if exposed <= 0:
            return link, 0.0
        t0 = self._clock()
        self._sleep(exposed)
        return link, self._clock() - t0
