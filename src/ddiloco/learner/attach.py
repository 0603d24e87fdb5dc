"""`LearnerClient.attach`: the step boundary as an optimizer step post-hook.

Frameworks (the Hugging Face Trainer, Lightning, torchtitan) own the training loop, but every one of
them calls `optimizer.step()`. A post-hook on the inner optimizer calls `client.step` right after it,
so such a loop takes part without a line of its own, as torchft's DiLoCo does.

A step AMP's grad scaler skipped (an inf or NaN gradient) is not counted: `GradScaler.step` does not
call `optimizer.step()` at all then, so the hook does not fire; an optimizer that takes the scaler's
`found_inf` itself (fused Adam/AdamW/SGD) is stepped anyway and skips inside, so the hook reads the
same `found_inf` and does not count that step either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.utils.hooks import RemovableHandle


class Steps(Protocol):
    """What the hook needs of a `LearnerClient` (no import of it: the client imports this module)."""

    state: str

    def step(
        self, tokens: int, seconds: float | None = None, position: int | None = None, loss: float | None = None
    ) -> list[int]: ...


def skipped_by_scaler(optimizer: torch.optim.Optimizer) -> bool:
    """True inside a step that GradScaler handed to an optimizer with its own inf check and whose
    gradients held an inf: the optimizer left its parameters alone, so nothing was trained."""
    found_inf = getattr(optimizer, "found_inf", None)
    return isinstance(found_inf, torch.Tensor) and bool(found_inf.item())


class Attachment:
    """The handle `attach` returns: counts the steps it handed on and those the scaler skipped;
    `detach()` (or leaving a `with` block) removes the hook."""

    def __init__(
        self,
        client: Steps,
        optimizer: torch.optim.Optimizer,
        tokens_per_step: int | None,
        count_tokens: Callable[[], int] | None,
        loss: Callable[[], float | None] | None,
    ) -> None:
        if (tokens_per_step is None) == (count_tokens is None):
            raise ValueError("give exactly one of tokens_per_step (an int) or count_tokens (a callable)")
        if tokens_per_step is not None and int(tokens_per_step) <= 0:
            raise ValueError(f"tokens_per_step must be positive, not {tokens_per_step}")
        self.client = client
        self.optimizer = optimizer
        self.tokens_per_step = None if tokens_per_step is None else int(tokens_per_step)
        self.count_tokens = count_tokens
        self.loss = loss
        self.steps = 0  # optimizer steps handed to client.step
        self.skipped = 0  # steps a fused optimizer skipped on the scaler's found_inf
        self.tokens = 0  # this rank's tokens handed to client.step
        self._handle: RemovableHandle | None = optimizer.register_step_post_hook(self._after_step)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if skipped_by_scaler(optimizer):
            self.skipped += 1
            return
        state = self.client.state
        if state == "new":
            raise RuntimeError("the optimizer stepped before client.start(): start the client before training")
        if state != "training":  # finishing or closed: steps after finish() are not the run's
            return
        tokens = self.tokens_per_step if self.count_tokens is None else int(self.count_tokens())
        loss = self.loss() if self.loss is not None else None
        self.steps += 1
        self.tokens += int(tokens or 0)
        self.client.step(int(tokens or 0), loss=loss)

    @property
    def attached(self) -> bool:
        return self._handle is not None

    def detach(self) -> None:
        """Remove the hook: later optimizer steps are the user's own (idempotent)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def __enter__(self) -> Attachment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()
