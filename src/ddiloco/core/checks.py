"""Why the synchronizer core refuses a contribution: its norms, and the checks on its sender, fragment,
counters, tensors and size (`AlgorithmConfig.max_outer_norm_ratio`).

The checks read the fragments' global state and change none of it, so a refused message leaves
everything as it was; their own state is a cache of each fragment's global norm.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

import torch

from .config import AlgorithmConfig
from .messages import Contribution, Refusal, RejectCode
from .round_sum import norm
from .sync_state import SyncState


def measure(c: Contribution) -> dict[str, float]:
    """The L2 norm of each tensor of a contribution: one pass each, and a NaN or Inf anywhere makes its
    norm non-finite. Pure, so a driver may take it before its lock."""
    return {
        name: norm(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else math.nan
        for name, t in c.outer_gradient.items()
    }


class ContributionChecks:
    """The checks a contribution must pass before its round admits it, against the global `state`."""

    def __init__(self, config: AlgorithmConfig, state: SyncState) -> None:
        self.config = config
        self.state = state
        self._param_norms: dict[int, tuple[int, float]] = {}  # fragment -> (version, its L2 norm)

    def refusal(self, c: Contribution, norms: Mapping[str, float], live: Collection[int]) -> Refusal | None:
        """Why a contribution must be refused, or None. `norms`: `measure(c)`; `live`: the learners
        that joined and have not left."""
        if c.learner not in live:
            return Refusal(RejectCode.UNKNOWN_LEARNER, f"unknown learner {c.learner}: register (join) first")
        if c.fragment not in self.state.versions:
            return Refusal(RejectCode.NOT_OWNED, f"fragment {c.fragment} is not owned by this synchronizer")
        if c.steps <= 0:
            return Refusal(RejectCode.BAD_COUNTERS, "no steps since the last update: nothing to contribute")
        if c.tokens < 0 or not (math.isfinite(c.seconds) and c.seconds >= 0):
            return Refusal(RejectCode.BAD_COUNTERS, "negative or non-finite token or time counters")
        if not (math.isfinite(c.step_time) and c.step_time >= 0):
            return Refusal(RejectCode.BAD_COUNTERS, "non-finite step time")
        expected = self.state.plan.names[c.fragment]
        if set(c.outer_gradient) != set(expected):
            extra = sorted(set(c.outer_gradient) - set(expected))
            lacking = sorted(set(expected) - set(c.outer_gradient))
            return Refusal(
                RejectCode.BAD_TENSORS,
                f"wrong tensors for fragment {c.fragment}: unexpected {extra[:3]}, missing {lacking[:3]}",
            )
        params = self.state.params
        for name in expected:
            t = c.outer_gradient[name]
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                return Refusal(RejectCode.BAD_TENSORS, f"{name}: expected a floating-point tensor")
            if tuple(t.shape) != tuple(params[name].shape):
                return Refusal(RejectCode.BAD_TENSORS, f"{name}: shape {tuple(t.shape)} != {tuple(params[name].shape)}")
            if not math.isfinite(norms[name]):
                return Refusal(RejectCode.NON_FINITE, f"{name}: NaN or Inf values")
        return self._too_large(c, norms)

    def _too_large(self, c: Contribution, norms: Mapping[str, float]) -> Refusal | None:
        """The norm bound of `AlgorithmConfig.max_outer_norm_ratio`, over the whole fragment."""
        ratio = self.config.max_outer_norm_ratio
        if ratio <= 0:
            return None
        plan = self.state.plan
        grad_sq = sum(norms[n] ** 2 for n in plan.names[c.fragment])
        param_sq = self._param_norm(c.fragment) ** 2
        floor_sq = 1e-2 * plan.sizes[c.fragment]  # an RMS of 0.1 per value
        limit = ratio * math.sqrt(max(param_sq, floor_sq))
        if not math.sqrt(grad_sq) <= limit:
            return Refusal(
                RejectCode.TOO_LARGE,
                f"outer gradient too large: norm {math.sqrt(grad_sq):.3g} exceeds {ratio:g} x the fragment's "
                f"norm ({limit:.3g}; max_outer_norm_ratio)",
            )
        return None

    def _param_norm(self, p: int) -> float:
        """The fragment's global L2 norm, once per version."""
        version = self.state.versions[p]
        cached = self._param_norms.get(p)
        if cached is None or cached[0] != version:
            value = math.sqrt(sum(norm(self.state.params[n]) ** 2 for n in self.state.plan.names[p]))
            cached = self._param_norms[p] = (version, value)
        return cached[1]
