"""`DecoupledDiLoCoCallback`: a Hugging Face `Trainer` as a Decoupled DiLoCo learner.

    trainer = Trainer(model, args, train_dataset=data,
                      callbacks=[DecoupledDiLoCoCallback("10.0.0.5:7070", learner_id=0)])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))  # rejoins after a crash

The client is created at `on_train_begin`, when the Trainer has built (and, on resume, loaded) its
optimizer, and is attached to it: every optimizer step the Trainer takes is a `client.step`, with the
tokens its training forward passes saw since the step before (steps AMP skipped are not counted).
When the run's budget is reached the callback stops the Trainer; `on_train_end` finishes the client.
Under torchrun / `accelerate launch` (DDP, FSDP2) every rank does the same: the client is collective;
with FSDP2 the Trainer's model holds DTensor shards, which the client keeps in step as in a hand-written
FSDP2 loop (rank 0 holds a full copy for the algorithm, each rank writes its own shard of a merge).
DeepSpeed ZeRO (`common.ZERO_REFUSED`) and FSDP1 (`common.FSDP1_REFUSED`) are refused.

After kill -9 the newest `checkpoint-N` folder may be half written (the Trainer writes in place, and
`resume_from_checkpoint=True` takes it anyway and fails): `last_checkpoint` skips those.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # an optional extra: say which
    raise ImportError(
        f"ddiloco.integrations.transformers needs transformers: pip install 'ddiloco[hf]' ({exc})"
    ) from exc

from ddiloco.integrations.common import (
    TokenCounter,
    refuse_deepspeed,
    refuse_fsdp1,
    start_or_finished,
    torch_optimizer,
)
from ddiloco.learner.attach import Attachment
from ddiloco.learner.client import LearnerClient
from ddiloco.learner.fanout import is_sharded

log = logging.getLogger(__name__)

FSDP_DROPPED = (
    "fsdp is set but the model's parameters are not sharded: Accelerate turns FSDP on only for GPU-like "
    "devices and trains with DDP elsewhere (use_cpu=True); the learner takes part as a DDP learner"
)


class DecoupledDiLoCoCallback(TrainerCallback):
    """Joins the Trainer's run to a synchronizer. `client_kwargs` go to `LearnerClient` (token,
    journal_dir, codec, timeouts, ...); `token_key`: the model input whose size counts tokens."""

    def __init__(self, address: str, learner_id: int, token_key: str = "input_ids", **client_kwargs: Any) -> None:
        self.address = address
        self.learner_id = int(learner_id)
        self.token_key = token_key
        self.client_kwargs = client_kwargs
        self.client: LearnerClient | None = None
        self.attachment: Attachment | None = None
        self.counter: TokenCounter | None = None
        self._loss: float | None = None

    def on_init_end(self, args, state, control, **kwargs):
        refuse_deepspeed(args)  # as early as the Trainer exists: before any training
        refuse_fsdp1(args)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        refuse_deepspeed(args)
        if model is None or optimizer is None:
            raise RuntimeError("the Trainer gave the callback no model or optimizer at on_train_begin")
        refuse_fsdp1(args, model)
        if getattr(args, "fsdp", None) and not any(is_sharded(p) for p in model.parameters()):
            log.warning(FSDP_DROPPED)
        inner = torch_optimizer(optimizer)
        client = LearnerClient(model, self.address, self.learner_id, optimizer=inner, **self.client_kwargs)
        if not start_or_finished(client):  # after the Trainer loaded a checkpoint: the global parameters win
            control.should_training_stop = True
            return control
        self.client = client
        self.counter = TokenCounter(model, self.token_key)
        self.attachment = self.client.attach(inner, count_tokens=self.counter.take, loss=lambda: self._loss)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.counter is not None:
            self.counter.reset()  # a step the grad scaler skipped left its tokens here: not trained

    def on_step_end(self, args, state, control, **kwargs):
        if self.client is not None and self.client.stopping:
            control.should_training_stop = True  # the run's budget is reached (same on every rank)

    def on_log(self, args, state, control, logs=None, **kwargs):
        loss = (logs or {}).get("loss")
        if isinstance(loss, (int, float)) and math.isfinite(loss):
            self._loss = float(loss)

    def on_train_end(self, args, state, control, **kwargs):
        if self.attachment is not None:
            self.attachment.detach()
        if self.counter is not None:
            self.counter.remove()
        if self.client is not None:
            self.client.finish()

    def stats(self) -> dict:
        """The client's counters (after training too)."""
        return self.client.stats() if self.client is not None else {}


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest `checkpoint-N` under `output_dir` that the Trainer finished writing (its
    trainer_state.json, written last, parses), or None: where to resume after a crash."""
    found = []
    for d in Path(output_dir).glob("checkpoint-*"):
        match = re.fullmatch(r"checkpoint-(\d+)", d.name)
        if match and d.is_dir():
            found.append((int(match.group(1)), d))
    for _, d in sorted(found, reverse=True):
        try:
            json.loads((d / "trainer_state.json").read_text())
        except (OSError, ValueError):
            continue  # cut short by the crash
        return str(d)
    return None
