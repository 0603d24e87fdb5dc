"""Simulated hardware: how long each learner's steps take and how long bytes take to move.

Step times model heterogeneous accelerators (a per-learner speed factor), jitter (uniform +-j) and
rare stragglers (a step occasionally k times slower). Every learner draws from its own generator
seeded by (seed, learner), so a run is reproducible and adding a learner does not change the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepTimeModel:
    base: float = 1.0
    speeds: tuple[float, ...] = ()  # per-learner slowdown factors; missing entries are 1.0
    jitter: float = 0.0
    straggle_prob: float = 0.0
    straggle_factor: float = 3.0

    def __post_init__(self) -> None:
        if not self.base > 0:
            raise ValueError(f"base step time must be > 0, got {self.base}")
        if any(not s > 0 for s in self.speeds):
            raise ValueError(f"speed factors must be > 0, got {self.speeds}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        if not 0 <= self.straggle_prob <= 1 or not self.straggle_factor >= 1:
            raise ValueError("straggle_prob must be in [0, 1] and straggle_factor >= 1")

    def speed(self, learner: int) -> float:
        return self.speeds[learner] if learner < len(self.speeds) else 1.0

    def sampler(self, learner: int, seed: int) -> StepTimeSampler:
        return StepTimeSampler(self, learner, np.random.default_rng([seed, learner, 7919]))


class StepTimeSampler:
    def __init__(self, model: StepTimeModel, learner: int, rng: np.random.Generator) -> None:
        self.model = model
        self.mean = model.base * model.speed(learner)
        self.rng = rng

    def __call__(self) -> float:
        m = self.model
        t = self.mean
        if m.jitter > 0:
            t *= 1.0 + float(self.rng.uniform(-m.jitter, m.jitter))
        if m.straggle_prob > 0 and float(self.rng.random()) < m.straggle_prob:
            t *= m.straggle_factor
        return t


def half_slow(num_learners: int, factor: float) -> tuple[float, ...]:
    """The paper's heterogeneity experiment: the second half of the learners `factor` times slower."""
    return tuple(1.0 if i < num_learners - num_learners // 2 else factor for i in range(num_learners))


@dataclass(frozen=True)
class LinkModel:
    """Latency + size / bandwidth per message, and the synchronizer's merge compute speed."""

    latency: float = 0.01
    bandwidth: float = 1e9  # bytes per simulated second
    merge_rate: float = 1e9  # parameters merged per simulated second, per contributing learner

    def __post_init__(self) -> None:
        if self.latency < 0 or not self.bandwidth > 0 or not self.merge_rate > 0:
            raise ValueError("latency must be >= 0, bandwidth and merge_rate > 0")

    def transfer(self, num_bytes: float) -> float:
        return self.latency + num_bytes / self.bandwidth

    def merge(self, numel: int, contributors: int) -> float:
        return numel * max(1, contributors) / self.merge_rate
