"""What the framework integrations share: counting the tokens a model trained on between optimizer
steps, finding the torch optimizer inside a framework's wrapper, and refusing DeepSpeed ZeRO and FSDP1
(FSDP2 works: the client keeps DTensor shards in step, `learner.fanout`)."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from ..learner.client import LearnerClient
from ..learner.ending import RunFinished

log = logging.getLogger(__name__)

ZERO_REFUSED = (
    "Decoupled DiLoCo does not work with DeepSpeed ZeRO: ZeRO keeps the fp32 master copy of the parameters "
    "inside its optimizer and overwrites the module's parameters from it after every step, so the global "
    "parameters the learner client writes into the model would be lost at the next step. Train this learner "
    "with DDP or FSDP2 instead (remove the deepspeed setting / ACCELERATE_USE_DEEPSPEED)."
)


FSDP1_REFUSED = (
    "Decoupled DiLoCo learners support FSDP2 (`fully_shard`), not FSDP1: FSDP1 flattens each wrapped "
    "module's parameters into one FlatParameter and keeps only this rank's slice, so the model's named "
    "parameters are no longer its tensors. Use FSDP2: fsdp_config={'version': 2} (the Trainer's default)."
)


def start_or_finished(client: LearnerClient) -> bool:
    """Start `client`; False (logged once) when its run is already over, so that the framework's loop
    stops before its first step instead of failing: a learner started after the run ended has nothing
    to train (the same end as a reached budget)."""
    try:
        client.start()
    except RunFinished as exc:
        log.warning("%s: nothing to train, the training loop stops", exc)
        return False
    return True


def refuse_fsdp1(args: Any = None, model: torch.nn.Module | None = None) -> None:
    """Raise with FSDP1_REFUSED when training arguments ask for FSDP version 1 or the model holds an
    FSDP1 `FullyShardedDataParallel` module."""
    config = getattr(args, "fsdp_config", None)
    version = config.get("version", config.get("fsdp_version", 2)) if isinstance(config, dict) else 2
    uses = bool(getattr(args, "fsdp", None)) and str(version) == "1"
    uses = uses or (model is not None and any(type(m).__name__ == "FullyShardedDataParallel" for m in model.modules()))
    if uses:
        raise ValueError(FSDP1_REFUSED)


def refuse_deepspeed(args: Any = None, accelerator: Any = None) -> None:
    """Raise with ZERO_REFUSED when training arguments, an Accelerator or the environment ask for DeepSpeed."""
    uses = bool(getattr(args, "deepspeed", None)) or getattr(args, "deepspeed_plugin", None) is not None
    state = getattr(accelerator, "state", None)
    uses = uses or getattr(state, "deepspeed_plugin", None) is not None
    uses = uses or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes")
    if uses:
        raise ValueError(ZERO_REFUSED)


def torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a framework's wrapper (Accelerate's `AcceleratedOptimizer`, Lightning's
    `LightningOptimizer`): the hook goes on the one whose `step` really runs, after the scaler's check."""
    for _ in range(4):  # bounded: wrappers nest at most a few deep
        if type(optimizer).__name__ in ("AcceleratedOptimizer", "LightningOptimizer") or not isinstance(
            optimizer, torch.optim.Optimizer
        ):
            inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
            if inner is None:
                break
            optimizer = inner
        else:
            break
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer (or a wrapper of one), not {type(optimizer).__name__}")
    return optimizer


class TokenCounter:
    """Counts the tokens of training forward passes (a forward pre-hook on the model) since it was last
    read: what one optimizer step trained on, over all its gradient-accumulation micro-batches."""

    def __init__(self, model: torch.nn.Module, key: str = "input_ids") -> None:
        self.key = key
        self.pending = 0
        self.total = 0
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return  # evaluation: not trained
        ids = kwargs.get(self.key, args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            self.pending += ids.numel()

    def take(self) -> int:
        """The tokens since the last take (or reset), counted as trained."""
        got, self.pending = self.pending, 0
        self.total += got
        return got

    def reset(self) -> None:
        """Forget what was counted since the last take (a step the grad scaler skipped)."""
        self.pending = 0

    def remove(self) -> None:
        self._handle.remove()
