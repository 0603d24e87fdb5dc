"""HeLoCo's correction of stale work (`AlgorithmConfig.stale_correction`, off by default).

HeLoCo (Al Asif et al. 2026, arXiv 2606.00271) takes the outer momentum as the direction the model is
going and corrects each incoming outer gradient, tensor by tensor, by its cosine with it: a tensor
that agrees is kept, one that opposes it loses part of its component along the momentum. Here it
applies to late work only (`late`: a contribution merged into a later round than its own, s >= 1
versions stale), against the fragment's outer-momentum buffer at the moment the work is admitted;
work merged in its own round is never touched.

Per tensor, with v the outer gradient, m the fragment's momentum buffer (`outer`: it sums outer
gradients, so it points where v points when they agree), m_hat = m / |m|:

    c    = <v, m> / (|v| |m|)                         the cosine
    conf = |v| / (|v| + KAPPA |m| + EPS)              how large v is beside the momentum
    c >= 0:  v is kept as it is
    c <  0:  beta = min(K_S * (-c) * conf, BETA_MAX);  v <- v - beta * c * |v| * m_hat

c |v| m_hat is v's component along the momentum, so the rule takes the fraction beta of that
(opposing) component away and leaves the rest of v alone: a v exactly opposite the momentum is
scaled by 1 - beta. The norm never grows (|v'|^2 = |v|^2 (1 - beta c^2 (2 - beta))).

Our reading, where the source stops: the formula above is the paper's, as a public summary of it
gives it (junaidaliop.github.io/zij/math/heloco); its values of K_S, BETA_MAX and KAPPA were not found,
so these are ours (1, 1, 1: beta = -c |v| / (|v| + |m|), below 1). The paper also turns *weakly*
aligned tensors (0 <= c < c_ok) part of the way towards the momentum, keeping their norm; the summary
cuts off before that rule's strength, so it is left out here, which is the paper's rule with c_ok = 0.
The paper corrects every incoming update of its asynchronous DiLoCo (each one stale); here work merged
in its own round is synchronous with the version it is merged into and is left alone.

A tensor with no momentum yet (before the fragment's first momentum step, or outer_momentum 0), or
a zero one, is kept: there is no direction to compare it with.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .round_sum import norm

K_S = 1.0  # shrinkage strength (the paper's k_s; our value)
BETA_MAX = 1.0  # at most the whole opposing component is removed (beta_max; ours)
KAPPA = 1.0  # weight of the momentum's norm in the confidence (kappa; ours)
EPS = 1e-12


def cosine(v: torch.Tensor, m: torch.Tensor, v_norm: float, m_norm: float) -> float:
    """<v, m> / (|v| |m|) in float32, clamped to [-1, 1] (rounding); 0 where either is zero."""
    if v_norm <= 0 or m_norm <= 0:
        return 0.0
    dot = float(torch.dot(v.reshape(-1).float(), m.reshape(-1).float()))
    return max(-1.0, min(1.0, dot / (v_norm * m_norm)))


def shrink_factor(c: float, v_norm: float, m_norm: float) -> float:
    """beta: the fraction of v's component along the momentum taken away (0 for c >= 0)."""
    if c >= 0:
        return 0.0
    conf = v_norm / (v_norm + KAPPA * m_norm + EPS)
    return min(K_S * -c * conf, BETA_MAX)


def correct_stale(
    values: Mapping[str, torch.Tensor], norms: Mapping[str, float], momentum: Mapping[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Stale outer gradients `values` (with their L2 `norms`) corrected against the fragment's momentum
    buffers (`momentum`, by tensor name; a name missing: no momentum yet). Returns the new values and
    norms: a corrected tensor is a new float32 tensor, every other one the same object as given."""
    out = dict(values)
    out_norms = {name: norms[name] for name in values}
    for name, v in values.items():
        m = momentum.get(name)
        if m is None:
            continue
        v_norm, m_norm = norms[name], norm(m)
        c = cosine(v, m, v_norm, m_norm)
        beta = shrink_factor(c, v_norm, m_norm)
        if beta <= 0:
            continue
        # v - beta c |v| m_hat: m_hat's coefficient is positive (c < 0), so v gains along the momentum
        corrected = v.to(torch.float32, copy=True).add_(m.to(v.device), alpha=-beta * c * v_norm / m_norm)
        out[name] = corrected
        out_norms[name] = norm(corrected)
    return out, out_norms
