"""Small builders shared by the simulator tests."""

from __future__ import annotations

from ddiloco.chaos.trace import FailureTrace
from ddiloco.core import AlgorithmConfig
from ddiloco.sim.config import SimConfig
from ddiloco.sim.hardware import LinkModel, StepTimeModel
from ddiloco.train.inner import InnerConfig

BATCH = 4
SEQ = 16
TOKENS_PER_STEP = BATCH * SEQ
# Constant learning rate, so that hand-written references need no schedule; AdamW, as they write it.
FLAT_INNER = InnerConfig(lr=3e-3, warmup_steps=0, min_lr_ratio=1.0, batch_size=BATCH, optimizer="adamw")
INSTANT = LinkModel(latency=0.0, bandwidth=1e15, merge_rate=1e15)


def sim_config(method: str = "decoupled", learners: int = 3, steps_per_learner: int = 12, **overrides) -> SimConfig:
    algorithm = overrides.pop("algorithm", AlgorithmConfig(fragments=2, sync_every=4, overlap=1, quorum=1, grace=0.5))
    return SimConfig(
        method=method,
        model="gpt",
        model_size="tiny",
        seq_len=SEQ,
        learners=learners,
        tokens=learners * steps_per_learner * TOKENS_PER_STEP,
        algorithm=algorithm,
        inner=overrides.pop("inner", FLAT_INNER),
        steps=overrides.pop("steps", StepTimeModel()),
        link=overrides.pop("link", INSTANT),
        failures=overrides.pop("failures", FailureTrace()),
        **overrides,
    )
