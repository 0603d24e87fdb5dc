"""One round's merge as a value: what to merge, and the tensor work split from the bookkeeping.

The synchronizer core closes a round by building a `MergeJob`. The heavy, read-only part, merging
the contributions into a direction and checking that the outer step stays finite, is `compute`: it
reads the contributions, the fragment's global tensors and its momentum, writes only into its own
`Workspace`, and so may run in another thread while the driver's lock is free (the fragment is
marked busy meanwhile, so nothing else writes those tensors). The core then applies the step and
books the merge in `SynchronizerCore.finish_merge`: a few passes, under the driver's lock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import torch

from .merge import merge_direction
from .messages import Contribution
from .outer import NesterovOuterOptimizer


class Workspace:
    """Reused scratch for merge directions: one flat float32 buffer, viewed per tensor.

    Allocating a fresh fragment-sized tensor per merge costs page faults on every round (large
    allocations are mmapped and returned to the OS when freed); one workspace per merging thread
    costs one fragment of memory once.
    """

    def __init__(self) -> None:
        self._flat = torch.empty(0, dtype=torch.float32)

    def views(self, shapes: Mapping[str, torch.Size]) -> dict[str, torch.Tensor]:
        total = sum(math.prod(s) for s in shapes.values())
        if self._flat.numel() < total:
            self._flat = torch.empty(total, dtype=torch.float32)
        out, offset = {}, 0
        for name, shape in shapes.items():
            n = math.prod(shape)
            out[name] = self._flat[offset:offset + n].view(shape)
            offset += n
        return out


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
    contributions: tuple[Contribution, ...] = field(repr=False)
    weights: tuple[float, ...]
    norms: tuple[Mapping[str, float], ...] = field(repr=False)  # per contribution, per tensor
    rda_names: frozenset[str]
    use_momentum: bool
    params: Mapping[str, torch.Tensor] = field(repr=False)  # the fragment's global tensors (read here)
    outer: NesterovOuterOptimizer = field(repr=False)
    opened_at: float = 0.0
    quorum_at: float | None = None
    deadline: float | None = None
    expected: int = 0

    def compute(self, workspace: Workspace | None = None) -> MergeResult:
        """Merge the contributions (RDA or mean per tensor) and check the outer step; read-only
        except for `workspace` (a fresh one if None)."""
        names = list(self.params)
        out = (workspace or Workspace()).views({n: self.params[n].shape for n in names})
        scaled, merged_sq = {}, 0.0
        for name in names:
            rda = name in self.rda_names
            values = [c.outer_gradient[name] for c in self.contributions]
            norms = [n[name] for n in self.norms] if rda else None
            direction, scale, update_norm = merge_direction(values, self.weights, rda=rda, norms=norms,
                                                            out=out[name])
            scaled[name] = (direction, scale)
            merged_sq += update_norm**2
        try:
            self.outer.check(self.params, scaled, self.use_momentum)
        except FloatingPointError as exc:
            return MergeResult(scaled, math.sqrt(merged_sq), str(exc))
        return MergeResult(scaled, math.sqrt(merged_sq))

    def contribution_norm(self) -> float:
        """Weighted mean over contributions of each one's L2 norm over the fragment."""
        total = sum(self.weights)
        fragment_norms = [math.sqrt(sum(v * v for v in n.values())) for n in self.norms]
        return sum(w * n for w, n in zip(self.weights, fragment_norms)) / total if total > 0 else 0.0


@dataclass(frozen=True)
class MergeDue:
    """Action of a core built with `defer_merges`: run `job.compute()` (outside the driver's lock if
    it likes), then give the result to `SynchronizerCore.finish_merge`."""

    job: MergeJob = field(repr=False)
