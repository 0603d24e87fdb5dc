"""torchtitan: a trainer subclass and a config function, as torchft's `FaultTolerantTrainer` does.

    torchrun --nproc-per-node 8 -m torchtitan.train \\
        --module ddiloco.integrations.torchtitan --config llama3_ddiloco_debugmodel \\
        --ddiloco.address 10.0.0.5:7070 --ddiloco.learner-id 0

`DecoupledDiLoCoTrainer` is torchtitan's `Trainer` with one more config section (`ddiloco`). At the first
`should_continue_training()` of `train()`, after torchtitan loaded its checkpoint, it starts a
`LearnerClient` on every rank (the global parameters win) and attaches it to the optimizers container:
each `optimizers.step()` is a `client.step` with this rank's tokens (local batch x sequence length x
gradient accumulation). Training stops when the run's budget is reached; the client finishes after the
loop. Data parallelism only (FSDP2 over all ranks, or DDP): TP, CP, PP, EP and HSDP are refused.

Fragments from module names: the synchronizer owns the split and learners take it at registration, so
start the synchronizer with `ddiloco.Synchronizer(model, fragments=layer_fragments(model, P))` (from
`integrations.fragments`, re-exported here with `module_fragments` and `parameter_fragments`); the
client names the parameters by their `clean_name`, the unwrapped model's, as those functions do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

try:
    from torchtitan.trainer import Trainer  # type: ignore[import-not-found, import-untyped, unused-ignore]
except ImportError as exc:  # an optional extra: say which
    raise ImportError(
        f"ddiloco.integrations.torchtitan needs torchtitan: pip install 'ddiloco[torchtitan]' "
        f"(0.3 imports triton: with a CPU build of torch, pip install triton too) ({exc})"
    ) from exc

from ddiloco.integrations.fragments import clean_name, layer_fragments, module_fragments, parameter_fragments
from ddiloco.learner.attach import Attachment
from ddiloco.learner.client import LearnerClient


@dataclass(kw_only=True, slots=True)
class DecoupledDiLoCoSettings:
    address: str = ""
    """host:port of the synchronizer (comma-separated shards)"""
    learner_id: int = 0
    token: str | None = None
    codec: str = "bf16"
    journal_dir: str | None = None


def refuse_unsupported(config: Any, world: int) -> None:
    """Only data parallelism over all ranks: what the learner client keeps in step (DDP or FSDP2)."""
    p = config.parallelism
    other = {
        "tensor": p.tensor_parallel_degree,
        "context": p.context_parallel_degree,
        "pipeline": p.pipeline_parallel_degree,
        "expert": p.expert_parallel_degree,
    }
    used = [k for k, v in other.items() if v > 1]
    if used:
        raise ValueError(f"Decoupled DiLoCo learners support data parallelism only; this config uses {used} parallel")
    if 1 < p.data_parallel_replicate_degree < world:
        raise ValueError("HSDP (replicate and shard together) is not supported: use FSDP or DDP over all ranks")


__all__ = [
    "DecoupledDiLoCoSettings",
    "DecoupledDiLoCoTrainer",
    "clean_name",
    "layer_fragments",
    "llama3_ddiloco_debugmodel",
    "module_fragments",
    "parameter_fragments",
    "refuse_unsupported",
    "with_ddiloco",
]


class DecoupledDiLoCoTrainer(Trainer):
    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        ddiloco: DecoupledDiLoCoSettings = field(default_factory=DecoupledDiLoCoSettings)

    def __init__(self, config: Config) -> None:
        refuse_unsupported(config, int(os.environ.get("WORLD_SIZE", "1")))
        if not config.ddiloco.address:
            raise ValueError("set ddiloco.address (host:port of the synchronizer)")
        super().__init__(config)
        self.client: LearnerClient | None = None
        self.attachment: Attachment | None = None

    def tokens_per_step(self) -> int:
        """This rank's tokens per optimizer step."""
        t = self.config.training
        return int(t.local_batch_size * t.seq_len * self.gradient_accumulation_steps)

    def _join(self) -> None:
        s = self.config.ddiloco
        (model,) = self.model_parts
        params = {clean_name(n): p for n, p in model.named_parameters()}
        self.client = LearnerClient(
            params, s.address, s.learner_id, token=s.token, codec=s.codec, journal_dir=s.journal_dir
        )
        self.client.start()
        self.attachment = self.client.attach(self.optimizers, tokens_per_step=self.tokens_per_step())

    def should_continue_training(self) -> bool:
        if self.client is None:  # the first call: after the checkpoint was loaded, before the first step
            self._join()
        assert self.client is not None
        return bool(Trainer.should_continue_training(self)) and not self.client.stopping

    def train(self) -> None:
        try:
            Trainer.train(self)
        except BaseException:
            if self.client is not None:
                self.client.close()
            raise
        if self.attachment is not None:
            self.attachment.detach()
        if self.client is not None:
            self.client.finish()


def with_ddiloco(base: Trainer.Config, **settings: Any) -> DecoupledDiLoCoTrainer.Config:
    """Any torchtitan config as a Decoupled DiLoCo learner's (its `build()` makes our trainer)."""
    values = {f.name: getattr(base, f.name) for f in fields(base)}
    return DecoupledDiLoCoTrainer.Config(**values, ddiloco=DecoupledDiLoCoSettings(**settings))


def llama3_ddiloco_debugmodel() -> DecoupledDiLoCoTrainer.Config:
    """torchtitan's llama3 debug model as a learner (`--module ddiloco.integrations.torchtitan`)."""
    from torchtitan.models.llama3.config_registry import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
        llama3_debugmodel,
    )

    config = with_ddiloco(llama3_debugmodel())
    config.training.steps = 1_000_000  # the run's token budget ends it
    return config
