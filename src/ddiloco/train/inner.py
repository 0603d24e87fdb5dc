"""The inner optimizer every driver uses: Muon for the hidden matrices with AdamW for the rest
(`optimizers.MuonWithAdamW`; the default since 0.4, measured: docs/results.md, "The gap to
data-parallel") or plain AdamW, with linear warm-up and cosine decay over the run, and the options
(`InnerConfig`; off by default: docs/algorithm.md, "Inner-optimizer options"): a slow momentum beside
AdamW's fast one (`optimizers.SlowFastAdamW`), a re-warm-up after each adoption (`lr_at`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch

from .optimizers import MuonWithAdamW, SlowFastAdamW, muon_matrices

InnerOptimizer = Literal["adamw", "muon"]
INNER_OPTIMIZERS: tuple[InnerOptimizer, ...] = ("adamw", "muon")
# The peak inner lr when none is given, per optimizer: each one's tuned choice on the sweeps of
# docs/results.md ("The gap to data-parallel": 84k and 148k parameters, every method; the demo's ~1M).
DEFAULT_LR: dict[InnerOptimizer, float] = {"adamw": 3e-3, "muon": 1.2e-2}


@dataclass(frozen=True)
class InnerConfig:
    lr: float = None  # type: ignore[assignment]  # peak; None: DEFAULT_LR[optimizer], set in __post_init__
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    batch_size: int = 16
    # adamw: torch.optim.AdamW on every parameter; muon: torch.optim.Muon on the hidden 2-D matrices,
    # AdamW on the rest (MuLoCo, arXiv 2505.23725; `optimizers.muon_matrices` says which are which)
    optimizer: InnerOptimizer = "muon"
    # MT-DAO (arXiv 2510.05361): beta_s of a slow first moment AdamW's step mixes with its fast one
    # (beta1), with weight slow_weight (`optimizers.SlowFastAdamW`); 0: off, plain AdamW
    slow_momentum: float = 0.0
    slow_weight: float = 0.5
    # the schedule across adoptions (the paper leaves it undefined): after a learner adopts a global
    # fragment value its learning rate warms up again, linearly over this many steps (`lr_at`); 0: off
    rewarm_steps: int = 0

    def __post_init__(self) -> None:
        if self.optimizer not in INNER_OPTIMIZERS:
            raise ValueError(f"inner optimizer must be one of {', '.join(INNER_OPTIMIZERS)}, got {self.optimizer!r}")
        if self.lr is None:
            object.__setattr__(self, "lr", DEFAULT_LR[self.optimizer])
        if not self.lr > 0 or self.batch_size < 1 or self.warmup_steps < 0 or self.rewarm_steps < 0:
            raise ValueError("inner lr must be > 0, batch_size >= 1, warmup_steps and rewarm_steps >= 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("min_lr_ratio must be in [0, 1]")
        if self.slow_momentum and not self.beta1 < self.slow_momentum < 1:
            raise ValueError(
                f"slow_momentum must be 0 (off) or between beta1 = {self.beta1} and 1, got {self.slow_momentum}"
            )
        if not 0 <= self.slow_weight <= 1:
            raise ValueError(f"slow_weight must be in [0, 1], got {self.slow_weight}")
        if self.slow_momentum and self.optimizer != "adamw":
            raise ValueError(
                "slow_momentum is AdamW's (MT-DAO); Muon keeps its own momentum: use one or the other "
                "(--inner-optimizer adamw)"
            )

    def to_dict(self) -> dict:
        return asdict(self)


def make_inner_optimizer(model: torch.nn.Module, config: InnerConfig) -> torch.optim.Optimizer:
    """The inner optimizer `config` asks for, over `model`'s parameters: by default Muon on the hidden
    matrices with AdamW on the rest (plain torch.optim.AdamW for a model without hidden matrices).
    Public (`ddiloco.make_inner_optimizer`): a training loop of one's own builds the same one."""
    betas = (config.beta1, config.beta2)
    if config.slow_momentum:
        return SlowFastAdamW(
            model.parameters(),
            lr=config.lr,
            betas=betas,
            slow_beta=config.slow_momentum,
            slow_weight=config.slow_weight,
            weight_decay=config.weight_decay,
        )
    if config.optimizer == "muon":
        matrices = muon_matrices(model)
        taken = {id(p) for p in matrices}
        others = [p for p in model.parameters() if id(p) not in taken]
        if matrices:  # else (a model without hidden matrices: SmallCNN) AdamW takes everything, as by default
            return MuonWithAdamW(matrices, others, lr=config.lr, weight_decay=config.weight_decay, betas=betas)
    return torch.optim.AdamW(model.parameters(), lr=config.lr, betas=betas, weight_decay=config.weight_decay)


def lr_at(config: InnerConfig, step: int, progress: float, since_adoption: int | None = None) -> float:
    """Warm-up over the learner's own first steps, cosine decay over the run's token progress in [0, 1].

    Decaying by global progress rather than by the learner's step count gives every method the same
    learning rate per token, which is what a comparison at equal tokens needs.

    `since_adoption`: the learner's steps since it last adopted a global value (joined, or took a
    merged fragment: 0 for the first step after it; None: never, as in data-parallel training). With
    `rewarm_steps` R > 0 the warm-up factor is at most (since_adoption + 1) / R: a linear re-warm-up
    over R steps after each adoption, the whole learner's learning rate at once whichever fragment came.
    """
    warm = min(1.0, (step + 1) / config.warmup_steps) if config.warmup_steps > 0 else 1.0
    if config.rewarm_steps > 0 and since_adoption is not None:
        warm = min(warm, (since_adoption + 1) / config.rewarm_steps)
    progress = min(1.0, max(0.0, progress))
    cosine = config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return config.lr * warm * cosine


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def inner_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    grad_clip: float,
) -> float:
    """backward, clip, step, zero: one inner step; returns the loss value."""
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())
