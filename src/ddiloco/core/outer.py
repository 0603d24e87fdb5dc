"""The outer optimizer: SGD with Nesterov momentum, one instance per fragment.

Same update as torch.optim.SGD(nesterov=True, dampening=0), written out so that its state is a plain
name -> tensor dict that checkpoints as safetensors and moves between synchronizer shards.
"""

from __future__ import annotations

from typing import Mapping, MutableMapping

import torch


class NesterovOuterOptimizer:
    """buf <- mu * buf + delta;  Theta <- Theta - lr * (delta + mu * buf)."""

    def __init__(self, lr: float = 0.7, momentum: float = 0.9) -> None:
        if not lr > 0:
            raise ValueError(f"outer lr must be > 0, got {lr}")
        if not 0 <= momentum < 1:
            raise ValueError(f"outer momentum must be in [0, 1), got {momentum}")
        self.lr = lr
        self.momentum = momentum
        self.buffers: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def step(self, params: MutableMapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor],
             use_momentum: bool = True) -> None:
        """Apply the merged outer gradient `delta` to `params` in place, all or nothing.
        `use_momentum=False`: a plain step lr * delta, momentum neither applied nor updated.

        Raises FloatingPointError, with `params` and the momentum untouched, when the result would
        hold NaN or Inf (finite inputs can still overflow): a global model must never become
        non-finite.
        """
        missing = set(delta) - set(params)
        if missing:
            raise KeyError(f"outer gradient for unknown tensors: {sorted(missing)}")
        new_params: dict[str, torch.Tensor] = {}
        new_buffers: dict[str, torch.Tensor] = {}
        for name, d in delta.items():
            p = params[name]
            d = d.to(device=p.device, dtype=torch.float32)
            if d.shape != p.shape:
                raise ValueError(f"{name}: outer gradient shape {tuple(d.shape)} != parameter {tuple(p.shape)}")
            update = d
            if self.momentum > 0 and use_momentum:
                buf = self.buffers.get(name)
                buf = d.clone() if buf is None else buf * self.momentum + d
                new_buffers[name] = buf
                update = d + self.momentum * buf
            value = (p.float() - self.lr * update).to(p.dtype)
            if not bool(torch.isfinite(value).all()) or (name in new_buffers and not bool(torch.isfinite(buf).all())):
                raise FloatingPointError(f"{name}: the outer step would make it non-finite")
            new_params[name] = value
        for name, value in new_params.items():
            params[name].copy_(value)
        self.buffers.update(new_buffers)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: buf.clone() for name, buf in self.buffers.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.buffers = {name: buf.detach().clone().float() for name, buf in state.items()}
