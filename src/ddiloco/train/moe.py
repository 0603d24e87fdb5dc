"""Mixture-of-experts feed-forward layer: top-k routed MLP experts with a load-balancing loss.

Sparse experts are the case where DiLoCo-style averaging is most delicate (experts that a
learner rarely routes to barely move), so the training drivers want an MoE model to try.
"""

from __future__ import annotations

import torch
from torch import nn

from .mlp import MLP


def load_balancing_loss(probs: torch.Tensor, expert_idx: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Switch-Transformer auxiliary loss: num_experts * sum_i f_i * P_i.

    f_i: fraction of the N*k routing assignments that went to expert i (not differentiable);
    P_i: mean router probability of expert i over the N tokens (carries the gradient).
    It is 1 when routing is perfectly uniform (its minimum) and grows as routing collapses,
    up to num_experts when every token sends everything to one expert with probability 1.

    probs: [N, num_experts] softmax router outputs; expert_idx: [N, k] chosen experts.
    """
    counts = torch.bincount(expert_idx.reshape(-1), minlength=num_experts).to(probs.dtype)
    f = counts / max(expert_idx.numel(), 1)
    p = probs.mean(dim=0)
    return num_experts * torch.sum(f * p)


class MoEMLP(nn.Module):
    """Router linear -> softmax -> top-k experts, gates renormalised to sum to 1 per token.

    Every expert is an `MLP`; the experts run one after another on just the tokens routed
    to them (gather, compute, `index_add_` back), which is the fast way for a few experts
    on a CPU and avoids any buffers or capacity dropping.
    """

    def __init__(self, d_model: int, hidden: int, num_experts: int, top_k: int, dropout: float = 0.0) -> None:
        super().__init__()
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {num_experts}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        self.num_experts = num_experts
        self.top_k = top_k
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(d_model, hidden, dropout) for _ in range(num_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For tokens x [N, d_model]: (gates [N, k] summing to 1, expert ids [N, k], probs [N, E])."""
        probs = torch.softmax(self.router(x).float(), dim=-1)
        top_p, top_i = probs.topk(self.top_k, dim=-1)
        gates = top_p / top_p.sum(dim=-1, keepdim=True)
        return gates, top_i, probs

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(output with x's shape, auxiliary load-balancing loss as a scalar tensor)."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        gates, top_i, probs = self.route(flat)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            tok, slot = (top_i == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            y = expert(flat[tok]) * gates[tok, slot].unsqueeze(-1).to(flat.dtype)
            out.index_add_(0, tok, y)
        aux = load_balancing_loss(probs, top_i, self.num_experts)
        return out.reshape(shape), aux
