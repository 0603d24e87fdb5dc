"""The outer optimizer: SGD with Nesterov momentum, one instance per fragment.

Same update as torch.optim.SGD(nesterov=True, dampening=0), written out so that its state is a plain
name -> tensor dict that checkpoints as safetensors and moves between synchronizer shards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping

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
    def step(
        self, params: MutableMapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor], use_momentum: bool = True
    ) -> None:
        """Apply the merged outer gradient `delta` to `params` in place, all or nothing.
        `use_momentum=False`: a plain step lr * delta, momentum neither applied nor updated.

        Raises FloatingPointError, with `params` and the momentum untouched, when the result would
        hold NaN or Inf (finite inputs can still overflow): a global model must never become
        non-finite.
        """
        missing = set(delta) - set(params)
        if missing:
            raise KeyError(f"outer gradient for unknown tensors: {sorted(missing)}")
        scaled = {}
        for name, d in delta.items():
            if d.shape != params[name].shape:
                raise ValueError(
                    f"{name}: outer gradient shape {tuple(d.shape)} != parameter {tuple(params[name].shape)}"
                )
            scaled[name] = (d.to(device=params[name].device, dtype=torch.float32), 1.0)
        self.check(params, scaled, use_momentum)
        self.apply(params, scaled, use_momentum)

    def check(
        self,
        params: Mapping[str, torch.Tensor],
        scaled: Mapping[str, tuple[torch.Tensor, float]],
        use_momentum: bool = True,
    ) -> None:
        """Raise FloatingPointError if `apply` would make a parameter or buffer non-finite.

        Read-only (so it may run outside a lock while nothing writes these tensors): three min/max
        passes bound every result; only a tensor whose bound overflows is computed exactly.
        """
        mu = self.momentum if use_momentum else 0.0
        limit = torch.finfo(torch.float32).max / 4
        for name, (d, s) in scaled.items():
            p, buf = params[name], self.buffers.get(name)
            big_p, big_d = max_abs(p), max_abs(d) * abs(s)
            big_buf = 0.0 if buf is None or mu == 0 else max_abs(buf)
            new_buf = mu * big_buf + big_d
            if max(big_p, big_d, big_buf) < limit and big_p + self.lr * (big_d + mu * new_buf) < limit:
                continue
            new_b = (buf * mu + d * s) if mu > 0 and buf is not None else d * s
            value = p - self.lr * (d * s + mu * new_b) if mu > 0 else p - self.lr * (d * s)
            if not (_finite(value) and _finite(new_b)):
                raise FloatingPointError(f"{name}: the outer step would make it non-finite")

    def apply(
        self,
        params: Mapping[str, torch.Tensor],
        scaled: Mapping[str, tuple[torch.Tensor, float]],
        use_momentum: bool = True,
    ) -> None:
        """In place, for update s * d per tensor: buf <- mu buf + s d; Theta <- Theta - lr (s d + mu buf).
        Two passes per tensor with momentum, one without; call `check` first."""
        for name, (d, s) in scaled.items():
            p = params[name]
            if self.momentum > 0 and use_momentum:
                buf = self.buffers.get(name)
                if buf is None:
                    buf = self.buffers[name] = torch.mul(d, s)
                else:
                    buf.mul_(self.momentum).add_(d, alpha=s)
                p.add_(d, alpha=-self.lr * s).add_(buf, alpha=-self.lr * self.momentum)
            else:
                p.add_(d, alpha=-self.lr * s)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: buf.clone() for name, buf in self.buffers.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.buffers = {name: buf.detach().clone().float() for name, buf in state.items()}


def max_abs(x: torch.Tensor) -> float:
    """max |x| from one min/max pass (NaN propagates), far faster than isfinite().all() on a CPU."""
    if x.numel() == 0:
        return 0.0
    lo, hi = (float(v) for v in torch.aminmax(x))
    return math.nan if math.isnan(lo) or math.isnan(hi) else max(-lo, hi)


def _finite(x: torch.Tensor) -> bool:
    return x.numel() == 0 or math.isfinite(max_abs(x))
