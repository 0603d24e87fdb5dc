"""The outer optimizer: SGD with Nesterov momentum, one instance per fragment.

Same update as torch.optim.SGD(nesterov=True, dampening=0), written out so that its state is a plain
name -> tensor dict that checkpoints as safetensors and moves between synchronizer shards, plus one
count (`steps`, the outer steps that took momentum) that a checkpoint keeps beside it.

Three options, each off by default (then the step is the one above, bit for bit; `AlgorithmConfig`'s
outer_restart_every, outer_debias and outer_lr_per_learner; docs/algorithm.md, "Outer-step options").
With t the step's number (counted per fragment from 1, over the steps that take momentum), M the
contributions merged into it, mu the momentum and lr the outer learning rate:

* `restart` R > 0 (outer-momentum restarting, Topollai et al. 2026): at every t that is a multiple of
  R the buffer is zeroed before the step, so it holds this step's delta alone.
* `bias_correction`: the buffer's term in the step is multiplied by c = 1 / (1 - mu**a), a the
  number of deltas the buffer holds (t, or the steps since its last restart). A constant delta d
  fills the buffer as d (1 - mu**a) / (1 - mu), so mu * c * buf = mu d / (1 - mu): every step is then
  lr d / (1 - mu), the size it only reaches at steady state without the correction (Adam corrects
  its first moment so; here the buffer is a plain sum, hence no factor 1 - mu). The buffer itself
  is kept uncorrected.
* `lr_per_learner` k > 0: the step's lr is lr * (1 + k (M - 1)): the best outer lr grows with the
  learners averaged (the DiLoCo scaling laws).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping

import torch


class NesterovOuterOptimizer:
    """buf <- mu * buf + delta;  Theta <- Theta - lr * (delta + mu * buf), and the options of the
    module docstring: buf <- keep * buf + delta; Theta <- Theta - lr_M * (delta + pull * buf) (`rates`)."""

    def __init__(
        self,
        lr: float = 0.7,
        momentum: float = 0.9,
        bias_correction: bool = False,
        restart: int = 0,
        lr_per_learner: float = 0.0,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"outer lr must be > 0, got {lr}")
        if not 0 <= momentum < 1:
            raise ValueError(f"outer momentum must be in [0, 1), got {momentum}")
        if restart < 0 or not lr_per_learner >= 0:
            raise ValueError(f"outer restart and lr per learner must be >= 0, got {restart}, {lr_per_learner}")
        self.lr = lr
        self.momentum = momentum
        self.bias_correction = bias_correction
        self.restart = restart
        self.lr_per_learner = lr_per_learner
        self.buffers: dict[str, torch.Tensor] = {}
        self.steps = 0  # outer steps that took momentum (t of the last one); a checkpoint keeps it

    def rates(self, use_momentum: bool = True, contributions: int = 1) -> tuple[float, float, float]:
        """(lr, keep, pull) of the next step: its learning rate for `contributions` merged, the factor
        the buffer is kept with before the delta is added (mu; 0 where it restarts), and the buffer's
        factor in the step (mu, times the bias correction). Without momentum: (lr, 0, 0)."""
        lr = self.lr
        if self.lr_per_learner > 0:
            lr = self.lr * (1 + self.lr_per_learner * (max(1, contributions) - 1))
        if not (use_momentum and self.momentum > 0):
            return lr, 0.0, 0.0
        t = self.steps + 1
        restarts = self.restart > 0 and t % self.restart == 0
        pull = self.momentum
        if self.bias_correction:
            held = t if self.restart == 0 or t < self.restart else t % self.restart + 1  # deltas in the buffer
            pull = self.momentum / (1 - self.momentum**held)
        return lr, 0.0 if restarts else self.momentum, pull

    @torch.no_grad()
    def step(
        self,
        params: MutableMapping[str, torch.Tensor],
        delta: Mapping[str, torch.Tensor],
        use_momentum: bool = True,
        contributions: int = 1,
    ) -> None:
        """Apply the merged outer gradient `delta` (of `contributions` contributions) to `params` in
        place, all or nothing. `use_momentum=False`: a plain step lr * delta, momentum neither applied
        nor updated (nor the step counted).

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
        self.check(params, scaled, use_momentum, contributions)
        self.apply(params, scaled, use_momentum, contributions)

    def check(
        self,
        params: Mapping[str, torch.Tensor],
        scaled: Mapping[str, tuple[torch.Tensor, float]],
        use_momentum: bool = True,
        contributions: int = 1,
    ) -> None:
        """Raise FloatingPointError if `apply` would make a parameter or buffer non-finite.

        Read-only (so it may run outside a lock while nothing writes these tensors): three min/max
        passes bound every result; only a tensor whose bound overflows is computed exactly.
        """
        lr, keep, pull = self.rates(use_momentum, contributions)
        limit = torch.finfo(torch.float32).max / 4
        for name, (d, s) in scaled.items():
            p, buf = params[name], self.buffers.get(name)
            big_p, big_d = max_abs(p), max_abs(d) * abs(s)
            big_buf = 0.0 if buf is None or keep == 0 else max_abs(buf)
            new_buf = keep * big_buf + big_d
            if max(big_p, big_d, big_buf) < limit and big_p + lr * (big_d + pull * new_buf) < limit:
                continue
            new_b = (buf * keep + d * s) if keep > 0 and buf is not None else d * s
            value = p - lr * (d * s + pull * new_b) if pull > 0 else p - lr * (d * s)
            if not (_finite(value) and _finite(new_b)):
                raise FloatingPointError(f"{name}: the outer step would make it non-finite")

    def update(
        self, scaled: Mapping[str, tuple[torch.Tensor, float]], use_momentum: bool = True, contributions: int = 1
    ) -> dict[str, torch.Tensor]:
        """The step `apply` would take at lr 1, per tensor, out of place (s d + pull (keep buf + s d):
        `rates`): for a caller that sizes the step itself, e.g. a line search over its scale."""
        _, keep, pull = self.rates(use_momentum, contributions)
        out = {}
        for name, (d, s) in scaled.items():
            u = d * s
            if pull > 0:
                buf = self.buffers.get(name)
                u = u + pull * (u if buf is None or keep == 0 else keep * buf + u)
            out[name] = u
        return out

    def apply(
        self,
        params: Mapping[str, torch.Tensor],
        scaled: Mapping[str, tuple[torch.Tensor, float]],
        use_momentum: bool = True,
        contributions: int = 1,
    ) -> None:
        """In place, for update s * d per tensor: buf <- keep buf + s d; Theta <- Theta - lr (s d + pull buf)
        (`rates`; by default keep = pull = mu). Two passes per tensor with momentum, one without; call
        `check` first."""
        lr, keep, pull = self.rates(use_momentum, contributions)
        for name, (d, s) in scaled.items():
            p = params[name]
            if pull > 0:
                buf = self.buffers.get(name)
                if buf is None:
                    buf = self.buffers[name] = torch.mul(d, s)
                elif keep == 0:  # a restart: the buffer holds this step's delta alone
                    buf.zero_().add_(d, alpha=s)
                else:
                    buf.mul_(keep).add_(d, alpha=s)
                p.add_(d, alpha=-lr * s).add_(buf, alpha=-lr * pull)
            else:
                p.add_(d, alpha=-lr * s)
        if pull > 0:
            self.steps += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: buf.clone() for name, buf in self.buffers.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], steps: int | None = None) -> None:
        """The buffers of `state_dict`, and `steps` (None: kept as it is)."""
        self.buffers = {name: buf.detach().clone().float() for name, buf in state.items()}
        if steps is not None:
            self.steps = steps


def max_abs(x: torch.Tensor) -> float:
    """max |x| from one min/max pass (NaN propagates), far faster than isfinite().all() on a CPU."""
    if x.numel() == 0:
        return 0.0
    lo, hi = (float(v) for v in torch.aminmax(x))
    return math.nan if math.isnan(lo) or math.isnan(hi) else max(-lo, hi)


def _finite(x: torch.Tensor) -> bool:
    return x.numel() == 0 or math.isfinite(max_abs(x))
