"""One learner of the virtual-clock cluster: its model, optimizer, data and where it is in its life."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..core import FragmentUpdate, LearnerCore
from ..train.streams import BatchStream


@dataclass
class SimLearner:
    """One learner process in the simulation; `incarnation` changes each time it fails."""

    id: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    stream: BatchStream
    sample_step_time: Callable[[], float]
    incarnation: int = 0
    state: str = "down"  # down | joining | stepping | waiting | stopped
    core: LearnerCore | None = None
    joining: dict[int, FragmentUpdate] = field(default_factory=dict)
    step_started: float = 0.0
    step_duration: float = 0.0
    inner_steps: int = 0
    waited: float = 0.0  # seconds spent waiting for merged fragments (the synchronous methods)
    wait_since: float = 0.0

    @property
    def live_core(self) -> LearnerCore:
        """The core of a learner that has joined: it exists from its join on."""
        assert self.core is not None, f"learner {self.id} has no core before it joins"
        return self.core
