"""Merging learners' outer gradients into one update per tensor.

Outer gradients v_m = Theta - theta_m (global minus local: a learner that moved the parameters up
gives a negative v, and the outer step Theta - lr * v moves the global model up too). They are nearly
orthogonal across learners, so a plain average shrinks like 1/sqrt(M); radial-directional averaging
(RDA) averages norms and directions separately so the update size does not depend on M. Embeddings
keep the plain weighted average (ALGORITHM.md).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Literal

import torch

from .round_sum import RoundSum

Tensors = Mapping[str, torch.Tensor]


def outer_gradient(global_value: torch.Tensor, local_value: torch.Tensor) -> torch.Tensor:
    """v = Theta - theta, in float32."""
    return global_value.float() - local_value.float()


def _check(values: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    if len(values) == 0:
        raise ValueError("cannot merge zero outer gradients")
    if len(values) != len(weights):
        raise ValueError(f"{len(values)} outer gradients but {len(weights)} weights")
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
        raise ValueError(f"weights must be finite and >= 0, got {list(weights)}")
    if float(w.sum()) <= 0:
        raise ValueError("weights must not all be zero")
    return w / w.sum()


def merge_direction(
    values: Sequence[torch.Tensor],
    weights: Sequence[float],
    rda: bool = True,
    norms: Sequence[float] | None = None,
) -> tuple[torch.Tensor, float, float]:
    """(D, s, |s D|) with the merged update s * D (`RoundSum` over a list): RDA, or the weighted
    mean with rda=False. `norms`: the values' L2 norms, if known."""
    _check(values, weights)
    total = RoundSum({"v"} if rda else ())
    for i, (v, w) in enumerate(zip(values, weights, strict=True)):
        total.add({"v": v}, float(w), None if norms is None else {"v": norms[i]})
    return total.result()["v"]


def weighted_mean(values: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """sum w_m v_m / sum w_m."""
    direction, scale, _ = merge_direction(values, weights, rda=False)
    return direction.mul_(scale)


def radial_directional_average(values: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """RDA(v, w) = (sum w |v| / sum w) * unit(sum w unit(v) / sum w)."""
    direction, scale, _ = merge_direction(values, weights)
    return direction.mul_(scale)


def merge_outer_gradients(
    outer_gradients: Sequence[Tensors],
    weights: Sequence[float],
    plain_names: Collection[str] = (),
    mode: Literal["rda", "mean"] = "rda",
) -> dict[str, torch.Tensor]:
    """One merged update per tensor of a fragment.

    `plain_names` (the embeddings) always use the weighted mean; other tensors use RDA unless
    mode is "mean".
    """
    if mode not in ("rda", "mean"):
        raise ValueError(f"unknown merge mode {mode!r}")
    if not outer_gradients:
        raise ValueError("cannot merge zero contributions")
    names = list(outer_gradients[0].keys())
    for grads in outer_gradients[1:]:
        if list(grads.keys()) != names:
            raise ValueError("all contributions must carry the same tensors")
    merged = {}
    for name in names:
        direction, scale, _ = merge_direction(
            [g[name] for g in outer_gradients], weights, rda=mode == "rda" and name not in plain_names
        )
        merged[name] = direction.mul_(scale)
    return merged
