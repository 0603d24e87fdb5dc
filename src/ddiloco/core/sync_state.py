"""The global state of the fragments a synchronizer owns: their tensors, versions and outer
optimizers, what each update carries out of them, and what a checkpoint saves and restores of them,
whole (`state_dict`) or one fragment at a time (`fragment_state`: a checkpoint writes only the
fragments whose version changed). The files themselves are the drivers' business.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from .config import AlgorithmConfig
from .fragments import FragmentPlan
from .messages import FragmentUpdate
from .outer import NesterovOuterOptimizer

#: Prefix of outer-optimizer buffers in `fragment_state`, so they can share a file with the parameters.
OUTER_PREFIX = "outer/"


class SyncState:
    """Per owned fragment: the global tensors (float32, on the CPU), the version, the outer optimizer,
    and who made the version. Changed only by `step` (a merge) and `load_state_dict` (a restore)."""

    def __init__(
        self, config: AlgorithmConfig, plan: FragmentPlan, owned: Iterable[int], params: Mapping[str, torch.Tensor]
    ) -> None:
        self.plan = plan
        self.owned = sorted(owned)
        self.params: dict[str, torch.Tensor] = {}
        for p in self.owned:
            for name in plan.names[p]:
                if name not in params:
                    raise KeyError(f"initial parameters lack {name!r}")
                self.params[name] = params[name].detach().to("cpu", torch.float32).clone()
        self.versions = {p: 0 for p in self.owned}
        self.merged_into: dict[int, tuple[int, ...]] = {p: () for p in self.owned}  # who made each version
        self.outer = {p: outer_optimizer(config) for p in self.owned}

    def step(
        self,
        p: int,
        scaled: Mapping[str, tuple[torch.Tensor, float]],
        use_momentum: bool,
        learners: Iterable[int],
        contributions: int = 1,
    ) -> None:
        """A merge of `contributions` contributions: fragment p's outer step in place, its next version,
        made by `learners`."""
        self.outer[p].apply(self.params, scaled, use_momentum, contributions)
        self.versions[p] += 1
        self.merged_into[p] = tuple(sorted(set(learners)))

    def detach(self, p: int) -> None:
        """Give fragment p's global tensors storage of their own (copies of the same values): whoever
        holds the current ones (a fetch sending them) keeps an unchanging snapshot of this version,
        and the next merge steps the copies in place."""
        for name in self.plan.names[p]:
            self.params[name] = self.params[name].clone()

    def update(self, p: int, learners: Sequence[int], copy: bool) -> FragmentUpdate:
        """Fragment p's current value addressed to `learners`: copies, or the live tensors."""
        tensors = {name: self.params[name].clone() if copy else self.params[name] for name in self.plan.names[p]}
        return FragmentUpdate(p, self.versions[p], tensors, tuple(learners), self.merged_into.get(p))

    def global_params(self) -> dict[str, torch.Tensor]:
        return {name: t.clone() for name, t in self.params.items()}

    def fragment_state(self, p: int, copy: bool = True) -> dict[str, torch.Tensor]:
        """Fragment p's global tensors and its outer-optimizer buffers (keys OUTER_PREFIX + name):
        copies, or with `copy=False` the live tensors, which the next merge of p changes in place.

        One fragment at a time, so a checkpoint can write only the fragments whose version changed.
        """
        state = {name: self.params[name].clone() if copy else self.params[name] for name in self.plan.names[p]}
        for name, buf in self.outer[p].buffers.items():
            state[OUTER_PREFIX + name] = buf.clone() if copy else buf
        return state

    def state_dict(self) -> dict[str, Any]:
        """Parameters, versions, outer optimizer buffers and their step counts."""
        return {
            "params": self.global_params(),
            "versions": dict(self.versions),
            "outer": {p: self.outer[p].state_dict() for p in self.owned},
            "outer_steps": {p: self.outer[p].steps for p in self.owned},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        params = state["params"]
        if set(params) != set(self.params):
            raise ValueError("checkpoint parameters do not match this synchronizer's fragments")
        for name, t in params.items():
            if tuple(t.shape) != tuple(self.params[name].shape):
                raise ValueError(f"checkpoint tensor {name} has shape {tuple(t.shape)}")
            self.params[name] = t.detach().to("cpu", torch.float32).clone()
        self.versions = {int(p): int(v) for p, v in state["versions"].items()}
        self.merged_into.clear()  # who made the restored versions is not kept: updates say "not known"
        steps = state.get("outer_steps", {})
        for p in self.owned:
            # a state saved before the count was kept: every merge so far counted as a momentum step
            self.outer[p].load_state_dict(state["outer"].get(p, {}), int(steps.get(p, self.versions.get(p, 0))))


def outer_optimizer(config: AlgorithmConfig) -> NesterovOuterOptimizer:
    """A fragment's outer optimizer, with the config's outer-step options."""
    return NesterovOuterOptimizer(
        config.outer_lr,
        config.outer_momentum,
        bias_correction=config.outer_debias,
        restart=config.outer_restart_every,
        lr_per_learner=config.outer_lr_per_learner,
    )
