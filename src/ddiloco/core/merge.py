"""Merging learners' outer gradients into one update per tensor.

Outer gradients v_m = Theta - theta_m (global minus local: a learner that moved the parameters up
gives a negative v, and the outer step Theta - lr * v moves the global model up too). They are nearly
orthogonal across learners, so a plain average shrinks like 1/sqrt(M); radial-directional averaging
(RDA) averages norms and directions separately so the update size does not depend on M. Embeddings
keep the plain weighted average (ALGORITHM.md).
"""

from __future__ import annotations

import math
from typing import Collection, Literal, Mapping, Sequence

import torch

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


def norm(x: torch.Tensor) -> float:
    """L2 norm: one float32 pass; non-finite exactly when `x` holds NaN or Inf (values whose
    squares overflow float32 are rescaled first, a slow path that sane updates never take)."""
    n = float(torch.linalg.vector_norm(x, dtype=torch.float32))
    if math.isinf(n):
        lo, hi = (float(v) for v in torch.aminmax(x))
        top = max(-lo, hi)
        if math.isfinite(top) and top > 0:
            return top * float(torch.linalg.vector_norm(x / top, dtype=torch.float32))
    return n


def merge_direction(
    values: Sequence[torch.Tensor],
    weights: Sequence[float],
    rda: bool = True,
    norms: Sequence[float] | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float, float]:
    """(D, s, |s D|) with the merged update s * D, without materialising s * D.

    Mean: D = sum w v / sum w, s = 1. RDA: D = sum w unit(v) / sum w and
    s = (sum w |v| / sum w) / |D|. One pass per value (plus one for |D|), written into `out` when
    given (a reused buffer), so the outer step can fold s into its own pass. `norms` are the
    values' L2 norms when the caller already has them.
    """
    w = _check(values, weights).tolist()
    if rda and norms is None:
        norms = [norm(v) for v in values]
    direction = torch.zeros_like(values[0], dtype=torch.float32) if out is None else out.zero_()
    mean_norm = 0.0
    for i, (wm, v) in enumerate(zip(w, values)):
        if not rda:
            direction.add_(v, alpha=wm)
        elif norms[i] > 0:
            direction.add_(v, alpha=wm / norms[i])
            mean_norm += wm * norms[i]
    d = norm(direction)
    if not rda:
        return direction, 1.0, d
    return direction, (mean_norm / d if d > 0 else 0.0), (mean_norm if d > 0 else 0.0)


def weighted_mean(values: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """sum w_m v_m / sum w_m."""
    return merge_direction(values, weights, rda=False)[0]


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
        direction, scale, _ = merge_direction([g[name] for g in outer_gradients], weights,
                                           rda=mode == "rda" and name not in plain_names)
        merged[name] = direction.mul_(scale)
    return merged


def fragment_norm(tensors: Tensors) -> float:
    """The L2 norm of a fragment's tensors taken together."""
    return sum(float(torch.linalg.vector_norm(t, dtype=torch.float32)) ** 2 for t in tensors.values()) ** 0.5
