"""One round's merge as a value: what to merge, and the tensor work split from the bookkeeping.

The synchronizer core closes a round by building a `MergeJob` around the round's running sum
(`round_sum`: the contributions were added up as they arrived). The read-only part, the direction's
norm and the check that the outer step stays finite, is `compute`: it reads the sum, the fragment's
global tensors and its momentum, writes nothing, and so may run in another thread while the
driver's lock is free (the fragment is marked busy meanwhile, so nothing else writes those tensors).
The core then applies the step and books the merge in `SynchronizerCore.finish_merge`: a few
passes, under the driver's lock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .messages import Contribution
from .outer import NesterovOuterOptimizer
from .round_sum import RoundSum


@dataclass(frozen=True)
class MergeResult:
    """The merged update per tensor as (direction, scale), or why the step was refused."""

    scaled: dict[str, tuple[torch.Tensor, float]] = field(repr=False)
    merged_norm: float
    error: str | None = None


@dataclass(frozen=True)
class MergeJob:
    fragment: int
    version: int  # the version merged from; the result is version + 1
    contributions: tuple[Contribution, ...] = field(repr=False)  # their counters (tensors already summed)
    weights: tuple[float, ...]
    norms: tuple[Mapping[str, float], ...] = field(repr=False)  # per contribution, per tensor
    total: RoundSum = field(repr=False)
    use_momentum: bool
    params: Mapping[str, torch.Tensor] = field(repr=False)  # the fragment's global tensors (read here)
    outer: NesterovOuterOptimizer = field(repr=False)
    opened_at: float = 0.0
    quorum_at: float | None = None
    deadline: float | None = None
    expected: int = 0

    def compute(self) -> MergeResult:
        """The merged update per tensor and the outer step's check; reads only."""
        merged = self.total.result()
        scaled = {name: (direction, scale) for name, (direction, scale, _) in merged.items()}
        merged_norm = math.sqrt(sum(n**2 for _, _, n in merged.values()))
        try:
            self.outer.check(self.params, scaled, self.use_momentum, len(self.contributions))
        except FloatingPointError as exc:
            return MergeResult(scaled, merged_norm, str(exc))
        return MergeResult(scaled, merged_norm)

    def contribution_norm(self) -> float:
        """Weighted mean over contributions of each one's L2 norm over the fragment."""
        total = sum(self.weights)
        fragment_norms = [math.sqrt(sum(v * v for v in n.values())) for n in self.norms]
        return sum(w * n for w, n in zip(self.weights, fragment_norms, strict=True)) / total if total > 0 else 0.0


@dataclass(frozen=True)
class MergeDue:
    """Action of a core built with `defer_merges`: run `job.compute()` (outside the driver's lock if
    it likes), then give the result to `SynchronizerCore.finish_merge`."""

    job: MergeJob = field(repr=False)
