"""What a synchronizer core saves and restores: the global parameters, their versions, the outer
optimizer's buffers and the timing estimates, whole (`state_dict`) or one fragment at a time (for
checkpoints that write only the fragments whose version changed).

Apart from `SynchronizerCore` (which mixes this in) because persisting its state is one idea of its
own, apart from rounds and merges; the files themselves are the drivers' business.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .fragments import FragmentPlan
from .outer import NesterovOuterOptimizer
from .rounds import Round
from .taken import TakenWork
from .timing import GraceWindow

#: Prefix of outer-optimizer buffers in `fragment_state`, so they can share a file with the parameters.
OUTER_PREFIX = "outer/"


class SyncState:
    """The state methods of `SynchronizerCore`, over the attributes it sets up."""

    plan: FragmentPlan
    owned: list[int]
    params: dict[str, torch.Tensor]
    versions: dict[int, int]
    merged_into: dict[int, tuple[int, ...]]
    outer: dict[int, NesterovOuterOptimizer]
    grace: GraceWindow
    rounds: dict[int, Round]
    carries: dict[int, Any]  # fragment -> `late.Carry`
    taken: TakenWork
    late_floor: dict[int, int]
    rejections: dict[str, int]

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
        """Everything needed to resume: parameters, versions, outer optimizer buffers, estimates."""
        return {
            "params": self.global_params(),
            "versions": dict(self.versions),
            "outer": {p: self.outer[p].state_dict() for p in self.owned},
            "grace": self.grace.state_dict(),
            "rejections": dict(self.rejections),
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
        for p in self.owned:
            self.outer[p].load_state_dict(state["outer"].get(p, {}))
        self.grace.load_state_dict(state.get("grace", {}))
        self.rejections = dict(state.get("rejections", {}))
        self.rounds.clear()
        self.carries.clear()  # late work is held like an open round's: not saved
        self.taken.clear()  # not saved: late work from before this restore is refused instead
        self.late_floor = dict(self.versions)
