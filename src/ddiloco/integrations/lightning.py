"""`DecoupledDiLoCo`: a Lightning `Trainer` as a Decoupled DiLoCo learner.

    trainer = lightning.Trainer(callbacks=[DecoupledDiLoCo("10.0.0.5:7070", learner_id=0)])
    trainer.fit(module, loader)       # ckpt_path="last" after a crash rejoins the run

The client is created at `on_train_start`, once Lightning has set up the optimizer and restored a
checkpoint, and attached to the (first) torch optimizer: each optimizer step is a `client.step`
(steps AMP's grad scaler skipped are not). Tokens: `tokens_per_step`, or `count_tokens(batch)` summed
over the batches since the step before (by default the size of the batch's `input_ids`, or of the
batch itself, or of its first element). The Trainer stops when the run's budget is reached; the client
finishes at `on_train_end`. Under DDP every rank does the same (the client is collective).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # an optional extra: say which
    raise ImportError(
        f"ddiloco.integrations.lightning needs lightning: pip install 'ddiloco[lightning]' ({exc})"
    ) from exc

from ddiloco.integrations.common import refuse_fsdp1, start_or_finished, torch_optimizer
from ddiloco.learner.attach import Attachment
from ddiloco.learner.client import LearnerClient


def batch_tokens(batch: Any) -> int:
    """Tokens of a batch: its `input_ids`, or the batch tensor, or its first element's size."""
    if isinstance(batch, dict):
        batch = batch.get("input_ids", next(iter(batch.values()), None))
    elif isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    return batch.numel() if isinstance(batch, torch.Tensor) else 0


class DecoupledDiLoCo(Callback):
    """Joins the Trainer's run to a synchronizer; `client_kwargs` go to `LearnerClient`."""

    def __init__(
        self,
        address: str,
        learner_id: int,
        *,
        tokens_per_step: int | None = None,
        count_tokens: Callable[[Any], int] = batch_tokens,
        **client_kwargs: Any,
    ) -> None:
        self.address = address
        self.learner_id = int(learner_id)
        self.tokens_per_step = tokens_per_step
        self.count_tokens = count_tokens
        self.client_kwargs = client_kwargs
        self.client: LearnerClient | None = None
        self.attachment: Attachment | None = None
        self._pending = 0
        self._loss: float | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.optimizers:
            raise RuntimeError("the LightningModule configured no optimizer: nothing to attach to")
        refuse_fsdp1(model=pl_module)  # Lightning's FSDPStrategy is FSDP1 (FSDP2: ModelParallelStrategy)
        inner = torch_optimizer(trainer.optimizers[0])
        client = LearnerClient(pl_module, self.address, self.learner_id, optimizer=inner, **self.client_kwargs)
        if not start_or_finished(client):  # after Lightning restored a checkpoint: the global parameters win
            trainer.should_stop = True
            return
        self.client = client
        if self.tokens_per_step is not None:
            self.attachment = self.client.attach(inner, tokens_per_step=self.tokens_per_step, loss=self._last_loss)
        else:
            self.attachment = self.client.attach(inner, count_tokens=self._take, loss=self._last_loss)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._pending += int(self.count_tokens(batch))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1 and math.isfinite(float(loss)):
            self._loss = float(loss)
        if self.client is not None and self.client.stopping:
            trainer.should_stop = True  # the run's budget is reached (same on every rank)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._leave(finish=True)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._leave(finish=False)

    def stats(self) -> dict:
        """The client's counters (after training too)."""
        return self.client.stats() if self.client is not None else {}

    def _take(self) -> int:
        got, self._pending = self._pending, 0
        return got

    def _last_loss(self) -> float | None:
        return self._loss

    def _leave(self, finish: bool) -> None:
        if self.attachment is not None:
            self.attachment.detach()
        if self.client is not None and self.client.state == "training":
            if finish:
                self.client.finish()
            else:
                self.client.close()
