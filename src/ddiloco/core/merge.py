"""Merging learners' outer gradients into one update per tensor.

Outer gradients v_m = Theta - theta_m (global minus local: a learner that moved the parameters up
gives a negative v, and the outer step Theta - lr * v moves the global model up too). They are nearly
orthogonal across learners, so a plain average shrinks like 1/sqrt(M); radial-directional averaging
(RDA) averages norms and directions separately so the update size does not depend on M. Embeddings
keep the plain weighted average (ALGORITHM.md).
"""

from __future__ import annotations

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


def weighted_mean(values: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """sum w_m v_m / sum w_m."""
    w = _check(values, weights)
    out = torch.zeros_like(values[0], dtype=torch.float32)
    for wm, v in zip(w.tolist(), values):
        out.add_(v.float(), alpha=wm)
    return out


def _unit(x: torch.Tensor) -> torch.Tensor:
    norm = torch.linalg.vector_norm(x)
    return x / norm if float(norm) > 0 else torch.zeros_like(x)


def radial_directional_average(values: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """RDA(v, w) = (sum w |v| / sum w) * unit(sum w unit(v) / sum w)."""
    w = _check(values, weights)
    mean_norm = 0.0
    direction = torch.zeros_like(values[0], dtype=torch.float32)
    for wm, v in zip(w.tolist(), values):
        v = v.float()
        mean_norm += wm * float(torch.linalg.vector_norm(v))
        direction.add_(_unit(v), alpha=wm)
    return _unit(direction) * mean_norm


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
        values = [grads[name] for grads in outer_gradients]
        if mode == "rda" and name not in plain_names:
            merged[name] = radial_directional_average(values, weights)
        else:
            merged[name] = weighted_mean(values, weights)
    return merged


def fragment_norm(tensors: Tensors) -> float:
    """The L2 norm of a fragment's tensors taken together."""
    return sum(float(torch.linalg.vector_norm(t, dtype=torch.float32)) ** 2 for t in tensors.values()) ** 0.5
